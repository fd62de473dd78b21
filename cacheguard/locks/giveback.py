"""Acquire calls whose reply was lost, and giving back what they may have taken.

An acquire call that fails without a reply (a socket timeout, a connection reset)
may have run on the server, or may still run there: a server paused with the call
in its socket buffer runs it when it resumes, and a partition may deliver it late.
The hold or waiting mark it made would then sit there unrenewed until its lease or
mark ran out, held by nobody: the caller got ``BackendUnavailable``. redis-py raises
the same ``ConnectionError`` / ``TimeoutError`` classes whether or not the command
had left (a refused connection and a reset one look alike), so every acquisition
that ends in ``BackendUnavailable`` counts as lost; giving back one that never ran
changes nothing.

Every acquisition has an attempt id (:func:`attempt_id`), sent with each of its
acquire calls; the script records it with the hold or mark it makes (``a:<owner>``,
see :mod:`cacheguard.locks.scripts`). A lost acquisition is kept here, per client,
lock and owner, and given back two ways, whichever comes first:

* the owner's next acquire call on that lock, through that client, carries the lost
  ids: the script gives them back before it decides, in the same atomic step (so a
  process whose owner id is reused, as the two-tier lock's is, never re-enters a
  hold it lost track of);
* the watchdog sends the give-back script in the background, every 0.5 s until
  Redis answers, for at most a lease (by then a hold it took has ended anyway).

The script takes back only the hold or mark that the owner's record proves that
call made, and cancels the ids (for a lease) so that a call arriving later does
nothing. No decision is made here: the drivers report lost acquisitions and the
watchdog asks what to send; the scripts decide. Sync and asyncio share the one
registry (a mutex; nothing waits under it).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from cacheguard._identity import on_fork_in_child, process_id
from cacheguard.keys import ResourceKeys
from cacheguard.locks import wire
from cacheguard.locks.scripts import ScriptCall

__all__ = ["GiveBacks", "LostCalls", "attempt_id", "give_backs", "never_sent"]

log = logging.getLogger("cacheguard.lock")

_attempt_numbers = itertools.count(1)


def attempt_id() -> str:
    """A new acquisition's attempt id, unique across processes and hosts."""
    return f"{process_id()}.{next(_attempt_numbers)}"


_Key = tuple[int, str, str]  # (id of the client, lock hash key, owner)


def never_sent(error: BaseException) -> bool:
    """Did ``error`` (a lock call's :class:`BackendUnavailable`, or the client's error
    behind it) happen before the call left, so it cannot have run? Only a refused
    connection says so for sure: redis-py connects before it writes a command."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ConnectionRefusedError):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


class LostCalls:
    """The lost acquisitions of one owner on one lock through one client: their
    attempt ids, each with the moment (on the registry's timer) after which a hold
    it took would have ended anyway."""

    __slots__ = ("client", "ids", "key", "keys", "lease_ms", "owner", "registry", "sending")

    def __init__(
        self, registry: GiveBacks, key: _Key, client: Any, keys: ResourceKeys, owner: str
    ) -> None:
        self.registry = registry
        self.key = key
        self.client = client  # kept, so its id is not reused while the ids wait here
        self.keys = keys
        self.owner = owner
        self.lease_ms = 1
        self.ids: dict[str, float] = {}
        self.sending: list[str] = []

    def prepare(self) -> bool:
        """Before a background give-back: take the ids to send. ``False`` (and this
        is forgotten) when none is left: given back by the owner's next call, or
        past the lease."""
        return self.registry._prepare(self)

    def call(self) -> ScriptCall:
        """The give-back of the ids :meth:`prepare` took."""
        return wire.give_back_call(self.keys, self.owner, self.lease_ms, self.sending)

    def settled(self) -> bool:
        """The give-back was answered: its ids are done. ``True`` when ids lost since
        are still to give back."""
        return self.registry._settled(self)

    def __repr__(self) -> str:
        return f"<LostCalls {self.keys.lock!r} owner={self.owner} ids={list(self.ids)}>"


class GiveBacks:
    """Every lost acquisition of this process, not yet given back."""

    def __init__(self, *, timer: Callable[[], float] = time.monotonic) -> None:
        self._timer = timer
        self._mutex = threading.Lock()
        self._lost: dict[_Key, LostCalls] = {}

    def __len__(self) -> int:
        with self._mutex:
            return sum(bool(lost.ids) for lost in self._lost.values())

    def pending(self, client: Any, keys: ResourceKeys, owner: str) -> list[str]:
        """The attempt ids the owner's next acquire call on this lock carries."""
        if not self._lost:  # the usual case, without the mutex
            return []
        with self._mutex:
            lost = self._lost.get((id(client), keys.lock, owner))
            if lost is None:
                return []
            now = self._timer()
            return [attempt for attempt, until in lost.ids.items() if until > now]

    def answered(self, client: Any, keys: ResourceKeys, owner: str, ids: list[str]) -> None:
        """An acquire call carrying ``ids`` got its reply: they are given back."""
        with self._mutex:
            lost = self._lost.get((id(client), keys.lock, owner))
            if lost is not None:
                for attempt in ids:
                    lost.ids.pop(attempt, None)

    def lose(
        self,
        client: Any,
        keys: ResourceKeys,
        owner: str,
        attempt: str,
        *,
        lease: float,
        lease_ms: int,
    ) -> LostCalls | None:
        """An acquisition of ``owner`` ended without knowing what its calls did. Returns
        the :class:`LostCalls` to give back in the background when it is new; ``None``
        when the owner's earlier lost calls are being given back already (this one
        goes along)."""
        log.debug(
            "an acquisition on %r (owner %s) failed: what its calls may have taken is "
            "given back in the background",
            keys.lock,
            owner,
        )
        key = (id(client), keys.lock, owner)
        now = self._timer()
        with self._mutex:
            lost = self._lost.get(key)
            # One with nothing left to give back may have no background give-back any
            # more (it ends at its next turn, or its event loop is gone): a new one.
            fresh = lost is None or not any(until > now for until in lost.ids.values())
            if lost is None or fresh:
                lost = self._lost[key] = LostCalls(self, key, client, keys, owner)
            lost.ids[attempt] = now + lease
            lost.lease_ms = max(lost.lease_ms, lease_ms)
            return lost if fresh else None

    def _prepare(self, lost: LostCalls) -> bool:
        with self._mutex:
            now = self._timer()
            for attempt, until in list(lost.ids.items()):
                if until <= now:
                    del lost.ids[attempt]
            lost.sending = list(lost.ids)
            if lost.sending:
                return True
            if self._lost.get(lost.key) is lost:
                del self._lost[lost.key]
            return False

    def _settled(self, lost: LostCalls) -> bool:
        with self._mutex:
            for attempt in lost.sending:
                lost.ids.pop(attempt, None)
            lost.sending = []
            if lost.ids:
                return True
            if self._lost.get(lost.key) is lost:
                del self._lost[lost.key]
            return False

    def forget_client(self, client: Any) -> None:
        """``client`` is closed: its lost calls are given back by nobody (their holds
        end with their leases, as they would have without this registry)."""
        with self._mutex:
            for key in [key for key, lost in self._lost.items() if lost.client is client]:
                self._lost[key].ids.clear()
                del self._lost[key]

    def _reset(self) -> None:
        self._mutex = threading.Lock()
        self._lost = {}


#: The process's registry (the drivers report to it, the watchdogs send from it).
give_backs = GiveBacks()

# The child's owners are new (a new process id): the parent's lost calls are not its own.
on_fork_in_child(give_backs._reset)
