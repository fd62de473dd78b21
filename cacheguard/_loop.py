"""Binding an object to the one event loop it may be used from."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

from cacheguard.exceptions import WrongEventLoop

__all__ = ["LoopBinding", "LoopTask"]

log = logging.getLogger("cacheguard.watchdog")


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


W = TypeVar("W")


class LoopTask(Generic[W]):
    """The one task an asyncio watchdog runs on its event loop (shared by
    :class:`AsyncWatchdog` and the asyncio Redlock watchdog).

    :meth:`_poke` starts it, or wakes it when something is due sooner than it
    planned; it does what :meth:`_due_work` finds due, sleeps until the next due
    time, and ends when nothing is left (the next poke starts a new one) or at
    :meth:`close`. Subclasses say what is due (``_due_work``), do it (``_do``) and
    handle an unexpected error (``_failed``).
    """

    _timer: Callable[[], float]

    def _init_loop_task(self, what: str) -> None:
        self._binding = LoopBinding(what)
        self._task: asyncio.Task[None] | None = None
        self._run_number = 0  # which task is the current one (see _run)
        self._wake: asyncio.Event | None = None
        self._wake_at = float("inf")  # when the task plans to wake next

    def _poke(self, due: float) -> None:
        loop = self._binding.check()
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._run_number += 1
            self._task = loop.create_task(self._run(self._run_number), name=self._task_name())
        elif due < self._wake_at and self._wake is not None:
            self._wake.set()

    def close(self) -> None:
        """Stop the task (what is watched stays; the next watch restarts it)."""
        task, self._task = self._task, None
        self._run_number += 1
        self._wake_at = float("inf")
        if task is not None:
            task.cancel()

    async def aclose(self) -> None:
        """:meth:`close`, then wait until the task has ended."""
        task = self._task
        self.close()
        if task is not None and not task.done():
            await asyncio.wait({task})

    async def _run(self, number: int) -> None:
        wake = self._wake
        assert wake is not None
        try:
            # Not ``while True``: a cancellation can be swallowed inside a client's
            # round trip (redis-py returns normally now and then), so a closed
            # watchdog's task also stops at its next turn. A number, not the task
            # object: an eager task factory runs this before create_task returns.
            while number == self._run_number:
                now = self._timer()
                work, soonest = self._due_work(now)
                if work is None:
                    if soonest == float("inf"):
                        return  # nothing to do: the next poke starts a new task
                    self._wake_at = soonest
                    wake.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(wake.wait(), soonest - now)
                    continue
                self._wake_at = now
                try:
                    await self._do(work)
                except Exception:  # keep renewing the others whatever one batch did
                    self._failed(work)
        finally:
            if number == self._run_number:
                self._task = None
                self._wake_at = float("inf")

    def _task_name(self) -> str:
        raise NotImplementedError

    def _due_work(self, now: float) -> tuple[W | None, float]:
        """(what is due at ``now``, or None; when the soonest is due: ``inf`` if nothing)."""
        raise NotImplementedError

    async def _do(self, work: W) -> None:
        raise NotImplementedError

    def _failed(self, work: W) -> None:
        raise NotImplementedError
