"""Redis killed and restarted under traffic: nobody hangs, bypass serves, all recovers."""

from __future__ import annotations

import threading
import time

import pytest

from cacheguard import MISSING, CacheGuard
from cacheguard.cache.scripts import FILL_BEGIN
from cacheguard.testing import OwnedRedisServer
from tests.helpers import wait_until

CONNECT_TIMEOUT, SOCKET_TIMEOUT, WAIT_TIMEOUT = 0.5, 0.5, 2.0
# The longest any call may take: its own wait plus one connect and one read.
DEADLINE = WAIT_TIMEOUT + CONNECT_TIMEOUT + SOCKET_TIMEOUT + 0.5


@pytest.mark.slow
def test_redis_restart_mid_traffic(owned_redis: OwnedRedisServer) -> None:
    guard = CacheGuard.from_url(
        owned_redis.url,
        namespace="restart",
        connect_timeout=CONNECT_TIMEOUT,
        socket_timeout=SOCKET_TIMEOUT,
        wait_timeout=WAIT_TIMEOUT,
        lease=2.0,
        breaker_failures=3,
        breaker_cooldown=0.3,
    )
    stop = threading.Event()
    slowest = [0.0]
    errors: list[BaseException] = []
    calls = [0]
    mutex = threading.Lock()

    def reader(index: int) -> None:
        n = 0
        while not stop.is_set():
            name = f"item:{n % 20}"
            n += 1
            began = time.monotonic()
            try:
                value = guard.get_or_load(name, lambda name=name: name.upper(), ttl=0.2)
                assert value == name.upper()
            except BaseException as exc:
                errors.append(exc)
            took = time.monotonic() - began
            with mutex:
                slowest[0] = max(slowest[0], took)
                calls[0] += 1

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    owned_redis.kill()
    down_from = guard.stats().backend_errors
    time.sleep(2.0)
    calls_down = calls[0]
    errors_down = guard.stats().backend_errors - down_from
    owned_redis.start()  # same port, empty, no scripts loaded
    restarted = time.monotonic()
    cached_again = wait_until(
        lambda: any(guard.peek(f"item:{i}") is not MISSING for i in range(20)), 10
    )
    recovered = time.monotonic() - restarted
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join(30)
    print(
        f"\nrestart: slowest call {slowest[0]:.3f} s, {calls_down} calls and {errors_down} "
        f"Redis errors while down, cached again {recovered:.3f} s after the restart"
    )
    assert cached_again
    assert not errors, errors[:3]
    assert slowest[0] <= DEADLINE, f"a call took {slowest[0]:.2f} s"
    # The breaker kept most calls off the dead server: far fewer errors than calls.
    assert 0 < errors_down < calls_down / 2
    # After the restart: values are stored again, locks can be taken, scripts reloaded.
    assert guard.get_or_load("fresh", lambda: "again", ttl=60) == "again"
    assert guard.peek("fresh") == "again"
    with guard.write("fresh", timeout=2):
        pass
    assert guard.client.script_exists(FILL_BEGIN.sha) == [True]
