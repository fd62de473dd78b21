"""Prometheus metrics for cacheguard's guards (extra ``prometheus``).

::

    from cacheguard.integrations.prometheus import CacheMetrics

    metrics = CacheMetrics()  # registers in prometheus_client's REGISTRY
    metrics.instrument(guard)  # a CacheGuard or an AsyncCacheGuard; any number of them
    body, content_type = metrics.exposition()  # for GET /metrics

Every metric has the labels ``namespace`` (the guard's) and ``template``: the
key's template (a loader's ``key=``, or its function's module and qualified name
without one, or the ``template=`` a direct ``get_or_load`` call gave), else
:data:`UNTEMPLATED`. Never the key name itself: names are unbounded, and one
label value per key would grow the series without end. The counts come from the
guard's events (:class:`~cacheguard.CacheEvent`), through an event hook
(:meth:`~cacheguard.CacheGuard.add_event_hook`): one per guard, in the calling
thread (or on the loop), a few dictionary look-ups and increments per event.

One :class:`CacheMetrics` per registry: it registers its metrics once, and
instruments every guard of the application (a second one on the same registry
raises :class:`ValueError`).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from cacheguard.cache.stats import CacheEvent

__all__ = ["UNTEMPLATED", "CacheMetrics"]

UNTEMPLATED: Final = "(untemplated)"
"""The ``template`` label of events whose call gave no template (``guard.get_or_load``
without ``template=``, ``guard.write``, the SQLAlchemy hooks' invalidations)."""

DEFAULT_BUCKETS: Final = Histogram.DEFAULT_BUCKETS

# Event kinds (Stats fields) counted by a counter of their own: kind -> (name, help).
_COUNTED: Final = {
    "misses": ("cacheguard_misses", "Reads whose GET found no usable entry"),
    "loads": ("cacheguard_loads", "Loader runs that returned a value"),
    "load_errors": ("cacheguard_load_errors", "Loader runs that raised"),
    "bypasses": (
        "cacheguard_bypasses",
        "Calls served by the loader without the cache (Redis failed or its circuit is open)",
    ),
    "lock_waits": ("cacheguard_lock_waits", "Fills that waited for another filler or a writer"),
    "wait_timeouts": ("cacheguard_wait_timeouts", "Waits that reached wait_timeout"),
    "shared_timeout_loads": (
        "cacheguard_shared_timeout_loads",
        "Timed-out callers that shared another caller's unlocked load instead of loading",
    ),
    "stale_served": ("cacheguard_stale_served", "Expired entries served (stale policies)"),
    "early_refreshes": (
        "cacheguard_early_refreshes",
        "Background refreshes that loaded before the entry expired",
    ),
    "backend_errors": ("cacheguard_backend_errors", "Redis calls that failed"),
    "corrupt_entries": ("cacheguard_corrupt_entries", "Entries that did not decode (a miss)"),
    "stores_rejected": (
        "cacheguard_stores_rejected",
        "Loaded values not stored: invalidated while loading, or lease lost",
    ),
    "values_too_large": (
        "cacheguard_values_too_large",
        "Loaded values over max_value_bytes (returned, not cached)",
    ),
    "outage_reuses": (
        "cacheguard_outage_reuses",
        "Calls answered by a value seen within outage_ttl while Redis was unreachable",
    ),
    "gutter_reads": (
        "cacheguard_gutter_reads",
        "Calls answered through the gutter while Redis was unreachable",
    ),
    "stale_on_error": (
        "cacheguard_stale_on_error",
        "Errors answered by the last value seen (stale_if_error)",
    ),
    "replay_failures": (
        "cacheguard_replay_failures",
        "Reads that found the outbox replay failing (not served from Redis)",
    ),
    "outbox_writes": (
        "cacheguard_outbox_writes",
        "Invalidations written to the outbox (Redis unreachable during a tracked write)",
    ),
    "outbox_replays": (
        "cacheguard_outbox_replays",
        "Outbox invalidations replayed and removed",
    ),
}
_TIERS: Final = {"l1_hits": "l1", "l2_hits": "l2"}


class Instrumentable(Protocol):
    """What :meth:`CacheMetrics.instrument` needs of a guard (either guard has it)."""

    @property
    def namespace(self) -> str: ...

    def add_event_hook(self, hook: Callable[[CacheEvent], None]) -> None: ...

    def remove_event_hook(self, hook: Callable[[CacheEvent], None]) -> None: ...


G = TypeVar("G", bound=Instrumentable)


def multiprocess_mode() -> bool:
    """Is prometheus_client's multiprocess mode on (``PROMETHEUS_MULTIPROC_DIR`` set)?"""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


class CacheMetrics:
    """cacheguard's counters and histograms, registered in ``registry``.

    Counters: ``cacheguard_hits_total`` (label ``tier``: ``l1`` or ``l2``) and one
    per other event kind (``cacheguard_misses_total``, ``_loads_total``,
    ``_load_errors_total``, ``_bypasses_total``, ``_lock_waits_total``,
    ``_wait_timeouts_total``, ``_shared_timeout_loads_total``, ``_stale_served_total``,
    ``_early_refreshes_total``, ``_backend_errors_total``, ``_corrupt_entries_total``,
    ``_stores_rejected_total``, ``_values_too_large_total``, ``_outage_reuses_total``,
    ``_gutter_reads_total``, ``_stale_on_error_total``, ``_replay_failures_total``,
    ``_outbox_writes_total``, ``_outbox_replays_total``); histograms:
    ``cacheguard_lock_wait_seconds`` (each wait for another filler or a writer) and
    ``cacheguard_load_seconds`` (each loader run that returned). Labels:
    ``namespace``, ``template`` (see the module docs). ``docs/guide.md`` (Metrics)
    has the table and example queries.
    """

    def __init__(
        self,
        registry: CollectorRegistry = REGISTRY,
        *,
        lock_wait_buckets: Sequence[float] = DEFAULT_BUCKETS,
        load_buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> None:
        if not isinstance(registry, CollectorRegistry):
            raise TypeError(f"registry must be a CollectorRegistry, not {type(registry).__name__}")
        self.registry = registry
        labels = ("namespace", "template")
        # Made unregistered, then registered together: a failure leaves none behind.
        self.hits = Counter(
            "cacheguard_hits",
            "Reads served from the cache, by tier (l1: in process, l2: Redis)",
            (*labels, "tier"),
            registry=None,
        )
        self.counters = {
            kind: Counter(name, text, labels, registry=None)
            for kind, (name, text) in _COUNTED.items()
        }
        self.lock_wait_seconds = Histogram(
            "cacheguard_lock_wait_seconds",
            "Seconds a fill waited for another filler or a writer",
            labels,
            buckets=lock_wait_buckets,
            registry=None,
        )
        self.load_seconds = Histogram(
            "cacheguard_load_seconds",
            "Seconds of each loader run that returned a value",
            labels,
            buckets=load_buckets,
            registry=None,
        )
        self._collectors = (
            self.hits,
            *self.counters.values(),
            self.lock_wait_seconds,
            self.load_seconds,
        )
        self._register()
        self._mutex = threading.Lock()
        self._hooks: weakref.WeakKeyDictionary[Any, _GuardHook] = weakref.WeakKeyDictionary()
        self._closed = False

    def _register(self) -> None:
        done: list[Any] = []
        try:
            for collector in self._collectors:
                self.registry.register(collector)
                done.append(collector)
        except ValueError as exc:
            for collector in done:
                self.registry.unregister(collector)
            raise ValueError(
                "this registry already has cacheguard's metrics: make one CacheMetrics per "
                f"registry and instrument every guard with it ({exc})"
            ) from exc

    def instrument(self, guard: G) -> G:
        """Count ``guard``'s events from now on (a :class:`~cacheguard.CacheGuard` or an
        :class:`~cacheguard.aio.AsyncCacheGuard`); returns the guard. Instrumenting a
        guard twice counts it once."""
        if not all(
            callable(getattr(guard, hook, None)) for hook in ("add_event_hook", "remove_event_hook")
        ):
            raise TypeError(
                f"guard must be a CacheGuard or an AsyncCacheGuard, not {type(guard).__name__}"
            )
        with self._mutex:
            if self._closed:
                raise RuntimeError("this CacheMetrics is closed")
            if guard in self._hooks:
                return guard
            hook = _GuardHook(self, guard.namespace)
            guard.add_event_hook(hook)
            self._hooks[guard] = hook
        return guard

    def uninstrument(self, guard: Instrumentable) -> None:
        """Stop counting ``guard``'s events (its samples so far stay)."""
        with self._mutex:
            hook = self._hooks.pop(guard, None)
        if hook is not None:
            guard.remove_event_hook(hook)

    def close(self) -> None:
        """Uninstrument every guard and unregister the metrics from the registry (a
        new :class:`CacheMetrics` may then register there, e.g. when an application's
        lifespan starts again)."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            hooked = list(self._hooks.items())
            self._hooks.clear()
        for guard, hook in hooked:
            guard.remove_event_hook(hook)
        for collector in self._collectors:
            self.registry.unregister(collector)

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition format for a scrape and its content type.

        The registry's metrics (cacheguard's and any other registered there); in
        prometheus_client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set), the
        samples of every process writing to that directory, aggregated."""
        registry = self.registry
        if multiprocess_mode():
            registry = CollectorRegistry()
            MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST


class _GuardHook:
    """One guard's event hook: each event to its labelled counter and histogram.

    The labelled children are looked up once per (kind, template) and kept: the
    templates of an application are few, and ``labels()`` takes a lock."""

    __slots__ = ("_actions", "_metrics", "_namespace")

    def __init__(self, metrics: CacheMetrics, namespace: str) -> None:
        self._metrics = metrics
        self._namespace = namespace
        self._actions: dict[tuple[str, str | None], tuple[Any, Any]] = {}

    def __call__(self, event: CacheEvent) -> None:
        action = self._actions.get((event.kind, event.template))
        if action is None:
            action = self._resolve(event.kind, event.template)
        counter, histogram = action
        if counter is not None:
            counter.inc()
        if histogram is not None:
            histogram.observe(event.seconds)

    def _resolve(self, kind: str, template: str | None) -> tuple[Any, Any]:
        metrics = self._metrics
        labels = (self._namespace, UNTEMPLATED if template is None else template)
        counter: Any = None
        histogram: Any = None
        if kind in _TIERS:
            counter = metrics.hits.labels(*labels, _TIERS[kind])
        elif kind in metrics.counters:
            counter = metrics.counters[kind].labels(*labels)
            if kind == "lock_waits":
                histogram = metrics.lock_wait_seconds.labels(*labels)
            elif kind == "loads":
                histogram = metrics.load_seconds.labels(*labels)
        action = (counter, histogram)
        self._actions[kind, template] = action
        return action
