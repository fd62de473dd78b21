"""Lease renewal: one background thread per process renews every held lock.

A lock is taken with a lease so that a dead holder frees it by itself; the
watchdog keeps a *live* holder's lease from running out. Every ``lease / 3`` it
renews the handles that are due, all handles on one Redis client in a single
pipelined round trip.

* A handle is unwatched *before* its release script runs, so nothing renews a
  lock after it was released (and the renew script can only extend a holding
  that still exists, never re-create one).
* Only the renew script's answer "that holding is gone" marks a handle lost
  (its ``on_lost`` callback then runs on a thread of its own, so a slow callback
  cannot stall renewals). An error reply (BUSY, READONLY, OOM ...) or an
  unreachable Redis is retried; once a whole lease has passed without a
  successful renewal the handle is marked lost, since the lock may have expired.
* A renewal also learns whether a writer of another owner is waiting
  (``handle.writer_waiting``); the two-tier lock uses it to stop admitting new
  local readers into a shared read hold, so remote writers are not starved.
* A release that failed because Redis was unreachable is retried here until it
  succeeds or the lease would have expired anyway, so it never leaks a hold.
* After ``fork()`` every watchdog forgets the parent's handles and thread.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from cacheguard._identity import on_fork_in_child
from cacheguard.locks.redis.lease import LeaseBook, LeaseEntry, WatchedHandle, renewal_call
from cacheguard.redis.clients import SyncClient
from cacheguard.redis.errors import REDIS_UNREACHABLE
from cacheguard.redis.scripts import run_pipelined

__all__ = ["Watchdog", "default_watchdog"]

log = logging.getLogger("cacheguard.watchdog")


_all_watchdogs: weakref.WeakSet[Watchdog] = weakref.WeakSet()


class Watchdog(LeaseBook[WatchedHandle]):
    """Renews the leases of watched handles from one daemon thread."""

    def __init__(self, *, timer: Callable[[], float] = time.monotonic) -> None:
        super().__init__(timer=timer)
        self._reset()
        _all_watchdogs.add(self)

    def _reset(self) -> None:
        self._cond = self._guard = threading.Condition(threading.Lock())
        self._entries = {}
        self._thread: threading.Thread | None = None
        self._wake_at = float("inf")  # when the thread plans to wake next

    def _add(self, entry: LeaseEntry[WatchedHandle]) -> None:
        with self._cond:
            self._entries[entry.key] = entry
            if self._thread is None:  # the loop never exits; a fork resets this object
                self._thread = threading.Thread(
                    target=self._run, name="cacheguard-watchdog", daemon=True
                )
                self._thread.start()
            # Waking the thread costs a context switch on every acquisition:
            # only do it when this entry is due before the thread's next wake-up.
            if entry.due < self._wake_at:
                self._cond.notify()

    # -- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = self._timer()
                    due, soonest = self._due(now)
                    if due:
                        self._wake_at = now
                        break
                    # Nothing watched: park until something is.
                    self._wake_at = soonest
                    self._cond.wait(None if soonest == float("inf") else soonest - now)
            try:
                self._work(due)
            except Exception:  # keep renewing the others whatever one batch did
                log.exception("unexpected error while renewing leases")
                self._after_error(due)

    def _work(self, due: list[LeaseEntry[WatchedHandle]]) -> None:
        for entries in self._batches(due):
            sent = time.monotonic()
            try:
                results = _run_batch(entries[0].handle.client, entries)
            except REDIS_UNREACHABLE as exc:
                log.warning("lease renewal failed, will retry: %s", exc)
                self._after_error(entries)
                continue
            self._settle_batch(entries, results, sent)


def _run_batch(client: SyncClient, entries: list[LeaseEntry[WatchedHandle]]) -> list[Any]:
    """Renew (or finish releasing) ``entries``, all on ``client``, in one round trip."""
    return run_pipelined(client, [renewal_call(e) for e in entries])


_default: Watchdog | None = None
_default_mutex = threading.Lock()


def default_watchdog() -> Watchdog:
    """The process-wide watchdog, created on first use."""
    global _default
    with _default_mutex:
        if _default is None:
            _default = Watchdog()
        return _default


def _reset_after_fork() -> None:
    global _default_mutex
    # Parent threads do not exist in the child; their locks may be held forever.
    _default_mutex = threading.Lock()
    for dog in list(_all_watchdogs):
        dog._reset()


on_fork_in_child(_reset_after_fork)
