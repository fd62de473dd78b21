"""Lease renewal on asyncio: one renewal task per event loop.

The rules are the sync watchdog's (:mod:`cacheguard.locks.redis.watchdog`), and so are
the decisions: both keep their handles in a :class:`~cacheguard.locks.redis.watchdog.LeaseBook`,
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
from typing import Any

from cacheguard._identity import on_fork_in_child
from cacheguard._loop import LoopTask
from cacheguard.locks.redis.lease import LeaseBook, LeaseEntry, WatchedHandle, renewal_call
from cacheguard.redis.async_scripts import arun_pipelined
from cacheguard.redis.clients import AsyncClient
from cacheguard.redis.errors import REDIS_UNREACHABLE

__all__ = ["AsyncWatchdog", "default_async_watchdog"]

log = logging.getLogger("cacheguard.watchdog")


class AsyncWatchdog(LeaseBook[WatchedHandle], LoopTask[list[LeaseEntry[WatchedHandle]]]):
    """Renews the leases of watched handles from one task on one event loop."""

    def __init__(self, *, timer: Callable[[], float] = time.monotonic) -> None:
        super().__init__(timer=timer)
        self._guard = contextlib.nullcontext()  # one loop: nothing runs in between
        self._init_loop_task("this AsyncWatchdog")

    def _add(self, entry: LeaseEntry[WatchedHandle]) -> None:
        self._binding.check()
        self._entries[entry.key] = entry
        self._poke(entry.due)

    def _task_name(self) -> str:
        return "cacheguard-watchdog"

    def _due_work(self, now: float) -> tuple[list[LeaseEntry[WatchedHandle]] | None, float]:
        due, soonest = self._due(now)
        return due or None, soonest

    async def _do(self, work: list[LeaseEntry[WatchedHandle]]) -> None:
        await self._work(work)

    def _failed(self, work: list[LeaseEntry[WatchedHandle]]) -> None:
        log.exception("unexpected error while renewing leases")
        self._after_error(work)

    async def _work(self, due: list[LeaseEntry[WatchedHandle]]) -> None:
        for entries in self._batches(due):
            sent = time.monotonic()
            try:
                results = await _run_batch(entries[0].handle.client, entries)
            except REDIS_UNREACHABLE as exc:
                log.warning("lease renewal failed, will retry: %s", exc)
                self._after_error(entries)
                continue
            self._settle_batch(entries, results, sent)


async def _run_batch(client: AsyncClient, entries: list[LeaseEntry[WatchedHandle]]) -> list[Any]:
    """Renew (or finish releasing) ``entries``, all on ``client``, in one round trip."""
    return await arun_pipelined(client, [renewal_call(e) for e in entries])


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
