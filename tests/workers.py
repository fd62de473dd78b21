"""Functions that tests run in child processes (module level, so spawn can import them)."""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

from cacheguard import LockFactory, RedisRWLock
from cacheguard.backoff import Backoff
from tests.helpers import client_for, run_threads


def canary_worker(
    url: str, namespace: str, name: str, threads: int, rounds: int, two_tier: bool
) -> dict[str, int]:
    """Writers do a non-atomic read-modify-write; readers check no writer is inside."""
    client = client_for(url)
    counter, canary = f"{namespace}:canary:count", f"{namespace}:canary:inside"
    factory = LockFactory(client, namespace=namespace, lease=5, timeout=60)
    violations = 0
    reads = 0
    mutex = threading.Lock()

    def run(index: int) -> None:
        nonlocal violations, reads
        lock: Any = (
            factory.rwlock(name)
            if two_tier
            else RedisRWLock(client, name, namespace=namespace, lease=5, timeout=60)
        )
        for i in range(rounds):
            if (i + index) % 2 == 0:
                with lock.write():
                    if client.getset(canary, 1) not in (None, b"0"):
                        with mutex:
                            violations += 1
                    value = int(client.get(counter) or 0)
                    time.sleep(0.0005)  # widen the race window
                    client.set(counter, value + 1)
                    client.set(canary, 0)
            else:
                with lock.read():
                    if client.get(canary) == b"1":
                        with mutex:
                            violations += 1
                    with mutex:
                        reads += 1

    run_threads(threads, run)
    return {"violations": violations, "reads": reads}


def hold_write_until_killed(url: str, namespace: str, name: str, lease: float, ready: Any) -> None:
    """Take the write lock (watchdog on), announce it, then sleep until SIGKILLed."""
    lock = RedisRWLock(client_for(url), name, namespace=namespace, lease=lease)
    lock.acquire_write(timeout=10)
    ready.set()
    time.sleep(120)


def fencing_worker(url: str, namespace: str, name: str, rounds: int) -> list[int]:
    """Take the write lock repeatedly; log each token to a shared list inside the lock."""
    client = client_for(url)
    lock = RedisRWLock(client, name, namespace=namespace, lease=5, timeout=60)
    tokens = []
    for _ in range(rounds):
        with lock.write() as handle:
            client.rpush(f"{namespace}:tokens", handle.token)
            tokens.append(handle.token)
    return tokens


def stream_of_readers(url: str, namespace: str, name: str, stop_after: float) -> int:
    """Overlapping readers: each re-acquires before the others leave, for a while."""
    client = client_for(url)
    held = 0
    deadline = time.monotonic() + stop_after

    def run() -> None:
        nonlocal held
        lock = RedisRWLock(client, name, namespace=namespace, lease=5, timeout=1)
        while time.monotonic() < deadline and not client.exists(f"{namespace}:writer-done"):
            try:
                with lock.read(timeout=0.5):
                    held += 1
                    time.sleep(0.01)
            except Exception:
                time.sleep(0.001)

    pool = [threading.Thread(target=run) for _ in range(4)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return held


def wait_for_write_woken_only_by_release(url: str, namespace: str, name: str) -> int:
    """Block on the write lock with a retry timer of a minute (and a holder whose lease
    runs as long): within the test's deadline only the release announcement can wake
    this waiter. Returns the fencing token it got."""
    lock = RedisRWLock(
        client_for(url),
        name,
        namespace=namespace,
        lease=5,
        timeout=120,
        backoff=functools.partial(Backoff, initial=60.0, cap=60.0),
    )
    with lock.write(owner="waiter") as handle:
        return handle.token
