"""What a guard falls back on while Redis is unreachable: the memory of values seen
(``outage_ttl``, ``stale_if_error``), the gutter, and the outbox replay that runs
before a value is served from Redis again (cache/outage/fallback.py, cache/outage/gutter.py,
cache/outage/recovery.py). Both guards; Redis made unreachable for real: a port nothing
listens on (connection refused) or a proxy that swallows every byte. The
multi-process bounds under killed, paused and black-holed servers are in
tests/faults/test_outage_modes.py.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis

from cacheguard import BackendUnavailable, CacheGuard, RecursiveLoadError, SerializationError
from cacheguard.cache.outage.fallback import NOT_SEEN, LastSeen, from_loader, mark_from_loader
from cacheguard.cache.outage.recovery import RETRY_DELAY, Recovery, ReplayFailed
from cacheguard.cache.watermark import note_snapshot
from cacheguard.testing import free_port
from tests.faults.proxy import TcpProxy
from tests.guard_drivers import KINDS, Guard, guard_from_url
from tests.helpers import wait_until

Make = Callable[..., Guard]


class Clock:
    """time.monotonic moved forward at will: everything the guard times ages at once."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


@pytest.fixture
def dead_url() -> str:
    """A Redis URL nothing listens on: every connect is refused at once."""
    return f"redis://127.0.0.1:{free_port()}/0"


@pytest.fixture
def proxy(redis_url: str) -> Iterator[TcpProxy]:
    port = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs["port"]
    proxy = TcpProxy(port)
    yield proxy
    proxy.close()


@pytest.fixture(params=KINDS)
async def make(request: pytest.FixtureRequest, namespace: str) -> AsyncIterator[Make]:
    made: list[Guard] = []

    def build(url: str, **settings: Any) -> Guard:
        settings.setdefault("namespace", namespace)
        settings.setdefault("ttl_jitter", 0)
        settings.setdefault("connect_timeout", 0.5)
        settings.setdefault("breaker_failures", 1)
        settings.setdefault("breaker_cooldown", 60.0)  # stays open: no probe mid-test
        made.append(Guard(request.param, guard_from_url(request.param, url, **settings)))
        return made[-1]

    yield build
    for guard in made:
        if guard.kind == "sync":
            guard.guard.close()
        else:
            await guard.guard.aclose()  # type: ignore[union-attr]


def counting(values: Iterator[Any] | None = None) -> tuple[Callable[[], Any], list[int]]:
    """A loader returning 1, 2, 3... (or ``values``), and the list of its calls."""
    calls: list[int] = []
    source = values if values is not None else itertools.count(1)

    def load() -> Any:
        calls.append(1)
        return next(source)

    return load, calls


def failing() -> Any:
    raise RuntimeError("the database is down")


# -- the memory, alone -------------------------------------------------------------------


def test_last_seen_answers_within_its_age_only() -> None:
    now = [100.0]
    seen = LastSeen(maxsize=10, timer=lambda: now[0])
    seen.note("a", "v1", seen.ticket("a"))
    now[0] += 5.0
    assert seen.within("a", 5.0) == "v1"
    assert seen.within("a", 4.9) is NOT_SEEN
    assert seen.within("a", 0.0) is NOT_SEEN  # a setting of 0 is off
    assert seen.within("b", 60.0) is NOT_SEEN


def test_last_seen_is_bounded_and_forgets_what_is_written() -> None:
    seen = LastSeen(maxsize=3, timer=lambda: 0.0)
    for name in ("a", "b", "c", "d"):
        seen.note(name, name, seen.ticket(name))
    assert len(seen) == 3
    assert seen.within("a", 1.0) is NOT_SEEN  # the least recently seen went first
    seen.note("b", "b2", seen.ticket("b"))  # seen again: now the newest
    seen.note("e", "e", seen.ticket("e"))
    assert seen.within("b", 1.0) == "b2"
    assert seen.within("c", 1.0) is NOT_SEEN
    seen.drop(["b"])
    assert seen.within("b", 1.0) is NOT_SEEN
    seen.note("menu:1", 1, seen.ticket("menu:1"))
    seen.note("menu:2", 2, seen.ticket("menu:2"))
    seen.drop_prefix("menu:")
    assert seen.within("menu:1", 1.0) is NOT_SEEN
    assert seen.within("e", 1.0) == "e"


def test_loader_errors_are_told_from_the_cache_s_own() -> None:
    error = RuntimeError("db")
    assert not from_loader(error)
    mark_from_loader(error)
    assert from_loader(error)


# -- replay before serving, alone ------------------------------------------------------------


def test_recovery_is_pending_from_the_first_hook_until_a_run_succeeds() -> None:
    clock = Clock()
    recovery = Recovery(timer=clock)
    recovery.mark()
    assert not recovery.pending  # nothing to replay without hooks
    ran: list[int] = []
    failures = [RuntimeError("the outbox is unreadable")]

    def hook() -> None:
        ran.append(1)
        if failures:
            raise failures.pop()

    recovery.add(hook)
    assert recovery.pending  # a process may start after an outage: replay first
    with pytest.raises(RuntimeError):
        recovery.run()
    assert recovery.pending  # a failed run leaves it pending
    clock.offset += RETRY_DELAY
    recovery.run()
    assert not recovery.pending
    assert len(ran) == 2
    recovery.run()
    assert len(ran) == 2  # nothing pending: nothing run
    recovery.mark()
    assert recovery.pending


def test_a_failure_seen_during_a_run_keeps_the_guard_pending() -> None:
    recovery = Recovery()
    recovery.add(recovery.mark)  # Redis failed again while replaying
    recovery.run()
    assert recovery.pending


def test_concurrent_callers_wait_for_one_run() -> None:
    recovery = Recovery()
    started, release = threading.Event(), threading.Event()
    runs: list[int] = []

    def hook() -> None:
        runs.append(1)
        started.set()
        assert release.wait(10)

    recovery.add(hook)
    first = threading.Thread(target=recovery.run)
    first.start()
    assert started.wait(10)
    others = [threading.Thread(target=recovery.run) for _ in range(4)]
    for thread in others:
        thread.start()
    release.set()
    for thread in [first, *others]:
        thread.join(10)
    assert runs == [1]
    assert not recovery.pending


async def test_the_asyncio_run_awaits_its_hooks() -> None:
    recovery = Recovery()
    ran: list[int] = []

    async def hook() -> None:
        await asyncio.sleep(0)
        ran.append(1)

    recovery.add(hook)
    await asyncio.gather(recovery.arun(), recovery.arun(), recovery.arun())
    assert ran == [1]
    assert not recovery.pending


class CountingLock:
    """A lock that counts the threads waiting to enter it (Recovery's run lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mutex = threading.Lock()
        self.waiting = 0

    def __enter__(self) -> None:
        with self._mutex:
            self.waiting += 1
        self._lock.acquire()
        with self._mutex:
            self.waiting -= 1

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_callers_queued_behind_a_failed_run_take_its_failure() -> None:
    recovery = Recovery(retry_delay=0)  # no delay: only the queueing is tested
    entry = CountingLock()
    recovery._running = entry  # type: ignore[assignment]
    started, release = threading.Event(), threading.Event()
    runs: list[int] = []

    def hook() -> None:
        runs.append(1)
        started.set()
        assert release.wait(10)
        raise RuntimeError("the database is unreachable")

    recovery.add(hook)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            recovery.run()
        except Exception as exc:
            errors.append(exc)

    first = threading.Thread(target=run)
    first.start()
    assert started.wait(10)
    queued = [threading.Thread(target=run) for _ in range(4)]
    for thread in queued:
        thread.start()
    assert wait_until(lambda: entry.waiting == 4, 10)
    release.set()
    for thread in [first, *queued]:
        thread.join(10)
    assert runs == [1]  # one attempt for the five callers
    assert sorted(type(e).__name__ for e in errors) == ["ReplayFailed"] * 4 + ["RuntimeError"]
    taken = [e for e in errors if isinstance(e, ReplayFailed)]
    assert all(isinstance(e.__cause__, RuntimeError) for e in taken)
    assert recovery.pending
    with pytest.raises(RuntimeError):  # a later caller tries again
        recovery.run()
    assert runs == [1, 1]


def test_after_a_failed_run_callers_fail_fast_until_the_retry_delay_passed() -> None:
    clock = Clock()
    recovery = Recovery(retry_delay=2.0, timer=clock)
    runs: list[int] = []
    failing = [True]

    def hook() -> None:
        runs.append(1)
        if failing[0]:
            raise RuntimeError("the database is unreachable")

    recovery.add(hook)
    with pytest.raises(RuntimeError):
        recovery.run()
    clock.offset += 1.9
    with pytest.raises(ReplayFailed, match="the database is unreachable") as refused:
        recovery.run()
    assert isinstance(refused.value.__cause__, RuntimeError)
    assert runs == [1]  # not tried within the delay
    clock.offset += 0.2
    with pytest.raises(RuntimeError):
        recovery.run()
    assert runs == [1, 1]
    with pytest.raises(ReplayFailed):
        recovery.run()  # the delay starts again at each failure
    failing[0] = False
    clock.offset += 2.0
    recovery.run()
    assert runs == [1, 1, 1]
    assert not recovery.pending
    recovery.mark()  # a new outage: the old failure holds nobody back
    recovery.run()
    assert runs == [1, 1, 1, 1]


async def test_asyncio_callers_queued_behind_a_failed_run_take_its_failure() -> None:
    recovery = Recovery(retry_delay=0)  # no delay: only the queueing is tested
    release = asyncio.Event()
    runs: list[int] = []

    async def hook() -> None:
        runs.append(1)
        await release.wait()
        raise RuntimeError("the database is unreachable")

    recovery.add(hook)
    callers = [asyncio.ensure_future(recovery.arun()) for _ in range(5)]
    for _ in range(5):  # each runs to its wait: the first in the hook, the others queued
        await asyncio.sleep(0)
    assert runs == [1]
    release.set()
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert [type(r).__name__ for r in results] == ["RuntimeError"] + ["ReplayFailed"] * 4
    assert runs == [1]  # one attempt for the five callers
    with pytest.raises(RuntimeError):  # a later caller tries again (the hook fails at once)
        await recovery.arun()
    assert runs == [1, 1]


# -- outage_ttl ---------------------------------------------------------------------------


async def test_outage_ttl_reuses_a_value_loaded_while_redis_is_down(
    make: Make, dead_url: str
) -> None:
    clock = Clock()
    guard = make(dead_url, outage_ttl=1.0, timer=clock)
    load, calls = counting()
    assert await guard.get_or_load("menu:list", load, ttl=60) == 1
    assert await guard.get_or_load("menu:list", load, ttl=60) == 1
    assert calls == [1]
    assert guard.stats().outage_reuses == 1
    clock.offset += 1.01  # past outage_ttl: loaded again, then reused again
    assert await guard.get_or_load("menu:list", load, ttl=60) == 2
    assert await guard.get_or_load("menu:list", load, ttl=60) == 2
    assert len(calls) == 2


async def test_outage_ttl_off_loads_every_time(make: Make, dead_url: str) -> None:
    guard = make(dead_url)
    load, calls = counting()
    for _ in range(3):
        await guard.get_or_load("menu:list", load, ttl=60)
    assert len(calls) == 3
    assert guard.stats().bypasses == 3


@pytest.mark.slow
async def test_outage_ttl_reuses_a_hit_seen_before_redis_went_away(
    make: Make, proxy: TcpProxy, client: redis.Redis, namespace: str
) -> None:
    guard = make(proxy.url, outage_ttl=30.0, socket_timeout=0.3)
    other = CacheGuard(client, namespace=namespace)
    other.get_or_load("menu:7", lambda: "stored elsewhere", ttl=60)
    load, calls = counting()
    assert await guard.get_or_load("menu:7", load, ttl=60) == "stored elsewhere"  # a hit
    proxy.set_mode("blackhole")
    assert await guard.get_or_load("menu:7", load, ttl=60) == "stored elsewhere"
    assert calls == []


async def test_a_write_here_drops_the_name_from_reuse(make: Make, dead_url: str) -> None:
    guard = make(dead_url, outage_ttl=30.0)
    load, _calls = counting()
    await guard.get_or_load("menu:7", load, ttl=60)
    with pytest.raises(BackendUnavailable):
        await guard.invalidate("menu:7")  # Redis is down: but this process forgets it
    assert await guard.get_or_load("menu:7", load, ttl=60) == 2
    with pytest.raises(BackendUnavailable):
        await guard.invalidate_prefix("menu:")
    assert await guard.get_or_load("menu:7", load, ttl=60) == 3


async def test_a_refresh_loads_even_with_a_value_to_reuse(make: Make, dead_url: str) -> None:
    guard = make(dead_url, outage_ttl=30.0)
    load, _calls = counting()
    await guard.get_or_load("menu:7", load, ttl=60)
    assert await guard.refresh("menu:7", load, ttl=60) == 2


@pytest.mark.slow
async def test_values_are_served_from_redis_once_it_answers_again(
    make: Make, proxy: TcpProxy, client: redis.Redis, namespace: str
) -> None:
    clock = Clock()
    guard = make(proxy.url, outage_ttl=30.0, socket_timeout=0.3, breaker_cooldown=1.0, timer=clock)
    load, _calls = counting()
    assert await guard.get_or_load("menu:7", load, ttl=60) == 1
    proxy.set_mode("blackhole")
    assert await guard.get_or_load("menu:7", load, ttl=60) == 1
    proxy.set_mode("pass")
    proxy.drop_all()
    CacheGuard(client, namespace=namespace).invalidate("menu:7")  # a write elsewhere
    clock.offset += 1.01  # the circuit half-opens: the next call probes Redis
    assert await guard.get_or_load("menu:7", load, ttl=60) == 2  # not the reused 1


# -- stale_if_error ------------------------------------------------------------------------


async def test_a_failing_loader_is_answered_by_the_last_value_seen(
    make: Make, client: redis.Redis, redis_url: str, namespace: str
) -> None:
    clock = Clock()
    guard = make(redis_url, stale_if_error=10.0, timer=clock)
    assert await guard.get_or_load("menu:7", lambda: "good", ttl=60) == "good"
    client.delete(guard.keys("menu:7").value)  # gone (evicted, say), not written here
    assert await guard.get_or_load("menu:7", failing, ttl=60) == "good"
    assert guard.stats().stale_on_error == 1
    clock.offset += 10.01  # older than stale_if_error: the loader's error
    with pytest.raises(RuntimeError, match="database is down"):
        await guard.get_or_load("menu:7", failing, ttl=60)


async def test_a_value_served_stale_keeps_its_age(
    make: Make, client: redis.Redis, redis_url: str
) -> None:
    clock = Clock()
    guard = make(redis_url, stale_if_error=10.0, timer=clock)
    await guard.get_or_load("menu:7", lambda: "good", ttl=60)
    client.delete(guard.keys("menu:7").value)
    for _ in range(3):
        clock.offset += 3.0
        assert await guard.get_or_load("menu:7", failing, ttl=60) == "good"  # 3, 6, 9 s
    clock.offset += 3.0  # 12 s since it was seen: serving it did not make it younger
    with pytest.raises(RuntimeError):
        await guard.get_or_load("menu:7", failing, ttl=60)


@pytest.mark.slow
async def test_stale_if_error_answers_backend_unavailable_under_raise(
    make: Make, proxy: TcpProxy
) -> None:
    guard = make(proxy.url, stale_if_error=30.0, on_backend_error="raise", socket_timeout=0.3)
    assert await guard.get_or_load("menu:7", lambda: "good", ttl=60) == "good"
    proxy.set_mode("blackhole")
    assert await guard.get_or_load("menu:7", failing, ttl=60) == "good"
    with pytest.raises(BackendUnavailable):  # never seen: nothing to answer with
        await guard.get_or_load("menu:8", failing, ttl=60)


async def test_the_cache_s_own_errors_are_not_answered(
    make: Make, client: redis.Redis, redis_url: str
) -> None:
    guard = make(redis_url, stale_if_error=30.0)
    await guard.get_or_load("menu:7", lambda: "good", ttl=60)
    await guard.invalidate("menu:7")  # a write here: forgotten
    with pytest.raises(RuntimeError):
        await guard.get_or_load("menu:7", failing, ttl=60)
    await guard.get_or_load("menu:8", lambda: "good", ttl=60)
    client.delete(guard.keys("menu:8").value)
    with pytest.raises(SerializationError):  # a value the codec refuses: a bug, not an outage
        await guard.get_or_load("menu:8", object, ttl=60)
    assert guard.stats().stale_on_error == 0


# -- the gutter ----------------------------------------------------------------------------


async def test_fills_go_through_the_gutter_once_across_guards(
    make: Make, dead_url: str, redis_url: str, client: redis.Redis, namespace: str
) -> None:
    calls: list[int] = []
    release = threading.Event()
    loop_release = asyncio.Event()

    def slow() -> str:  # in a worker thread (sync guard)
        calls.append(1)
        assert release.wait(10)
        return "from the database"

    async def aslow() -> str:  # on the loop (asyncio guard)
        calls.append(1)
        await asyncio.wait_for(loop_release.wait(), 10)
        return "from the database"

    guards = [make(dead_url, gutter=redis_url, gutter_ttl=2.0) for _ in range(3)]
    load = slow if guards[0].kind == "sync" else aslow
    reads = [asyncio.ensure_future(g.get_or_load("menu:list", load, ttl=300)) for g in guards * 3]
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    release.set()
    loop_release.set()
    assert set(await asyncio.gather(*reads)) == {"from the database"}
    assert calls == [1]  # one load for 9 callers in 3 guards (3 lock owners)
    # Each guard's leaders read through the gutter (their followers share the value).
    assert all(g.stats().gutter_reads >= 1 for g in guards)
    assert sum(g.stats().loads for g in guards) == 1  # the gutter's load counted here
    key = guards[0].guard._state.gutter.keys("menu:list").value  # the gutter's own namespace
    assert 0 < client.pttl(key) <= 2000  # kept gutter_ttl, not the read's 300 s


async def test_a_gutter_that_is_down_too_falls_through(make: Make, dead_url: str) -> None:
    also_dead = f"redis://127.0.0.1:{free_port()}/0"
    guard = make(dead_url, gutter=also_dead)
    load, _calls = counting()
    assert await guard.get_or_load("menu:7", load, ttl=60) == 1
    assert guard.stats().gutter_reads == 0
    assert guard.stats().bypasses == 1
    raising = make(dead_url, gutter=also_dead, on_backend_error="raise")
    with pytest.raises(BackendUnavailable):
        await raising.get_or_load("menu:7", load, ttl=60)


async def test_the_gutter_is_not_used_while_the_primary_answers(
    make: Make, redis_url: str, dead_url: str
) -> None:
    guard = make(redis_url, gutter=dead_url)
    load, _calls = counting()
    assert await guard.get_or_load("menu:7", load, ttl=60) == 1
    assert await guard.get_or_load("menu:7", load, ttl=60) == 1
    assert guard.stats().gutter_reads == 0
    assert guard.stats().l2_hits == 1


def test_the_gutter_keeps_none_no_longer_than_gutter_ttl(
    redis_url: str, client: redis.Redis, namespace: str, dead_url: str
) -> None:
    with CacheGuard.from_url(
        dead_url, namespace=namespace, gutter=redis_url, gutter_ttl=1.5, none_ttl=600
    ) as guard:
        assert guard.get_or_load("menu:none", lambda: None, ttl=600) is None
        assert 0 < client.pttl(guard._state.gutter.keys("menu:none").value) <= 1500


def test_a_gutter_client_of_the_wrong_kind_is_refused(dead_url: str) -> None:
    import redis.asyncio

    with pytest.raises(TypeError, match="gutter"):
        CacheGuard.from_url(dead_url, gutter=redis.asyncio.Redis())


# -- the outbox replay before serving ------------------------------------------------------


async def test_a_read_replays_before_it_serves_from_redis(make: Make, redis_url: str) -> None:
    guard = make(redis_url)
    clock = Clock()
    guard.guard._state.recovery._timer = clock  # the retry delay's
    await guard.get_or_load("menu:7", lambda: "cached", ttl=60)
    order: list[str] = []
    failures = [RuntimeError("the outbox is unreadable")]

    def replay() -> None:
        order.append("replay")
        if failures:
            raise failures.pop()

    async def areplay() -> None:
        replay()

    guard.guard._state.recovery.add(replay if guard.kind == "sync" else areplay)

    def load() -> str:
        order.append("load")
        return "loaded"

    # The replay fails: nothing read from Redis is served; the loader answers.
    assert await guard.get_or_load("menu:7", load, ttl=60) == "loaded"
    assert order == ["replay", "load"]
    assert guard.stats().replay_failures == 1
    # Within the retry delay it is not tried again, and still nothing is served from Redis.
    assert await guard.get_or_load("menu:7", load, ttl=60) == "loaded"
    assert order == ["replay", "load", "load"]
    assert guard.stats().replay_failures == 2
    clock.offset += RETRY_DELAY
    assert await guard.get_or_load("menu:7", load, ttl=60) == "cached"
    assert order == ["replay", "load", "load", "replay"]
    assert await guard.get_or_load("menu:7", load, ttl=60) == "cached"
    assert order == ["replay", "load", "load", "replay"]  # done: not run again
    assert await guard.peek("menu:7") == "cached"


# -- coalescing stays linearizable while Redis is down ---------------------------------------


async def test_a_caller_joining_a_bypass_load_under_way_does_not_take_its_value(
    make: Make, dead_url: str
) -> None:
    """The load began before a write committed; a caller that started after the
    commit and joined that load must not get the older value: it loads again."""
    guard = make(dead_url)
    database = {"version": 1}
    started, release = threading.Event(), threading.Event()
    loop_release = asyncio.Event()
    first = [True]

    def read_row() -> int:
        version = database["version"]  # the snapshot this load sees
        if first[0]:
            first[0] = False
            started.set()
            assert release.wait(10)
        return version

    async def aread_row() -> int:
        version = database["version"]
        if first[0]:
            first[0] = False
            started.set()
            await asyncio.wait_for(loop_release.wait(), 10)
        return version

    load = read_row if guard.kind == "sync" else aread_row
    leader = asyncio.ensure_future(guard.get_or_load("menu:7", load, ttl=60))
    assert await asyncio.to_thread(started.wait, 10)
    database["version"] = 2  # a write commits while the leader's load is under way
    follower = asyncio.ensure_future(guard.get_or_load("menu:7", load, ttl=60))
    flights = guard.guard._state.flights._flights  # joined: the leader's flight has a follower
    assert await asyncio.to_thread(
        wait_until,
        lambda: flights.get("menu:7") is not None and flights["menu:7"].newest_follower >= 0,
    )
    release.set()
    loop_release.set()
    assert await leader == 1  # began before the write: its own answer
    assert await follower == 2  # began after it: never the older value


# -- what the review of the outage mode found ------------------------------------------------


async def test_stale_if_error_leaves_the_cache_s_own_errors_raised_in_a_loader(
    make: Make, client: redis.Redis, redis_url: str
) -> None:
    """A loader that reads its own key gets RecursiveLoadError: the cache's refusal,
    not the database failing, so no stale value answers it."""
    guard = make(redis_url, stale_if_error=30.0)
    assert await guard.get_or_load("menu:7", lambda: "v1", ttl=60) == "v1"
    client.delete(guard.keys("menu:7").value)
    inner = guard.guard

    def recursive() -> Any:
        return inner.get_or_load("menu:7", recursive, ttl=60)

    async def arecursive() -> Any:
        return await inner.get_or_load("menu:7", arecursive, ttl=60)  # type: ignore[misc]

    with pytest.raises(RecursiveLoadError):
        await guard.get_or_load("menu:7", recursive if guard.kind == "sync" else arecursive, ttl=60)
    assert guard.stats().stale_on_error == 0


@pytest.mark.slow
async def test_a_gutter_on_the_primary_s_own_server_keeps_to_keys_of_its_own(
    make: Make, proxy: TcpProxy, redis_url: str, client: redis.Redis
) -> None:
    """A gutter given the primary's server by mistake never touches the primary's
    entries: its guard has a namespace of its own."""
    guard = make(proxy.url, gutter=redis_url, socket_timeout=0.3)
    assert await guard.get_or_load("menu:7", lambda: "old", ttl=60) == "old"  # cached
    proxy.set_mode("blackhole")
    assert await guard.get_or_load("menu:8", lambda: "through the gutter", ttl=60) == (
        "through the gutter"
    )
    assert client.exists(guard.guard._state.gutter.keys("menu:8").value)
    assert not client.exists(guard.keys("menu:8").value)  # nothing in the primary's keys
    assert client.get(guard.keys("menu:7").value) is not None  # the primary's entry as it was


async def test_the_gutter_stores_loads_whose_snapshot_the_primary_could_not_number(
    make: Make, dead_url: str, redis_url: str
) -> None:
    """A tracked session that began while the primary was down has no watermark (-1):
    the primary would refuse its loads' stores, the gutter (never invalidated) keeps
    them: one load for two guards."""
    calls: list[int] = []

    def load() -> str:
        calls.append(1)
        note_snapshot(-1)  # what a tracked session's query reports then
        return "from a session"

    one = make(dead_url, gutter=redis_url)
    two = make(dead_url, gutter=redis_url)
    assert await one.get_or_load("menu:7", load, ttl=60) == "from a session"
    assert await two.get_or_load("menu:7", load, ttl=60) == "from a session"
    assert calls == [1]
    assert one.stats().stores_rejected == 0


async def test_l1_is_not_served_while_a_replay_is_pending(make: Make, redis_url: str) -> None:
    """An L1 copy may predate writes waiting in an outbox: while the guard is pending,
    a read goes to Redis and replays first."""
    guard = make(redis_url, l1_maxsize=100)
    deadline = time.monotonic() + 10
    while guard.stats().l1_hits == 0:  # hits: in L1 once it holds the value (the
        assert time.monotonic() < deadline  # asyncio guard subscribes L1's feed first)
        assert await guard.get_or_load("menu:7", lambda: "cached", ttl=60) == "cached"
        await asyncio.sleep(0.01)
    l1_hits = guard.stats().l1_hits
    replays: list[int] = []

    async def areplay() -> None:
        replays.append(1)

    def replay() -> None:
        replays.append(1)

    guard.guard._state.recovery.add(replay if guard.kind == "sync" else areplay)
    assert await guard.get_or_load("menu:7", lambda: "cached", ttl=60) == "cached"
    assert len(replays) == 1  # the read went past L1 to Redis and replayed
    assert guard.stats().l1_hits == l1_hits


def test_peek_entry_replays_before_it_shows_what_redis_holds(
    client: redis.Redis, redis_url: str, namespace: str
) -> None:
    clock = Clock()
    with CacheGuard.from_url(redis_url, namespace=namespace, timer=clock) as guard:
        guard.get_or_load("menu:7", lambda: "cached", ttl=60)
        failures = [RuntimeError("the outbox is unreadable")]

        def replay() -> None:
            if failures:
                raise failures.pop()

        guard._state.recovery.add(replay)
        assert guard.peek_entry("menu:7") is None  # the replay failed: nothing shown
        clock.offset += RETRY_DELAY  # the next attempt after the retry delay
        entry = guard.peek_entry("menu:7")
        assert entry is not None
        assert entry.value == "cached"


async def test_a_replay_failure_answers_with_on_backend_error_only(
    make: Make, redis_url: str
) -> None:
    """Redis answers but the replay fails: the read loads (on_backend_error); it is not
    an outage, so neither a remembered value nor the gutter answers it."""
    guard = make(redis_url, outage_ttl=30.0)
    assert await guard.get_or_load("menu:7", lambda: "seen", ttl=60) == "seen"

    def replay() -> None:
        raise RuntimeError("the outbox is unreadable")

    async def areplay() -> None:
        replay()

    guard.guard._state.recovery.add(replay if guard.kind == "sync" else areplay)
    assert await guard.get_or_load("menu:7", lambda: "loaded", ttl=60) == "loaded"
    assert guard.stats().outage_reuses == 0


def test_a_write_that_probes_a_circuit_back_marks_the_replay_pending(
    proxy: TcpProxy, namespace: str
) -> None:
    """Rows of a node whose circuit is open wait in the outbox while the replay counts
    as done; whichever call then finds the node back (here an invalidation) makes the
    guard replay before it serves from Redis again."""
    clock = Clock()
    with CacheGuard.from_url(
        proxy.url,
        namespace=namespace,
        socket_timeout=0.3,
        breaker_failures=1,
        breaker_cooldown=1.0,
        timer=clock,
    ) as guard:
        guard._state.recovery.add(lambda: None)
        guard.get_or_load("menu:7", lambda: "cached", ttl=60)  # replays, then serves
        assert not guard._state.recovery.pending
        proxy.set_mode("blackhole")
        with pytest.raises(BackendUnavailable):
            guard.invalidate("menu:8")  # the circuit opens
        guard._state.recovery.run()  # a replay that left the node's rows waiting: "done"
        assert not guard._state.recovery.pending
        proxy.set_mode("pass")
        proxy.drop_all()
        clock.offset += 1.0
        guard.invalidate("menu:8")  # the probe: a write finds the node back
        assert guard._state.recovery.pending
