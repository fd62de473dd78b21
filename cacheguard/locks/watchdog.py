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

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from cacheguard._identity import on_fork_in_child
from cacheguard.clients import SyncClient
from cacheguard.exceptions import REDIS_UNREACHABLE
from cacheguard.keys import ResourceKeys
from cacheguard.locks import wire
from cacheguard.locks.scripts import ScriptCall, run_pipelined

if TYPE_CHECKING:
    from cacheguard.locks.protocol import Mode
    from cacheguard.locks.redis_rwlock import LockHandle

__all__ = ["LeaseBook", "Watchdog", "WatchedHandle", "default_watchdog"]

log = logging.getLogger("cacheguard.watchdog")

_RETRY_AFTER_ERROR = 0.5  # s before retrying a renewal or release that failed


class WatchedHandle(Protocol):
    """What a watchdog needs of a handle (the sync and the asyncio handle alike)."""

    owner: str
    mode: Mode
    token: int
    writer_waiting: bool
    confirmed_at: float | None

    @property
    def client(self) -> Any: ...

    @property
    def keys(self) -> ResourceKeys: ...

    @property
    def lease(self) -> float: ...

    @property
    def lease_ms(self) -> int: ...

    def _mark_lost(self, why: str) -> None: ...

    def remains(self) -> Any: ...

    def _dropped(self) -> None: ...


H = TypeVar("H", bound=WatchedHandle)


class _Entry(Generic[H]):
    __slots__ = (
        "_ref",
        "_remains",
        "_strong",
        "due",
        "key",
        "last_renewed",
        "releasing",
        "renew_until",
    )

    def __init__(
        self,
        handle: H,
        now: float,
        *,
        releasing: bool = False,
        renew_until: float | None = None,
        weak: bool = False,
    ) -> None:
        self.key = id(handle)
        # A weakly watched handle is renewed while someone references it: one that
        # was dropped unreleased (its thread ended holding it) is released instead.
        self._strong: H | None = None if weak else handle
        self._ref = weakref.ref(handle) if weak else None
        self._remains = handle.remains() if weak else None
        self.last_renewed = now
        self.releasing = releasing
        self.renew_until = renew_until
        self.due = now + (_RETRY_AFTER_ERROR if releasing else handle.lease / 3)

    @property
    def handle(self) -> H:
        if self._strong is not None:
            return self._strong
        assert self._ref is not None
        alive = self._ref()
        return alive if alive is not None else self._remains  # type: ignore[return-value]

    @property
    def abandoned(self) -> bool:
        """The handle was collected while its holding stood (weakly watched only)."""
        return self._ref is not None and self._ref() is None

    def call(self) -> ScriptCall:
        """This entry's script call: finish the release, or renew."""
        h = self.handle
        if self.releasing:
            return wire.release_call(h.keys, h.owner, h.mode, h.token)
        return wire.renew_call(h.keys, h.owner, h.token, h.lease_ms)


class LeaseBook(Generic[H]):
    """The watched handles and every decision about them, shared by the thread of
    :class:`Watchdog` and the task of the asyncio watchdog; no I/O here.

    Subclasses decide how the renewals run (``_add`` wakes them) and set
    ``_guard``: a mutex for a thread, nothing for a task on one loop.
    """

    _guard: contextlib.AbstractContextManager[Any]

    def __init__(self, *, timer: Callable[[], float] = time.monotonic) -> None:
        self._timer = timer
        self._entries: dict[int, _Entry[H]] = {}
        self.renewals = 0  # successful renewals, for tests and stats

    def watch(self, handle: H, *, renew_for: float | None = None, weak: bool = False) -> None:
        """Renew ``handle`` until released; with ``renew_for``, only for that many
        seconds: then the holding is left to expire and the handle is marked lost.
        ``weak``: renew only while something else references the handle; one that
        is collected unreleased is released at its next renewal instead."""
        now = self._timer()
        until = None if renew_for is None else now + renew_for
        self._add(_Entry(handle, now, renew_until=until, weak=weak))

    def retry_release(self, handle: H, last_renewed: float | None = None) -> None:
        """Keep trying to release ``handle`` (its release failed: Redis unreachable)."""
        entry = _Entry(handle, self._timer(), releasing=True)
        if last_renewed is not None:
            entry.last_renewed = last_renewed
        self._add(entry)

    def _add(self, entry: _Entry[H]) -> None:
        raise NotImplementedError

    def unwatch(self, handle: H) -> float | None:
        """Stop renewing ``handle``; returns when it was last renewed (None: not watched)."""
        with self._guard:
            entry = self._entries.pop(id(handle), None)
            return entry.last_renewed if entry is not None else None

    def watching(self, handle: H) -> bool:
        with self._guard:
            entry = self._entries.get(id(handle))
            return entry is not None and entry.handle is handle and not entry.releasing

    def __len__(self) -> int:
        with self._guard:
            return len(self._entries)

    # -- what is due when, and what an answer means ----------------------------------

    def _due(self, now: float) -> tuple[list[_Entry[H]], float]:
        """(the entries due at ``now``, when the soonest is due: ``inf`` if none is
        watched); the caller holds the guard."""
        if not self._entries:
            return [], float("inf")
        soonest = min(e.due for e in self._entries.values())
        if soonest > now:
            return [], soonest
        return [e for e in self._entries.values() if e.due <= now], soonest

    def _batches(self, due: list[_Entry[H]]) -> list[list[_Entry[H]]]:
        """``due`` grouped by client, one round trip each; entries past their renewal
        limit are lost here instead."""
        now = self._timer()
        by_client: dict[int, list[_Entry[H]]] = {}
        for entry in due:
            if not entry.releasing and entry.abandoned:
                # Dropped unreleased (the thread that held it ended): give it back.
                log.warning(
                    "a %s hold of %r was dropped unreleased (owner %s): releasing it",
                    entry.handle.mode,
                    entry.handle.keys.lock,
                    entry.handle.owner,
                )
                entry.handle._dropped()
                entry.releasing = True
            if not entry.releasing and entry.renew_until is not None and now >= entry.renew_until:
                # A cache fill whose loader overran max_load_time: stop renewing, so
                # its hold ends with its lease and writers of the key get in.
                self._lose(entry, "held longer than its renewal limit (max_load_time)")
                continue
            by_client.setdefault(id(entry.handle.client), []).append(entry)
        return list(by_client.values())

    def _settle_batch(self, entries: list[_Entry[H]], results: list[Any], sent: float) -> None:
        """``results`` of the round trip sent at ``sent`` (``time.monotonic()``)."""
        now = self._timer()
        for entry, result in zip(entries, results, strict=True):
            self._settle(entry, result, now, sent)

    def _settle(self, entry: _Entry[H], result: Any, now: float, sent: float | None = None) -> None:
        handle = entry.handle
        if isinstance(result, Exception):  # an error reply: transient, retry
            log.warning("lease renewal of %r got an error reply, will retry: %s", handle, result)
            self._after_error([entry])
            return
        if entry.releasing:  # a release that had failed went through now
            self._forget(entry)
            return
        renewal = wire.parse_renewal(result)
        if renewal is wire.Renewal.GONE:
            self._lose(entry, "its holding was gone at renewal")
            return
        entry.last_renewed = now
        entry.due = now + handle.lease / 3
        if sent is not None:  # the lease runs a whole lease from at least then
            handle.confirmed_at = sent
        handle.writer_waiting = renewal is wire.Renewal.RENEWED_WRITER_WAITS
        self.renewals += 1

    def _after_error(self, entries: list[_Entry[H]]) -> None:
        now = self._timer()
        for entry in entries:
            if now - entry.last_renewed >= entry.handle.lease:
                if entry.releasing:
                    self._forget(entry)  # expired by now anyway: nothing left to release
                else:
                    self._lose(entry, "no renewal succeeded for a whole lease")
            else:
                entry.due = now + min(_RETRY_AFTER_ERROR, entry.handle.lease / 3)

    def _forget(self, entry: _Entry[H]) -> None:
        with self._guard:
            if self._entries.get(entry.key) is entry:
                del self._entries[entry.key]

    def _lose(self, entry: _Entry[H], why: str) -> None:
        with self._guard:
            # Released meanwhile? Then "gone" is expected, not a loss.
            if self._entries.get(entry.key) is not entry:
                return
            del self._entries[entry.key]
        entry.handle._mark_lost(why)


_all_watchdogs: weakref.WeakSet[Watchdog] = weakref.WeakSet()


class Watchdog(LeaseBook["LockHandle"]):
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

    def _add(self, entry: _Entry[LockHandle]) -> None:
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

    def _work(self, due: list[_Entry[LockHandle]]) -> None:
        for entries in self._batches(due):
            sent = time.monotonic()
            try:
                results = _run_batch(entries[0].handle.client, entries)
            except REDIS_UNREACHABLE as exc:
                log.warning("lease renewal failed, will retry: %s", exc)
                self._after_error(entries)
                continue
            self._settle_batch(entries, results, sent)


def _run_batch(client: SyncClient, entries: list[_Entry[LockHandle]]) -> list[Any]:
    """Renew (or finish releasing) ``entries``, all on ``client``, in one round trip."""
    return run_pipelined(client, [e.call() for e in entries])


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
