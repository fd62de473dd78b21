"""What a guard must do when it reaches Redis again, before it serves a value from it.

Writes committed while Redis was unreachable left their invalidations in an
outbox (``track_models(..., outbox=True)``, :mod:`cacheguard.integrations.sqlalchemy.outbox`).
Until they are replayed, Redis may hold values those writes replaced. So a
guard with replay hooks is *pending* from the start (a process may start after
an outage) and after every Redis failure it sees; a read that reached Redis
while pending first runs the hooks (the :class:`~cacheguard.cache.flows.read.Replay`
step) and serves from Redis only once they succeeded.

The hooks run one at a time per guard; callers that need them meanwhile wait
for the run under way, then find it done. A failure seen during a run keeps
the guard pending for the next read (marks are counted, not flags).

A run that fails is not run again at once by every caller (with the database
unreachable each attempt may take a connect timeout): the callers that waited
for it take its failure, and for ``retry_delay`` seconds after it callers fail
at once (:class:`ReplayFailed`) instead of queueing for another attempt.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

from cacheguard.checks import check_non_negative
from cacheguard.exceptions import CacheGuardError

__all__ = ["RETRY_DELAY", "Recovery", "ReplayFailed", "ReplayHook"]

ReplayHook = Callable[[], Any]  # sync guard: returns None; asyncio guard: an awaitable

RETRY_DELAY = 1.0  # s: after a failed run, the next attempt waits this long


class ReplayFailed(CacheGuardError):
    """The replay was not run for this call: the run it waited for failed, or the
    last run failed less than ``retry_delay`` seconds ago. That run's error is the
    ``__cause__``."""


class Recovery:
    """The replay hooks of one guard, and whether they must run before serving."""

    __slots__ = (
        "_async_mutex",
        "_done",
        "_ended",
        "_failed_at",
        "_failure",
        "_hooks",
        "_marks",
        "_mutex",
        "_running",
        "_timer",
        "pending",
        "retry_delay",
    )

    def __init__(
        self, *, retry_delay: float = RETRY_DELAY, timer: Callable[[], float] = time.monotonic
    ) -> None:
        self.pending = False  # read on every GET: a plain attribute
        self.retry_delay = check_non_negative("retry_delay", retry_delay)
        self._timer = timer
        self._hooks: tuple[ReplayHook, ...] = ()
        self._marks = 0  # failures seen (and hooks added)
        self._done = 0  # the marks the last successful run covered
        self._ended = 0  # runs ended, failed or not
        self._failure: Exception | None = None  # the last run's error (None: it succeeded)
        self._failed_at = 0.0
        self._mutex = threading.Lock()  # the counters only: never held while a hook runs
        self._running = threading.Lock()  # one sync run at a time
        self._async_mutex: asyncio.Lock | None = None

    def reset_after_fork(self) -> None:
        """In a forked child: the parent's threads (which may hold the locks) are gone."""
        self._mutex = threading.Lock()
        self._running = threading.Lock()
        self._async_mutex = None
        self._failure = None  # the child tries its own replay at once

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
            self._ended += 1
            self._failure = None
            self._done = max(self._done, covered)
            self.pending = self._done < self._marks and bool(self._hooks)

    def _failed(self, error: Exception) -> None:
        with self._mutex:
            self._ended += 1
            self._failure = error
            self._failed_at = self._timer()

    def _ask(self) -> tuple[tuple[ReplayHook, ...], int, int]:
        """The hooks, the marks a run now covers and the runs ended so far; raises
        :class:`ReplayFailed` within ``retry_delay`` of a failed run (not queueing)."""
        with self._mutex:
            refused = self._refusal(self._ended)
            asked = self._hooks, self._marks, self._ended
        if refused is not None:
            raise refused
        return asked

    def _covered(self, covered: int, ended: int) -> bool:
        """Our turn to run: did a run cover our marks? Raises the failure of a run
        that ended while we waited (it ran for us), or one within ``retry_delay``."""
        with self._mutex:
            if self._done >= covered:
                return True
            refused = self._refusal(ended)
        if refused is not None:
            raise refused
        return False

    def _refusal(self, ended: int) -> ReplayFailed | None:
        """Under ``_mutex``: the error a caller that saw ``ended`` runs ended takes
        instead of running, if any."""
        failure = self._failure
        if failure is None:
            return None
        if self._ended > ended:
            why = "the replay run this call waited for failed"
        else:
            age = self._timer() - self._failed_at
            if age >= self.retry_delay:
                return None
            why = f"the last replay failed {age:.2f} s ago, retried {self.retry_delay:g} s after"
        refused = ReplayFailed(f"{why}: {failure}")
        refused.__cause__ = failure  # (a new error per caller: the run's is not raised again)
        return refused

    def run(self) -> None:
        """Run every hook (the sync guard's); raises the first failure, leaving the
        guard pending (or :class:`ReplayFailed`, see the module)."""
        if not self.pending:
            return
        hooks, covered, ended = self._ask()
        with self._running:
            if self._covered(covered, ended):  # another caller's run covered ours
                return
            try:
                for hook in hooks:
                    hook()
            except Exception as exc:
                self._failed(exc)
                raise
            self._finished(covered)

    async def arun(self) -> None:
        """:meth:`run` for the asyncio guard: hooks return awaitables."""
        if not self.pending:
            return
        hooks, covered, ended = self._ask()
        if self._async_mutex is None:
            self._async_mutex = asyncio.Lock()
        async with self._async_mutex:
            if self._covered(covered, ended):
                return
            try:
                for hook in hooks:
                    result = hook()
                    if inspect.isawaitable(result):
                        await result
            except Exception as exc:
                self._failed(exc)
                raise
            self._finished(covered)
