"""Failovers under mixed read/write load, on private deployments, for both guards.

The contract: **no read returns a value older than a write whose guard.write
returned successfully**, through a Sentinel crash failover, a planned Sentinel
failover (SENTINEL FAILOVER) and a SIGKILLed cluster master; no raw redis-py error
reaches a caller; writes that could not be confirmed fail (and are counted).
Each test prints its tallies (run with ``-s`` to see them; docs/reliability.md
lists a run's).
"""

from __future__ import annotations

import pytest

from cacheguard.deployments import OwnedRedisCluster, OwnedSentinelSet
from cacheguard.keys import ResourceKeys
from tests.failover_load import Load, Tally, guard_maker
from tests.guard_drivers import KINDS

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


@pytest.mark.parametrize("kind", KINDS)
def test_sentinel_crash_failover_under_load(kind: str, redis_server_binary: str) -> None:
    with OwnedSentinelSet() as sentinels:
        load = Load(guard_maker(kind, sentinel_url(sentinels), namespace="fo"), KEYS)
        load.start()
        try:
            load.settle(1.5)
            load.phase("during")
            old = sentinels.kill_master()
            sentinels.wait_for_new_master(old, timeout=30)
            sentinels.restart(sentinels.server_at(old))  # back as the new master's replica
            sentinels.wait_healthy(timeout=30)
            load.phase("after")
            load.settle(2.0)
        finally:
            load.stop()
        check(load, f"sentinel crash ({kind})")


@pytest.mark.parametrize("kind", KINDS)
def test_sentinel_planned_failover_under_load(kind: str, redis_server_binary: str) -> None:
    # The old master keeps taking writes until Sentinel demotes it: without WAIT its
    # invalidations were acknowledged and then lost (thousands of stale reads).
    with OwnedSentinelSet() as sentinels:
        load = Load(guard_maker(kind, sentinel_url(sentinels), namespace="fo"), KEYS)
        load.start()
        try:
            load.settle(1.5)
            load.phase("during")
            old = sentinels.planned_failover()
            sentinels.wait_for_new_master(old, timeout=30)
            sentinels.wait_healthy(timeout=30)
            load.phase("after")
            load.settle(2.0)
        finally:
            load.stop()
        check(load, f"sentinel planned failover ({kind})")


@pytest.mark.parametrize("kind", KINDS)
def test_cluster_master_sigkill_under_load(kind: str, redis_server_binary: str) -> None:
    with OwnedRedisCluster() as cluster:
        namespace = "fo"
        sequence = f"{namespace}:wm"
        url = "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in cluster.nodes)
        load = Load(guard_maker(kind, url, namespace=namespace), KEYS)
        # The master to kill: one serving some keys, not the namespace's sequence
        # (still one shard's; see docs/guide.md, "Cluster and Sentinel").
        keep = cluster.master_for_key(sequence).port

        def port_of(key: str) -> int:
            return cluster.master_for_key(ResourceKeys(namespace, key).value).port

        victim = next(
            m
            for m in cluster.masters()
            if m.port != keep and any(port_of(key) == m.port for key in KEYS)
        )
        load.start()
        try:
            load.settle(1.5)
            load.phase("during")
            cluster.kill(victim)
            cluster.wait_for_failover(victim, timeout=30)
            cluster.restart(victim)  # rejoins as a replica of the promoted one
            cluster.wait_healthy(timeout=30)
            load.phase("after")
            load.settle(2.0)
        finally:
            load.stop()
        check(load, f"cluster master SIGKILL ({kind})")
        during = load.phases["during"]
        healthy = [key for key in KEYS if port_of(key) != victim.port]
        # The other shards kept working: their keys were read and written meanwhile.
        assert all(during.reads[key] > 0 for key in healthy)
        assert sum(during.writes_ok[key] for key in healthy) > 0
