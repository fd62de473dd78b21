"""Regression tests for the defects an adversarial review found in the cache guard
(each fails on the code before its fix): the write path exited in another thread,
L1 in forked workers, under thread races and past its entry's expiry, loaders
that read their own key, hung loaders, the stale timeout policy, settings Redis
cannot take, the body's error on a failing write, nested namespaces, the circuit
breaker on every entry point, and corrupt entries counted once."""

from __future__ import annotations

import multiprocessing
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cacheguard import (
    MISSING,
    BackendUnavailable,
    CacheGuard,
    CacheLoader,
    RecursiveLoadError,
)
from cacheguard.cache.entry import pack_entry
from tests.helpers import make_guard, run_threads, start_gated_fill, wait_until


@pytest.fixture
def guards() -> Iterator[list[CacheGuard]]:
    made: list[CacheGuard] = []
    yield made
    for guard in made:
        guard.close()


# -- the write path ------------------------------------------------------------------


def test_a_write_exited_in_another_thread_releases_its_locks(
    client: redis.Redis, namespace: str
) -> None:
    # ASGI servers run a sync dependency's enter and exit in two worker threads.
    guard = make_guard(client, namespace, wait_timeout=2)
    context = guard.write("menu:list", "menu:7")
    inside, done = threading.Event(), threading.Event()

    def enter() -> None:
        context.__enter__()
        inside.set()
        done.wait(10)  # alive until the exit ran: a finished thread's ident is reused

    entering = threading.Thread(target=enter)
    entering.start()
    assert inside.wait(5)
    exiting = threading.Thread(target=lambda: context.__exit__(None, None, None))
    exiting.start()
    exiting.join(5)
    done.set()
    entering.join(5)
    for name in ("menu:list", "menu:7"):
        assert not client.exists(guard.keys(name).lock), "the write lock hash is left behind"
        assert guard.rwlock(name).local.is_free()
    with guard.write("menu:list", timeout=2):  # and the next write gets in
        pass
    assert guard.get_or_load("menu:list", lambda: "fresh", ttl=60) == "fresh"
    assert guard.peek("menu:list") == "fresh"  # cached again


def test_the_bodys_error_wins_over_a_failing_closing_invalidation(
    client: redis.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cacheguard.cache.guard
    from cacheguard.cache.scripts import NEXT_STAMP

    guard = make_guard(client, namespace)
    stamps = {"n": 0}
    send = cacheguard.cache.guard.run_pipelined

    def fail_the_closing_stamp(client: Any, calls: list[Any], *args: Any) -> Any:
        if calls[0][0] is NEXT_STAMP:
            stamps["n"] += 1
            if stamps["n"] == 2:  # the closing invalidation's
                raise redis.ConnectionError("Redis went away")
        return send(client, calls, *args)

    monkeypatch.setattr(cacheguard.cache.guard, "run_pipelined", fail_the_closing_stamp)
    with pytest.raises(RuntimeError, match="the update failed") as caught, guard.write("k"):
        raise RuntimeError("the update failed")
    if sys.version_info >= (3, 11):
        assert any("closing invalidation" in note for note in caught.value.__notes__)
    assert not client.exists(guard.keys("k").lock)


# -- L1 --------------------------------------------------------------------------------


def _forked_reader(url: str, guard: CacheGuard, ready: Any, report: Any) -> None:
    # Runs in a forked child that inherited ``guard`` (gunicorn --preload, celery prefork).
    deadline = time.monotonic() + 10
    kept = False
    while not kept and time.monotonic() < deadline:
        guard.get_or_load("k", lambda: "child-load", ttl=600)
        kept = guard._state.l1 is not None and "k" in guard._state.l1
        time.sleep(0.01)
    ready.send("kept" if kept else "L1 took no copy in the child")
    if report.poll(10):  # the parent has written
        report.recv()
        deadline = time.monotonic() + 10
        seen = guard.get_or_load("k", lambda: "child-load", ttl=600)
        while seen != "v2" and time.monotonic() < deadline:
            time.sleep(0.01)
            seen = guard.get_or_load("k", lambda: "child-load", ttl=600)
        ready.send(seen)


@pytest.mark.skipif(sys.platform == "win32", reason="fork start method")
def test_a_forked_worker_drops_its_l1_copy_when_the_parent_writes(
    client: redis.Redis, redis_url: str, namespace: str, guards: list[CacheGuard]
) -> None:
    guard = make_guard(client, namespace, l1_maxsize=100, l1_ttl=600)
    guards.append(guard)
    assert guard.get_or_load("k", lambda: "v1", ttl=600) == "v1"
    context = multiprocessing.get_context("fork")
    child_end, parent_end = context.Pipe()
    child = context.Process(target=_forked_reader, args=(redis_url, guard, child_end, child_end))
    child.start()
    try:
        assert parent_end.poll(15)
        assert parent_end.recv() == "kept"
        writer = make_guard(redis.Redis.from_url(redis_url), namespace)
        guards.append(writer)
        with writer.write("k"):
            pass
        assert writer.get_or_load("k", lambda: "v2", ttl=600) == "v2"
        parent_end.send("written")
        assert parent_end.poll(15)
        assert parent_end.recv() == "v2", "the child kept serving its L1 copy"
    finally:
        child.join(15)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0


@pytest.mark.slow  # over a second: the whole suite runs it, -m 'not slow' does not
def test_l1_survives_racing_threads(
    client: redis.Redis, namespace: str, guards: list[CacheGuard]
) -> None:
    guard = make_guard(client, namespace, l1_maxsize=6, l1_ttl=0.01)
    guards.append(guard)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:

        def work(index: int) -> None:
            for i in range(1500):
                name = f"k{(i * 7 + index) % 12}"
                assert guard.get_or_load(name, lambda n=name: n, ttl=60) == name
                assert guard.peek(name) in (name, MISSING)
                if i % 9 == index:
                    guard._state.l1.drop([name])  # what an invalidation message does

        run_threads(8, work)
    finally:
        sys.setswitchinterval(old)


def test_an_l1_copy_never_outlives_its_entry(
    client: redis.Redis, namespace: str, guards: list[CacheGuard]
) -> None:
    guard = make_guard(client, namespace, l1_maxsize=100, l1_ttl=30)
    guards.append(guard)
    loads: list[int] = []

    def load() -> int:
        loads.append(1)
        return len(loads)

    assert wait_until(lambda: guard._state.l1.guard() is not None)  # the L1 feed is live
    assert guard.get_or_load("k", load, ttl=0.3) == 1
    assert guard._state.l1 is not None
    assert "k" in guard._state.l1
    assert wait_until(lambda: not client.exists(guard.keys("k").value))
    assert guard.get_or_load("k", load, ttl=0.3) == 2  # not the L1 copy of an expired entry


def test_l1_refuses_a_copy_read_before_an_invalidation(
    client: redis.Redis, namespace: str, guards: list[CacheGuard]
) -> None:
    guard = make_guard(client, namespace, l1_maxsize=100, l1_ttl=30)
    guards.append(guard)
    assert wait_until(lambda: guard._state.l1.guard() is not None)
    guard.get_or_load("k", lambda: "old", ttl=60)
    assert guard._state.l1 is not None
    guard._state.l1.tier.clear()
    seen = guard._state.l1.guard()  # a reader takes this, then reads "old" from Redis ...
    assert seen is not None
    guard.invalidate("k")  # ... a writer invalidates meanwhile ...
    guard._state.l1.keep("k", "old", 60, seen)  # ... and the reader tries to keep its copy
    assert "k" not in guard._state.l1


# -- loads ------------------------------------------------------------------------------


@pytest.mark.parametrize("inner", ["get_or_load", "refresh", "loader"])
def test_a_loader_reading_its_own_key_fails_at_once(
    client: redis.Redis, namespace: str, inner: str
) -> None:
    guard = make_guard(client, namespace, wait_timeout=2, on_timeout="raise")
    menu: CacheLoader[[], str]

    def load() -> str:
        if inner == "get_or_load":
            return guard.get_or_load("k", lambda: "inner", ttl=60)
        if inner == "refresh":
            return guard.refresh("k", lambda: "inner", ttl=60)
        return menu.get()

    menu = CacheLoader(guard, key="k", load=load, ttl=60)
    outer = menu.get if inner == "loader" else lambda: guard.get_or_load("k", load, ttl=60)
    with pytest.raises(RecursiveLoadError) as caught:
        outer()
    assert caught.value.key == "k"
    assert guard.peek("k") is MISSING
    assert wait_until(lambda: not client.exists(guard.keys("k").lock))
    assert guard.get_or_load("k", lambda: "fine", ttl=60) == "fine"  # nothing left behind


def test_a_loader_may_read_other_keys(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace)

    def load_list() -> list[str]:
        return [guard.get_or_load("item", lambda: "one", ttl=60)]

    assert guard.get_or_load("list", load_list, ttl=60) == ["one"]


@pytest.mark.slow
def test_a_hung_loader_stops_blocking_writers_after_max_load_time(
    redis_url: str, namespace: str, guards: list[CacheGuard]
) -> None:
    filler = make_guard(redis.Redis.from_url(redis_url), namespace, lease=0.6, max_load_time=0.3)
    writer = make_guard(redis.Redis.from_url(redis_url), namespace, lease=5)
    guards += [filler, writer]
    release, thread = start_gated_fill(filler, "k", "late", hold=30)
    try:
        with writer.write("k", timeout=8):  # LockTimeout if the fill's hold lasts
            pass
        assert writer.get_or_load("k", lambda: "written", ttl=60) == "written"
    finally:
        release.set()
        thread.join(10)
    assert writer.peek("k") == "written"  # the late load was not stored over it
    assert client_free(writer, "k")


def client_free(guard: CacheGuard, name: str) -> bool:
    return wait_until(lambda: not guard.client.exists(guard.keys(name).lock))


def test_max_load_time_is_validated(client: redis.Redis, namespace: str) -> None:
    for bad in (0, -1, float("inf"), 1e300):
        with pytest.raises(ValueError, match="max_load_time"):
            make_guard(client, namespace, max_load_time=bad)


# -- the stale policy ---------------------------------------------------------------------


def test_on_timeout_stale_serves_the_last_value_after_a_wait_timeout(
    redis_url: str, namespace: str, guards: list[CacheGuard]
) -> None:
    settings: dict[str, Any] = {"on_timeout": "stale", "wait_timeout": 0.3}
    reader = make_guard(redis.Redis.from_url(redis_url), namespace, **settings)
    filler = make_guard(redis.Redis.from_url(redis_url), namespace, **settings)
    guards += [reader, filler]
    assert reader.get_or_load("k", lambda: "v1", ttl=30) == "v1"
    # Kept in Redis past its expiry (stale_ttl is 0): one more TTL, for timeouts only.
    value_key = reader.keys("k").value
    kept_ms = reader.client.pttl(value_key)
    assert kept_ms > 30_000
    # Loaded 45 s ago by the server's clock (which judges ages): logically expired
    # now, still stored.
    stored = reader.peek_entry("k")
    assert stored is not None
    seconds, micros = reader.client.time()
    aged = stored._replace(created=seconds + micros / 1e6 - 45)
    reader.client.set(value_key, pack_entry(reader.settings.codec, aged.value, created=aged.created,
                      ttl=aged.ttl, version=aged.version, load_duration=aged.load_duration),
                      px=kept_ms)  # fmt: skip
    assert reader.peek("k") is MISSING  # an expired value is not a hit
    release, thread = start_gated_fill(filler, "k", "v2")  # a slow reload is under way
    try:
        loads: list[str] = []
        value = reader.get_or_load("k", lambda: loads.append("x") or "unlocked", ttl=30)
        assert value == "v1"
        assert not loads
        assert reader.stats().stale_served == 1
    finally:
        release.set()
        thread.join(10)
    assert reader.get_or_load("k", lambda: "v3", ttl=30) == "v2"


def test_on_timeout_stale_without_a_kept_value_loads(
    redis_url: str, namespace: str, guards: list[CacheGuard]
) -> None:
    reader = make_guard(
        redis.Redis.from_url(redis_url), namespace, on_timeout="stale", wait_timeout=0.3
    )
    filler = make_guard(redis.Redis.from_url(redis_url), namespace)
    guards += [reader, filler]
    release, thread = start_gated_fill(filler, "k", "v2")
    try:
        assert reader.get_or_load("k", lambda: "unlocked", ttl=30) == "unlocked"
    finally:
        release.set()
        thread.join(10)


# -- settings and key layout -------------------------------------------------------------------


def test_durations_redis_cannot_take_are_refused_up_front(
    client: redis.Redis, namespace: str
) -> None:
    guard = make_guard(client, namespace)
    with pytest.raises(ValueError, match="ten years"):
        guard.get_or_load("k", lambda: 1, ttl=1e300)
    with pytest.raises(ValueError, match="ten years"):
        CacheLoader(guard, key="k", load=lambda: 1, ttl=1e300)
    for setting in ("lease", "wait_timeout", "none_ttl", "l1_ttl", "version_ttl", "stale_ttl"):
        with pytest.raises(ValueError, match=setting):
            make_guard(client, namespace, **{setting: 1e300})
    assert guard.peek("k") is MISSING
    assert not client.exists(guard.keys("k").lock)


def test_nested_namespaces_do_not_share_keys(client: redis.Redis, namespace: str) -> None:
    outer = make_guard(client, namespace)
    inner = make_guard(client, f"{namespace}:ps")
    for _ in range(5):
        inner.invalidate("a")  # its sequence runs ahead of the outer one's
    before = inner.watermark()
    outer.invalidate_prefix("wm")
    outer.invalidate_prefix("l1")
    assert inner.watermark() == before
    inner.get_or_load("x", lambda: "inner", ttl=60)
    outer.get_or_load("x", lambda: "outer", ttl=60)
    assert inner.peek("x") == "inner"
    assert outer.peek("x") == "outer"


# -- the circuit breaker on every entry point -----------------------------------------------


class _CountingClient(redis.Redis):
    commands = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        type(self).commands += 1
        return super().execute_command(*args, **options)


def test_every_entry_point_honours_an_open_circuit(namespace: str) -> None:
    dead = _CountingClient(port=1, retry=Retry(NoBackoff(), 0))  # nothing listens on port 1
    guard = make_guard(dead, namespace, breaker_failures=1, breaker_cooldown=60)
    assert guard.get_or_load("k", lambda: "loaded", ttl=60) == "loaded"  # opens the circuit
    before = _CountingClient.commands
    assert guard.peek("k") is MISSING
    assert guard.refresh("k", lambda: "refreshed", ttl=60) == "refreshed"
    with pytest.raises(BackendUnavailable, match="circuit open"):
        guard.invalidate("k")
    with pytest.raises(BackendUnavailable, match="circuit open"), guard.write("k"):
        pass
    assert guard.get_or_load("k", lambda: "again", ttl=60) == "again"
    assert _CountingClient.commands == before, "a call went to Redis while the circuit was open"


def test_refresh_follows_on_backend_error(namespace: str) -> None:
    dead = redis.Redis(port=1, retry=Retry(NoBackoff(), 0))
    bypassing = make_guard(dead, namespace)
    assert bypassing.refresh("k", lambda: "loaded", ttl=60) == "loaded"
    raising = make_guard(dead, namespace, on_backend_error="raise")
    with pytest.raises(BackendUnavailable):
        raising.refresh("k", lambda: "loaded", ttl=60)


def test_a_corrupt_entry_is_counted_once_per_read(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace)
    client.set(guard.keys("k").value, b"garbage")
    assert guard.get_or_load("k", lambda: "fresh", ttl=60) == "fresh"
    assert guard.stats().corrupt_entries == 1


def test_a_write_of_several_keys_can_be_the_probe_of_a_half_open_circuit(
    client: redis.Redis, namespace: str
) -> None:
    # Both keys live on one server, so on one breaker: the write must ask it once,
    # not once per key (the second ask would be refused while the first holds the
    # probe, and a multi-key write could never close the circuit).
    now = [0.0]
    guard = make_guard(
        client, namespace, breaker_failures=1, breaker_cooldown=5, timer=lambda: now[0]
    )
    guard._state.breaker("a").failure()
    with pytest.raises(BackendUnavailable, match="circuit open"), guard.write("a", "b"):
        pass
    now[0] = 6.0  # cooldown over: this write is the probe
    with guard.write("a", "b"):
        pass
    assert guard._state.breaker("a").state == "closed"
