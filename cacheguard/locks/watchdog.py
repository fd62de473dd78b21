"""Lease renewal: one background thread per process renews every held lock.

A lock is taken with a lease so that a dead holder frees it by itself; the
watchdog keeps a *live* holder's lease from running out. Every ``lease / 3`` it
renews the handles that are due, all handles on one Redis client in a single
pipelined round trip.

* A handle is unwatched *before* its release script runs, so nothing renews a
  lock after it was released (and the renew script can only extend a holding
  that still exists, never re-create one).
* When a renewal finds the holding gone (lease ran out during a pause, key
  deleted), the handle is marked lost and its ``on_lost`` callback runs.
* When Redis cannot be reached, renewals are retried; once a whole lease has
  passed without a successful renewal the handle is marked lost, since the lock
  may have expired in the meantime.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis

from cacheguard._identity import on_fork_in_child
from cacheguard.locks.scripts import RENEW

if TYPE_CHECKING:
    from cacheguard.locks.redis_rwlock import LockHandle

__all__ = ["Watchdog", "default_watchdog"]

log = logging.getLogger("cacheguard.watchdog")

_RETRY_AFTER_ERROR = 0.5  # s before retrying a renewal that hit a connection error


class _Entry:
    __slots__ = ("due", "handle", "last_renewed")

    def __init__(self, handle: LockHandle, now: float) -> None:
        self.handle = handle
        self.last_renewed = now
        self.due = now + handle.lease / 3


class Watchdog:
    """Renews the leases of watched handles from one daemon thread."""

    def __init__(self, *, timer: Callable[[], float] = time.monotonic) -> None:
        self._timer = timer
        self._cond = threading.Condition(threading.Lock())
        self._entries: dict[int, _Entry] = {}
        self._thread: threading.Thread | None = None
        self._wake_at = float("inf")  # when the thread plans to wake next
        self.renewals = 0  # successful renewals, for tests and stats

    def watch(self, handle: LockHandle) -> None:
        with self._cond:
            entry = _Entry(handle, self._timer())
            self._entries[id(handle)] = entry
            if self._thread is None:  # the loop never exits; a fork resets this object
                self._thread = threading.Thread(
                    target=self._run, name="cacheguard-watchdog", daemon=True
                )
                self._thread.start()
            # Waking the thread costs a context switch on every acquisition:
            # only do it when this entry is due before the thread's next wake-up.
            if entry.due < self._wake_at:
                self._cond.notify()

    def unwatch(self, handle: LockHandle) -> None:
        with self._cond:
            self._entries.pop(id(handle), None)

    def watching(self, handle: LockHandle) -> bool:
        with self._cond:
            entry = self._entries.get(id(handle))
            return entry is not None and entry.handle is handle

    def __len__(self) -> int:
        with self._cond:
            return len(self._entries)

    # -- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if not self._entries:
                        # Nothing to renew: park until something is watched.
                        self._wake_at = float("inf")
                        self._cond.wait()
                        continue
                    now = self._timer()
                    soonest = min(e.due for e in self._entries.values())
                    if soonest <= now:
                        due = [e for e in self._entries.values() if e.due <= now]
                        self._wake_at = now
                        break
                    self._wake_at = soonest
                    self._cond.wait(soonest - now)
            try:
                self._renew(due)
            except Exception:  # keep renewing the others whatever one batch did
                log.exception("unexpected error while renewing leases")
                self._after_error(due)

    def _renew(self, due: list[_Entry]) -> None:
        by_client: dict[int, tuple[redis.Redis, list[_Entry]]] = {}
        for entry in due:
            client = entry.handle.client
            by_client.setdefault(id(client), (client, []))[1].append(entry)
        for client, entries in by_client.values():
            try:
                results = _renew_batch(client, [e.handle for e in entries])
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                log.warning("lease renewal failed, will retry: %s", exc)
                self._after_error(entries)
                continue
            now = self._timer()
            for entry, renewed in zip(entries, results, strict=True):
                if renewed:
                    entry.last_renewed = now
                    entry.due = now + entry.handle.lease / 3
                    self.renewals += 1
                else:
                    self._lose(entry, "its holding was gone at renewal")

    def _after_error(self, entries: list[_Entry]) -> None:
        now = self._timer()
        for entry in entries:
            if now - entry.last_renewed >= entry.handle.lease:
                self._lose(entry, "no renewal succeeded for a whole lease")
            else:
                entry.due = now + min(_RETRY_AFTER_ERROR, entry.handle.lease / 3)

    def _lose(self, entry: _Entry, why: str) -> None:
        with self._cond:
            # Released meanwhile? Then "gone" is expected, not a loss.
            if self._entries.get(id(entry.handle)) is not entry:
                return
            del self._entries[id(entry.handle)]
        entry.handle._mark_lost(why)


def _renew_batch(client: redis.Redis, handles: list[LockHandle]) -> list[bool]:
    """Renew ``handles`` (all on ``client``) in one pipelined round trip."""

    def queue_all(pipe: Any) -> None:
        for h in handles:
            RENEW.queue(pipe, [h.keys.lock], [h.owner, h.token, h.lease_ms])

    pipe = client.pipeline(transaction=False)
    queue_all(pipe)
    results = pipe.execute(raise_on_error=False)
    if any(isinstance(r, redis.exceptions.NoScriptError) for r in results):
        client.script_load(RENEW.source)  # server restarted or flushed scripts
        pipe = client.pipeline(transaction=False)
        queue_all(pipe)
        results = pipe.execute(raise_on_error=False)
    for r in results:
        if isinstance(r, (redis.ConnectionError, redis.TimeoutError)):
            raise r
    return [r == 1 for r in results]


_default: Watchdog | None = None
_default_mutex = threading.Lock()


def default_watchdog() -> Watchdog:
    """The process-wide watchdog, created on first use (and anew after fork)."""
    global _default
    with _default_mutex:
        if _default is None:
            _default = Watchdog()
        return _default


def _forget_after_fork() -> None:
    global _default, _default_mutex
    _default = None
    _default_mutex = threading.Lock()


on_fork_in_child(_forget_after_fork)
