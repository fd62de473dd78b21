"""Acquire calls whose reply was lost take nothing that outlives the outage.

A ``redis-server`` paused by SIGSTOP keeps an acquire call in its socket buffer; the
caller times out (``BackendUnavailable``) and the server runs the call when SIGCONT
resumes it. Without a give-back that hold (or waiting writer's mark) would sit there,
held by nobody, for its whole lease. Here, on a throwaway server per test and with
leases (and marks) of 30 s, others must get in within deadlines far below that:

* the hold (read or write) is given back in the background once Redis answers,
  both drivers, also through ``guard.write``;
* a writer's mark left by an acquisition that failed is withdrawn;
* the owner's next acquire call gives its lost call back in the same step;
* a give-back never takes a hold that another call of the owner made.

The scripts' own rules (what the record proves, the cancellation of a call that
arrives after its give-back) are checked first, on the shared Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

from cacheguard import CacheGuard, Watchdog
from cacheguard.aio import AsyncCacheGuard, AsyncWatchdog
from cacheguard.aio.notifier import async_notifier_for
from cacheguard.backoff import Backoff
from cacheguard.cache.settings import client_options
from cacheguard.exceptions import BackendUnavailable
from cacheguard.keys import ResourceKeys
from cacheguard.locks import wire
from cacheguard.locks.giveback import give_backs
from cacheguard.locks.notifier import close_notifier_of
from cacheguard.locks.scripts import GIVE_BACK, ScriptCall
from cacheguard.testing import OwnedRedisServer, free_port
from tests.lock_drivers import Driver, Lock, fields, release

LEASE = 30.0  # s: every deadline below is far under it
LEASE_MS = int(LEASE * 1000)
WITHIN = 10.0  # s: how long another owner may wait for a lost call's hold to go
# A waiting writer's mark lasts 3 backoff caps: 30 s, as long as the lease.
LONG_MARK = functools.partial(Backoff, initial=0.05, cap=10.0)


# -- the scripts, on the shared Redis ------------------------------------------------------------


def run(client: redis.Redis, call: ScriptCall) -> Any:
    script, keys, args = call
    return script(client, keys, args)


def acquire(
    client: redis.Redis,
    keys: ResourceKeys,
    owner: str,
    mode: str = "write",
    *,
    attempt: str = "",
    give_back: tuple[str, ...] = (),
    mark_ms: int = 0,
) -> Any:
    call = wire.acquire_call(
        keys,
        owner,
        mode,  # type: ignore[arg-type]
        lease_ms=LEASE_MS,
        mark_ms=mark_ms,
        attempt=attempt,
        give_back=give_back,
    )
    return wire.parse_attempt(run(client, call))


def give_back(client: redis.Redis, keys: ResourceKeys, owner: str, *attempts: str) -> bool:
    return wire.parse_give_back(run(client, wire.give_back_call(keys, owner, LEASE_MS, attempts)))


@pytest.fixture
def keys(namespace: str) -> ResourceKeys:
    return ResourceKeys(namespace, "res")


def test_a_lost_call_s_hold_is_taken_back_and_the_lock_freed(
    client: redis.Redis, keys: ResourceKeys
) -> None:
    assert acquire(client, keys, "me", attempt="a.1").granted
    assert give_back(client, keys, "me", "a.1") is True
    f = fields(client, keys.lock)
    assert "mode" not in f
    assert "w:me" not in f
    assert "a:me" not in f  # the record goes with the owner's holds
    assert acquire(client, keys, "other").granted  # free for anyone
    assert give_back(client, keys, "me", "a.1") is False  # twice: nothing more


def test_only_the_lost_call_s_count_goes_from_a_reentrant_holding(
    client: redis.Redis, keys: ResourceKeys
) -> None:
    held = acquire(client, keys, "me", attempt="a.1")
    assert acquire(client, keys, "me", attempt="a.2").epoch == held.epoch  # re-entered: 2
    assert give_back(client, keys, "me", "a.2") is True
    assert fields(client, keys.lock)["w:me"] == "1"
    # The holding that was legitimately taken is still released by its own handle.
    assert wire.parse_release(run(client, wire.release_call(keys, "me", "write", held.epoch)))


def test_a_give_back_leaves_alone_what_a_later_call_of_the_owner_took(
    client: redis.Redis, keys: ResourceKeys
) -> None:
    holder = acquire(client, keys, "holder")
    assert not acquire(client, keys, "me", attempt="a.1").granted  # lost: it was refused
    run(client, wire.release_call(keys, "holder", "write", holder.epoch))
    later = acquire(client, keys, "me", attempt="a.2")  # the owner's next call
    assert give_back(client, keys, "me", "a.1") is False
    assert fields(client, keys.lock)["w:me"] == "1"
    assert wire.parse_release(run(client, wire.release_call(keys, "me", "write", later.epoch)))


def test_a_lost_re_entry_stays_counted_once_a_later_call_re_entered_without_it(
    client: redis.Redis, keys: ResourceKeys
) -> None:
    """The limit: a later call that does not carry the lost one (another client or
    process with the same owner id) re-enters; the record names that call now, and
    holds of one owner are counted, not named: the lost count stays until the owner's
    lease ends after its last release."""
    lost = acquire(client, keys, "me", attempt="a.1")
    later = acquire(client, keys, "me", attempt="a.2")
    assert later.epoch == lost.epoch
    assert give_back(client, keys, "me", "a.1") is False
    assert fields(client, keys.lock)["w:me"] == "2"


def test_a_call_arriving_after_its_give_back_does_nothing(
    client: redis.Redis, keys: ResourceKeys
) -> None:
    assert give_back(client, keys, "me", "a.1") is False  # it had not run yet
    late = acquire(client, keys, "me", attempt="a.1")
    assert late == wire.parse_attempt([0, 0])
    assert "w:me" not in fields(client, keys.lock)
    assert acquire(client, keys, "other").granted


def test_a_lost_call_s_mark_is_withdrawn(client: redis.Redis, keys: ResourceKeys) -> None:
    reader = acquire(client, keys, "reader", mode="read")
    assert not acquire(client, keys, "me", attempt="a.1", mark_ms=LEASE_MS).granted
    assert acquire(client, keys, "new-reader", mode="read").granted is False  # held off
    assert give_back(client, keys, "me", "a.1") is True
    assert "q:me" not in fields(client, keys.lock)
    assert acquire(client, keys, "new-reader", mode="read").granted
    assert reader.granted


def test_the_owner_s_next_call_gives_its_lost_call_back_first(
    client: redis.Redis, keys: ResourceKeys
) -> None:
    lost = acquire(client, keys, "me", attempt="a.1")
    fresh = acquire(client, keys, "me", attempt="a.2", give_back=("a.1",))
    assert fresh.epoch > lost.epoch  # a new holding, not a re-entry of the lost one
    assert fields(client, keys.lock)["w:me"] == "1"
    assert wire.parse_release(run(client, wire.release_call(keys, "me", "write", fresh.epoch)))
    assert "mode" not in fields(client, keys.lock)


def test_cancellations_end_with_their_lifetime(client: redis.Redis, keys: ResourceKeys) -> None:
    assert not wire.parse_give_back(run(client, (GIVE_BACK, [keys.lock], ["me", 50, "ch", "a.1"])))
    assert client.hexists(keys.lock, "c:a.1")
    assert 0 < client.pttl(keys.lock) <= 50
    deadline = time.monotonic() + 5
    while client.exists(keys.lock):  # a condition polled with a deadline
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert acquire(client, keys, "me", attempt="a.1").granted  # forgotten: it runs


# -- a paused server: SIGSTOP, then SIGCONT -------------------------------------------------------


@pytest.fixture
def server() -> Iterator[OwnedRedisServer]:
    owned = OwnedRedisServer()
    try:
        yield owned
    finally:
        resume(owned)
        owned.close()


@contextlib.contextmanager
def paused(server: OwnedRedisServer) -> Iterator[None]:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        resume(server)


def resume(server: OwnedRedisServer) -> None:
    if server.proc is not None:
        os.kill(server.proc.pid, signal.SIGCONT)


class Rig:
    """Both drivers on the paused server: ``short`` fails fast (socket timeout 0.3 s,
    no retries: ``from_url``'s options), ``steady`` waits (another pool: other owners)."""

    def __init__(self, kind: str, url: str, namespace: str) -> None:
        self.observer = redis.Redis.from_url(url, socket_timeout=10)
        short, steady = client_options(1.0, 0.3), client_options(1.0, 10.0)
        self.short = Driver(
            kind,
            redis.Redis.from_url(url, **short),
            redis.asyncio.Redis.from_url(url, **short),
            namespace,
        )
        self.steady = Driver(
            kind,
            redis.Redis.from_url(url, **steady),
            redis.asyncio.Redis.from_url(url, **steady),
            namespace,
        )

    def fields(self, lock: Lock) -> dict[str, str]:
        return fields(self.observer, lock.keys.lock)

    def lost_ids(self, lock: Lock, owner: str) -> list[str]:
        """The owner's lost calls still to give back, through the short client."""
        client = self.short.client if self.short.kind == "sync" else self.short.aclient
        return give_backs.pending(client, lock.keys, owner)

    async def aclose(self) -> None:
        for driver in (self.short, self.steady):
            close_notifier_of(driver.client)
            driver.client.close()
            await async_notifier_for(driver.aclient).aclose()
            await driver.aclient.aclose()
        self.observer.close()


@contextlib.asynccontextmanager
async def rig(kind: str, server: OwnedRedisServer, namespace: str) -> AsyncIterator[Rig]:
    made = Rig(kind, server.url, namespace)
    try:
        yield made
    finally:
        resume(server)
        await made.aclose()


async def until(condition: Callable[[], object], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not condition():  # a condition polled with a deadline
        assert time.monotonic() < deadline, f"{what}: not within {within} s"
        await asyncio.sleep(0.02)


async def warmed(lock: Lock) -> Lock:
    """One acquisition first: the connection is open and the scripts loaded, so the
    call made while paused is written to the server's socket."""
    await release(await lock.acquire_write(timeout=5, owner="warm-up"))
    return lock


class HeldBack:
    """A watchdog whose clock stands still until :meth:`go`: its background give-backs
    wait, so that a test decides what happens first."""

    def __init__(self, kind: str) -> None:
        self.clock = 0.0
        self.watchdog: Watchdog | AsyncWatchdog
        if kind == "sync":
            self.watchdog = Watchdog(timer=self.now)
        else:
            self.watchdog = AsyncWatchdog(timer=self.now)

    def now(self) -> float:
        return self.clock

    def go(self) -> None:
        """Time moves on: what is due runs (then the sync thread parks for good)."""
        self.clock += 3600.0

    async def aclose(self) -> None:
        self.go()
        if isinstance(self.watchdog, AsyncWatchdog):
            await self.watchdog.aclose()


@contextlib.asynccontextmanager
async def held_back(kind: str) -> AsyncIterator[HeldBack]:
    made = HeldBack(kind)
    try:
        yield made
    finally:
        await made.aclose()


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("mode", ["read", "write"])
async def test_a_hold_whose_reply_was_lost_is_given_back_once_redis_answers(
    server: OwnedRedisServer,
    namespace: str,
    kind: str,
    mode: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="cacheguard")
    async with rig(kind, server, namespace) as r:
        lock = await warmed(r.short.lock(lease=LEASE))
        take = lock.acquire_read if mode == "read" else lock.acquire_write
        with paused(server), pytest.raises(BackendUnavailable):
            await take(timeout=5, owner="lost")
        # The server ran the call when it resumed; another owner gets in long before
        # that hold's 30 s lease would have ended.
        other = r.steady.lock(lease=LEASE)
        handle = await other.acquire_write(timeout=WITHIN, owner="next")
        assert "w:lost" not in r.fields(lock)
        assert "r:lost" not in r.fields(lock)
        await release(handle)
        await until(lambda: not r.lost_ids(lock, "lost"), WITHIN, "the give-back settled")
        assert any("gave back" in rec.getMessage() for rec in caplog.records)


async def test_a_waiting_writer_s_mark_is_withdrawn_when_its_acquisition_fails(
    server: OwnedRedisServer, namespace: str, kind: str
) -> None:
    async with rig(kind, server, namespace) as r:
        lock = await warmed(r.short.lock(lease=LEASE, backoff=LONG_MARK))
        other = r.steady.lock(lease=LEASE)
        reader = await other.acquire_read(timeout=5, owner="reader")
        writer = r.short.in_background(lambda: lock.lock.acquire_write(timeout=20, owner="writer"))
        await until(lambda: "q:writer" in r.fields(lock), WITHIN, "the writer queued")
        # Its next try gets no reply: the acquisition fails.
        with paused(server), pytest.raises(BackendUnavailable):
            await asyncio.wait_for(writer, 20)
        await release(reader)
        # Its mark (30 s) would hold new readers off; it is withdrawn instead.
        await release(await other.acquire_read(timeout=WITHIN, owner="new-reader"))
        assert "q:writer" not in r.fields(lock)


async def test_the_owner_s_next_acquisition_gives_its_lost_call_back_first(
    server: OwnedRedisServer, namespace: str, kind: str
) -> None:
    async with rig(kind, server, namespace) as r, held_back(kind) as held:
        lock = await warmed(r.short.lock(lease=LEASE, watchdog=held.watchdog))
        with paused(server), pytest.raises(BackendUnavailable):
            await lock.acquire_write(timeout=5, owner="me")
        await until(lambda: r.fields(lock).get("w:me") == "1", WITHIN, "the lost call ran")
        lost_token = int(r.fields(lock)["token"])
        handle = await lock.acquire_write(timeout=5, owner="me")
        # Not a re-entry of the lost hold: that was taken back in the same script.
        assert handle.token > lost_token
        assert r.fields(lock)["w:me"] == "1"
        assert not r.lost_ids(lock, "me")
        await release(handle)
        assert await r.steady.lock().try_acquire_write(owner="other") is not None


async def test_a_give_back_never_takes_a_hold_another_call_of_the_owner_made(
    server: OwnedRedisServer, namespace: str, kind: str
) -> None:
    async with rig(kind, server, namespace) as r, held_back(kind) as held:
        lock = await warmed(r.short.lock(lease=LEASE, watchdog=held.watchdog))
        other = r.steady.lock(lease=LEASE)
        holder = await other.acquire_write(timeout=5, owner="holder")
        with paused(server), pytest.raises(BackendUnavailable):
            await lock.try_acquire_write(owner="me")  # runs on resume: refused, no mark
        await release(holder)
        # The owner gets the lock through another client (which knows nothing of the
        # lost call), before the background give-back runs.
        mine = await other.acquire_write(timeout=5, owner="me")
        held.go()
        await until(lambda: not r.lost_ids(lock, "me"), WITHIN, "the give-back ran")
        f = r.fields(lock)
        assert any(field.startswith("c:") for field in f)  # it did run: a cancellation
        assert (f["w:me"], f["token"]) == ("1", str(mine.token))
        await release(mine)  # still ours: no LockLostError


def test_through_the_guard_write_path(server: OwnedRedisServer, namespace: str) -> None:
    """``guard.write`` while Redis is paused fails; its two-tier lock's hold, taken
    when Redis resumes, does not keep other processes' writes out."""
    lost = CacheGuard.from_url(server.url, socket_timeout=0.3, namespace=namespace)
    other = CacheGuard.from_url(server.url, namespace=namespace)
    try:
        with lost.write("k"):  # connections open, scripts loaded
            pass
        with paused(server), pytest.raises(BackendUnavailable), lost.write("k"):
            pass
        with other.write("k", timeout=WITHIN):
            pass
        with lost.write("k", timeout=WITHIN):  # its next write: the lost call went back
            pass
        with other.write("k", timeout=WITHIN):
            pass
    finally:
        resume(server)
        lost.close()
        other.close()


async def test_through_the_asyncio_guard_write_path(
    server: OwnedRedisServer, namespace: str
) -> None:
    lost = AsyncCacheGuard.from_url(server.url, socket_timeout=0.3, namespace=namespace)
    other = AsyncCacheGuard.from_url(server.url, namespace=namespace)
    try:
        async with lost.write("k"):
            pass
        with paused(server), pytest.raises(BackendUnavailable):
            async with lost.write("k"):
                pass
        async with other.write("k", timeout=WITHIN):
            pass
        async with lost.write("k", timeout=WITHIN):
            pass
        async with other.write("k", timeout=WITHIN):
            pass
    finally:
        resume(server)
        await lost.aclose()
        await other.aclose()


# -- what needs no give-back --------------------------------------------------------------------


async def test_an_acquisition_refused_before_it_left_leaves_nothing_to_give_back(
    namespace: str, kind: str
) -> None:
    """A refused connection: the call never left, so nothing waits to be given back
    (a Redis that is down would otherwise queue one give-back per write)."""
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: refused at once
    short = client_options(1.0, 0.3)
    driver = Driver(
        kind,
        redis.Redis.from_url(url, **short),
        redis.asyncio.Redis.from_url(url, **short),
        namespace,
    )
    client = driver.client if kind == "sync" else driver.aclient
    lock = driver.lock(lease=LEASE)
    try:
        with pytest.raises(BackendUnavailable):
            await lock.acquire_write(timeout=5, owner="refused")
        assert give_backs.pending(client, lock.keys, "refused") == []
    finally:
        driver.client.close()
        await driver.aclient.aclose()


def test_a_closed_guard_s_lost_calls_are_forgotten(
    server: OwnedRedisServer, namespace: str
) -> None:
    """The guard closed the client its lost calls would be given back through: they
    are dropped (their holds end with their leases), not sent through a reopened pool."""
    lost = CacheGuard.from_url(server.url, socket_timeout=0.3, namespace=namespace)
    try:
        with lost.write("k"):
            pass
        with paused(server), pytest.raises(BackendUnavailable), lost.write("k"):
            pass
        keys = ResourceKeys(namespace, "k")
        owner = lost.rwlock("k").owner
        assert give_backs.pending(lost.client, keys, owner) != []
    finally:
        lost.close()
        resume(server)
    assert give_backs.pending(lost.client, keys, owner) == []
