"""Counters of what the cache did, and hooks for your own metrics.

Every count is offered to the guard's event hooks (``on_event=`` at construction,
:meth:`StatsRecorder.add_hook` later) as a :class:`CacheEvent`. An event names the
key and, when the call knew it, the key's **template**: the ``key=`` template of
a :class:`~cacheguard.CacheLoader` or ``@cached_with_lock`` function, the
function's qualified name for one without a template, or what a direct call gave
as ``template=`` (``guard.get_or_load(name, load, ttl=..., template=...)``); None
otherwise. Metrics label by the template: key names are unbounded, templates are not.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

__all__ = ["CacheEvent", "EventHook", "Stats", "StatsRecorder"]

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
    # Timed-out callers (on_timeout="load") that took the outcome of an unlocked load
    # another caller of the process ran for them, instead of loading themselves.
    shared_timeout_loads: int = 0
    stale_served: int = 0
    early_refreshes: int = 0
    backend_errors: int = 0
    corrupt_entries: int = 0
    stores_rejected: int = 0
    values_too_large: int = 0
    # Calls answered by the loader without the cache (Redis failed, or its circuit
    # is open, under on_backend_error="bypass"); each is also counted in loads.
    bypasses: int = 0
    # While Redis is unreachable (docs/outage.md): calls answered by a value this
    # process saw within outage_ttl; by the gutter; errors answered by the last value
    # seen (stale_if_error); reads that found the outbox replay failing.
    outage_reuses: int = 0
    gutter_reads: int = 0
    stale_on_error: int = 0
    replay_failures: int = 0
    # Invalidations written to the outbox (a tracked write while Redis was unreachable)
    # and replayed from it.
    outbox_writes: int = 0
    outbox_replays: int = 0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class CacheEvent:
    """What happened (``kind`` is a :class:`Stats` field name), to which key, how long;
    ``template`` is the key's template when the call knew it (see the module docs)."""

    kind: str
    key: str
    seconds: float = 0.0
    error: BaseException | None = field(default=None, compare=False)
    template: str | None = None


EventHook = Callable[[CacheEvent], None]


class StatsRecorder:
    """Thread-safe counters; every count is also offered to each event hook.

    Hooks are kept in a tuple replaced as a whole under the mutex, so a count reads
    them without a lock and a hook added or removed meanwhile is either called or
    not, never half. A hook that raises is logged and skipped: it never fails the
    cache call that counted."""

    def __init__(self, on_event: EventHook | None = None) -> None:
        self._mutex = threading.Lock()
        self._counts: dict[str, float] = dict.fromkeys(Stats().as_dict(), 0)
        self._hooks: tuple[EventHook, ...] = () if on_event is None else (on_event,)

    def add_hook(self, hook: EventHook) -> None:
        """Call ``hook`` with every event from now on; adding one already added does
        nothing (an event is never offered twice to one hook)."""
        if not callable(hook):
            raise TypeError(f"an event hook must be callable, not {type(hook).__name__}")
        with self._mutex:
            if hook not in self._hooks:
                self._hooks = (*self._hooks, hook)

    def remove_hook(self, hook: EventHook) -> None:
        """Stop calling ``hook``; :class:`ValueError` if it was not added."""
        with self._mutex:
            if hook not in self._hooks:
                raise ValueError(f"{hook!r} is not an event hook of this guard")
            self._hooks = tuple(h for h in self._hooks if h != hook)

    def count(
        self,
        kind: str,
        key: str,
        seconds: float = 0.0,
        error: BaseException | None = None,
        template: str | None = None,
    ) -> None:
        with self._mutex:
            self._counts[kind] += 1
            if kind == "lock_waits":
                self._counts["lock_wait_seconds"] += seconds
        hooks = self._hooks
        if hooks:
            event = CacheEvent(kind, key, seconds, error, template)
            for hook in hooks:
                try:
                    hook(event)
                except Exception:
                    log.exception("cacheguard event hook %r failed", hook)

    def snapshot(self) -> Stats:
        with self._mutex:
            counts = dict(self._counts)
        return Stats(**{k: (v if k == "lock_wait_seconds" else int(v)) for k, v in counts.items()})  # type: ignore[arg-type]
