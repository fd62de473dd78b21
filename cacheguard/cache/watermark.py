"""Snapshot watermarks: which invalidations a loader's database snapshot has seen.

Every invalidation takes the next number of the namespace's invalidation
sequence and stamps it on the key's version (see ``cache/scripts.py``). A
database transaction that reads the sequence *before* its snapshot is taken
(``CacheGuard.watermark()``, done by the SQLAlchemy hooks when a transaction
begins) knows that it sees every write whose invalidation number is at most
that watermark. A fill whose loader ran on such a snapshot may store only if
the key's version is not newer than the watermark; otherwise a reader holding
an old snapshot (PostgreSQL REPEATABLE READ, SQLite WAL, a long request
transaction) would write back the row a writer had just replaced.

Which snapshots a load used is found per thread (a context variable):

* snapshots *open* in this thread when the load starts (their holders register
  with :func:`snapshot_opened`), because a loader may read objects that its
  session loaded earlier without any new query;
* snapshots *noted* while the load runs (:func:`note_snapshot`), for sessions
  that begin during the load or are used from another thread.

The fill keeps the oldest of them. Counting an open snapshot that the loader
did not actually use only makes a store less likely, never wrong.

Watermarks are numbers of one namespace's sequence: a holder may name its
namespace (``snapshot_namespace``), and a fill then counts it only if it fills a
key of that namespace (another namespace's numbers say nothing about this one's
versions). A holder naming none counts for every fill.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol

__all__ = [
    "SnapshotHolder",
    "collecting",
    "note_snapshot",
    "snapshot_opened",
]


class SnapshotHolder(Protocol):
    """Anything with a snapshot open: its watermark, or None once it ended."""

    @property
    def snapshot_watermark(self) -> int | None: ...


_open: ContextVar[weakref.WeakSet[SnapshotHolder] | None] = ContextVar(
    "cacheguard_open_snapshots", default=None
)
# The namespace of the load running now (None: any), and the watermarks it read.
_collector: ContextVar[tuple[str | None, list[int]] | None] = ContextVar(
    "cacheguard_load_snapshots", default=None
)


def snapshot_opened(holder: SnapshotHolder) -> None:
    """Register ``holder`` as open in this thread until its watermark becomes None
    (or it is garbage collected), and note it for a load that is running now."""
    holders = _open.get()
    if holders is None:
        holders = weakref.WeakSet()
        _open.set(holders)
    holders.add(holder)
    watermark = holder.snapshot_watermark
    if watermark is not None:
        note_snapshot(watermark, _namespace_of(holder))


def note_snapshot(watermark: int, namespace: str | None = None) -> None:
    """Tell the load running in this thread that it read a snapshot with ``watermark``
    (of ``namespace``'s sequence; None: of whichever the load fills)."""
    collector = _collector.get()
    if collector is not None and _same_sequence(collector[0], namespace):
        collector[1].append(watermark)


def _namespace_of(holder: SnapshotHolder) -> str | None:
    namespace = getattr(holder, "snapshot_namespace", None)
    return namespace if isinstance(namespace, str) else None


def _same_sequence(filling: str | None, holder: str | None) -> bool:
    return filling is None or holder is None or filling == holder


@contextmanager
def collecting(namespace: str | None = None) -> Iterator[list[int]]:
    """Collect the watermarks of the snapshots a load filling a key of ``namespace``
    may read (see the module doc)."""
    seen: list[int] = []
    holders = _open.get()
    if holders is not None:
        for holder in list(holders):
            watermark = holder.snapshot_watermark
            if watermark is None:
                holders.discard(holder)
            elif _same_sequence(namespace, _namespace_of(holder)):
                seen.append(watermark)
    token = _collector.set((namespace, seen))
    try:
        yield seen
    finally:
        _collector.reset(token)
