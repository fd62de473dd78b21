"""Counters of what the cache did, and a hook for your own metrics."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

__all__ = ["CacheEvent", "Stats", "StatsRecorder"]

log = logging.getLogger("cacheguard")


@dataclass(frozen=True)
class Stats:
    """A snapshot of :meth:`CacheGuard.stats`."""

    l1_hits: int = 0
    l2_hits: int = 0
    misses: int = 0
    loads: int = 0
    load_errors: int = 0
    lock_waits: int = 0
    lock_wait_seconds: float = 0.0
    wait_timeouts: int = 0
    stale_served: int = 0
    early_refreshes: int = 0
    backend_errors: int = 0
    corrupt_entries: int = 0
    stores_rejected: int = 0
    values_too_large: int = 0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class CacheEvent:
    """What happened (``kind`` is a :class:`Stats` field name), to which key, how long."""

    kind: str
    key: str
    seconds: float = 0.0
    error: BaseException | None = field(default=None, compare=False)


class StatsRecorder:
    """Thread-safe counters; every count is also offered to the event hook."""

    def __init__(self, on_event: Callable[[CacheEvent], None] | None = None) -> None:
        self._mutex = threading.Lock()
        self._counts: dict[str, float] = dict.fromkeys(Stats().as_dict(), 0)
        self._on_event = on_event

    def count(
        self, kind: str, key: str, seconds: float = 0.0, error: BaseException | None = None
    ) -> None:
        with self._mutex:
            self._counts[kind] += 1
            if kind == "lock_waits":
                self._counts["lock_wait_seconds"] += seconds
        if self._on_event is not None:
            try:
                self._on_event(CacheEvent(kind, key, seconds, error))
            except Exception:
                log.exception("cacheguard on_event hook failed")

    def snapshot(self) -> Stats:
        with self._mutex:
            counts = dict(self._counts)
        return Stats(**{k: (v if k == "lock_wait_seconds" else int(v)) for k, v in counts.items()})  # type: ignore[arg-type]
