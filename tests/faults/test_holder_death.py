"""Holder death and freeze: a filler SIGKILLed or SIGSTOPped mid-load.

(A writer SIGKILLed mid-transaction, write locks held, is in
``tests/test_sqlalchemy.py::test_a_process_killed_mid_transaction_frees_its_locks_at_lease_end``.)
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import redis

from cacheguard import CacheGuard
from cacheguard.testing import OwnedRedisServer
from tests import cache_workers
from tests.procs import CTX, run_processes, start_process


@pytest.mark.slow  # over a second: the whole suite runs it, -m 'not slow' does not
def test_frozen_fill_past_its_lease_is_rejected(owned_redis: OwnedRedisServer) -> None:
    """The GC-pause case: a filler SIGSTOPped past its lease, a fill and a write
    meanwhile; on SIGCONT its store is refused and the newer value stays."""
    client, redis_url, namespace = redis.Redis.from_url(owned_redis.url), owned_redis.url, "death"
    lease = 1.0
    loading = CTX.Event()
    result: list[dict[str, object]] = []
    child_done = threading.Event()

    def run_child() -> None:
        result.extend(
            run_processes(cache_workers.paused_filler, [(redis_url, namespace, loading, lease)])
        )
        child_done.set()

    runner = threading.Thread(target=run_child)
    runner.start()
    assert loading.wait(30), "the child never started loading"
    child_pid = _child_pid_loading()
    os.kill(child_pid, signal.SIGSTOP)
    try:
        time.sleep(lease + 0.5)  # its lease runs out while frozen
        guard = CacheGuard(client, namespace=namespace, lease=5, wait_timeout=10, ttl_jitter=0)
        with guard.write("k"):
            pass  # a writer invalidates meanwhile
        assert guard.get_or_load("k", lambda: "new", ttl=60) == "new"
    finally:
        os.kill(child_pid, signal.SIGCONT)
    runner.join(60)
    assert child_done.is_set()
    assert result[0] == {"value": "old", "rejected": 1}  # its caller got its load ...
    assert guard.peek("k") == "new"  # ... but the cache kept the newer value


def _child_pid_loading() -> int:
    children = [p for p in CTX.active_children()]
    assert len(children) == 1
    pid = children[0].pid
    assert pid is not None
    return pid


@pytest.mark.slow  # over a second: the whole suite runs it, -m 'not slow' does not
def test_sigkilled_filler_is_taken_over(owned_redis: OwnedRedisServer) -> None:
    """A filler SIGKILLed mid-load: the next caller takes over when its lease ends."""
    client, redis_url, namespace = redis.Redis.from_url(owned_redis.url), owned_redis.url, "death"
    lease = 1.0
    loading = CTX.Event()
    child = start_process(cache_workers.paused_filler, redis_url, namespace, loading, lease)
    try:
        assert loading.wait(30)
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join(10)
        guard = CacheGuard(client, namespace=namespace, lease=5, wait_timeout=lease + 1.0)
        start = time.monotonic()
        value = guard.get_or_load("k", lambda: "taken over", ttl=60)
        took = time.monotonic() - start
        print(f"\nSIGKILLed filler (lease {lease:g} s) taken over after {took:.3f} s")
        assert value == "taken over"
        assert took <= lease + 1.0
        assert guard.stats().wait_timeouts == 0  # not the timeout policy: a real takeover
    finally:
        if child.is_alive():
            child.kill()
