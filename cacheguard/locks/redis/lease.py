"""The lease book: which held locks a watchdog renews, when, and what each answer means.

Every lock on Redis hashes (the Redis lock and Redlock, on both drivers) keeps its handles
in a :class:`LeaseBook`; the store's watchdog only runs the renewals the book says
are due and hands the replies back. No I/O here.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from cacheguard.locks.redis import wire

if TYPE_CHECKING:
    from cacheguard.locks.protocol import Mode
    from cacheguard.redis.keys import ResourceKeys
    from cacheguard.redis.scripts import ScriptCall

__all__ = ["LeaseBook", "LeaseEntry", "WatchedHandle", "renewal_call"]

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


class LeaseEntry(Generic[H]):
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


class LeaseBook(Generic[H]):
    """The watched handles and every decision about them, shared by the thread of
    :class:`Watchdog` and the task of the asyncio watchdog; no I/O here.

    Subclasses decide how the renewals run (``_add`` wakes them) and set
    ``_guard``: a mutex for a thread, nothing for a task on one loop.
    """

    _guard: contextlib.AbstractContextManager[Any]

    def __init__(self, *, timer: Callable[[], float] = time.monotonic) -> None:
        self._timer = timer
        self._entries: dict[int, LeaseEntry[H]] = {}
        self.renewals = 0  # successful renewals, for tests and stats

    def watch(self, handle: H, *, renew_for: float | None = None, weak: bool = False) -> None:
        """Renew ``handle`` until released; with ``renew_for``, only for that many
        seconds: then the holding is left to expire and the handle is marked lost.
        ``weak``: renew only while something else references the handle; one that
        is collected unreleased is released at its next renewal instead."""
        now = self._timer()
        until = None if renew_for is None else now + renew_for
        self._add(LeaseEntry(handle, now, renew_until=until, weak=weak))

    def retry_release(self, handle: H, last_renewed: float | None = None) -> None:
        """Keep trying to release ``handle`` (its release failed: Redis unreachable)."""
        entry = LeaseEntry(handle, self._timer(), releasing=True)
        if last_renewed is not None:
            entry.last_renewed = last_renewed
        self._add(entry)

    def _add(self, entry: LeaseEntry[H]) -> None:
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

    def _due(self, now: float) -> tuple[list[LeaseEntry[H]], float]:
        """(the entries due at ``now``, when the soonest is due: ``inf`` if none is
        watched); the caller holds the guard."""
        if not self._entries:
            return [], float("inf")
        soonest = min(e.due for e in self._entries.values())
        if soonest > now:
            return [], soonest
        return [e for e in self._entries.values() if e.due <= now], soonest

    def _batches(self, due: list[LeaseEntry[H]]) -> list[list[LeaseEntry[H]]]:
        """``due`` grouped by client, one round trip each; entries past their renewal
        limit are lost here instead."""
        now = self._timer()
        by_client: dict[int, list[LeaseEntry[H]]] = {}
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

    def _settle_batch(self, entries: list[LeaseEntry[H]], results: list[Any], sent: float) -> None:
        """``results`` of the round trip sent at ``sent`` (``time.monotonic()``)."""
        now = self._timer()
        for entry, result in zip(entries, results, strict=True):
            self._settle(entry, result, now, sent)

    def _settle(
        self, entry: LeaseEntry[H], result: Any, now: float, sent: float | None = None
    ) -> None:
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

    def _after_error(self, entries: list[LeaseEntry[H]]) -> None:
        now = self._timer()
        for entry in entries:
            if now - entry.last_renewed >= entry.handle.lease:
                if entry.releasing:
                    self._forget(entry)  # expired by now anyway: nothing left to release
                else:
                    self._lose(entry, "no renewal succeeded for a whole lease")
            else:
                entry.due = now + min(_RETRY_AFTER_ERROR, entry.handle.lease / 3)

    def _forget(self, entry: LeaseEntry[H]) -> None:
        with self._guard:
            if self._entries.get(entry.key) is entry:
                del self._entries[entry.key]

    def _lose(self, entry: LeaseEntry[H], why: str) -> None:
        with self._guard:
            # Released meanwhile? Then "gone" is expected, not a loss.
            if self._entries.get(entry.key) is not entry:
                return
            del self._entries[entry.key]
        entry.handle._mark_lost(why)


def renewal_call(entry: LeaseEntry[Any]) -> ScriptCall:
    """The script call an entry is due for: finish its release, or renew it."""
    h = entry.handle
    if entry.releasing:
        return wire.release_call(h.keys, h.owner, h.mode, h.token)
    return wire.renew_call(h.keys, h.owner, h.token, h.lease_ms)
