"""The hit path and the clients ``from_url`` makes for it (issue #25): what a hit
reads without the read flow is judged as the flow would, anything else goes on in
the flow; the asyncio pool queues tasks only when it is used up; a pooled TCP
connection is checked with one poll, and one the server closed while it sat idle is
replaced; the hit's GET on a pooled connection fails as ``client.get`` does. Speed
is measured in bench/cache.py, never here."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis
import redis.asyncio

from cacheguard import CacheGuard
from cacheguard.aio import AsyncCacheGuard
from cacheguard.cache.flows.state import value_key
from cacheguard.cache.settings import client_options
from cacheguard.redis.clients import (
    QueueingPool,
    QuickCheckConnection,
    _send,
    async_client_from_url,
    direct_aget,
    sync_client_from_url,
)
from tests.helpers import wait_until


@pytest.fixture
def namespace() -> str:
    return f"hit-{uuid.uuid4().hex[:8]}"


def test_a_from_url_hit_of_a_key_of_another_type_is_counted_and_loaded(
    redis_url: str, namespace: str
) -> None:
    admin = redis.Redis.from_url(redis_url)
    guard = CacheGuard.from_url(redis_url, namespace=namespace, ttl_jitter=0)
    try:
        guard.get_or_load("warm", lambda: 0, ttl=60)  # the first read samples the clock
        admin.hset(value_key(namespace, "k"), "field", "not ours")
        assert guard.get_or_load("k", lambda: "loaded", ttl=60) == "loaded"
        stats = guard.stats()
        assert (stats.corrupt_entries, stats.loads, stats.backend_errors) == (1, 2, 0)
        assert guard.get_or_load("k", lambda: "again", ttl=60) == "loaded"  # stored over it
        assert guard.stats().l2_hits == 1
    finally:
        guard.close()
        admin.delete(value_key(namespace, "k"))
        admin.close()


async def test_an_asyncio_from_url_hit_of_a_key_of_another_type_is_counted_and_loaded(
    redis_url: str, namespace: str
) -> None:
    admin = redis.Redis.from_url(redis_url)
    guard = AsyncCacheGuard.from_url(redis_url, namespace=namespace, ttl_jitter=0)
    try:
        await guard.get_or_load("warm", lambda: 0, ttl=60)  # the first read samples the clock
        admin.hset(value_key(namespace, "k"), "field", "not ours")
        assert await guard.get_or_load("k", lambda: "loaded", ttl=60) == "loaded"
        stats = guard.stats()
        assert (stats.corrupt_entries, stats.loads, stats.backend_errors) == (1, 2, 0)
        assert await guard.get_or_load("k", lambda: "again", ttl=60) == "loaded"
        assert guard.stats().l2_hits == 1
    finally:
        await guard.aclose()
        admin.delete(value_key(namespace, "k"))
        admin.close()


def test_a_from_url_hit_with_redis_down_is_a_backend_error_and_a_bypass(namespace: str) -> None:
    guard = CacheGuard.from_url(
        "redis://127.0.0.1:1/0", namespace=namespace, connect_timeout=0.2, socket_timeout=0.2
    )
    try:
        assert guard.get_or_load("k", lambda: "loaded", ttl=60) == "loaded"
        stats = guard.stats()
        assert (stats.backend_errors, stats.bypasses, stats.loads) == (1, 1, 1)
        guard._state.server_clock.resample_at = float("inf")  # as if sampled: the hit path's GET
        assert guard.get_or_load("k", lambda: "again", ttl=60) == "again"
        stats = guard.stats()
        assert (stats.backend_errors, stats.bypasses, stats.loads) == (2, 2, 2)
    finally:
        guard.close()


async def test_the_asyncio_pool_makes_tasks_wait_for_a_connection(
    redis_url: str, namespace: str
) -> None:
    guard = AsyncCacheGuard.from_url(redis_url, namespace=namespace, max_connections=2)
    try:
        assert isinstance(guard.client.connection_pool, QueueingPool)
        names = [f"k{i}" for i in range(40)]
        values = await asyncio.gather(
            *(guard.get_or_load(name, lambda name=name: name, ttl=60) for name in names)
        )
        assert values == names
        values = await asyncio.gather(  # now 40 hits at once on 2 connections
            *(guard.get_or_load(name, lambda: "reloaded", ttl=60) for name in names)
        )
        assert values == names
        stats = guard.stats()
        assert (stats.backend_errors, stats.bypasses, stats.l2_hits) == (0, 0, 40)
        assert len(guard.client.connection_pool._in_use_connections) == 0
    finally:
        await guard.aclose()


async def _pool(redis_url: str, max_connections: int, timeout: float) -> redis.asyncio.Redis:
    client = async_client_from_url(redis_url, client_options(1.0, timeout), max_connections)
    assert isinstance(client, redis.asyncio.Redis)
    return client


async def test_a_task_waits_for_a_connection_at_most_the_pool_timeout(redis_url: str) -> None:
    client = await _pool(redis_url, 1, 0.3)
    pool = client.connection_pool
    try:
        held = await pool.get_connection()
        with pytest.raises(redis.ConnectionError, match="No connection available"):
            await asyncio.wait_for(pool.get_connection(), 5)  # the pool's 0.3 s, not 5
        waiting = asyncio.ensure_future(pool.get_connection())
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await pool.release(held)
        taken = await asyncio.wait_for(waiting, 5)
        assert taken is held
        await pool.release(taken)
    finally:
        await client.aclose()


async def test_a_waiter_cancelled_as_it_is_woken_passes_the_connection_on(redis_url: str) -> None:
    client = await _pool(redis_url, 1, 2.0)
    pool = client.connection_pool
    try:
        held = await pool.get_connection()
        first = asyncio.ensure_future(pool.get_connection())
        second = asyncio.ensure_future(pool.get_connection())
        for _ in range(500):  # both are parked on the pool (each a waiter of its own)
            if len(pool._waiters) == 2:  # type: ignore[attr-defined]
                break
            await asyncio.sleep(0.01)
        assert len(pool._waiters) == 2  # type: ignore[attr-defined]
        await pool.release(held)  # wakes the first waiter...
        first.cancel()  # ...which is cancelled before it runs
        taken = await asyncio.wait_for(second, 1.5)  # within the 2 s: woken, not timed out
        assert taken is held
        with pytest.raises(asyncio.CancelledError):
            await first
        await pool.release(taken)
    finally:
        await client.aclose()


def test_a_pooled_connection_with_a_reply_or_closed_by_the_server_is_seen(
    redis_url: str,
) -> None:
    client = sync_client_from_url(redis_url, client_options(1.0, 2.0))
    admin = redis.Redis.from_url(redis_url)
    try:
        connection = client.connection_pool.get_connection()
        assert isinstance(connection, QuickCheckConnection)
        assert connection.can_read() is False  # idle: nothing came in
        connection.send_command("PING")
        assert wait_until(connection.can_read)  # the reply arrived, unread
        assert connection.read_response() == b"PONG"
        assert connection.can_read() is False
        connection.send_command("CLIENT", "ID")
        client_id = connection.read_response()
        admin.client_kill_filter(_id=client_id)

        def seen() -> bool:
            try:
                return bool(connection.can_read())
            except redis.ConnectionError:
                return True

        assert wait_until(seen)  # the server closed it while it sat idle
        client.connection_pool.release(connection)
    finally:
        client.close()
        admin.close()


def test_an_open_circuit_keeps_a_hit_off_redis(redis_url: str, namespace: str) -> None:
    now = [0.0]
    guard = CacheGuard(
        redis.Redis.from_url(redis_url),
        namespace=namespace,
        breaker_failures=1,
        breaker_cooldown=5,
        timer=lambda: now[0],
    )
    try:
        assert guard.get_or_load("k", lambda: "cached", ttl=60) == "cached"
        guard._state.breaker("k").failure()  # as if Redis had just failed another call
        assert guard.get_or_load("k", lambda: "bypassed", ttl=60) == "bypassed"
        stats = guard.stats()
        assert (stats.bypasses, stats.l2_hits) == (1, 0)
        now[0] = 6.0  # the cooldown is over: the next call probes Redis, and hits
        assert guard.get_or_load("k", lambda: "unused", ttl=60) == "cached"
    finally:
        guard.close()
        guard.client.close()


def _server_time(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return float(seconds) + micros / 1e6


@pytest.mark.slow  # over a second: the whole suite runs it, -m 'not slow' does not
def test_an_entry_read_past_its_life_is_loaded_again(redis_url: str, namespace: str) -> None:
    # on_timeout="stale" keeps an entry in Redis for a second lifetime after its end
    # (for readers whose wait timed out): a GET still reads it, and must not serve it.
    client = redis.Redis.from_url(redis_url)
    guard = CacheGuard(
        client, namespace=namespace, on_timeout="stale", ttl_jitter=0, early_refresh_beta=0
    )
    try:
        assert guard.get_or_load("k", lambda: "v1", ttl=2) == "v1"
        entry = guard.peek_entry("k")
        assert entry is not None
        assert wait_until(lambda: _server_time(client) > entry.expires_at + 0.05, timeout=10)
        assert client.exists(value_key(namespace, "k"))  # still kept, past its life
        assert guard.get_or_load("k", lambda: "v2", ttl=2) == "v2"
        assert guard.stats().misses == 2
    finally:
        guard.close()
        client.delete(value_key(namespace, "k"))
        client.close()


class _MarksDuringGet(redis.Redis):
    """A client whose GETs, while on the wire, see an outbox write of another thread
    (the guard's recovery marked pending)."""

    guard: CacheGuard | None = None
    gets = 0

    def get(self, name: object) -> object:
        type(self).gets += 1
        if self.guard is not None:
            self.guard._state.recovery.mark()
        return super().get(name)  # type: ignore[arg-type]


def test_a_value_read_as_an_outbox_write_happens_is_served_after_the_replay(
    redis_url: str, namespace: str
) -> None:
    client = _MarksDuringGet.from_url(redis_url)
    guard = CacheGuard(client, namespace=namespace)
    replays: list[int] = []
    try:
        guard._state.recovery.add(lambda: replays.append(1))  # replays pending at once, as at start
        assert guard.get_or_load("k", lambda: "v1", ttl=60) == "v1"
        assert len(replays) == 1
        _MarksDuringGet.gets = 0
        client.guard = guard  # the next GET sees an outbox write meanwhile
        assert guard.get_or_load("k", lambda: "unused", ttl=60) == "v1"
        assert len(replays) == 2  # replayed before serving...
        assert _MarksDuringGet.gets == 2  # ...and read again after it
    finally:
        client.guard = None
        guard.close()
        client.close()


_MANY_DESCRIPTORS = """
import os, resource, sys
from cacheguard import CacheGuard

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
wanted = 1200
if soft < wanted:
    if hard != resource.RLIM_INFINITY and hard < wanted:
        sys.exit(f"the descriptor limit is {hard}: cannot open 1024 descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # a busy server's files
guard = CacheGuard.from_url(sys.argv[1], namespace=sys.argv[2])
values = [guard.get_or_load("k", lambda: "v", ttl=30) for _ in range(3)]  # a miss, then hits
sock = guard.client.connection_pool._available_connections[0]._sock
assert sock.fileno() >= 1024, sock.fileno()
print(values, guard.stats().l2_hits)
"""


@pytest.mark.slow
def test_a_pooled_connection_numbered_past_1024_is_checked_like_any(
    redis_url: str, namespace: str
) -> None:
    """from_url's connection check works on a socket numbered 1024 or more (select
    refuses those; a busy process has that many files open)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _MANY_DESCRIPTORS, redis_url, namespace],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['v', 'v', 'v'] 2"


def test_the_asyncio_pool_knows_it_is_used_up_on_every_redis_py() -> None:
    """redis-py before 7.2 says "used up" with a plain ConnectionError; the queueing
    pool must wait then too, and fail at once on any other connection error."""
    from cacheguard.redis.clients import _pool_used_up

    assert _pool_used_up(redis.ConnectionError("Too many connections"))
    assert _pool_used_up(redis.exceptions.MaxConnectionsError("Too many connections"))
    assert not _pool_used_up(redis.ConnectionError("Error 111 connecting: refused."))
    assert not _pool_used_up(redis.TimeoutError("Too many connections"))


async def test_an_asyncio_pooled_connection_the_server_closed_while_idle_is_replaced(
    redis_url: str,
) -> None:
    # A restarted Redis closes every idle pooled connection. The pool from_url makes
    # checks a connection as it is taken (redis-py skips that while maintenance
    # notifications are on, its default with RESP3), so the next command goes on a
    # new connection instead of failing on the dead one.
    client = async_client_from_url(redis_url, client_options(1.0, 2.0))
    admin = redis.Redis.from_url(redis_url)
    key = f"hit-{uuid.uuid4().hex}"
    try:
        assert await client.ping()
        pool = client.connection_pool
        (idle,) = pool._available_connections  # type: ignore[attr-defined]
        connection = await pool.get_connection()
        assert connection is idle
        await connection.send_command("CLIENT", "ID")
        client_id = await connection.read_response()
        await pool.release(connection)
        admin.client_kill_filter(_id=client_id)

        async def closed() -> bool:
            try:
                return bool(await idle.can_read())
            except (redis.ConnectionError, OSError):
                return True

        for _ in range(500):  # the server's close has reached the idle socket
            if await closed():
                break
            await asyncio.sleep(0.01)
        assert await client.set(key, "v")  # no error
        assert await client.get(key) == b"v"
        assert await client.client_id() != client_id  # on a new connection
    finally:
        await client.delete(key)
        await client.aclose()
        admin.close()


class _ScriptedWriter:
    """An asyncio stream writer whose socket buffer keeps what it is given (a
    server that stopped reading) or whose write fails."""

    def __init__(self, *, fails: bool = False) -> None:
        self.fails = fails
        self.written: list[bytes] = []
        self.transport = self

    def writelines(self, data: list[bytes]) -> None:
        if self.fails:
            raise BrokenPipeError(32, "Broken pipe")
        self.written.extend(data)

    def get_write_buffer_size(self) -> int:
        return sum(map(len, self.written))

    async def drain(self) -> None:
        await asyncio.Event().wait()  # never drained


class _ScriptedConnection:
    def __init__(self, writer: _ScriptedWriter, *, health_check_interval: int = 0) -> None:
        self._writer = writer
        self.socket_timeout = 0.05
        self.health_check_interval = health_check_interval
        self.health_checks = 0
        self.dropped = 0

    async def check_health(self) -> None:
        self.health_checks += 1

    async def disconnect(self, nowait: bool = False) -> None:
        assert nowait
        self.dropped += 1


async def test_a_direct_asyncio_write_fails_as_redis_py_s_and_drops_the_connection() -> None:
    stuck = _ScriptedConnection(_ScriptedWriter(), health_check_interval=30)
    with pytest.raises(redis.TimeoutError, match="Timeout writing to socket"):
        await asyncio.wait_for(_send(stuck, [b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"]), 5)
    assert (stuck.dropped, stuck.health_checks) == (1, 1)  # the deadline was armed
    broken = _ScriptedConnection(_ScriptedWriter(fails=True))
    with pytest.raises(redis.ConnectionError, match="Broken pipe"):
        await _send(broken, [b"GET"])
    assert (broken.dropped, broken.health_checks) == (1, 0)
    cancelled = _ScriptedConnection(_ScriptedWriter())
    cancelled.socket_timeout = 60
    task = asyncio.ensure_future(_send(cancelled, [b"GET"]))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled.dropped == 1  # half a command may be on the wire


async def test_a_direct_asyncio_get_over_a_real_connection_writes_no_task_of_its_own(
    redis_url: str,
) -> None:
    client = async_client_from_url(redis_url, client_options(1.0, 2.0))
    key = f"hit-{uuid.uuid4().hex}"
    try:
        await client.set(key, "v")
        get = direct_aget(client)
        assert get is not None
        tasks_before = len(asyncio.all_tasks())
        created = []
        loop = asyncio.get_running_loop()
        factory = loop.get_task_factory()

        def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
            created.append(coro)
            return asyncio.Task(coro, loop=loop, **kwargs)

        loop.set_task_factory(counting)
        try:
            assert await get(key) == b"v"
        finally:
            loop.set_task_factory(factory)
        assert created == []  # no wait_for task: the write did not need the deadline
        assert len(asyncio.all_tasks()) == tasks_before
    finally:
        await client.delete(key)
        await client.aclose()
