"""Small helpers shared by tests and their child processes."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import redis

from cacheguard import CacheGuard
from cacheguard.redis.clients import sync_client_from_url

if TYPE_CHECKING:
    import pytest


def wait_until(predicate: Callable[[], object], timeout: float = 5.0) -> bool:
    """Poll ``predicate`` (test-side only) until it is true or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


def subscribers(client: redis.Redis, channel: str) -> int:
    """How many connections Redis has subscribed to ``channel``, as a broadcast
    channel (PUBSUB NUMSUB) or a sharded one (PUBSUB SHARDNUMSUB)."""
    broadcast = int(client.pubsub_numsub(channel)[0][1])
    sharded = client.execute_command("PUBSUB", "SHARDNUMSUB", channel)
    return broadcast + int(sharded[1])


@contextlib.contextmanager
def waiting_in(thread: threading.Thread | None = None) -> Iterator[threading.Event]:
    """An event set once a waiter (``thread``, or any caller when None) waits on a
    pub/sub subscription, sync or asyncio, while the block runs: it tried, found the
    key busy, subscribed, tried again and now waits for an announcement or a release,
    so a message sent from here on is kept for that wait. A channel's subscriber
    count says less: an earlier waiter's lingering subscription can already meet it,
    and it is met at the SUBSCRIBE, before the waiter's next try, which a release at
    that moment would let through without any message."""
    from cacheguard.redis.async_notifier import AsyncSubscription
    from cacheguard.redis.notifier import Subscription

    waits = threading.Event()
    real_wait, real_async_wait = Subscription.wait, AsyncSubscription.wait

    def note() -> None:
        if thread is None or threading.current_thread() is thread:
            waits.set()

    def wait(self: Subscription, seconds: float) -> list[bytes]:
        note()
        return real_wait(self, seconds)

    async def async_wait(self: AsyncSubscription, seconds: float) -> list[bytes]:
        note()
        return await real_async_wait(self, seconds)

    Subscription.wait = wait  # type: ignore[method-assign]
    AsyncSubscription.wait = async_wait  # type: ignore[method-assign]
    try:
        yield waits
    finally:
        Subscription.wait = real_wait  # type: ignore[method-assign]
        AsyncSubscription.wait = real_async_wait  # type: ignore[method-assign]


def flight_entries(monkeypatch: pytest.MonkeyPatch, flights: Any) -> list[str]:
    """The names of the calls that entered ``flights`` (a guard's single flight), as
    leaders or followers, in the order they came: a list the test watches."""
    entered: list[str] = []
    join, lead = flights.join, flights.lead

    def counted_join(key: str, since: float = math.inf) -> Any:
        entered.append(key)
        return join(key, since)

    def counted_lead(key: str, since: float) -> Any:
        flight = lead(key, since)
        if flight is not None:
            entered.append(key)
        return flight

    monkeypatch.setattr(flights, "join", counted_join)
    monkeypatch.setattr(flights, "lead", counted_lead)
    return entered


def client_for(url: str) -> Any:
    """The client a test child process uses (any deployment's URL, see cacheguard.redis.clients)."""
    return sync_client_from_url(url, {"socket_connect_timeout": 2, "socket_timeout": 10})


def make_guard(client: redis.Redis, namespace: str, **settings: Any) -> CacheGuard:
    """A guard for tests: no TTL jitter unless asked for, so TTLs are exact."""
    settings.setdefault("ttl_jitter", 0)
    return CacheGuard(client, namespace=namespace, **settings)


def run_threads(count: int, target: Callable[[int], None]) -> None:
    """Run ``target(i)`` in ``count`` threads; re-raise the first error any raised."""
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            target(index)
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]


def start_gated_fill(
    guard: CacheGuard, name: str, value: Any, *, hold: float = 10.0
) -> tuple[threading.Event, threading.Thread]:
    """Start filling ``name`` in a thread whose loader holds until the returned event is
    set (or ``hold`` seconds pass), then returns ``value``; returns once the loader runs
    (the fill is under way)."""
    loading, release = threading.Event(), threading.Event()

    def load() -> Any:
        loading.set()
        release.wait(hold)
        return value

    thread = threading.Thread(target=lambda: guard.get_or_load(name, load, ttl=60))
    thread.start()
    assert loading.wait(5), "the fill did not start"
    return release, thread
