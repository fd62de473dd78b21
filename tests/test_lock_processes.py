"""The distributed lock across real processes: exclusion, crash takeover, fencing."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time

import pytest
import redis

from cacheguard import RedisRWLock
from tests import workers
from tests.helpers import subscribers, wait_until
from tests.procs import (
    CTX,
    result_within,
    run_processes,
    start_process,
    start_process_reporting,
)


@pytest.mark.slow  # over a second: the whole suite runs it, -m 'not slow' does not
@pytest.mark.parametrize("two_tier", [True, False], ids=["two-tier", "redis-only"])
def test_mutual_exclusion_canary(
    client: redis.Redis, redis_url: str, namespace: str, two_tier: bool
) -> None:
    """4 processes x 8 threads; half the operations write (non-atomic +1), half read."""
    processes, threads, rounds = 4, 8, 12
    results = run_processes(
        workers.canary_worker,
        [(redis_url, namespace, "canary", threads, rounds, two_tier)] * processes,
    )
    writes_per_thread = [sum(1 for i in range(rounds) if (i + t) % 2 == 0) for t in range(threads)]
    expected = processes * sum(writes_per_thread)
    assert int(client.get(f"{namespace}:canary:count") or 0) == expected
    assert sum(r["violations"] for r in results) == 0
    assert sum(r["reads"] for r in results) == processes * threads * rounds - expected


@pytest.mark.slow  # over a second: the whole suite runs it, -m 'not slow' does not
def test_sigkilled_writer_is_taken_over_within_lease(
    client: redis.Redis, redis_url: str, namespace: str
) -> None:
    lease = 1.0
    ready = CTX.Event()
    child = start_process(workers.hold_write_until_killed, redis_url, namespace, "k", lease, ready)
    try:
        assert ready.wait(30), "child never took the lock"
        lock = RedisRWLock(client, "k", namespace=namespace, lease=5)
        assert lock.try_acquire_write() is None  # the child holds it (watchdog renewing)
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join(10)
        killed_at = time.monotonic()
        # Must succeed inside lease + 1 s, else LockTimeout fails the test.
        with lock.write(timeout=lease + 1.0) as handle:
            took = time.monotonic() - killed_at
            assert handle.token > 1
        assert took <= lease + 1.0
    finally:
        if child.is_alive():
            child.kill()


@pytest.mark.slow
def test_fencing_tokens_increase_across_processes(
    client: redis.Redis, redis_url: str, namespace: str
) -> None:
    per_process = run_processes(workers.fencing_worker, [(redis_url, namespace, "f", 15)] * 4)
    in_lock_order = [int(t) for t in client.lrange(f"{namespace}:tokens", 0, -1)]
    assert len(in_lock_order) == 60
    # Logged inside the lock, in the order holders got in: strictly increasing.
    assert all(a < b for a, b in itertools.pairwise(in_lock_order))
    for tokens in per_process:
        assert all(a < b for a, b in itertools.pairwise(tokens))


@pytest.mark.slow
def test_writer_gets_in_past_a_stream_of_readers(
    client: redis.Redis, redis_url: str, namespace: str
) -> None:
    """Readers in 2 processes keep the read lock busy; a writer still gets in."""
    results: list[int] = []
    t = threading.Thread(
        target=lambda: results.extend(
            run_processes(workers.stream_of_readers, [(redis_url, namespace, "s", 20.0)] * 2)
        )
    )
    t.start()
    lock = RedisRWLock(client, "s", namespace=namespace, lease=5)
    try:
        # The readers are streaming: the lock is held (in read mode) when the writer comes.
        assert wait_until(lambda: client.hget(lock.keys.lock, "mode") == b"read", 30)
        with lock.write(timeout=5):  # LockTimeout here would mean writer starvation
            assert client.hget(lock.keys.lock, "mode") == b"write"
    finally:
        client.set(f"{namespace}:writer-done", 1)
        t.join(60)
    assert sum(results) > 0  # readers really were running


@pytest.mark.slow
def test_waiter_in_another_process_wakes_on_release(
    client: redis.Redis, redis_url: str, namespace: str
) -> None:
    """The waiting process's retry timer and the holder's lease both run for a minute,
    longer than the test waits: only the release announcement can wake it in time."""
    lock = RedisRWLock(client, "h", namespace=namespace, lease=60)
    holder = lock.acquire_write(owner="holder")
    child, results = start_process_reporting(
        workers.wait_for_write_woken_only_by_release, redis_url, namespace, "h"
    )
    try:
        # Queued behind the holder and subscribed (the parent's client subscribes to
        # nothing, so the subscriber is the child's pub/sub connection).
        assert wait_until(lambda: client.hexists(lock.keys.lock, "q:waiter"), 60)
        assert wait_until(lambda: subscribers(client, lock.keys.released_channel) >= 1)
        holder.release()
        token = result_within(results, 20, "the waiting process was not woken by the release")
        assert token > holder.token
    finally:
        child.join(5)
        if child.is_alive():
            child.kill()
