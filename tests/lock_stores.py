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
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import redis

from cacheguard import RedisRWLock
from cacheguard.testing import redis_server


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


# name -> a context manager yielding the Store; tests/test_lock_contract.py runs each.
STORES: dict[str, Callable[[], contextlib.AbstractContextManager[Store]]] = {
    "redis": redis_store,
}
