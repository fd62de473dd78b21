"""The cache's guarantees, written once and run against both guards (sync and
asyncio) on the real Redis; then the two side by side on one namespace.

Every test gets a ``make`` fixture that builds guards of the parametrised kind;
``tests/guard_drivers.py`` gives both the same awaitable face.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis
import redis.asyncio

from cacheguard import (
    MISSING,
    BackendUnavailable,
    CacheGuard,
    GuardClosed,
    LockTimeout,
    RecursiveLoadError,
    WriteNotConfirmed,
)
from cacheguard.aio import AsyncCacheGuard
from tests.guard_drivers import KINDS, NO_TIMER_WAKE_UP, Guard
from tests.helpers import flight_entries, subscribers, wait_until, waiting_in

Make = Callable[..., Guard]


@pytest.fixture(params=KINDS)
async def make(
    request: pytest.FixtureRequest, redis_url: str, namespace: str
) -> AsyncIterator[Make]:
    made: list[Guard] = []

    def build(*, kind: str | None = None, url: str | None = None, **settings: Any) -> Guard:
        settings.setdefault("namespace", namespace)
        settings.setdefault("ttl_jitter", 0)
        which = kind or request.param
        if which == "sync":
            guard: CacheGuard | AsyncCacheGuard = CacheGuard(
                redis.Redis.from_url(url or redis_url, socket_timeout=10), **settings
            )
        else:
            guard = AsyncCacheGuard(
                redis.asyncio.Redis.from_url(url or redis_url, socket_timeout=10), **settings
            )
        made.append(Guard(which, guard))
        return made[-1]

    yield build
    for guard in made:
        await guard.close()


class Loads:
    """A loader that counts its calls; ``gate`` holds it until set."""

    def __init__(self, value: Any = "v", *, gate: threading.Event | None = None) -> None:
        self.value = value
        self.calls = 0
        self.started = threading.Event()
        self.gate = gate

    def __call__(self) -> Any:
        self.calls += 1
        self.started.set()
        if self.gate is None:
            return self.value
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # a worker thread of the sync guard: block
            assert self.gate.wait(30), "the test never opened the gate"
            return self.value
        return self._gated()  # on the loop (the asyncio guard): an awaitable

    async def _gated(self) -> Any:
        assert self.gate is not None
        assert await asyncio.to_thread(self.gate.wait, 30), "the test never opened the gate"
        return self.value


async def started(loads: Loads) -> None:
    assert await asyncio.to_thread(loads.started.wait, 10), "the loader never started"


def lock_hash(client: redis.Redis, guard: Guard, name: str) -> dict[bytes, bytes]:
    return client.hgetall(guard.keys(name).lock)  # type: ignore[return-value]


# -- one guard -----------------------------------------------------------------------------


async def test_a_stampede_loads_once(make: Make) -> None:
    guard = make()
    gate = threading.Event()
    loads = Loads({"rows": [1, 2, 3]}, gate=gate)
    callers = [
        asyncio.ensure_future(guard.get_or_load("menu:list", loads, ttl=60)) for _ in range(40)
    ]
    await started(loads)
    gate.set()
    values = await asyncio.gather(*callers)
    assert values == [{"rows": [1, 2, 3]}] * 40
    assert loads.calls == 1
    assert await guard.get_or_load("menu:list", loads, ttl=60) == {"rows": [1, 2, 3]}
    assert loads.calls == 1
    assert guard.stats().loads == 1


async def test_invalidate_makes_the_next_read_load(make: Make) -> None:
    guard = make()
    assert await guard.get_or_load("k", Loads("old"), ttl=60) == "old"
    assert await guard.peek("k") == "old"
    await guard.invalidate("k")
    assert await guard.peek("k") is MISSING
    assert await guard.get_or_load("k", Loads("new"), ttl=60) == "new"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["invalidate", "invalidate_prefix"])
async def test_a_read_after_an_invalidation_does_not_share_a_load_begun_before(
    make: Make, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # invalidate takes no lock: a load under way as it returns may have read the data
    # before the change it stands for. A read that starts after it begins a flight of
    # its own (and loads); those that joined before keep the load's value (their calls
    # overlap the invalidation).
    guard = make()
    entered = flight_entries(monkeypatch, guard.guard._state.flights)
    gate = threading.Event()
    before = Loads("loaded before", gate=gate)
    leader = asyncio.ensure_future(guard.get_or_load("k", before, ttl=60))
    await started(before)
    early = asyncio.ensure_future(guard.get_or_load("k", Loads("early"), ttl=60))
    assert await asyncio.to_thread(wait_until, lambda: len(entered) >= 2, 10)
    if how == "invalidate":
        await guard.invalidate("k")
    else:
        assert await guard.invalidate_prefix("k") == 1
    after = Loads("loaded after")
    late = asyncio.ensure_future(guard.get_or_load("k", after, ttl=60))
    # The late read joined the flight, or began its own (then waits for the fill).
    assert await asyncio.to_thread(wait_until, lambda: len(entered) >= 3, 10)
    gate.set()
    values = await asyncio.wait_for(asyncio.gather(leader, early, late), 30)
    assert values == ["loaded before", "loaded before", "loaded after"]
    assert after.calls == 1
    assert await guard.peek("k") == "loaded after"  # the load from before stored nothing


@pytest.mark.parametrize("how", ["invalidate", "invalidate_prefix"])
async def test_an_evicted_version_key_does_not_let_the_old_value_in(
    make: Make, client: redis.Redis, how: str
) -> None:
    # A cold key: the fill begins at version '0'. The invalidation during the load
    # writes a version, which eviction (here a DEL) takes away before the fill ends;
    # the version alone would read "never invalidated". (Real eviction: test_eviction.py.)
    guard = make()
    keys = guard.keys("evicted:k")
    gate = threading.Event()
    loads = Loads("old", gate=gate)
    filling = asyncio.ensure_future(guard.get_or_load("evicted:k", loads, ttl=60))
    await started(loads)
    if how == "invalidate":
        await guard.invalidate("evicted:k")
    else:
        assert await guard.invalidate_prefix("evicted:") == 1  # found by its lock hash
    assert client.exists(keys.version)
    client.delete(keys.version)
    assert client.hexists(keys.lock, "fill")  # the fill's hold is still there
    gate.set()
    assert await filling == "old"  # the caller gets what it loaded, the cache does not
    assert await guard.peek("evicted:k") is MISSING
    assert await guard.get_or_load("evicted:k", Loads("new"), ttl=60) == "new"


async def test_an_evicted_lock_hash_takes_the_fill_with_it(make: Make, client: redis.Redis) -> None:
    guard = make()
    keys = guard.keys("k")
    gate = threading.Event()
    loads = Loads("old", gate=gate)
    filling = asyncio.ensure_future(guard.get_or_load("k", loads, ttl=60))
    await started(loads)
    client.delete(keys.lock)  # evicted: the fill's hold (and its right to store) is gone
    gate.set()
    assert await filling == "old"
    assert await guard.peek("k") is MISSING
    assert await guard.get_or_load("k", Loads("new"), ttl=60) == "new"


@pytest.mark.slow
async def test_a_value_loaded_during_a_write_is_not_stored(make: Make, client: redis.Redis) -> None:
    # (The sync face runs each call in a worker thread of its own context, so the read
    # is not the write block's: it waits wait_timeout, then loads without storing.)
    guard, other = make(wait_timeout=1), make()
    async with guard.write("k"):
        # The writer itself may read (it sees its own uncommitted state) but stores nothing.
        assert await guard.get_or_load("k", Loads("uncommitted"), ttl=60) == "uncommitted"
        assert await other.peek("k") is MISSING
    assert not client.exists(guard.keys("k").value)
    assert await other.get_or_load("k", Loads("committed"), ttl=60) == "committed"


async def test_a_reader_waits_for_the_writer_and_gets_the_new_value(
    make: Make, client: redis.Redis
) -> None:
    writer, reader = make(), make(lease=5)
    assert await reader.get_or_load("k", Loads("old"), ttl=60) == "old"
    async with writer.write("k"):
        read = asyncio.ensure_future(reader.get_or_load("k", Loads("new"), ttl=60))
        # The reader is waiting on the key's channel once Redis shows it subscribed.
        assert await asyncio.to_thread(
            wait_until, lambda: subscribers(client, reader.keys("k").released_channel) >= 1, 10
        )
        assert not read.done()
    assert await read == "new"


async def test_negative_caching(make: Make) -> None:
    guard = make(none_ttl=30)
    loads = Loads(None)
    assert await guard.get_or_load("missing", loads, ttl=60) is None
    assert await guard.get_or_load("missing", loads, ttl=60) is None
    assert loads.calls == 1
    no_negative = make(none_ttl=None)
    loads = Loads(None)
    assert await no_negative.get_or_load("missing2", loads, ttl=60) is None
    assert await no_negative.get_or_load("missing2", loads, ttl=60) is None
    assert loads.calls == 2


async def test_a_failing_loader_leaves_no_hold_and_the_next_call_loads(
    make: Make, client: redis.Redis
) -> None:
    guard = make()

    def broken() -> Any:
        raise ZeroDivisionError("db down")

    with pytest.raises(ZeroDivisionError):
        await guard.get_or_load("k", broken, ttl=60)
    assert lock_hash(client, guard, "k") == {}
    assert await guard.get_or_load("k", Loads("fine"), ttl=60) == "fine"
    assert guard.stats().load_errors == 1


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["raise", "load", "stale"])
async def test_the_timeout_policy(make: Make, policy: str) -> None:
    writer = make()
    reader = make(wait_timeout=0.3, on_timeout=policy)
    assert await reader.get_or_load("k", Loads("old"), ttl=0.2) == "old"
    async with writer.write("k"):
        if policy == "raise":
            with pytest.raises(LockTimeout):
                await reader.get_or_load("k", Loads("unlocked"), ttl=60)
        elif policy == "load":
            assert await reader.get_or_load("k", Loads("unlocked"), ttl=60) == "unlocked"
        else:  # the write invalidated "old": nothing stale is left to serve, so it loads
            assert await reader.get_or_load("k", Loads("unlocked"), ttl=60) == "unlocked"
    assert reader.stats().wait_timeouts == 1


@pytest.mark.slow
async def test_the_stale_policy_serves_the_last_value(make: Make) -> None:
    filler = make(lease=5)
    reader = make(wait_timeout=0.3, on_timeout="stale")
    assert await reader.get_or_load("k", Loads("old"), ttl=0.2) == "old"
    await asyncio.sleep(0.3)  # the subject: the entry's expiry (kept past it for timeouts)
    gate = threading.Event()
    slow = Loads("new", gate=gate)
    filling = asyncio.ensure_future(filler.get_or_load("k", slow, ttl=60))
    await started(slow)
    try:
        assert await reader.get_or_load("k", Loads("unlocked"), ttl=60) == "old"
    finally:
        gate.set()
    assert await filling == "new"
    assert reader.stats().stale_served == 1


async def test_refresh_loads_now(make: Make) -> None:
    guard = make()
    assert await guard.get_or_load("k", Loads("v1"), ttl=60) == "v1"
    assert await guard.refresh("k", Loads("v2"), ttl=60) == "v2"
    assert await guard.peek("k") == "v2"


async def test_a_loader_reading_its_own_key_fails_at_once(make: Make) -> None:
    guard = make(wait_timeout=30)
    if guard.kind == "async":

        async def inner() -> Any:
            return await guard.guard.get_or_load("k", Loads("x"), ttl=60)  # type: ignore[misc]

    else:

        def inner() -> Any:
            return guard.guard.get_or_load("k", Loads("x"), ttl=60)

    with pytest.raises(RecursiveLoadError):
        await guard.get_or_load("k", inner, ttl=60)


async def test_redis_down_bypasses_or_raises(make: Make) -> None:
    down = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    bypass = make(url=down, on_backend_error="bypass")
    assert await bypass.get_or_load("k", Loads("direct"), ttl=60) == "direct"
    assert bypass.stats().backend_errors >= 1
    raising = make(url=down, on_backend_error="raise")
    with pytest.raises(BackendUnavailable):
        await raising.get_or_load("k", Loads("direct"), ttl=60)
    with pytest.raises(BackendUnavailable):
        await raising.invalidate("k")


async def test_loaders_and_the_decorator(make: Make) -> None:
    guard = make()
    rows = {7: {"id": 7, "name": "Soups"}}
    loader = guard.loader(key="menu:{menu_id}", load=lambda menu_id: rows[menu_id], ttl=60)
    assert await loader.get(7) == {"id": 7, "name": "Soups"}
    assert await loader.peek(7) == {"id": 7, "name": "Soups"}
    rows[7] = {"id": 7, "name": "Salads"}
    await loader.invalidate(7)
    assert await loader.get(7) == {"id": 7, "name": "Salads"}

    calls: list[int] = []

    @guard.decorate(key="menu:list", ttl=60)
    def list_menus() -> list[int]:
        calls.append(1)
        return [7]

    assert await list_menus() == [7]
    assert await list_menus() == [7]
    assert calls == [1]
    await list_menus.invalidate()
    assert await list_menus.peek() is MISSING


async def test_a_waiter_in_another_process_is_woken_by_the_announcement(
    make: Make, client: redis.Redis
) -> None:
    """Another guard on its own client (another process's worth) waits for the
    fill with every timer a minute long: only the fill's announcement wakes it."""
    filler = make(lease=60)
    waiter = make(lease=60, wait_timeout=120, on_timeout="raise")
    waiter.guard._state.wait_backoff = NO_TIMER_WAKE_UP
    gate = threading.Event()
    slow = Loads("filled", gate=gate)
    filling = asyncio.ensure_future(filler.get_or_load("k", slow, ttl=60))
    await started(slow)
    with waiting_in() as waits:  # the waiter subscribed, looked again, and waits
        waiting = asyncio.ensure_future(waiter.get_or_load("k", Loads("waiter"), ttl=60))
        assert await asyncio.to_thread(waits.wait, 10)
    assert subscribers(client, waiter.keys("k").released_channel) >= 1
    gate.set()
    assert await asyncio.wait_for(waiting, 20) == "filled"
    assert await filling == "filled"


# -- sync and asyncio side by side -------------------------------------------------------


@pytest.mark.parametrize("first", KINDS)
async def test_sync_and_async_processes_load_a_cold_key_once(
    make: Make, first: str, client: redis.Redis
) -> None:
    second = "async" if first == "sync" else "sync"
    a, b = make(kind=first), make(kind=second)
    gate = threading.Event()
    loads = Loads("once", gate=gate)
    leader = asyncio.ensure_future(a.get_or_load("k", loads, ttl=60))
    await started(loads)
    others = [asyncio.ensure_future(g.get_or_load("k", loads, ttl=60)) for g in (a, b) * 10]
    # The other process's callers wait on the key's channel before the load ends.
    assert await asyncio.to_thread(
        wait_until, lambda: subscribers(client, b.keys("k").released_channel) >= 1, 10
    )
    gate.set()
    assert await leader == "once"
    assert await asyncio.gather(*others) == ["once"] * 20
    assert loads.calls == 1


async def test_a_sync_write_invalidates_what_async_readers_see(make: Make) -> None:
    sync, aio = make(kind="sync"), make(kind="async")
    assert await aio.get_or_load("k", Loads("v1"), ttl=60) == "v1"
    async with sync.write("k"):
        pass
    assert await aio.peek("k") is MISSING
    assert await aio.get_or_load("k", Loads("v2"), ttl=60) == "v2"
    assert await sync.peek("k") == "v2"


async def test_an_async_write_excludes_a_sync_fill(make: Make, client: redis.Redis) -> None:
    sync, aio = make(kind="sync", lease=5), make(kind="async")
    async with aio.write("k"):
        read = asyncio.ensure_future(sync.get_or_load("k", Loads("after"), ttl=60))
        assert await asyncio.to_thread(
            wait_until, lambda: subscribers(client, sync.keys("k").released_channel) >= 1, 10
        )
        assert not read.done()
    assert await read == "after"


def test_the_sync_test_face_calls_real_threads() -> None:
    """The sync face really runs the blocking guard off the loop (else the
    concurrency tests above would run callers one by one)."""
    seen: set[int] = set()

    async def main() -> None:
        guard = Guard("sync", object())  # type: ignore[arg-type]
        await asyncio.gather(
            *(guard._call(lambda: seen.add(threading.get_ident())) for _ in range(8))
        )

    asyncio.run(main())
    assert threading.get_ident() not in seen


async def test_time_is_not_asserted(make: Make) -> None:
    """A smoke test that the fixture builds the parametrised kind."""
    guard = make()
    assert isinstance(guard.guard, CacheGuard if guard.kind == "sync" else AsyncCacheGuard)
    assert time.monotonic() > 0


async def test_a_loaders_own_oserror_is_its_error_not_redis_being_down(make: Make) -> None:
    # OSError and redis.ConnectionError are how the client says Redis is down; raised
    # by the loader they are the loader's: raised once, not a bypass that loads again.
    guard = make()
    calls: list[int] = []

    def load() -> Any:
        calls.append(1)
        raise FileNotFoundError("menu.json")

    with pytest.raises(FileNotFoundError, match=r"menu\.json"):
        await guard.get_or_load("k", load, ttl=60)
    assert calls == [1]
    stats = guard.stats()
    assert (stats.load_errors, stats.backend_errors) == (1, 0)
    assert await guard.peek("k") is MISSING

    def lost_its_own_redis() -> Any:
        calls.append(2)
        raise redis.ConnectionError("the loader's other Redis")

    with pytest.raises(redis.ConnectionError, match="other Redis"):
        await guard.refresh("k", lost_its_own_redis, ttl=60)
    assert calls == [1, 2]
    assert guard.stats().backend_errors == 0


REFUSALS = (
    redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"),
    redis.exceptions.TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot"),
    redis.exceptions.MasterDownError("MASTERDOWN Link with MASTER is down"),
    redis.exceptions.ReadOnlyError("READONLY You can't write against a read only replica."),
    redis.exceptions.SlotNotCoveredError("no node serves slot 866"),
)


@pytest.mark.parametrize("refusal", REFUSALS, ids=lambda e: type(e).__name__)
async def test_a_deployment_in_transition_is_redis_down_not_a_corrupt_entry(
    make: Make, refusal: Exception
) -> None:
    # What a cluster or a failing-over master answers while a failover runs: under
    # "bypass" the loader's value, under "raise" BackendUnavailable; never a raw
    # redis-py error, never a corrupt entry, and a write is refused cleanly.
    bypass, raising = make(on_backend_error="bypass"), make(on_backend_error="raise")
    for guard in (bypass, raising):
        client = guard.guard.client

        def refuse(*args: Any, **options: Any) -> Any:
            raise refusal

        async def refuse_async(*args: Any, **options: Any) -> Any:
            raise refusal

        refused = refuse if guard.kind == "sync" else refuse_async
        client.get = refused  # type: ignore[method-assign]
        client.execute_command = refused  # type: ignore[method-assign]
        client.pipeline = refuse  # type: ignore[method-assign]  # script batches
    assert await bypass.get_or_load("k", lambda: "loaded", ttl=60) == "loaded"
    with pytest.raises(BackendUnavailable) as caught:
        await raising.get_or_load("k", lambda: "loaded", ttl=60)
    assert caught.value.__cause__ is refusal
    with pytest.raises(BackendUnavailable):
        await bypass.invalidate("k")
    for guard in (bypass, raising):
        stats = guard.stats()
        assert stats.corrupt_entries == 0
        assert stats.backend_errors >= 1


async def test_an_unconfirmed_invalidation_fails_the_write_before_its_body(make: Make) -> None:
    # This Redis has no replica: WAIT 1 can never be satisfied. The write fails before
    # its body runs (the database is not touched), and so does a plain invalidate: on
    # one server already at its invalidation number, which must be confirmed too.
    guard = make(confirm_replicas=1, confirm_timeout=0.05)
    assert await guard.get_or_load("k", lambda: "cached", ttl=60) == "cached"
    ran: list[str] = []
    with pytest.raises(WriteNotConfirmed, match="0 of 1 replica"):
        async with guard.write("k"):
            ran.append("body")
    assert ran == []
    with pytest.raises(WriteNotConfirmed):
        await guard.invalidate("k")
    assert guard.stats().backend_errors == 2
    # The write released its lock: a write without confirmation goes through.
    async with make().write("k"):
        ran.append("unconfirmed write")
    assert ran == ["unconfirmed write"]


async def test_a_write_failing_in_the_lock_layer_counts_toward_the_circuit(make: Make) -> None:
    # Nothing listens on port 1: the write's lock script fails. It must count like
    # any Redis failure (else a half-open circuit's probe would never report back).
    guard = make(url="redis://127.0.0.1:1/0", breaker_failures=1, breaker_cooldown=60)
    with pytest.raises(BackendUnavailable):
        async with guard.write("k"):
            pass
    assert guard.stats().backend_errors == 1
    assert guard.guard._state.breaker("k").state == "open"


# -- what a guard's state says and keeps (issue #25 review) ----------------------------------


async def test_a_closed_guard_names_itself(make: Make) -> None:
    guard = make()
    await guard.close()
    front = type(guard.guard).__name__  # CacheGuard or AsyncCacheGuard, not its state
    with pytest.raises(GuardClosed, match=f"^this {front} is closed"):
        await guard.get_or_load("k", Loads(), ttl=60)
    with pytest.raises(GuardClosed, match=f"^this {front} is closed"):
        guard.guard.rwlock("k")


@pytest.mark.parametrize("none_ttl", [-1, 0, True, "x", float("nan"), 1e12])
async def test_a_bad_none_ttl_is_refused_before_the_loader_runs(make: Make, none_ttl: Any) -> None:
    """Miss or hit, get_or_load and refresh: none_ttl is checked as ttl is (as
    CacheLoader checks it), before anything is loaded or stored."""
    guard = make()
    loads = Loads(None)
    await guard.get_or_load("warm", Loads("v"), ttl=60)  # a hit takes the hit path
    for name in ("cold", "warm"):
        with pytest.raises((ValueError, TypeError), match="none_ttl"):
            await guard.get_or_load(name, loads, ttl=60, none_ttl=none_ttl)
    with pytest.raises((ValueError, TypeError), match="none_ttl"):
        await guard.refresh("cold", loads, ttl=60, none_ttl=none_ttl)
    assert loads.calls == 0
    assert len(guard.guard._state.flights) == 0  # a refused read leads no flight
    assert await guard.get_or_load("cold", loads, ttl=60, none_ttl=5) is None  # good: loads


def test_a_dropped_guard_is_freed_at_once(redis_url: str, namespace: str) -> None:
    """A guard's state keeps no reference to its guard: dropped, a guard is freed
    without waiting for the garbage collector (which a busy process may run late)."""
    import gc
    import weakref

    made = [
        CacheGuard(redis.Redis.from_url(redis_url), namespace=namespace),
        AsyncCacheGuard(redis.asyncio.Redis.from_url(redis_url), namespace=namespace),
    ]
    refs = [weakref.ref(guard) for guard in made]
    gc.disable()
    try:
        del made
        assert [ref() for ref in refs] == [None, None]
    finally:
        gc.enable()
