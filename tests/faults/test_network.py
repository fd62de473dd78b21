"""Network faults between the client and Redis, through an in-test TCP proxy."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from cacheguard import MISSING, CacheGuard, CacheGuardError
from cacheguard.redis.notifier import notifier_for
from cacheguard.testing import OwnedRedisServer
from tests.faults.proxy import TcpProxy
from tests.helpers import start_gated_fill, subscribers, wait_until

CONNECT, SOCKET, WAIT = 0.5, 0.5, 1.0
DEADLINE = WAIT + CONNECT + SOCKET + 0.5


@pytest.fixture
def proxy(owned_redis: OwnedRedisServer) -> Iterator[TcpProxy]:
    p = TcpProxy(owned_redis.port)
    yield p
    p.close()


def _guard(url: str, **settings: Any) -> CacheGuard:
    settings.setdefault("wait_timeout", WAIT)
    return CacheGuard.from_url(
        url, namespace="net", connect_timeout=CONNECT, socket_timeout=SOCKET, **settings
    )


def _timed(call: Callable[[], Any]) -> tuple[float, Any]:
    began = time.monotonic()
    try:
        outcome: Any = call()
    except CacheGuardError as exc:  # the only kind of error a public call may raise
        outcome = exc
    return time.monotonic() - began, outcome


@pytest.mark.slow
def test_black_hole_every_public_call_returns_or_raises_within_its_deadline(
    proxy: TcpProxy,
) -> None:
    guard = _guard(proxy.url, l1_maxsize=10, breaker_failures=100)  # breaker kept shut
    assert guard.get_or_load("warm", lambda: "w", ttl=60) == "w"
    proxy.set_mode("blackhole")
    calls: dict[str, Callable[[], Any]] = {
        "get_or_load (cold)": lambda: guard.get_or_load("cold", lambda: "c", ttl=60),
        "get_or_load (cached)": lambda: guard.get_or_load("warm", lambda: "fresh", ttl=60),
        "peek": lambda: guard.peek("warm"),
        "refresh": lambda: guard.refresh("warm", lambda: "r", ttl=60),
        "invalidate": lambda: guard.invalidate("warm"),
        "watermark": guard.watermark,
        "write": lambda: guard.write("warm", timeout=WAIT).__enter__(),
        "rwlock read": lambda: guard.rwlock("other").acquire_read(timeout=WAIT),
    }
    timings = {}
    for what, call in calls.items():
        took, outcome = _timed(call)
        timings[what] = (took, outcome)
    print("\nblack hole:", {k: f"{v[0]:.2f}s {type(v[1]).__name__}" for k, v in timings.items()})
    for what, (took, _) in timings.items():
        assert took <= DEADLINE, f"{what} took {took:.2f} s"
    assert timings["get_or_load (cold)"][1] == "c"  # bypass: served by the loader
    assert timings["get_or_load (cached)"][1] in ("w", "fresh")  # L1, or the loader
    assert timings["peek"][1] in ("w", MISSING)
    assert isinstance(timings["invalidate"][1], CacheGuardError)
    assert isinstance(timings["write"][1], CacheGuardError)
    proxy.set_mode("pass")


@pytest.mark.slow
def test_added_latency_still_one_load_and_right_values(proxy: TcpProxy) -> None:
    proxy.set_mode("delay", 0.02)
    guards = [_guard(proxy.url, wait_timeout=10) for _ in range(2)]  # two owners
    loads = []

    def load() -> str:
        loads.append(1)
        time.sleep(0.1)
        return "value"

    results: list[str] = []
    threads = [
        threading.Thread(
            target=lambda g=guards[i % 2]: results.append(g.get_or_load("k", load, ttl=60))
        )
        for i in range(10)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == ["value"] * 10
    assert len(loads) == 1


def test_waiters_finish_when_their_pubsub_connection_dies(
    owned_redis: OwnedRedisServer, proxy: TcpProxy
) -> None:
    """The filler talks to Redis directly; waiters in another guard go through the proxy,
    which kills their pub/sub connection mid-wait (their command connections live on:
    a dropped command connection fails its call, see the black-hole test)."""
    filler = _guard(owned_redis.url, wait_timeout=10)
    waiters = _guard(proxy.url, wait_timeout=10)
    release, fill = start_gated_fill(filler, "k", "filled")
    results: list[tuple[float, str]] = []

    def wait_for_it() -> None:
        began = time.monotonic()
        value = waiters.get_or_load("k", lambda: "waiter loaded", ttl=60)
        results.append((time.monotonic() - began, value))

    pool = [threading.Thread(target=wait_for_it) for _ in range(4)]
    for t in pool:
        t.start()
    direct = redis.Redis(port=owned_redis.port)
    channel = waiters.keys("k").released_channel
    # The waiters' fill waits on the key's channel (the filler subscribes to nothing).
    assert wait_until(lambda: subscribers(direct, channel) >= 1)
    notifier = notifier_for(waiters.client)
    connects = notifier.reconnects
    assert proxy.drop_subscribers() == 1  # the subscription dies
    # The waiters' notifier saw it die and connected again.
    assert wait_until(lambda: notifier.reconnects > connects)
    release.set()
    fill.join(10)
    for t in pool:
        t.join(15)
    print("\nwaiters after a dropped subscription:", [f"{s:.2f}s" for s, _ in results])
    assert [v for _, v in results] == ["filled"] * 4
    assert all(seconds < 10 for seconds, _ in results)
    assert direct.get("net:{k}:v") is not None
