"""The throwaway Redis Cluster and Sentinel deployments, against the real processes.

Tests that kill or fail over a master start a private deployment, so the
session-wide ones (shared with later tests) stay healthy.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import redis
from cacheguard_testing import deployments
from cacheguard_testing.deployments import OwnedClusterNode, OwnedRedisCluster, OwnedSentinelSet
from redis.cluster import RedisCluster

from cacheguard.exceptions import BackendUnavailable
from cacheguard.testing import OwnedRedisServer

# The redis_cluster, sentinel_set, cluster_namespace and redis_server_binary fixtures.
pytest_plugins = ["tests.deployment_fixtures"]

T = TypeVar("T")

needs_redis_server = pytest.mark.usefixtures("redis_server_binary")


def eventually(action: Callable[[], T], timeout: float = 10.0) -> T:
    """``action()``'s result once it stops raising Redis errors, within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return action()
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def keys_on_every_master(cluster: OwnedRedisCluster, namespace: str) -> dict[int, str]:
    """One key per master (by port), found by trying hash tags."""
    masters = {m.port for m in cluster.masters()}
    keys: dict[int, str] = {}
    for i in range(1000):
        key = f"{namespace}:{{tag{i}}}"
        keys.setdefault(cluster.master_for_key(key).port, key)
        if keys.keys() == masters:
            return keys
    raise AssertionError(f"no hash tag found for some master: {keys}")


def replicate_now(url: str) -> None:
    """Block until the master at ``url`` has one replica acknowledging its writes, so
    a failover cannot lose what the test wrote."""
    with redis.Redis.from_url(url, socket_timeout=5) as client:
        assert client.wait(1, 3000) >= 1


def role_of(url: str) -> str:
    with redis.Redis.from_url(url, socket_timeout=2, decode_responses=True) as client:
        return str(client.role()[0])


def assert_all_gone(pids: list[int], workdirs: list[str]) -> None:
    assert pids, "the deployment reported no processes"
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not [d for d in workdirs if os.path.exists(d)]


def child_redis_servers() -> set[int]:
    """PIDs of this process's redis-server children (Linux /proc)."""
    me, found = os.getpid(), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        if ppid == me and comm == "redis-server":
            found.add(int(stat.parent.name))
    return found


# --- Redis Cluster ---------------------------------------------------------------


def test_cluster_has_three_masters_each_with_a_replica_over_all_slots(
    redis_cluster: OwnedRedisCluster,
) -> None:
    masters, replicas = redis_cluster.masters(), redis_cluster.replicas()
    assert len(masters) == 3
    assert len(replicas) == 3
    assert {redis_cluster.replica_of(m).port for m in masters} == {r.port for r in replicas}
    with redis.Redis.from_url(redis_cluster.url, decode_responses=True) as client:
        ranges = client.execute_command("CLUSTER", "SLOTS")
    assert sum(int(r[1]) - int(r[0]) + 1 for r in ranges) == 16384
    assert all(len(r) == 4 for r in ranges), "each slot range has a master and one replica"
    assert {int(r[2][1]) for r in ranges} == {m.port for m in masters}


def test_every_master_serves_keys_through_the_cluster_client(
    redis_cluster: OwnedRedisCluster, cluster_namespace: str
) -> None:
    keys = keys_on_every_master(redis_cluster, cluster_namespace)
    client = RedisCluster(startup_nodes=redis_cluster.startup_nodes, decode_responses=True)
    try:
        for port, key in keys.items():
            client.set(key, f"on {port}")
            assert client.get(key) == f"on {port}"
            with redis.Redis(host="127.0.0.1", port=port, decode_responses=True) as node:
                assert node.get(key) == f"on {port}", "the key lives on the master chosen"
    finally:
        client.close()


@pytest.mark.slow
@needs_redis_server
def test_private_cluster_flushes_then_closes_leaving_nothing() -> None:
    cluster = OwnedRedisCluster(masters=1, replicas_per_master=1)
    client = cluster.client()
    client.set("k", "v")
    cluster.flushall()
    assert client.get("k") is None
    client.close()
    pids, workdirs = cluster.pids(), cluster.workdirs()
    assert len(pids) == 2
    cluster.close()
    cluster.close()  # idempotent
    assert_all_gone(pids, workdirs)


@needs_redis_server
def test_cluster_start_up_timeout_names_what_is_missing_and_leaves_nothing() -> None:
    before = child_redis_servers()
    # Masters refuse cluster_state:ok for 2 s after they start: this cannot converge.
    with pytest.raises(BackendUnavailable, match="did not happen within"):
        OwnedRedisCluster(startup_timeout=0.01)
    assert child_redis_servers() <= before


@pytest.mark.slow
@needs_redis_server
def test_killed_master_is_replaced_by_its_replica_and_rejoins_as_a_replica() -> None:
    cluster = OwnedRedisCluster()
    try:
        key = f"kill:{{{uuid.uuid4().hex}}}"
        master = cluster.master_for_key(key)
        replica = cluster.replica_of(master)
        client = cluster.client(decode_responses=True)
        client.set(key, "before")
        replicate_now(master.url)

        cluster.kill(master)
        promoted: OwnedClusterNode = cluster.wait_for_failover(master, timeout=30)

        assert promoted is replica
        assert cluster.master_for_key(key) is replica
        # The client made before the failover finds the new master by itself.
        assert eventually(lambda: client.get(key)) == "before"
        client.set(key, "after")
        assert client.get(key) == "after"
        client.close()

        cluster.restart(master)
        cluster.wait_healthy(timeout=20)
        assert role_of(master.url) == "slave"
        assert cluster.replica_of(promoted) is master
        assert len(cluster.masters()) == 3
    finally:
        pids, workdirs = cluster.pids(), cluster.workdirs()
        cluster.close()
    assert_all_gone(pids, workdirs)


# --- Sentinel ------------------------------------------------------------------------


def test_every_sentinel_knows_the_master_its_replica_and_the_others(
    sentinel_set: OwnedSentinelSet,
) -> None:
    master = sentinel_set.master_address()
    for host, port in sentinel_set.sentinel_addresses:
        with redis.Redis(host=host, port=port, decode_responses=True) as sentinel:
            state = sentinel.sentinel_master(sentinel_set.master_name)
            assert (state["ip"], int(state["port"])) == master
            assert int(state["num-slaves"]) == 1
            assert int(state["num-other-sentinels"]) == 2
    assert sentinel_set.sentinel().discover_master(sentinel_set.master_name) == master


def test_master_for_reads_and_writes(sentinel_set: OwnedSentinelSet) -> None:
    key = f"t{uuid.uuid4().hex[:12]}:k"
    master = sentinel_set.sentinel().master_for(sentinel_set.master_name, decode_responses=True)
    try:
        master.set(key, "value")
        assert master.get(key) == "value"
    finally:
        master.delete(key)
        master.close()


@pytest.mark.slow
@needs_redis_server
def test_sentinel_close_kills_every_process_and_removes_its_directories() -> None:
    sentinels = OwnedSentinelSet()
    pids, workdirs = sentinels.pids(), sentinels.workdirs()
    assert len(pids) == 5  # master, replica, three sentinels
    sentinels.close()
    sentinels.close()  # idempotent
    assert_all_gone(pids, workdirs)


@pytest.mark.slow
@needs_redis_server
def test_restart_refuses_a_port_another_server_took(monkeypatch: pytest.MonkeyPatch) -> None:
    # Between a kill and the restart anyone may bind the freed port; a restart must
    # not take that server's PING for its own.
    monkeypatch.setattr(deployments, "_RESTART_PATIENCE", 0.5)
    sentinels = OwnedSentinelSet()
    try:
        replica = next(s for s in sentinels.servers if s.port != sentinels.master_address()[1])
        replica.kill()
        intruder = OwnedRedisServer(port=replica.port)
        try:
            with pytest.raises(BackendUnavailable, match="another process"):
                sentinels.restart(replica)
        finally:
            intruder.close()
        assert not replica.alive
        sentinels.restart(replica)
        sentinels.wait_healthy(timeout=20)
    finally:
        pids, workdirs = sentinels.pids(), sentinels.workdirs()
        sentinels.close()
    assert_all_gone(pids, workdirs)


@pytest.mark.slow
@needs_redis_server
def test_sigkill_of_the_master_promotes_the_replica() -> None:
    sentinels = OwnedSentinelSet()
    try:
        name = sentinels.master_name
        old_server = sentinels.master_server()
        sentinels.sentinel().master_for(name).set("k", "before")
        replicate_now(old_server.url)

        old = sentinels.kill_master()
        new = sentinels.wait_for_new_master(old, timeout=30)

        assert new != old
        master = sentinels.sentinel().master_for(name, decode_responses=True)
        assert master.get("k") == "before"
        master.set("k", "after")
        assert master.get("k") == "after"
        master.close()

        sentinels.restart(old_server)
        sentinels.wait_healthy(timeout=20)
        assert role_of(old_server.url) == "slave"
        assert sentinels.master_address() == new
    finally:
        pids, workdirs = sentinels.pids(), sentinels.workdirs()
        sentinels.close()
    assert_all_gone(pids, workdirs)


@pytest.mark.slow
@needs_redis_server
def test_planned_failover_makes_the_old_master_a_replica() -> None:
    sentinels = OwnedSentinelSet()
    try:
        name = sentinels.master_name
        old_server = sentinels.master_server()

        old = sentinels.planned_failover()
        new = sentinels.wait_for_new_master(old, timeout=30)

        assert new != old
        assert role_of(old_server.url) == "slave"
        master = sentinels.sentinel().master_for(name, decode_responses=True)
        master.set("k", "after")
        assert master.get("k") == "after"
        master.close()
        sentinels.wait_healthy(timeout=20)
    finally:
        pids, workdirs = sentinels.pids(), sentinels.workdirs()
        sentinels.close()
    assert_all_gone(pids, workdirs)
