"""outage_ttl, stale_if_error and the gutter, one guarantee at a time, for both guards.

Each test owns its Redis servers (a primary, and a gutter when it needs one:
throwaway ``redis-server`` processes, never the shared one) and kills or
restarts them as the outage it needs; ``tests/faults/test_outage_modes.py``
has the other outage kinds (a SIGSTOPped server, a black-holed address, a
cluster shard, a Sentinel failover) and the multi-process bounds.

Time is the subject here (a value seen at most so many seconds ago), so the
guards run on a :class:`Clock` the test moves forward: every window is crossed
by a jump, never by a sleep, and "within the window" means a few milliseconds
into a 30 s one.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis
from prometheus_client import CollectorRegistry

from cacheguard import BackendUnavailable
from cacheguard.integrations.prometheus import UNTEMPLATED, CacheMetrics
from cacheguard.testing import OwnedRedisServer
from tests.outage_support import (
    FAST_FAIL,
    NAMESPACE,
    WINDOW,
    Clock,
    Counted,
    Make,
    gutter_commands,
    many,
    read,
    reset_stats,
    value_key,
)
from tests.test_guard_both_drivers import Loads, started

pytest_plugins = ["tests.deployment_fixtures", "tests.outage_fixtures"]

# -- outage_ttl ---------------------------------------------------------------------------


async def test_outage_reuse_serves_a_value_seen_within_outage_ttl_then_loads_once_more(
    make: Make, primary: OwnedRedisServer, clock: Clock
) -> None:
    guard = make(primary.url, outage_ttl=WINDOW)
    menu = Counted("menu")
    assert await read(guard, menu) == "menu-1"  # loaded and stored: seen now
    primary.kill()
    assert await many(guard, menu) == ["menu-1"] * 8
    assert menu.calls == 1  # no load while the value is at most outage_ttl old
    assert guard.stats().outage_reuses >= 1
    clock.advance(WINDOW - 1)
    assert await read(guard, menu) == "menu-1"
    clock.advance(2)  # now seen more than outage_ttl ago: load, once
    assert await many(guard, menu) == ["menu-2"] * 8
    assert menu.calls == 2
    assert guard.stats().bypasses == 1
    clock.advance(WINDOW - 1)  # the load was seen at the jump: still within
    assert await read(guard, menu) == "menu-2"
    assert menu.calls == 2


async def test_concurrent_callers_past_the_window_load_once(
    make: Make, primary: OwnedRedisServer, clock: Clock
) -> None:
    guard = make(primary.url, outage_ttl=WINDOW)
    assert await read(guard, Counted("menu")) == "menu-1"
    primary.kill()
    clock.advance(WINDOW + 1)
    gate = threading.Event()
    slow = Loads("menu-slow", gate=gate)
    callers = [asyncio.ensure_future(read(guard, slow, "menu")) for _ in range(12)]
    await started(slow)
    gate.set()
    assert await asyncio.gather(*callers) == ["menu-slow"] * 12
    # One load: the callers that came after it reuse what it loaded.
    assert await read(guard, slow, "menu") == "menu-slow"
    assert slow.calls == 1


async def test_a_value_reused_keeps_the_age_it_was_first_seen_with(
    make: Make, primary: OwnedRedisServer, clock: Clock
) -> None:
    guard = make(primary.url, outage_ttl=10)
    menu = Counted("menu")
    assert await read(guard, menu) == "menu-1"
    primary.kill()
    for step in (6, 2, 1.9):  # reused at 6, 8 and 9.9 s: never seen anew
        clock.advance(step)
        assert await read(guard, menu) == "menu-1"
    clock.advance(0.6)  # 10.5 s after it was loaded
    assert await read(guard, menu) == "menu-2"


async def test_a_write_or_invalidation_here_drops_the_name_from_reuse(
    make: Make, primary: OwnedRedisServer
) -> None:
    guard = make(primary.url, outage_ttl=WINDOW)
    loads = {name: Counted(name) for name in ("written", "invalidated", "prefixed", "kept")}
    for load in loads.values():
        assert await read(guard, load) == f"{load.name}-1"
    primary.kill()
    with pytest.raises(BackendUnavailable):
        async with guard.write("written"):
            pytest.fail("the write's body ran with Redis down")
    with pytest.raises(BackendUnavailable):
        await guard.invalidate("invalidated")
    with pytest.raises(BackendUnavailable):
        await guard.invalidate_prefix("pre")
    # Each write dropped its names: the next read loads (once), the other name is reused.
    for name in ("written", "invalidated", "prefixed"):
        assert await many(guard, loads[name], 4) == [f"{name}-2"] * 4
    assert await read(guard, loads["kept"]) == "kept-1"
    assert [load.calls for load in loads.values()] == [2, 2, 2, 1]


async def test_a_write_here_during_a_load_keeps_that_loads_value_out_of_reuse(
    make: Make, primary: OwnedRedisServer
) -> None:
    # The load began before the write (its value may predate the write's commit): it
    # answers its own callers, but this process must not reuse it afterwards.
    guard = make(primary.url, outage_ttl=WINDOW, stale_if_error=WINDOW)
    primary.kill()
    gate = threading.Event()
    before = Loads("loaded before the write", gate=gate)
    loading = asyncio.ensure_future(read(guard, before, "menu"))
    await started(before)
    with pytest.raises(BackendUnavailable):
        async with guard.write("menu"):
            pytest.fail("the write's body ran with Redis down")
    gate.set()
    assert await loading == "loaded before the write"
    after = Counted("menu")
    assert await read(guard, after) == "menu-1"
    assert await read(guard, after) == "menu-1"  # this one is reused
    assert after.calls == 1


async def test_after_recovery_values_come_from_redis_not_from_reuse(
    make: Make, primary: OwnedRedisServer, clock: Clock
) -> None:
    guard = make(primary.url, outage_ttl=WINDOW)
    menu = Counted("menu")
    assert await read(guard, menu) == "menu-1"
    primary.kill()
    assert await read(guard, menu) == "menu-1"
    primary.start()  # empty
    peer = make(primary.url)  # another process stores a newer value
    assert await peer.get_or_load("menu", lambda: "from redis", ttl=600) == "from redis"
    clock.advance(FAST_FAIL["breaker_cooldown"])  # the breaker's probe may go
    assert await read(guard, menu) == "from redis"  # well within outage_ttl of menu-1
    assert await many(guard, menu) == ["from redis"] * 8
    assert menu.calls == 1
    # Noted again from Redis: the next outage reuses the newer value.
    primary.kill()
    assert await read(guard, menu) == "from redis"


async def test_reuse_is_off_by_default(make: Make, primary: OwnedRedisServer) -> None:
    guard = make(primary.url)
    menu = Counted("menu")
    assert await read(guard, menu) == "menu-1"
    primary.kill()
    assert await read(guard, menu) == "menu-2"
    assert await read(guard, menu) == "menu-3"
    assert guard.stats().outage_reuses == 0


# -- stale_if_error -----------------------------------------------------------------------


async def test_a_failing_loader_is_answered_by_the_last_value_seen_within_stale_if_error(
    make: Make, primary: OwnedRedisServer, clock: Clock
) -> None:
    guard = make(primary.url, stale_if_error=WINDOW)
    registry = CollectorRegistry()
    metrics = CacheMetrics(registry)
    metrics.instrument(guard.guard)
    peer = make(primary.url)
    menu = Counted("menu")
    assert await read(guard, menu) == "menu-1"
    await peer.invalidate("menu")  # another process's write: this one keeps its memory
    menu.failing = True
    assert await many(guard, menu, 4) == ["menu-1"] * 4
    stale = guard.stats().stale_on_error
    assert stale >= 1
    labels = {"namespace": NAMESPACE, "template": UNTEMPLATED}
    assert registry.get_sample_value("cacheguard_stale_on_error_total", labels) == stale
    clock.advance(WINDOW + 1)  # seen too long ago: the loader's error
    with pytest.raises(LookupError, match="cannot load menu"):
        await read(guard, menu)
    assert guard.stats().stale_on_error == stale
    metrics.close()


async def test_backend_unavailable_under_raise_is_answered_by_the_last_value_seen(
    make: Make, primary: OwnedRedisServer, clock: Clock
) -> None:
    guard = make(primary.url, stale_if_error=WINDOW, on_backend_error="raise")
    menu = Counted("menu")
    assert await read(guard, menu) == "menu-1"
    primary.kill()
    assert await many(guard, menu, 4) == ["menu-1"] * 4
    assert guard.stats().stale_on_error >= 1
    with pytest.raises(BackendUnavailable):
        await read(guard, Counted("never-seen"))
    clock.advance(WINDOW + 1)
    with pytest.raises(BackendUnavailable):
        await read(guard, menu)
    assert menu.calls == 1


async def test_a_value_served_stale_keeps_its_age(
    make: Make, primary: OwnedRedisServer, clock: Clock
) -> None:
    # Served at 4, 7 and 9.5 s after it was seen: each serve leaves its time as it was,
    # so 10.5 s after it was seen it is too old, however often it was served.
    guard = make(primary.url, stale_if_error=10, on_backend_error="raise")
    menu = Counted("menu")
    assert await read(guard, menu) == "menu-1"
    primary.kill()
    for step in (4, 3, 2.5):
        clock.advance(step)
        assert await read(guard, menu) == "menu-1"
    clock.advance(1)
    with pytest.raises(BackendUnavailable):
        await read(guard, menu)


async def test_the_fallback_memory_keeps_fallback_maxsize_names(
    make: Make, primary: OwnedRedisServer
) -> None:
    guard = make(primary.url, stale_if_error=WINDOW, on_backend_error="raise", fallback_maxsize=3)
    loads = [Counted(f"menu:{i}") for i in range(5)]
    for load in loads:
        assert await read(guard, load) == f"{load.name}-1"
    primary.kill()
    for _ in range(3):  # served stale again and again: still the same three names
        for load in loads[2:]:
            assert await read(guard, load) == f"{load.name}-1"
    for load in loads[:2]:  # the oldest two were evicted
        with pytest.raises(BackendUnavailable):
            await read(guard, load)
    assert len(guard.guard._state.last_seen) == 3  # type: ignore[arg-type]


# -- the gutter ---------------------------------------------------------------------------


async def test_the_gutter_serves_one_load_across_guards_with_entries_capped_at_gutter_ttl(
    make: Make, primary: OwnedRedisServer, gutter: OwnedRedisServer, clock: Clock
) -> None:
    # Settings that would keep an entry longer than gutter_ttl on the primary (a jitter
    # drawn at its top, a stale window, the stale timeout policy): not in the gutter.
    settings = {
        "gutter_ttl": 3,
        "ttl_jitter": 0.5,
        "stale_ttl": 60,
        "on_timeout": "stale",
        "rng": lambda: 0.999,
    }
    one = make(primary.url, gutter=gutter.url, **settings)
    two = make(primary.url, gutter=gutter.url, **settings)  # another process
    primary.kill()
    gate = threading.Event()
    slow = Loads("from the gutter's fill", gate=gate)
    first = asyncio.ensure_future(read(one, slow, "menu"))
    await started(slow)
    others = [asyncio.ensure_future(read(two, slow, "menu")) for _ in range(4)]
    gate.set()
    assert await asyncio.gather(first, *others) == ["from the gutter's fill"] * 5
    assert slow.calls == 1  # one load across both guards: the gutter's single flight
    assert one.stats().loads + two.stats().loads == 1  # the gutter's load, counted here
    assert one.stats().gutter_reads + two.stats().gutter_reads >= 2
    with redis.Redis(port=gutter.port) as direct:
        lifetime = direct.pttl(value_key("menu", f"{NAMESPACE}-gutter"))
    assert 0 < lifetime <= 3000
    assert await read(two, slow, "menu") == "from the gutter's fill"
    assert slow.calls == 1
    clock.advance(3.5)  # the gutter's entry is over (for the guards' clocks too)
    assert await read(two, slow, "menu") == "from the gutter's fill"
    assert slow.calls == 2


async def test_a_gutter_down_too_falls_through_to_reuse_then_on_backend_error(
    make: Make, primary: OwnedRedisServer, gutter: OwnedRedisServer
) -> None:
    reusing = make(primary.url, gutter=gutter.url, outage_ttl=WINDOW)
    bypassing = make(primary.url, gutter=gutter.url)
    raising = make(primary.url, gutter=gutter.url, on_backend_error="raise")
    menu = Counted("menu")
    assert await read(reusing, menu) == "menu-1"
    primary.kill()
    gutter.kill()
    assert await read(reusing, menu) == "menu-1"  # reuse comes first, the gutter never asked
    assert reusing.stats().outage_reuses == 1
    assert await read(bypassing, menu) == "menu-2"  # the gutter's error falls through
    assert bypassing.stats().bypasses == 1
    assert bypassing.stats().gutter_reads == 0
    with pytest.raises(BackendUnavailable):
        await read(raising, menu)
    assert menu.calls == 2


async def test_the_gutter_is_never_touched_while_the_primary_is_up(
    make: Make, primary: OwnedRedisServer, gutter: OwnedRedisServer, clock: Clock
) -> None:
    guard = make(primary.url, gutter=gutter.url, outage_ttl=WINDOW, stale_if_error=WINDOW)
    reset_stats(gutter)
    menu = Counted("menu")
    assert await read(guard, menu) == "menu-1"  # a miss and a fill
    assert await read(guard, menu) == "menu-1"  # a hit
    async with guard.write("menu"):
        pass
    await guard.invalidate("menu")
    await guard.invalidate_prefix("me")
    assert await guard.refresh("menu", menu, ttl=600) == "menu-2"
    assert await read(guard, menu) == "menu-2"  # a hit: seen
    menu.failing = True
    await make(primary.url).invalidate("menu")  # another process's write
    assert await read(guard, menu) == "menu-2"  # stale_if_error
    menu.failing = False
    assert gutter_commands(gutter) == {}
    # The primary down, then back: reads go to it again, and the gutter is left alone.
    primary.kill()
    clock.advance(WINDOW + 1)
    assert await read(guard, menu) == "menu-3"  # through the gutter
    assert guard.stats().gutter_reads == 1
    primary.start()
    clock.advance(FAST_FAIL["breaker_cooldown"])
    reset_stats(gutter)
    assert await read(guard, menu) == "menu-4"  # the primary is empty: a fill there
    assert await read(guard, menu) == "menu-4"
    assert guard.stats().gutter_reads == 1
    assert gutter_commands(gutter) == {}
    with redis.Redis(port=primary.port) as direct:
        assert direct.exists(value_key("menu"))
