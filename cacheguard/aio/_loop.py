"""Binding an object to the one event loop it may be used from."""

from __future__ import annotations

import asyncio
import weakref

from cacheguard.exceptions import WrongEventLoop

__all__ = ["LoopBinding"]


class LoopBinding:
    """Remembers the event loop of an object's first use; another loop is refused.

    A ``redis.asyncio`` client, its connections and the tasks cacheguard starts for
    it all belong to one loop: used from a second loop they fail in obscure ways
    (futures attached to a different loop) or hang, so the second use fails at once
    with :class:`~cacheguard.exceptions.WrongEventLoop` instead.
    """

    __slots__ = ("_loop", "_what")

    def __init__(self, what: str) -> None:
        self._what = what
        self._loop: weakref.ref[asyncio.AbstractEventLoop] | None = None

    def check(self) -> asyncio.AbstractEventLoop:
        """The running loop, if it is this object's loop (binding it on first use)."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = weakref.ref(loop)
        elif self._loop() is not loop:
            raise WrongEventLoop(
                f"{self._what} was first used on another event loop and cannot be used "
                "from this one: create one Redis client, and its locks, notifier, "
                "watchdog and guards, per event loop"
            )
        return loop

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The bound loop, if any and still alive."""
        return self._loop() if self._loop is not None else None
