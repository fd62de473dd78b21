"""The gutter: a second, small Redis that fills go through while the primary is down.

Facebook's memcache paper names it: when a cache server fails, its keys' reads
go to a *gutter* pool whose entries live only seconds and are never
invalidated, so the database sees one load per key per few seconds instead of
one per request. Here the gutter is a guard of its own (the same class as the
primary's) on the gutter's client, so its fills keep the whole protocol: one
load per key across processes, waiters woken by the announcement.

What differs from the primary guard is only its settings (:func:`gutter_settings`):
every entry lives at most ``gutter_ttl`` (no jitter above it, no stale window,
no serving past expiry), and a gutter that is down too raises at once
(``on_backend_error="raise"``), so the primary's read goes on to its own
fallbacks. Writes never touch the gutter: staleness is bounded by ``gutter_ttl``
alone (``docs/outage.md``).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Final, TypeVar

from cacheguard.cache.settings import GuardSettings
from cacheguard.cache.stats import CacheEvent, StatsRecorder

__all__ = ["FORWARDED", "forward_loads", "gutter_guard_made", "gutter_settings"]

# The gutter guard's events the primary counts as its own: database work.
FORWARDED: Final = frozenset({"loads", "load_errors"})


def gutter_settings(settings: GuardSettings) -> dict[str, Any]:
    """The gutter guard's settings, made from the primary's."""
    mine = {f.name: getattr(settings, f.name) for f in fields(settings)}
    mine.update(
        # Keys of its own: a gutter pointed at the primary's server by mistake never
        # touches the primary's entries (or its outbox replay's guarantees).
        namespace=f"{settings.namespace}-gutter",
        on_backend_error="raise",  # the primary's read has fallbacks of its own
        on_timeout="load" if settings.on_timeout == "stale" else settings.on_timeout,
        ttl_jitter=0.0,  # a jittered lifetime could outlive gutter_ttl
        stale_ttl=0.0,
        early_refresh_beta=0.0,  # no background refreshes: entries just expire
        l1_maxsize=0,
        outage_ttl=0.0,
        stale_if_error=0.0,
        confirm_replicas=0,  # never invalidated: nothing to confirm
    )
    return mine


G = TypeVar("G")


def gutter_guard_made(guard: G, primary_stats: StatsRecorder) -> G:
    """Finish a gutter's guard: its loads counted on the primary's stats; its stores
    not checked against database snapshots (a tracked session's snapshot is judged
    by the primary's invalidations, which the gutter never sees)."""
    guard._state.checks_snapshots = False  # type: ignore[attr-defined]
    guard.add_event_hook(forward_loads(primary_stats))  # type: ignore[attr-defined]
    return guard


def forward_loads(stats: StatsRecorder) -> Any:
    """An event hook for the gutter guard that counts its loads on the primary's
    ``stats`` (and so in its metrics)."""

    def forward(event: CacheEvent) -> None:
        if event.kind in FORWARDED:
            stats.count(event.kind, event.key, event.seconds, event.error, event.template)

    return forward
