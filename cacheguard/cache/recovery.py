"""What a guard must do when it reaches Redis again, before it serves a value from it.

Writes committed while Redis was unreachable left their invalidations in an
outbox (``track_models(..., outbox=True)``, :mod:`cacheguard.sqlalchemy.outbox`).
Until they are replayed, Redis may hold values those writes replaced. So a
guard with replay hooks is *pending* from the start (a process may start after
an outage) and after every Redis failure it sees; a read that reached Redis
while pending first runs the hooks (the :class:`~cacheguard.cache.read_path.Replay`
step) and serves from Redis only once they succeeded.

The hooks run one at a time per guard; callers that need them meanwhile wait
for the run under way, then find it done. A failure seen during a run keeps
the guard pending for the next read (marks are counted, not flags).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Recovery", "ReplayHook"]

ReplayHook = Callable[[], Any]  # sync guard: returns None; asyncio guard: an awaitable


class Recovery:
    """The replay hooks of one guard, and whether they must run before serving."""

    __slots__ = ("_async_mutex", "_done", "_hooks", "_marks", "_mutex", "_running", "pending")

    def __init__(self) -> None:
        self.pending = False  # read on every GET: a plain attribute
        self._hooks: tuple[ReplayHook, ...] = ()
        self._marks = 0  # failures seen (and hooks added)
        self._done = 0  # the marks the last successful run covered
        self._mutex = threading.Lock()  # the counters only: never held while a hook runs
        self._running = threading.Lock()  # one sync run at a time
        self._async_mutex: asyncio.Lock | None = None

    def reset_after_fork(self) -> None:
        """In a forked child: the parent's threads (which may hold the locks) are gone."""
        self._mutex = threading.Lock()
        self._running = threading.Lock()
        self._async_mutex = None

    @property
    def hooks(self) -> tuple[ReplayHook, ...]:
        return self._hooks

    def add(self, hook: ReplayHook) -> None:
        """Run ``hook`` before serving from Redis after each outage (and once first)."""
        with self._mutex:
            if hook not in self._hooks:
                self._hooks = (*self._hooks, hook)
            self._mark()

    def remove(self, hook: ReplayHook) -> None:
        with self._mutex:
            self._hooks = tuple(h for h in self._hooks if h != hook)
            if not self._hooks:
                self.pending = False

    def mark(self) -> None:
        """Redis failed a call (or a write went to the outbox): replay before serving."""
        if self._hooks:
            with self._mutex:
                self._mark()

    def _mark(self) -> None:
        self._marks += 1
        self.pending = bool(self._hooks)

    def _finished(self, covered: int) -> None:
        with self._mutex:
            self._done = max(self._done, covered)
            self.pending = self._done < self._marks and bool(self._hooks)

    def run(self) -> None:
        """Run every hook (the sync guard's); raises the first failure, leaving the
        guard pending."""
        with self._mutex:
            hooks, covered = self._hooks, self._marks
        if not self.pending:
            return
        with self._running:
            if self._done >= covered:  # another caller's run covered ours
                return
            for hook in hooks:
                hook()
            self._finished(covered)

    async def arun(self) -> None:
        """:meth:`run` for the asyncio guard: hooks return awaitables."""
        with self._mutex:
            hooks, covered = self._hooks, self._marks
        if not self.pending:
            return
        if self._async_mutex is None:
            self._async_mutex = asyncio.Lock()
        async with self._async_mutex:
            if self._done >= covered:
                return
            for hook in hooks:
                result = hook()
                if inspect.isawaitable(result):
                    await result
            self._finished(covered)
