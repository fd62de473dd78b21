"""The lock stores the contract suite (tests/test_lock_contract.py) runs against.

Each entry of :data:`STORES` is a context manager that yields a :class:`Store`:
how to make a lock in this process, how a child process makes the same lock (a
picklable ``maker``: a module-level function and its arguments), and what the
store offers beyond the common rules (fencing, writer preference, what happens
to a frozen holder). A store whose server cannot run here makes its entry fail,
not skip: CI must run every store.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import pytest
import redis
import sqlalchemy
from cacheguard_testing.zookeeper import OwnedZooKeeperServer, zookeeper_server
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from cacheguard import RedisRWLock
from cacheguard.locks import RedlockRWLock
from cacheguard.locks.postgres.rwlock import PostgresRWLock, close_idle_connections, key_parts
from cacheguard.locks.zookeeper.rwlock import ZooKeeperRWLock
from cacheguard.testing import OwnedRedisServer, redis_server, require_real_redis


class Lock(Protocol):
    """What every store's lock offers (``RedisRWLock``'s shape)."""

    name: str

    def acquire_read(self, timeout: float | None = None) -> Any: ...
    def acquire_write(self, timeout: float | None = None) -> Any: ...
    def read(self, timeout: float | None = None) -> Any: ...
    def write(self, timeout: float | None = None) -> Any: ...


@dataclass
class Store:
    """One lock store under the contract."""

    name: str
    # A lock named ``name`` in this process (each call may return a new object for the
    # same lock: all of them exclude each other).
    make: Callable[[str], Lock]
    # (module-level function, args): ``maker(*args, name)`` builds the same lock in a
    # child process (spawned: it imports and connects on its own).
    maker: tuple[Callable[..., Lock], tuple[Any, ...]]
    # Seconds after a holder's death by which the store must have freed its lock.
    recovers_within: float
    fencing: bool = True  # write handles carry strictly increasing tokens
    # Test-side probe: is a writer queued on the lock ``name``? Given by stores whose
    # waiting writer holds off new readers (writer preference); None: no preference.
    writer_waiting: Callable[[str], bool] | None = None
    # A holder frozen (SIGSTOP) past its lease or session: "taken over" by a waiter
    # (leases, ZooKeeper sessions) or "keeps" the lock (a live database session).
    frozen_holder: Literal["taken over", "keeps"] = "taken over"


# -- Redis (one server) ---------------------------------------------------------------------------

REDIS_LEASE = 2.0


def redis_lock(url: str, namespace: str, name: str) -> RedisRWLock:
    return RedisRWLock(redis.Redis.from_url(url), name, namespace=namespace, lease=REDIS_LEASE)


@contextlib.contextmanager
def redis_store() -> Iterator[Store]:
    with redis_server() as endpoint:
        namespace = f"contract-{uuid.uuid4().hex[:8]}"
        client = redis.Redis.from_url(endpoint.url)

        def writer_waiting(name: str) -> bool:
            key = RedisRWLock(client, name, namespace=namespace).keys.lock
            return any(field.startswith(b"q:") for field in client.hkeys(key))

        try:
            yield Store(
                name="redis",
                make=lambda name: redis_lock(endpoint.url, namespace, name),
                maker=(redis_lock, (endpoint.url, namespace)),
                recovers_within=REDIS_LEASE,
                writer_waiting=writer_waiting,
            )
        finally:
            for key in client.scan_iter(match=f"{namespace}:*", count=1000):
                client.delete(key)
            client.close()


# -- Redlock (five throwaway masters) -------------------------------------------------------------

REDLOCK_MASTERS = 5
REDLOCK_LEASE = 2.0


@contextlib.contextmanager
def redlock_masters(count: int = REDLOCK_MASTERS) -> Iterator[list[OwnedRedisServer]]:
    """``count`` throwaway ``redis-server`` masters on free loopback ports, each killed
    by its PID afterwards (also the ones a test killed or froze: a frozen one is
    SIGKILLed too)."""
    servers: list[OwnedRedisServer] = []
    try:
        for _ in range(count):
            servers.append(OwnedRedisServer())
        yield servers
    finally:
        for server in servers:
            server.close()


def redlock_lock(urls: tuple[str, ...], namespace: str, name: str) -> RedlockRWLock:
    clients = [redis.Redis.from_url(url) for url in urls]
    return RedlockRWLock(clients, name, namespace=namespace, lease=REDLOCK_LEASE)


def redlock_writer_waiting(clients: list[redis.Redis], key: str) -> bool:
    """Is a writer queued (a waiting mark in the lock hash) on a majority of masters?"""
    marked = 0
    for client in clients:
        with contextlib.suppress(redis.RedisError):
            marked += any(field.startswith(b"q:") for field in client.hkeys(key))
    return marked > len(clients) // 2


@contextlib.contextmanager
def redlock_store() -> Iterator[Store]:
    with redlock_masters() as servers:
        urls = tuple(server.url for server in servers)
        namespace = f"contract-{uuid.uuid4().hex[:8]}"
        clients = [redis.Redis.from_url(url, socket_timeout=2) for url in urls]

        def make(name: str) -> RedlockRWLock:
            return RedlockRWLock(clients, name, namespace=namespace, lease=REDLOCK_LEASE)

        try:
            yield Store(
                name="redlock",
                make=make,
                maker=(redlock_lock, (urls, namespace)),
                recovers_within=REDLOCK_LEASE,
                writer_waiting=lambda name: redlock_writer_waiting(clients, make(name).keys.lock),
            )
        finally:
            for client in clients:
                client.close()


# -- ZooKeeper (one standalone server, through kazoo) -----------------------------------------

# The session timeout: a dead or frozen holder's znode goes when its session expires.
ZOOKEEPER_SESSION = 2.0


def zookeeper_client(hosts: str) -> KazooClient:
    client = KazooClient(hosts=hosts, timeout=ZOOKEEPER_SESSION)
    client.start(timeout=15)
    return client


def zookeeper_lock(hosts: str, namespace: str, name: str) -> ZooKeeperRWLock:
    """A lock on a client of its own (in a child process: its own session)."""
    return ZooKeeperRWLock(zookeeper_client(hosts), name, namespace=namespace)


def zookeeper_writer_waiting(client: KazooClient, lock: ZooKeeperRWLock) -> bool:
    """Is a write node queued behind another node of the lock (a writer waiting)?"""
    try:
        children = client.get_children(lock.path)
    except NoNodeError:
        return False
    queue = sorted(children, key=lambda child: child.rpartition("-")[2])
    return any("-write-" in child for child in queue[1:])


@contextlib.contextmanager
def zookeeper_or_skip() -> Iterator[OwnedZooKeeperServer]:
    """A throwaway ZooKeeper; where none is installed, a skip (a failure when real
    servers are required, as in CI: CACHEGUARD_REQUIRE_REDIS)."""
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(zookeeper_server())
        except FileNotFoundError as exc:
            if require_real_redis():
                raise
            pytest.skip(f"ZooKeeper is not installed ({exc}); CI requires it")
        yield server


@contextlib.contextmanager
def zookeeper_store() -> Iterator[Store]:
    with zookeeper_or_skip() as server:
        namespace = f"contract-{uuid.uuid4().hex[:8]}"
        client = zookeeper_client(server.hosts)

        def make(name: str) -> ZooKeeperRWLock:
            return ZooKeeperRWLock(client, name, namespace=namespace)

        try:
            yield Store(
                name="zookeeper",
                make=make,
                maker=(zookeeper_lock, (server.hosts, namespace)),
                # Sessions expire on the server's ticks (0.1 s) after the timeout.
                recovers_within=ZOOKEEPER_SESSION + 0.5,
                writer_waiting=lambda name: zookeeper_writer_waiting(client, make(name)),
            )
        finally:
            client.stop()
            client.close()


# -- PostgreSQL (advisory locks on a dedicated session per owner) --------------------------------

POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def postgres_url() -> str:
    """``DATABASE_URL`` if it names PostgreSQL (CI sets it), through psycopg 3; else the
    local test server."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgresql"):
        return POSTGRES_URL
    return "postgresql+psycopg" + url[url.index("://") :]


def postgres_lock(url: str, namespace: str, fence_sequence: str, name: str) -> PostgresRWLock:
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.NullPool)
    return PostgresRWLock(engine, name, namespace=namespace, fence_sequence=fence_sequence)


@contextlib.contextmanager
def postgres_engine() -> Iterator[sqlalchemy.Engine]:
    """An engine on the test PostgreSQL. Unreachable: a failure when a real server is
    required (``CACHEGUARD_REQUIRE_REDIS``, as in CI), else a skip."""
    engine = sqlalchemy.create_engine(postgres_url(), connect_args={"connect_timeout": 5})
    try:
        with engine.connect():
            pass
    except sqlalchemy.exc.OperationalError as exc:
        engine.dispose()
        if require_real_redis():
            raise AssertionError(f"PostgreSQL unreachable at {postgres_url()}: {exc}") from exc
        pytest.skip(f"PostgreSQL unreachable at {postgres_url()} (CI requires it)")
    try:
        yield engine
    finally:
        close_idle_connections(engine)
        engine.dispose()


def postgres_writer_waiting(engine: sqlalchemy.Engine, key: int) -> bool:
    """Is an exclusive request queued on the advisory ``key``?"""
    classid, objid = key_parts(key)
    query = sqlalchemy.text(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND mode = 'ExclusiveLock' AND classid = CAST(:classid AS oid)"
        " AND objid = CAST(:objid AS oid) AND objsubid = 1)"
    )
    with engine.connect() as conn:
        return bool(conn.execute(query, {"classid": classid, "objid": objid}).scalar_one())


@contextlib.contextmanager
def postgres_store() -> Iterator[Store]:
    with postgres_engine() as engine:
        namespace = f"contract-{uuid.uuid4().hex[:8]}"
        fence = f"cg_contract_fence_{uuid.uuid4().hex[:8]}"  # dropped afterwards

        def make(name: str) -> PostgresRWLock:
            return PostgresRWLock(engine, name, namespace=namespace, fence_sequence=fence)

        try:
            yield Store(
                name="postgres",
                make=make,
                maker=(postgres_lock, (postgres_url(), namespace, fence)),
                # The server ends a dead client's session as soon as its socket closes.
                recovers_within=2.0,
                writer_waiting=lambda name: postgres_writer_waiting(engine, make(name).key),
                frozen_holder="keeps",  # no lease: a live session keeps its locks
            )
        finally:
            with engine.begin() as conn:
                conn.execute(sqlalchemy.text(f"DROP SEQUENCE IF EXISTS {fence}"))


# name -> a context manager yielding the Store; tests/test_lock_contract.py runs each.
STORES: dict[str, Callable[[], contextlib.AbstractContextManager[Store]]] = {
    "redis": redis_store,
    "redlock": redlock_store,
    "postgres": postgres_store,
    "zookeeper": zookeeper_store,
}


# -- another owner: a thread (shared by the lock test modules) ---------------------------------


class Outcome:
    """What another owner's work ended with: its result, or its exception."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._value: Any = None

    def set(self, value: Any) -> None:
        self._value = value
        self._done.set()

    def result(self, timeout: float) -> Any:
        assert self._done.wait(timeout), f"the other owner did not finish within {timeout} s"
        return self._value


def in_thread(work: Callable[[], Any]) -> Outcome:
    """Run ``work`` as another owner (a thread); its result, or the exception it raised."""
    outcome = Outcome()

    def run() -> None:
        try:
            outcome.set(work())
        except Exception as exc:
            outcome.set(exc)

    threading.Thread(target=run, daemon=True).start()
    return outcome


def held_briefly(context: Any) -> str:
    with context:
        return "held"


def token_of(context: Any) -> int:
    with context as handle:
        return int(handle.token)
