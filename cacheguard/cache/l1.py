"""L1: a small in-process tier of hot values in front of Redis.

Rules that keep it from serving what Redis no longer has:

* a copy lives at most ``ttl`` (``l1_ttl``) and never past its entry's own
  expiry (a 0.2 s entry is not kept 5 s here);
* every invalidation of a name, and every gap in the invalidation feed (a lost
  pub/sub connection, a fork), bumps an epoch; a copy read from Redis before the
  bump is refused (``put`` is given the epoch seen before the read), so a slow
  reader cannot put back a value invalidated while it was reading.

Reads take no lock (one ``dict.get``, atomic in CPython) so the hit path stays
cheap; writes, drops and evictions take the mutex. When full, the oldest stored
copy goes first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, Final, Protocol

__all__ = ["ABSENT", "L1Feed", "Listener", "LocalTier"]


class _Absent:
    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Final = _Absent()


class LocalTier:
    """Thread-safe, bounded copies of entries, each with its own deadline."""

    __slots__ = ("_data", "_mutex", "_timer", "epoch", "maxsize", "ttl")

    def __init__(self, *, maxsize: int, ttl: float, timer: Callable[[], float]) -> None:
        self.maxsize = maxsize
        self.ttl = ttl
        self._timer = timer
        self._data: dict[str, tuple[Any, float]] = {}
        self._mutex = threading.Lock()
        self.epoch = 0  # bumped by every drop and clear

    def get(self, name: str) -> Any:
        """The copy of ``name``, or :data:`ABSENT` (missing or past its deadline)."""
        item = self._data.get(name)
        if item is not None and item[1] > self._timer():
            return item[0]
        return ABSENT

    def put(self, name: str, value: Any, lifetime: float, epoch: int) -> bool:
        """Keep ``value`` for ``min(lifetime, ttl)`` seconds, unless anything was dropped
        since ``epoch`` was read (the value may predate that invalidation)."""
        lifetime = min(lifetime, self.ttl)
        if lifetime <= 0:
            return False
        with self._mutex:
            if self.epoch != epoch:
                return False
            data = self._data
            data.pop(name, None)  # re-inserted last: the newest goes last
            data[name] = (value, self._timer() + lifetime)
            while len(data) > self.maxsize:
                del data[next(iter(data))]
        return True

    def drop(self, names: Iterable[str]) -> None:
        with self._mutex:
            self.epoch += 1
            for name in names:
                self._data.pop(name, None)

    def clear(self) -> None:
        with self._mutex:
            self.epoch += 1
            self._data.clear()

    def reset_after_fork(self) -> None:
        """In a forked child: a fresh mutex, nothing kept (invalidations sent between
        the fork and the child's new subscription would be missed)."""
        self._mutex = threading.Lock()
        self.epoch += 1
        self._data = {}

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, name: object) -> bool:
        """Whether a live copy of ``name`` is kept."""
        return isinstance(name, str) and self.get(name) is not ABSENT


class Listener(Protocol):
    """The invalidation feed's subscription (sync or asyncio notifier alike)."""

    def live_token(self) -> object | None: ...

    def close(self) -> None: ...


class L1Feed:
    """A guard's L1: the copies, and the invalidation feed that keeps them honest.

    ``listen(timeout)`` subscribes to the namespace's invalidation channel with
    :meth:`on_message` and :meth:`on_gap` as callbacks (waiting up to ``timeout``
    for the confirmation). A copy is kept only while that subscription is live
    and unchanged since before the value was read (:meth:`guard`, :meth:`keep`).
    """

    def __init__(self, tier: LocalTier, listen: Callable[[float], Listener | None]) -> None:
        self.tier = tier
        self._listen = listen
        self._listener: Listener | None = None
        self._mutex = threading.Lock()
        self._closed = False

    def start(self, timeout: float) -> None:
        """Subscribe, unless subscribed. ``listen`` may return None and subscribe in
        the background (asyncio), then hand its subscription to :meth:`attach`."""
        with self._mutex:
            if self._listener is None and not self._closed:
                self._listener = self._listen(timeout)

    def attach(self, listener: Listener) -> None:
        with self._mutex:
            if self._closed:
                listener.close()
            else:
                self._listener = listener

    def guard(self) -> tuple[int, object] | None:
        """What must not change between reading a value and keeping it: the L1
        epoch (no drop meanwhile) and the listener's live token (no gap in the
        feed). None: the feed is not live right now."""
        listener = self._listener
        if listener is None:
            self.start(0.0)  # a fork left us without one: subscribe again
            listener = self._listener
            if listener is None:
                return None
        token = listener.live_token()
        return None if token is None else (self.tier.epoch, token)

    def keep(self, name: str, value: Any, lifetime: float, seen: tuple[int, object]) -> None:
        listener = self._listener
        if listener is not None and listener.live_token() is seen[1]:
            self.tier.put(name, value, lifetime, seen[0])

    def drop(self, names: Iterable[str]) -> None:
        self.tier.drop(names)

    def on_message(self, payload: bytes) -> None:
        self.tier.drop([payload.decode("utf-8", "surrogateescape")])

    def on_gap(self) -> None:
        self.tier.clear()  # invalidations may have been missed

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            if self._listener is not None:
                self._listener.close()
                self._listener = None
        self.tier.clear()  # no invalidations reach it any more

    def __contains__(self, name: object) -> bool:
        return name in self.tier

    def __len__(self) -> int:
        return len(self.tier)

    def reset_after_fork(self) -> None:
        """The parent's subscription is gone with its notifier: drop what the parent
        kept and subscribe again on first use (no threads start inside a fork hook)."""
        self._mutex = threading.Lock()
        self.tier.reset_after_fork()
        self._listener = None
