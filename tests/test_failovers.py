"""Failovers under mixed read/write load, on private deployments, for both guards.

The contract: **no read returns a value older than a write whose guard.write
returned successfully**, through a Sentinel crash failover, a planned Sentinel
failover (SENTINEL FAILOVER) and a SIGKILLed cluster master; no raw redis-py error
reaches a caller; writes that could not be confirmed fail (and are counted).
Each test prints its tallies (run with ``-s`` to see them; docs/reliability.md
lists a run's).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from cacheguard_testing.deployments import OwnedRedisCluster, OwnedSentinelSet

from cacheguard import CacheGuard
from cacheguard.redis.keys import ResourceKeys
from tests.failover_load import Load, Tally, guard_maker
from tests.guard_drivers import KINDS, NO_TIMER_WAKE_UP
from tests.helpers import start_gated_fill, waiting_in
from tests.test_cluster import shard_subscribers

pytest_plugins = ["tests.deployment_fixtures"]

pytestmark = pytest.mark.slow

KEYS = [f"menu:{i}" for i in range(12)]


def sentinel_url(sentinels: OwnedSentinelSet) -> str:
    hosts = ",".join(f"{h}:{p}" for h, p in sentinels.sentinel_addresses)
    return f"redis+sentinel://{hosts}/{sentinels.master_name}"


def check(load: Load, label: str) -> Tally:
    for name, tally in load.phases.items():
        print(f"{label} [{name}]: {tally.summary()}")
    total = load.totals()
    assert total.stale == 0, f"{total.stale} reads older than a successful write"
    assert not total.raw_errors, f"raw errors reached callers: {dict(total.raw_errors)}"
    after = load.phases["after"]
    assert sum(after.reads.values()) > 0, "no read was served after the failover"
    assert sum(after.writes_ok.values()) > 0, "no write succeeded after the failover"
    return total


def through(load: Load, failover: Callable[[], object]) -> None:
    """Run ``load`` before, during and after ``failover`` (which returns once the
    deployment is healthy again), until a write succeeded after it and 2 s more."""
    load.start()
    try:
        load.settle(1.5)
        load.phase("during")
        failover()
        load.phase("after")
        assert load.recovered(30), f"no write within 30 s: {load.phases['after'].summary()}"
        load.settle(2.0)
    finally:
        load.stop()


@pytest.mark.parametrize("kind", KINDS)
def test_sentinel_crash_failover_under_load(kind: str, redis_server_binary: str) -> None:
    with OwnedSentinelSet() as sentinels:
        load = Load(guard_maker(kind, sentinel_url(sentinels), namespace="fo"), KEYS)

        def crash() -> None:
            old = sentinels.kill_master()
            new = sentinels.wait_for_new_master(old, timeout=30)
            sentinels.restart(sentinels.server_at(old))  # back as the new master's replica
            sentinels.wait_healthy(timeout=30)
            print(f"sentinel crash ({kind}): master {old} killed, {new} promoted")

        through(load, crash)
        check(load, f"sentinel crash ({kind})")


@pytest.mark.parametrize("kind", KINDS)
def test_sentinel_planned_failover_under_load(kind: str, redis_server_binary: str) -> None:
    # The old master keeps taking writes until Sentinel demotes it: without WAIT its
    # invalidations were acknowledged and then lost (thousands of stale reads).
    with OwnedSentinelSet() as sentinels:
        load = Load(guard_maker(kind, sentinel_url(sentinels), namespace="fo"), KEYS)

        def planned() -> None:
            sentinels.wait_for_new_master(sentinels.planned_failover(), timeout=30)
            sentinels.wait_healthy(timeout=30)

        through(load, planned)
        check(load, f"sentinel planned failover ({kind})")


@pytest.mark.parametrize("kind", KINDS)
def test_cluster_master_sigkill_under_load(kind: str, redis_server_binary: str) -> None:
    with OwnedRedisCluster() as cluster:
        url = "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in cluster.nodes)

        def port_of(namespace: str, key: str) -> int:
            return cluster.master_for_key(ResourceKeys(namespace, key).value).port

        # The master to kill: the one holding the namespace's invalidation sequence,
        # and some of the keys too (the namespace is picked so that it does). While it
        # is down, writes of keys on the other shards must go on.
        namespace = next(
            ns
            for ns in (f"fo{i}" for i in range(100))
            if any(port_of(ns, key) == cluster.master_for_key(f"{ns}:wm").port for key in KEYS)
        )
        victim = cluster.master_for_key(f"{namespace}:wm")
        load = Load(guard_maker(kind, url, namespace=namespace), KEYS)
        moved = [key for key in KEYS if port_of(namespace, key) == victim.port]

        def kill() -> None:
            cluster.kill(victim)
            load.phase("down")  # until a replica takes over (the sequence's too)
            cluster.wait_for_failover(victim, timeout=30)
            load.phase("rejoining")
            cluster.restart(victim)  # rejoins as a replica of the promoted one
            cluster.wait_healthy(timeout=30)

        through(load, kill)
        check(load, f"cluster master SIGKILL ({kind})")
        # Wake-ups are back on the failed-over shard: a waiter whose every timer is a
        # minute long gets the fill's value through the promoted master's announcement.
        woken_by_the_announcement(cluster, url, namespace, moved[0])
        down = load.phases["down"]
        healthy = [key for key in KEYS if key not in moved]
        # The other shards kept working while the master was down: their keys were
        # read and written (with the sequence unreachable, the writes' invalidations
        # poisoned their versions), and their reads kept hitting the cache (loads:
        # about one per write).
        reads = sum(down.reads[key] for key in healthy)
        loads = sum(down.loads[key] for key in healthy)
        writes = sum(down.writes_ok[key] for key in healthy)
        print(
            f"healthy shards while the master was down: {reads} reads, {loads} loads, "
            f"{writes} writes"
        )
        assert reads > 0
        assert writes > 0
        assert loads < reads / 2


def woken_by_the_announcement(
    cluster: OwnedRedisCluster, url: str, namespace: str, name: str
) -> None:
    filler = CacheGuard.from_url(url, namespace=namespace, lease=60)
    waiter = CacheGuard.from_url(url, namespace=namespace, wait_timeout=120, on_timeout="raise")
    waiter._state.wait_backoff = NO_TIMER_WAKE_UP
    try:
        filler.invalidate(name)
        release, fill = start_gated_fill(filler, name, "filled after the failover", hold=60)
        got: list[str] = []
        asking = threading.Thread(
            target=lambda: got.append(waiter.get_or_load(name, lambda: "waiter", ttl=60))
        )
        with waiting_in(asking) as waits:
            asking.start()
            # The waiter itself waits for the announcement (the load's readers may
            # have left this key's channel subscribed: its count proves nothing).
            assert waits.wait(10), "the waiter never waited for the announcement"
        assert shard_subscribers(cluster, waiter.keys(name).released_channel) >= 1
        release.set()
        fill.join(10)
        asking.join(20)
        assert got == ["filled after the failover"]
    finally:
        filler.client.close()
        waiter.client.close()
