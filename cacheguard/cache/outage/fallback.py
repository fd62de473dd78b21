"""What a process falls back on while Redis is unreachable or a loader fails.

:class:`LastSeen` keeps, per key name, the last value this process got from
Redis or from its loader, and when. Two settings read it (``docs/outage.md``):

* ``outage_ttl``: while Redis is unreachable, a value seen at most that long ago
  is reused instead of calling the loader again (one load per key per process
  per ``outage_ttl``, not one per call);
* ``stale_if_error``: a value seen at most that long ago is served instead of
  an error: the loader's, or :class:`~cacheguard.exceptions.BackendUnavailable`
  under ``on_backend_error="raise"``.

Only fresh values are noted: a value served from this memory (or stale from
Redis) keeps the time it was first seen, so its age, and the staleness bound,
never grows past the setting. A write or invalidation in this process drops
its names, and voids the notes of reads of them already under way (a load that
began before the write may return what the write replaced): a read takes a
:meth:`LastSeen.ticket` before it asks, and its note is refused if a drop came
in between. Bounded: the least recently noted names go first past ``maxsize``.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, Final

__all__ = ["NOT_SEEN", "LastSeen", "from_loader", "mark_from_loader"]


class _NotSeen:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_SEEN"


NOT_SEEN: Final = _NotSeen()

_FROM_LOADER: Final = "_cacheguard_from_loader"

# Drops are counted per bucket of names, not per name: bounded memory, and a
# collision only refuses a note (one more load later), never keeps a stale value.
_DROP_BUCKETS: Final = 1024


class LastSeen:
    """The last value seen per name, with its time (``timer``'s seconds)."""

    __slots__ = ("_drops", "_entries", "_maxsize", "_mutex", "_prefix_drops", "_timer")

    def __init__(self, *, maxsize: int, timer: Callable[[], float]) -> None:
        self._maxsize = maxsize
        self._timer = timer
        self._entries: OrderedDict[str, tuple[Any, float]] = OrderedDict()
        self._mutex = threading.Lock()  # threads of the sync guard share it
        self._drops = [0] * _DROP_BUCKETS  # names dropped so far, by bucket
        self._prefix_drops = 0  # drop_prefix calls so far: they void every ticket

    def ticket(self, name: str) -> int:
        """Taken before a read of ``name`` whose value :meth:`note` may keep."""
        return self._drops[hash(name) % _DROP_BUCKETS] + self._prefix_drops

    def note(self, name: str, value: Any, ticket: int) -> None:
        """``name`` was just seen fresh with ``value`` by a read that took ``ticket``
        before it asked; ignored if ``name`` was dropped since."""
        entries = self._entries
        with self._mutex:
            if self.ticket(name) != ticket:
                return  # written here while the read was under way
            entries[name] = (value, self._timer())
            entries.move_to_end(name)
            if len(entries) > self._maxsize:
                entries.popitem(last=False)

    def within(self, name: str, max_age: float) -> Any:
        """The value last seen for ``name`` if seen at most ``max_age`` s ago, else
        :data:`NOT_SEEN`."""
        if max_age <= 0:
            return NOT_SEEN
        seen = self._entries.get(name)
        if seen is None or self._timer() - seen[1] > max_age:
            return NOT_SEEN
        return seen[0]

    def drop(self, names: Iterable[str]) -> None:
        """Forget ``names`` (written or invalidated here)."""
        with self._mutex:
            for name in names:
                self._entries.pop(name, None)
                self._drops[hash(name) % _DROP_BUCKETS] += 1

    def drop_prefix(self, prefix: str) -> None:
        """Forget every name starting with ``prefix``."""
        with self._mutex:
            self._prefix_drops += 1
            for name in [n for n in self._entries if n.startswith(prefix)]:
                del self._entries[name]

    def reset_after_fork(self) -> None:
        """In a forked child: the parent's threads (one may hold the lock) are gone."""
        self._mutex = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)


def mark_from_loader(error: BaseException) -> None:
    """Tag ``error`` as raised by a loader (not by the cache), so ``stale_if_error``
    may answer it."""
    with contextlib.suppress(AttributeError):  # a class refusing attributes: untagged
        setattr(error, _FROM_LOADER, True)


def from_loader(error: BaseException) -> bool:
    """Was ``error`` raised by a loader (see :func:`mark_from_loader`)?"""
    return getattr(error, _FROM_LOADER, False) is True
