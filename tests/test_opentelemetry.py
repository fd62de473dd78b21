"""The OpenTelemetry integration (cacheguard.integrations.opentelemetry) on the real Redis.

Both guards, instrumented with a real SDK TracerProvider whose spans go to an
InMemorySpanExporter: a span per call with the key's template (never the key name)
and how the value came (hit, load, wait, stale, bypass); the loader's run and the
waits as child spans; exceptions recorded; the spans nested in the caller's
current span (per thread, per asyncio task); uninstrument undoes it all.
Calls of the sync guard run in worker threads (tests/guard_drivers.py), those of
the asyncio guard are tasks of the test's loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from cacheguard import MISSING
from cacheguard.integrations.opentelemetry import (
    BYPASS,
    HIT,
    LOAD,
    STALE,
    WAIT,
    GuardTracing,
    instrument,
)
from cacheguard.testing import free_port
from tests.guard_drivers import KINDS, Guard, guard_from_url
from tests.helpers import subscribers

TEMPLATE = "menu:{menu_id}"

Make = Callable[..., Guard]


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    made = TracerProvider()
    made.add_span_processor(SimpleSpanProcessor(exporter))
    yield made
    made.shutdown()


@pytest.fixture(params=KINDS)
async def make(
    request: pytest.FixtureRequest, redis_url: str, namespace: str, provider: TracerProvider
) -> AsyncIterator[Make]:
    """Guards of the parametrised kind, each instrumented with ``provider``."""
    made: list[tuple[Guard, GuardTracing]] = []

    def build(*, url: str | None = None, **settings: Any) -> Guard:
        settings.setdefault("namespace", namespace)
        settings.setdefault("ttl_jitter", 0)
        guard = Guard(request.param, guard_from_url(request.param, url or redis_url, **settings))
        made.append((guard, instrument(guard.guard, tracer_provider=provider)))
        return guard

    yield build
    for guard, tracing in made:
        tracing.uninstrument()
        await guard.close()


class Rows:
    """A loader of menu rows by id (or of one value, with no argument); counts its
    calls; ``gate`` holds it until set (blocking a worker thread, or awaited on the
    loop of the asyncio guard); ``fail`` raises instead; ``inner`` runs inside it
    (a database query's span, say)."""

    def __init__(
        self,
        *,
        gate: threading.Event | None = None,
        fail: bool = False,
        inner: Callable[[], None] | None = None,
    ) -> None:
        self.calls = 0
        self.started = threading.Event()
        self.gate = gate
        self.fail = fail
        self.inner = inner

    def __call__(self, menu_id: int = 7) -> Any:
        self.calls += 1
        self.started.set()
        if self.inner is not None:
            self.inner()
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
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout}s"
        await asyncio.sleep(0.01)


def spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def children(exporter: InMemorySpanExporter, parent: ReadableSpan) -> list[ReadableSpan]:
    return [
        span
        for span in exporter.get_finished_spans()
        if span.parent is not None and span.parent.span_id == parent.context.span_id
    ]


def event_names(span: ReadableSpan) -> list[str]:
    return [event.name for event in span.events]


def attribute(span: ReadableSpan, name: str) -> Any:
    assert span.attributes is not None
    return span.attributes.get(name)


def no_key_names(exporter: InMemorySpanExporter, *names: str) -> bool:
    """No span, nor any of its events, carries a key name in an attribute."""
    for span in exporter.get_finished_spans():
        values = [*dict(span.attributes or {}).values()]
        for event in span.events:
            values += [*dict(event.attributes or {}).values()]
        if any(name in str(value) for value in values for name in names):
            return False
    return True


# -- what a call's span says -----------------------------------------------------------------


async def test_a_load_then_a_hit(
    make: Make, exporter: InMemorySpanExporter, namespace: str
) -> None:
    guard = make()
    menu = guard.loader(key=TEMPLATE, load=Rows(), ttl=60)
    assert await menu.get(7) == {"id": 7}
    assert await menu.get(7) == {"id": 7}
    loaded, hit = spans(exporter, "cacheguard.get_or_load")
    for span in (loaded, hit):
        assert span.kind is SpanKind.INTERNAL
        assert span.status.status_code is StatusCode.UNSET
        assert attribute(span, "cacheguard.namespace") == namespace
        assert attribute(span, "cacheguard.key.template") == TEMPLATE
    assert attribute(loaded, "cacheguard.outcome") == LOAD
    assert event_names(loaded) == ["cacheguard.misses"]
    (load,) = children(exporter, loaded)
    assert load.name == "cacheguard.load"
    assert attribute(load, "cacheguard.key.template") == TEMPLATE
    assert loaded.start_time <= load.start_time <= load.end_time <= loaded.end_time  # type: ignore[operator]
    assert attribute(hit, "cacheguard.outcome") == HIT
    assert attribute(hit, "cacheguard.hit.tier") == "l2"
    assert event_names(hit) == []
    assert children(exporter, hit) == []
    assert no_key_names(exporter, "menu:7")


async def test_an_l1_hit(make: Make, exporter: InMemorySpanExporter) -> None:
    guard = make(l1_maxsize=100, l1_ttl=60)
    menu = guard.loader(key=TEMPLATE, load=Rows(), ttl=60)
    deadline = time.monotonic() + 10
    while True:  # L1 keeps a copy once its invalidation feed is subscribed
        exporter.clear()
        await menu.get(7)
        if guard.stats().l1_hits:
            break
        assert time.monotonic() < deadline, "no L1 hit within 10 s"
        await asyncio.sleep(0.01)
    (span,) = spans(exporter, "cacheguard.get_or_load")
    assert attribute(span, "cacheguard.outcome") == HIT
    assert attribute(span, "cacheguard.hit.tier") == "l1"


async def test_the_loaders_exception_is_recorded(
    make: Make, exporter: InMemorySpanExporter
) -> None:
    guard = make()
    menu = guard.loader(key=TEMPLATE, load=Rows(fail=True), ttl=60)
    with pytest.raises(ZeroDivisionError):
        await menu.get(3)
    (call,) = spans(exporter, "cacheguard.get_or_load")
    (load,) = children(exporter, call)
    for span in (call, load):
        assert span.status.status_code is StatusCode.ERROR
        assert "ZeroDivisionError" in (span.status.description or "")
        assert attribute(span, "error.type") == "ZeroDivisionError"
        (exception,) = [e for e in span.events if e.name == "exception"]
        assert exception.attributes is not None
        assert exception.attributes["exception.type"] == "ZeroDivisionError"
        assert exception.attributes["exception.message"] == "the database is down"
    assert attribute(call, "cacheguard.outcome") == LOAD
    assert "cacheguard.load_errors" in event_names(call)


async def test_a_caller_waits_for_the_leader_of_its_process(
    make: Make, exporter: InMemorySpanExporter
) -> None:
    """Two callers of one guard (two threads, or two tasks): one loads, the other
    waits for it in the key's single flight."""
    guard = make()
    rows = Rows(gate=threading.Event())
    first = asyncio.ensure_future(guard.get_or_load("menu:7", rows, ttl=60, template=TEMPLATE))
    second: asyncio.Future[Any] | None = None
    try:
        await wait_for(rows.started.is_set, "the first caller's load")
        second = asyncio.ensure_future(guard.get_or_load("menu:7", rows, ttl=60, template=TEMPLATE))
        flights = guard.guard._state.flights._flights

        def joined() -> bool:
            flight = flights.get("menu:7")
            return flight is not None and flight.event is not None  # made by a follower

        await wait_for(joined, "the second caller joining the first's flight")
    finally:
        assert rows.gate is not None
        rows.gate.set()
    assert await first == await second == {"id": 7}
    assert rows.calls == 1
    by_outcome = {
        attribute(span, "cacheguard.outcome"): span
        for span in spans(exporter, "cacheguard.get_or_load")
    }
    assert set(by_outcome) == {LOAD, WAIT}
    assert [s.name for s in children(exporter, by_outcome[LOAD])] == ["cacheguard.load"]
    (wait,) = children(exporter, by_outcome[WAIT])
    assert wait.name == "cacheguard.wait"
    assert attribute(wait, "cacheguard.wait.on") == "leader"
    assert wait.end_time - wait.start_time > 0  # type: ignore[operator]
    assert event_names(by_outcome[WAIT]) == []


async def test_a_caller_waits_on_the_lock_of_a_filler_elsewhere(
    make: Make, exporter: InMemorySpanExporter, client: redis.Redis
) -> None:
    # Two guards with clients and subscribers of their own: what two processes are.
    filler, waiter = make(wait_timeout=30), make(wait_timeout=30)
    rows = Rows(gate=threading.Event())
    first = asyncio.ensure_future(filler.get_or_load("menu:7", rows, ttl=60, template=TEMPLATE))
    second: asyncio.Future[Any] | None = None
    try:
        await wait_for(rows.started.is_set, "the fill")
        second = asyncio.ensure_future(
            waiter.get_or_load("menu:7", rows, ttl=60, template=TEMPLATE)
        )
        channel = filler.keys("menu:7").released_channel
        await wait_for(lambda: subscribers(client, channel) >= 1, "the waiter on the lock")
    finally:
        assert rows.gate is not None
        rows.gate.set()
    assert await first == await second == {"id": 7}
    assert rows.calls == 1
    by_outcome = {
        attribute(span, "cacheguard.outcome"): span
        for span in spans(exporter, "cacheguard.get_or_load")
    }
    assert set(by_outcome) == {LOAD, WAIT}
    (wait,) = children(exporter, by_outcome[WAIT])
    assert wait.name == "cacheguard.wait"
    assert attribute(wait, "cacheguard.wait.on") == "lock"
    assert event_names(by_outcome[WAIT]) == ["cacheguard.misses"]


async def test_redis_down_is_a_bypass(make: Make, exporter: InMemorySpanExporter) -> None:
    down = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    guard = make(url=down, breaker_failures=1, breaker_cooldown=60)
    menu = guard.loader(key=TEMPLATE, load=Rows(), ttl=60)
    assert await menu.get(1) == {"id": 1}  # the GET fails: a backend error, a bypass
    assert await menu.get(2) == {"id": 2}  # the circuit is open: a bypass only
    failed, refused = spans(exporter, "cacheguard.get_or_load")
    for span in (failed, refused):
        assert attribute(span, "cacheguard.outcome") == BYPASS
        assert span.status.status_code is StatusCode.UNSET  # answered by the loader
        assert [s.name for s in children(exporter, span)] == ["cacheguard.load"]
    assert event_names(failed) == ["cacheguard.backend_errors", "cacheguard.bypasses"]
    (error,) = failed.events[:1]
    assert error.attributes is not None
    assert "ConnectionError" in str(error.attributes["exception.type"])
    assert event_names(refused) == ["cacheguard.bypasses"]


async def test_an_expired_entry_in_the_stale_window_is_stale(
    make: Make, exporter: InMemorySpanExporter
) -> None:
    guard = make(stale_ttl=60)
    assert await guard.get_or_load("menu:7", lambda: "old", ttl=0.05, template=TEMPLATE) == "old"

    async def expired() -> bool:
        return await guard.peek("menu:7") is MISSING

    deadline = time.monotonic() + 10
    while not await expired():
        assert time.monotonic() < deadline, "the entry never expired"
        await asyncio.sleep(0.01)
    rows = Rows()
    assert await guard.get_or_load("menu:7", rows, ttl=60, template=TEMPLATE) == "old"

    async def refreshed() -> bool:
        return await guard.peek("menu:7") == {"id": 7}

    deadline = time.monotonic() + 10
    while not await refreshed():  # the background refresh
        assert time.monotonic() < deadline, "the stale entry was never refreshed"
        await asyncio.sleep(0.01)
    stale = spans(exporter, "cacheguard.get_or_load")[-1]
    assert attribute(stale, "cacheguard.outcome") == STALE
    assert event_names(stale) == ["cacheguard.stale_served"]
    assert children(exporter, stale) == []
    # The refresh ran apart from any call: no span of its own, none in the call's.
    assert rows.calls == 1
    assert len(spans(exporter, "cacheguard.load")) == 1  # the first fill's


async def test_every_call_is_a_span(make: Make, exporter: InMemorySpanExporter) -> None:
    guard = make()
    menu = guard.loader(key=TEMPLATE, load=Rows(), ttl=60)
    assert await menu.peek(7) is MISSING
    assert await menu.refresh(7) == {"id": 7}
    await menu.invalidate(7)
    await guard.invalidate_prefix("menu:")
    names = [span.name for span in exporter.get_finished_spans() if span.parent is None]
    assert names == [
        "cacheguard.peek",
        "cacheguard.refresh",
        "cacheguard.invalidate",
        "cacheguard.invalidate_prefix",
    ]
    peek, refresh, invalidate, prefix = (spans(exporter, name)[0] for name in names)
    for span in (peek, refresh, invalidate):
        assert attribute(span, "cacheguard.key.template") == TEMPLATE
    assert attribute(prefix, "cacheguard.key.template") is None
    assert attribute(refresh, "cacheguard.outcome") == LOAD
    assert [s.name for s in children(exporter, refresh)] == ["cacheguard.load"]
    assert attribute(peek, "cacheguard.outcome") is None  # not a read through the loader
    assert no_key_names(exporter, "menu:7")


# -- where the spans go ----------------------------------------------------------------------


async def test_spans_nest_in_each_callers_current_span(
    make: Make, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """Two callers at once (threads, or tasks), each in a request span of its own: each
    call is its own request's child, the loader's spans are the load's children, and
    a loader's call of the guard nests in that load."""
    guard = make()
    app = provider.get_tracer("the application")
    gate = threading.Event()

    def query() -> None:
        with app.start_as_current_span("SELECT menu"):
            pass

    rows = Rows(gate=gate, inner=query)

    def load_menu() -> Any:
        value = rows()
        # A loader that reads another key through the guard (a sync guard's, in its thread).
        if guard.kind == "sync":
            guard.guard.get_or_load("menu:title", lambda: "Soups", ttl=60, template="title")
        return value

    async def load_async() -> Any:
        value = await rows()
        await guard.guard.get_or_load("menu:title", lambda: "Soups", ttl=60, template="title")  # type: ignore[misc]
        return value

    loader = load_menu if guard.kind == "sync" else load_async

    async def request(number: int) -> Any:
        with app.start_as_current_span(f"request {number}"):
            return await guard.get_or_load("menu:7", loader, ttl=60, template=TEMPLATE)

    first = asyncio.ensure_future(request(1))
    try:
        await wait_for(rows.started.is_set, "the first request's load")
        second = asyncio.ensure_future(request(2))
        flights = guard.guard._state.flights._flights
        await wait_for(
            lambda: "menu:7" in flights and flights["menu:7"].event is not None,
            "the second request waiting for the first's load",
        )
    finally:
        gate.set()
    assert await first == await second == {"id": 7}
    requests = {span.name: span for span in exporter.get_finished_spans() if span.parent is None}
    assert set(requests) == {"request 1", "request 2"}
    calls = {}
    for name, request_span in requests.items():
        (call,) = children(exporter, request_span)
        assert call.name == "cacheguard.get_or_load"
        assert call.context.trace_id == request_span.context.trace_id
        calls[name] = call
    assert attribute(calls["request 1"], "cacheguard.outcome") == LOAD
    assert attribute(calls["request 2"], "cacheguard.outcome") == WAIT
    (load,) = children(exporter, calls["request 1"])
    inner = {span.name: span for span in children(exporter, load)}
    assert set(inner) == {"SELECT menu", "cacheguard.get_or_load"}
    nested = inner["cacheguard.get_or_load"]
    assert attribute(nested, "cacheguard.key.template") == "title"
    assert attribute(nested, "cacheguard.outcome") == LOAD
    assert event_names(nested) == ["cacheguard.misses"]
    assert event_names(calls["request 1"]) == ["cacheguard.misses"]  # not the nested call's


async def test_asyncio_tasks_keep_their_own_spans(
    redis_url: str, namespace: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """Many tasks of one loop interleave their calls; each call is the child of the span
    current in its own task, and no task's span leaks into another's."""
    from cacheguard.aio import AsyncCacheGuard

    guard = AsyncCacheGuard.from_url(redis_url, namespace=namespace)
    tracing = instrument(guard, tracer_provider=provider)
    app = provider.get_tracer("the application")

    async def load(number: int) -> int:
        await asyncio.sleep(0)  # let the other tasks run meanwhile
        return number

    async def request(number: int) -> int:
        with app.start_as_current_span(f"request {number}") as parent:
            assert trace.get_current_span() is parent
            value = await guard.get_or_load(
                f"menu:{number}", lambda: load(number), ttl=60, template=TEMPLATE
            )
            assert trace.get_current_span() is parent  # the call put its own back
            return int(value)

    try:
        assert await asyncio.gather(*(request(n) for n in range(20))) == list(range(20))
    finally:
        tracing.uninstrument()
        await guard.aclose()
    for span in exporter.get_finished_spans():
        if span.parent is None:
            (call,) = children(exporter, span)
            (loaded,) = children(exporter, call)
            assert loaded.name == "cacheguard.load"
    assert len(spans(exporter, "cacheguard.get_or_load")) == 20


# -- instrument and uninstrument -------------------------------------------------------------


async def test_uninstrument_undoes_instrument(
    redis_url: str, namespace: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    for kind in KINDS:
        guard = Guard(kind, guard_from_url(kind, redis_url, namespace=namespace))
        try:
            tracing = instrument(guard.guard, tracer_provider=provider)
            assert tracing.instrumented
            with pytest.raises(ValueError, match="traced already"):
                instrument(guard.guard, tracer_provider=provider)
            await guard.get_or_load(f"{kind}:1", lambda: 1, ttl=60)
            assert len(spans(exporter, "cacheguard.get_or_load")) == 1
            tracing.uninstrument()
            tracing.uninstrument()  # again: nothing
            assert not tracing.instrumented
            assert guard.guard._state.recorder._hooks == ()  # its event hook is gone
            await guard.get_or_load(f"{kind}:2", lambda: 2, ttl=60)
            await guard.get_or_load(f"{kind}:2", lambda: 2, ttl=60)
            assert len(exporter.get_finished_spans()) == 2  # the first call's and its load
            again = instrument(guard.guard, tracer_provider=provider)
            await guard.get_or_load(f"{kind}:2", lambda: 2, ttl=60)
            assert len(spans(exporter, "cacheguard.get_or_load")) == 2
            again.uninstrument()
        finally:
            await guard.close()
        exporter.clear()


def test_instrument_refuses_what_it_cannot_trace(redis_url: str, namespace: str) -> None:
    with pytest.raises(TypeError, match="CacheGuard or an AsyncCacheGuard"):
        instrument(object())  # type: ignore[arg-type]
    from cacheguard import CacheGuard

    guard = CacheGuard(redis.Redis.from_url(redis_url), namespace=namespace)
    try:
        with pytest.raises(TypeError, match="TracerProvider"):
            instrument(guard, tracer_provider="console")  # type: ignore[arg-type]
        assert guard._state.tracer is None
    finally:
        guard.close()
        guard.client.close()


def test_the_global_tracer_provider_is_the_default(redis_url: str, namespace: str) -> None:
    """Without ``tracer_provider`` the spans go to the global provider, even one set
    after instrumenting (OpenTelemetry's proxy tracer)."""
    from cacheguard import CacheGuard

    guard = CacheGuard(redis.Redis.from_url(redis_url), namespace=namespace)
    tracing = instrument(guard)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        with pytest.MonkeyPatch.context() as patch:
            # The global provider can be set once per process: swapped in for this test.
            patch.setattr(trace, "_TRACER_PROVIDER", provider)
            assert guard.get_or_load("menu:1", lambda: 1, ttl=60) == 1
        assert [span.name for span in exporter.get_finished_spans()] == [
            "cacheguard.load",
            "cacheguard.get_or_load",
        ]
        assert {span.instrumentation_scope.name for span in exporter.get_finished_spans()} == {  # type: ignore[union-attr]
            "cacheguard"
        }
    finally:
        tracing.uninstrument()
        guard.close()
        guard.client.close()
        provider.shutdown()


async def test_a_batch_is_one_span_with_the_furthest_outcome(
    make: Make, exporter: InMemorySpanExporter
) -> None:
    guard = make()

    def load_many(names: list[str]) -> dict[str, Any]:
        return {name: {"name": name} for name in names}

    await guard.get_or_load_many(["menu:1", "menu:2"], load_many, ttl=60, template=TEMPLATE)
    await guard.get_or_load_many(["menu:1", "menu:2"], load_many, ttl=60, template=TEMPLATE)
    batches = spans(exporter, "cacheguard.get_or_load_many")
    assert [attribute(span, "cacheguard.outcome") for span in batches] == [LOAD, HIT]
    assert all(attribute(span, "cacheguard.key.template") == TEMPLATE for span in batches)
    assert no_key_names(exporter, "menu:1")
