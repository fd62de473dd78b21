"""The Prometheus integration (cacheguard.integrations.prometheus) on the real Redis.

After real cache calls of both guards (hits from both tiers, misses with a load,
a failing load, a stampede of several guards waiting on one fill, a bypass with
Redis unreachable) the registry holds the expected samples, labelled by the
key's template and never by a key name; a scrape parses; prometheus_client's
multiprocess mode aggregates the samples of several worker processes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cacheguard import CacheEvent, CacheGuard, CacheLoader, cached_with_lock
from cacheguard.aio import AsyncCacheGuard
from cacheguard.integrations.prometheus import UNTEMPLATED, CacheMetrics
from cacheguard.testing import free_port
from tests.guard_drivers import KINDS, Guard, guard_from_url
from tests.helpers import subscribers
from tests.procs import run_processes

TEMPLATE = "menu:{menu_id}"

Make = Callable[..., Guard]


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> Iterator[CacheMetrics]:
    made = CacheMetrics(registry)
    yield made
    made.close()


@pytest.fixture(params=KINDS)
async def make(
    request: pytest.FixtureRequest, redis_url: str, namespace: str, metrics: CacheMetrics
) -> AsyncIterator[Make]:
    """Guards of the parametrised kind, each instrumented by ``metrics``."""
    made: list[Guard] = []

    def build(*, url: str | None = None, **settings: Any) -> Guard:
        settings.setdefault("namespace", namespace)
        settings.setdefault("ttl_jitter", 0)
        guard = Guard(request.param, guard_from_url(request.param, url or redis_url, **settings))
        metrics.instrument(guard.guard)
        made.append(guard)
        return guard

    yield build
    for guard in made:
        await guard.close()


def value(registry: CollectorRegistry, name: str, template: str = TEMPLATE, **labels: str) -> float:
    """The sample ``name`` of ``template`` summed over namespaces (0 when absent)."""
    total = 0.0
    for family in registry.collect():
        for sample in family.samples:
            wanted = {"template": template, **labels}
            if sample.name == name and all(sample.labels.get(k) == v for k, v in wanted.items()):
                total += sample.value
    return total


def label_values(registry: CollectorRegistry, label: str) -> set[str]:
    return {
        sample.labels[label]
        for family in registry.collect()
        for sample in family.samples
        if label in sample.labels
    }


class Rows:
    """A loader of menu rows by id; counts its calls; ``gate`` holds it until set
    (blocking a worker thread, or awaited on the loop of the asyncio guard)."""

    def __init__(self, *, gate: threading.Event | None = None, fail: bool = False) -> None:
        self.calls = 0
        self.started = threading.Event()
        self.gate = gate
        self.fail = fail

    def __call__(self, menu_id: int) -> Any:
        self.calls += 1
        self.started.set()
        if self.fail:
            raise ZeroDivisionError("the database is down")
        if self.gate is None:
            return {"id": menu_id}
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            assert self.gate.wait(30), "the test never opened the gate"
            return {"id": menu_id}
        return self._gated(menu_id)

    async def _gated(self, menu_id: int) -> Any:
        assert self.gate is not None
        assert await asyncio.to_thread(self.gate.wait, 30), "the test never opened the gate"
        return {"id": menu_id}


async def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout}s"
        await asyncio.sleep(0.01)


# -- what the counters count -----------------------------------------------------------------


async def test_misses_loads_and_hits_are_labelled_by_template_never_by_key(
    make: Make, registry: CollectorRegistry, namespace: str
) -> None:
    guard = make()
    menu = guard.loader(key=TEMPLATE, load=Rows(), ttl=60)
    for menu_id in (1, 1, 2, 2, 2):
        assert await menu.get(menu_id) == {"id": menu_id}
    assert value(registry, "cacheguard_misses_total") == 2
    assert value(registry, "cacheguard_loads_total") == 2
    assert value(registry, "cacheguard_load_seconds_count") == 2
    assert value(registry, "cacheguard_hits_total", tier="l2") == 3
    assert value(registry, "cacheguard_hits_total", tier="l1") == 0
    # Two ids of one template: one label value, and no key name anywhere.
    assert label_values(registry, "template") == {TEMPLATE}
    assert label_values(registry, "namespace") == {namespace}
    assert guard.stats().l2_hits == 3


async def test_l1_hits_are_counted_by_tier(make: Make, registry: CollectorRegistry) -> None:
    guard = make(l1_maxsize=100, l1_ttl=60)
    menu = guard.loader(key=TEMPLATE, load=Rows(), ttl=60)

    async def served_from_l1() -> bool:
        await menu.get(7)  # L1 keeps a copy once its invalidation feed is subscribed
        return value(registry, "cacheguard_hits_total", tier="l1") > 0

    await wait_for(served_from_l1, "an L1 hit")
    assert value(registry, "cacheguard_hits_total", tier="l1") == guard.stats().l1_hits
    assert value(registry, "cacheguard_loads_total") == 1
    assert label_values(registry, "template") == {TEMPLATE}


async def test_a_failing_load_counts_a_load_error_not_a_load(
    make: Make, registry: CollectorRegistry
) -> None:
    guard = make()
    menu = guard.loader(key=TEMPLATE, load=Rows(fail=True), ttl=60)
    with pytest.raises(ZeroDivisionError):
        await menu.get(3)
    assert value(registry, "cacheguard_load_errors_total") == 1
    assert value(registry, "cacheguard_misses_total") == 1
    assert value(registry, "cacheguard_loads_total") == 0
    assert value(registry, "cacheguard_load_seconds_count") == 0


async def test_a_stampede_of_several_guards_counts_lock_waits(
    make: Make, registry: CollectorRegistry, client: redis.Redis
) -> None:
    # Guards of their own (own clients, own pub/sub): what separate processes are. One
    # fills; the others wait on the key's lock until its announcement.
    guards = [make(wait_timeout=30) for _ in range(4)]
    gate = threading.Event()
    rows = Rows(gate=gate)
    loaders = [guard.loader(key=TEMPLATE, load=rows, ttl=60) for guard in guards]
    calls = [asyncio.ensure_future(loader.get(5)) for loader in loaders]
    try:
        assert await asyncio.to_thread(rows.started.wait, 10), "no fill started"
        channel = guards[0].keys("menu:5").released_channel

        async def all_waiting() -> bool:
            return subscribers(client, channel) >= len(guards) - 1

        await wait_for(all_waiting, "every other guard waiting on the lock")
    finally:
        gate.set()
    assert await asyncio.gather(*calls) == [{"id": 5}] * len(guards)
    assert rows.calls == 1
    assert value(registry, "cacheguard_loads_total") == 1
    assert value(registry, "cacheguard_misses_total") == len(guards)
    assert value(registry, "cacheguard_lock_waits_total") == len(guards) - 1
    assert value(registry, "cacheguard_lock_wait_seconds_count") == len(guards) - 1
    assert value(registry, "cacheguard_lock_wait_seconds_sum") > 0
    assert label_values(registry, "template") == {TEMPLATE}


async def test_a_bypass_with_redis_unreachable_is_counted(
    make: Make, registry: CollectorRegistry
) -> None:
    down = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    guard = make(url=down, breaker_failures=1, breaker_cooldown=60)
    menu = guard.loader(key=TEMPLATE, load=Rows(), ttl=60)
    assert await menu.get(1) == {"id": 1}  # the GET fails: a backend error, a bypass
    assert await menu.get(2) == {"id": 2}  # the circuit is open: a bypass only
    assert value(registry, "cacheguard_bypasses_total") == 2
    assert value(registry, "cacheguard_backend_errors_total") == 1
    assert value(registry, "cacheguard_loads_total") == 2
    assert value(registry, "cacheguard_hits_total", tier="l2") == 0
    assert guard.stats().bypasses == 2
    assert label_values(registry, "template") == {TEMPLATE}


async def test_every_counter_is_wired(make: Make, registry: CollectorRegistry) -> None:
    """Each event kind reaches its own counter (and only it)."""
    guard = make()
    kinds = {
        "l1_hits": ("cacheguard_hits_total", {"tier": "l1"}),
        "l2_hits": ("cacheguard_hits_total", {"tier": "l2"}),
        "misses": ("cacheguard_misses_total", {}),
        "loads": ("cacheguard_loads_total", {}),
        "load_errors": ("cacheguard_load_errors_total", {}),
        "bypasses": ("cacheguard_bypasses_total", {}),
        "lock_waits": ("cacheguard_lock_waits_total", {}),
        "wait_timeouts": ("cacheguard_wait_timeouts_total", {}),
        "shared_timeout_loads": ("cacheguard_shared_timeout_loads_total", {}),
        "stale_served": ("cacheguard_stale_served_total", {}),
        "early_refreshes": ("cacheguard_early_refreshes_total", {}),
        "backend_errors": ("cacheguard_backend_errors_total", {}),
        "corrupt_entries": ("cacheguard_corrupt_entries_total", {}),
        "stores_rejected": ("cacheguard_stores_rejected_total", {}),
        "values_too_large": ("cacheguard_values_too_large_total", {}),
    }
    recorder = guard.guard._state.recorder
    for times, kind in enumerate(kinds, start=1):
        for _ in range(times):  # a different number each: a crossed wire shows
            recorder.count(kind, f"key:{times}", 0.25, None, f"t{times}")
    for times, (kind, (name, labels)) in enumerate(kinds.items(), start=1):
        assert value(registry, name, f"t{times}", **labels) == times, kind
    assert value(registry, "cacheguard_lock_wait_seconds_sum", "t7") == 7 * 0.25
    assert value(registry, "cacheguard_load_seconds_sum", "t4") == 4 * 0.25


# -- what labels a template ------------------------------------------------------------------


def menu_title(menu_id: int) -> str:
    return f"menu {menu_id}"


async def async_menu_title(menu_id: int) -> str:
    return f"menu {menu_id}"


async def test_untemplated_keys_get_a_stable_label(make: Make, registry: CollectorRegistry) -> None:
    guard = make()
    raw = guard.guard
    if isinstance(raw, AsyncCacheGuard):
        titled: Any = cached_with_lock(raw, ttl=60)(async_menu_title)
        assert await titled(1) == "menu 1"
        await raw.get_or_load("menu:list", lambda: [1], ttl=60)
        await raw.get_or_load("menu:all", lambda: [1], ttl=60, template="menu:all")
        function = f"{__name__}.async_menu_title"
    else:
        titled = cached_with_lock(raw, ttl=60)(menu_title)
        assert await asyncio.to_thread(titled, 1) == "menu 1"
        await asyncio.to_thread(raw.get_or_load, "menu:list", lambda: [1], ttl=60)
        await asyncio.to_thread(
            raw.get_or_load, "menu:all", lambda: [1], ttl=60, template="menu:all"
        )
        function = f"{__name__}.menu_title"
    # A default key: the function's qualified name. A direct call: the fixed label,
    # unless it opts in by naming its template.
    assert titled.template == function
    assert value(registry, "cacheguard_loads_total", function) == 1
    assert value(registry, "cacheguard_loads_total", UNTEMPLATED) == 1
    assert value(registry, "cacheguard_loads_total", "menu:all") == 1
    assert label_values(registry, "template") == {function, UNTEMPLATED, "menu:all"}


def test_the_sync_loaders_pass_their_template_to_every_call(redis_url: str, namespace: str) -> None:
    events: list[CacheEvent] = []
    guard = CacheGuard(redis.Redis.from_url(redis_url), namespace=namespace, on_event=events.append)
    try:
        menu = CacheLoader(guard, key=TEMPLATE, load=lambda menu_id: {"id": menu_id}, ttl=60)
        menu.get(1)
        menu.refresh(1)
        menu.get(1)
        menu.peek(1)
        menu.invalidate(1)
        assert [e.kind for e in events] == ["misses", "loads", "loads", "l2_hits"]
        assert {e.template for e in events} == {TEMPLATE}
        assert {e.key for e in events} == {"menu:1"}  # the key name stays in the event
    finally:
        guard.close()
        guard.client.close()


# -- hooks, registration, scraping ---------------------------------------------------------


async def test_a_failing_hook_never_breaks_a_call(
    make: Make, registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    guard = make()

    def broken(event: CacheEvent) -> None:
        raise RuntimeError("a broken metrics backend")

    guard.guard.add_event_hook(broken)
    menu = guard.loader(key=TEMPLATE, load=Rows(), ttl=60)
    with caplog.at_level(logging.ERROR, logger="cacheguard"):
        assert await menu.get(1) == {"id": 1}
        assert await menu.get(1) == {"id": 1}
    assert "event hook" in caplog.text
    assert value(registry, "cacheguard_hits_total", tier="l2") == 1  # other hooks still run
    assert guard.stats().loads == 1


def test_hooks_are_added_once_and_removed(
    redis_url: str, namespace: str, registry: CollectorRegistry
) -> None:
    guard = CacheGuard(redis.Redis.from_url(redis_url), namespace=namespace)
    try:
        seen: list[str] = []

        def hook(event: CacheEvent) -> None:
            seen.append(event.kind)

        guard.add_event_hook(hook)
        guard.add_event_hook(hook)
        metrics = CacheMetrics(registry)
        assert metrics.instrument(guard) is guard
        metrics.instrument(guard)  # twice: counted once
        guard.get_or_load("k", lambda: 1, ttl=60, template="k")
        assert seen == ["misses", "loads"]
        assert value(registry, "cacheguard_loads_total", "k") == 1
        guard.remove_event_hook(hook)
        metrics.uninstrument(guard)
        guard.get_or_load("k", lambda: 1, ttl=60, template="k")
        assert seen == ["misses", "loads"]
        assert value(registry, "cacheguard_hits_total", "k", tier="l2") == 0
        with pytest.raises(ValueError, match="not an event hook"):
            guard.remove_event_hook(hook)
        with pytest.raises(TypeError):
            guard.add_event_hook("not callable")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            metrics.instrument(object())  # type: ignore[type-var]
        metrics.close()
    finally:
        guard.close()
        guard.client.close()


def test_one_registry_takes_one_cache_metrics_until_it_is_closed(
    registry: CollectorRegistry, redis_url: str, namespace: str
) -> None:
    first = CacheMetrics(registry)
    with pytest.raises(ValueError, match="one CacheMetrics per registry"):
        CacheMetrics(registry)
    first.close()
    # A refusal part way (only the last name is taken) registers nothing either.
    taken = Histogram("cacheguard_load_seconds", "someone else's", registry=registry)
    with pytest.raises(ValueError, match="one CacheMetrics per registry"):
        CacheMetrics(registry)
    registry.unregister(taken)
    second = CacheMetrics(registry)  # the first unregistered everything, the refusals nothing
    guard = CacheGuard(redis.Redis.from_url(redis_url), namespace=namespace)
    try:
        second.instrument(guard)
        guard.get_or_load("k", lambda: 1, ttl=60)
        assert value(registry, "cacheguard_loads_total", UNTEMPLATED) == 1
        second.close()
        with pytest.raises(RuntimeError, match="closed"):
            second.instrument(guard)
        guard.get_or_load("k", lambda: 1, ttl=60)  # no hook left behind
    finally:
        guard.close()
        guard.client.close()


async def test_a_scrape_parses(
    make: Make, registry: CollectorRegistry, metrics: CacheMetrics
) -> None:
    sync_or_async = make()
    menu = sync_or_async.loader(key=TEMPLATE, load=Rows(), ttl=60)
    await menu.get(1)
    await menu.get(1)
    body, content_type = metrics.exposition()
    assert content_type == CONTENT_TYPE_LATEST
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert {
        "cacheguard_hits",
        "cacheguard_misses",
        "cacheguard_loads",
        "cacheguard_bypasses",
        "cacheguard_lock_wait_seconds",
        "cacheguard_load_seconds",
    } <= set(families)
    assert families["cacheguard_hits"].type == "counter"
    assert families["cacheguard_load_seconds"].type == "histogram"
    hits = [s for s in families["cacheguard_hits"].samples if s.name == "cacheguard_hits_total"]
    assert [(s.labels["template"], s.labels["tier"], s.value) for s in hits] == [
        (TEMPLATE, "l2", 1.0)
    ]
    assert body == generate_latest(registry)  # the registry's own exposition


# -- several worker processes ----------------------------------------------------------------


def _worker(url: str, namespace: str) -> None:
    """One worker process of a multiprocess deployment: one read of menu 1."""
    guard = CacheGuard.from_url(url, namespace=namespace)
    metrics = CacheMetrics(CollectorRegistry())
    metrics.instrument(guard)
    CacheLoader(guard, key=TEMPLATE, load=lambda menu_id: {"id": menu_id}, ttl=60).get(1)
    guard.close()


@pytest.mark.slow
def test_multiprocess_mode_aggregates_the_workers(
    redis_url: str, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Set before the workers start (they import prometheus_client with it set).
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    run_processes(_worker, [(redis_url, namespace)])  # misses and loads
    run_processes(_worker, [(redis_url, namespace)])  # hits
    assert len(list(tmp_path.glob("counter_*.db"))) == 2  # one file per worker
    scraper = CacheMetrics(CollectorRegistry())  # the process serving GET /metrics
    try:
        body, _ = scraper.exposition()
    finally:
        scraper.close()
    samples = {
        (s.name, s.labels.get("template"), s.labels.get("tier")): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
    assert samples[("cacheguard_loads_total", TEMPLATE, None)] == 1
    assert samples[("cacheguard_misses_total", TEMPLATE, None)] == 1
    assert samples[("cacheguard_hits_total", TEMPLATE, "l2")] == 1
    assert samples[("cacheguard_load_seconds_count", TEMPLATE, None)] == 1
