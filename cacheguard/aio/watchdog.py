"""Lease renewal on asyncio: one renewal task per event loop.

The rules are the sync watchdog's (:mod:`cacheguard.locks.watchdog`), and so are
the decisions: both keep their handles in a :class:`~cacheguard.locks.watchdog.LeaseBook`,
which says what is due when and what each answer means. Every ``lease / 3`` the
due handles are renewed, all handles on one client in one pipelined round trip;
a handle with ``renew_for`` is left to expire (and marked lost) past that limit;
a release that failed because Redis was down is retried until it goes through or
the lease would have ended anyway; a renewal answering that another owner's writer
waits sets ``handle.writer_waiting``.

The task exists only while something is watched: with nothing left it ends, and
the next :meth:`AsyncWatchdog.watch` starts a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from cacheguard._identity import on_fork_in_child
from cacheguard.aio._loop import LoopBinding
from cacheguard.clients import AsyncClient
from cacheguard.exceptions import REDIS_UNREACHABLE
from cacheguard.locks.scripts import arun_pipelined
from cacheguard.locks.watchdog import LeaseBook, _Entry

if TYPE_CHECKING:
    from cacheguard.aio.rwlock import AsyncLockHandle

__all__ = ["AsyncWatchdog", "LoopTask", "default_async_watchdog"]

log = logging.getLogger("cacheguard.watchdog")


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


class AsyncWatchdog(LeaseBook["AsyncLockHandle"], LoopTask[list[_Entry["AsyncLockHandle"]]]):
    """Renews the leases of watched handles from one task on one event loop."""

    def __init__(self, *, timer: Callable[[], float] = time.monotonic) -> None:
        super().__init__(timer=timer)
        self._guard = contextlib.nullcontext()  # one loop: nothing runs in between
        self._init_loop_task("this AsyncWatchdog")

    def _add(self, entry: _Entry[AsyncLockHandle]) -> None:
        self._binding.check()
        self._entries[entry.key] = entry
        self._poke(entry.due)

    def _task_name(self) -> str:
        return "cacheguard-watchdog"

    def _due_work(self, now: float) -> tuple[list[_Entry[AsyncLockHandle]] | None, float]:
        due, soonest = self._due(now)
        return due or None, soonest

    async def _do(self, work: list[_Entry[AsyncLockHandle]]) -> None:
        await self._work(work)

    def _failed(self, work: list[_Entry[AsyncLockHandle]]) -> None:
        log.exception("unexpected error while renewing leases")
        self._after_error(work)

    async def _work(self, due: list[_Entry[AsyncLockHandle]]) -> None:
        for entries in self._batches(due):
            sent = time.monotonic()
            try:
                results = await _run_batch(entries[0].handle.client, entries)
            except REDIS_UNREACHABLE as exc:
                log.warning("lease renewal failed, will retry: %s", exc)
                self._after_error(entries)
                continue
            self._settle_batch(entries, results, sent)


async def _run_batch(client: AsyncClient, entries: list[_Entry[AsyncLockHandle]]) -> list[Any]:
    """Renew (or finish releasing) ``entries``, all on ``client``, in one round trip."""
    return await arun_pipelined(client, [e.call() for e in entries])


# -- one watchdog per event loop ---------------------------------------------------------

_watchdogs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncWatchdog] = (
    weakref.WeakKeyDictionary()
)


def default_async_watchdog() -> AsyncWatchdog:
    """The running event loop's watchdog, created on first use."""
    loop = asyncio.get_running_loop()
    dog = _watchdogs.get(loop)
    if dog is None:
        dog = _watchdogs[loop] = AsyncWatchdog()
        dog._binding.check()
    return dog


def _reset_after_fork() -> None:
    # A forked child runs none of its parent's loops: it starts with no watchdogs.
    _watchdogs.clear()


on_fork_in_child(_reset_after_fork)
