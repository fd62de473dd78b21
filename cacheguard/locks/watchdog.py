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
from typing import TYPE_CHECKING, Any

import redis

from cacheguard._identity import on_fork_in_child
from cacheguard.exceptions import REDIS_UNREACHABLE
from cacheguard.locks.scripts import RELEASE, RENEW, ScriptCall, run_pipelined

if TYPE_CHECKING:
    from cacheguard.locks.redis_rwlock import LockHandle

__all__ = ["Watchdog", "default_watchdog"]

log = logging.getLogger("cacheguard.watchdog")

_RETRY_AFTER_ERROR = 0.5  # s before retrying a renewal or release that failed

# Renew script answers.
_GONE, _RENEWED, _RENEWED_WRITER_WAITS = 0, 1, 2


class _Entry:
    __slots__ = ("due", "handle", "last_renewed", "releasing", "renew_until")

    def __init__(
        self,
        handle: LockHandle,
        now: float,
        *,
        releasing: bool = False,
        renew_until: float | None = None,
    ) -> None:
        self.handle = handle
        self.last_renewed = now
        self.releasing = releasing
        self.renew_until = renew_until
        self.due = now + (_RETRY_AFTER_ERROR if releasing else handle.lease / 3)


_all_watchdogs: weakref.WeakSet[Watchdog] = weakref.WeakSet()


class Watchdog:
    """Renews the leases of watched handles from one daemon thread."""

    def __init__(self, *, timer: Callable[[], float] = time.monotonic) -> None:
        self._timer = timer
        self._reset()
        self.renewals = 0  # successful renewals, for tests and stats
        _all_watchdogs.add(self)

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._entries: dict[int, _Entry] = {}
        self._thread: threading.Thread | None = None
        self._wake_at = float("inf")  # when the thread plans to wake next

    def watch(self, handle: LockHandle, *, renew_for: float | None = None) -> None:
        """Renew ``handle`` until released; with ``renew_for``, only for that many
        seconds: then the holding is left to expire and the handle is marked lost."""
        now = self._timer()
        self._add(_Entry(handle, now, renew_until=None if renew_for is None else now + renew_for))

    def retry_release(self, handle: LockHandle, last_renewed: float | None = None) -> None:
        """Keep trying to release ``handle`` (its release failed: Redis unreachable)."""
        entry = _Entry(handle, self._timer(), releasing=True)
        if last_renewed is not None:
            entry.last_renewed = last_renewed
        self._add(entry)

    def _add(self, entry: _Entry) -> None:
        with self._cond:
            self._entries[id(entry.handle)] = entry
            if self._thread is None:  # the loop never exits; a fork resets this object
                self._thread = threading.Thread(
                    target=self._run, name="cacheguard-watchdog", daemon=True
                )
                self._thread.start()
            # Waking the thread costs a context switch on every acquisition:
            # only do it when this entry is due before the thread's next wake-up.
            if entry.due < self._wake_at:
                self._cond.notify()

    def unwatch(self, handle: LockHandle) -> float | None:
        """Stop renewing ``handle``; returns when it was last renewed (None: not watched)."""
        with self._cond:
            entry = self._entries.pop(id(handle), None)
            return entry.last_renewed if entry is not None else None

    def watching(self, handle: LockHandle) -> bool:
        with self._cond:
            entry = self._entries.get(id(handle))
            return entry is not None and entry.handle is handle and not entry.releasing

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
                self._work(due)
            except Exception:  # keep renewing the others whatever one batch did
                log.exception("unexpected error while renewing leases")
                self._after_error(due)

    def _work(self, due: list[_Entry]) -> None:
        now = self._timer()
        by_client: dict[int, tuple[redis.Redis, list[_Entry]]] = {}
        for entry in due:
            if not entry.releasing and entry.renew_until is not None and now >= entry.renew_until:
                # A cache fill whose loader overran max_load_time: stop renewing, so
                # its hold ends with its lease and writers of the key get in.
                self._lose(entry, "held longer than its renewal limit (max_load_time)")
                continue
            client = entry.handle.client
            by_client.setdefault(id(client), (client, []))[1].append(entry)
        for client, entries in by_client.values():
            try:
                results = _run_batch(client, entries)
            except REDIS_UNREACHABLE as exc:
                log.warning("lease renewal failed, will retry: %s", exc)
                self._after_error(entries)
                continue
            now = self._timer()
            for entry, result in zip(entries, results, strict=True):
                self._settle(entry, result, now)

    def _settle(self, entry: _Entry, result: Any, now: float) -> None:
        handle = entry.handle
        if isinstance(result, Exception):  # an error reply: transient, retry
            log.warning("lease renewal of %r got an error reply, will retry: %s", handle, result)
            self._after_error([entry])
            return
        if entry.releasing:  # a release that had failed went through now
            self._forget(entry)
            return
        if result == _GONE:
            self._lose(entry, "its holding was gone at renewal")
            return
        entry.last_renewed = now
        entry.due = now + handle.lease / 3
        handle.writer_waiting = result == _RENEWED_WRITER_WAITS
        self.renewals += 1

    def _after_error(self, entries: list[_Entry]) -> None:
        now = self._timer()
        for entry in entries:
            if now - entry.last_renewed >= entry.handle.lease:
                if entry.releasing:
                    self._forget(entry)  # expired by now anyway: nothing left to release
                else:
                    self._lose(entry, "no renewal succeeded for a whole lease")
            else:
                entry.due = now + min(_RETRY_AFTER_ERROR, entry.handle.lease / 3)

    def _forget(self, entry: _Entry) -> None:
        with self._cond:
            if self._entries.get(id(entry.handle)) is entry:
                del self._entries[id(entry.handle)]

    def _lose(self, entry: _Entry, why: str) -> None:
        with self._cond:
            # Released meanwhile? Then "gone" is expected, not a loss.
            if self._entries.get(id(entry.handle)) is not entry:
                return
            del self._entries[id(entry.handle)]
        entry.handle._mark_lost(why)


def _run_batch(client: redis.Redis, entries: list[_Entry]) -> list[Any]:
    """Renew (or finish releasing) ``entries``, all on ``client``, in one round trip."""
    calls: list[ScriptCall] = []
    for e in entries:
        h = e.handle
        if e.releasing:
            calls.append(
                (RELEASE, [h.keys.lock], [h.owner, h.mode, h.token, h.keys.released_channel])
            )
        else:
            calls.append((RENEW, [h.keys.lock], [h.owner, h.token, h.lease_ms]))
    return run_pipelined(client, calls)


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
