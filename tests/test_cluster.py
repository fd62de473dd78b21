"""Both guards and the locks on a real Redis Cluster (3 masters, 3 replicas, started
by the session fixture): keys on every master, fills and writes across slots,
wake-ups over sharded pub/sub, L1 invalidations broadcast to every process.

Failovers under load (a master killed, a Sentinel failover) are in tests/test_failovers.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis
import redis.asyncio.cluster
import redis.cluster
from cacheguard_testing.deployments import OwnedRedisCluster

from cacheguard import MISSING, BackendUnavailable, CacheGuard, RedisRWLock
from cacheguard.aio import AsyncCacheGuard
from cacheguard.cache.scripts import NEXT_STAMP
from cacheguard.cache.watermark import note_snapshot
from cacheguard.cache.wire import POISON_FLOOR
from cacheguard.redis.async_scripts import arun_pipelined
from cacheguard.redis.keys import ResourceKeys
from cacheguard.redis.scripts import run_pipelined
from tests import cache_workers
from tests.guard_drivers import KINDS, NO_TIMER_WAKE_UP, Guard, guard_from_url, guards_on
from tests.helpers import start_gated_fill, wait_until, waiting_in
from tests.procs import CTX, result_within, run_processes, start_process_reporting
from tests.test_guard_both_drivers import Loads, started

pytest_plugins = ["tests.deployment_fixtures"]

Make = Callable[..., Guard]


def cluster_url(cluster: OwnedRedisCluster) -> str:
    return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in cluster.nodes)


@pytest.fixture
def cluster_ns() -> str:
    return f"cg-cluster-{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=KINDS)
async def make(
    request: pytest.FixtureRequest, redis_cluster: OwnedRedisCluster, cluster_ns: str
) -> AsyncIterator[Make]:
    url = cluster_url(redis_cluster)
    async with guards_on(request.param, url, namespace=cluster_ns, ttl_jitter=0) as build:
        yield build


def names_on_every_master(cluster: OwnedRedisCluster, namespace: str) -> list[str]:
    """One resource name per master (its keys' slot served by that master)."""
    found: dict[int, str] = {}
    for i in range(1000):
        name = f"menu:{i}"
        port = cluster.master_for_key(ResourceKeys(namespace, name).value).port
        found.setdefault(port, name)
        if len(found) == len(cluster.masters()):
            return list(found.values())
    raise AssertionError(f"no name found for every master: {found}")


def shard_subscribers(cluster: OwnedRedisCluster, channel: str) -> int:
    """Subscribers of the sharded ``channel`` on the master serving its slot."""
    node = cluster.master_for_key(channel)
    with redis.Redis(port=node.port) as direct:
        return int(direct.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1])


@pytest.mark.slow
async def test_every_master_serves_fills_writes_and_invalidations(
    make: Make, redis_cluster: OwnedRedisCluster, cluster_ns: str
) -> None:
    guard = make()
    names = names_on_every_master(redis_cluster, cluster_ns)
    assert len(names) == 3
    loads = {name: Loads(f"value of {name}") for name in names}
    for name in names:
        assert await guard.get_or_load(name, loads[name], ttl=60) == f"value of {name}"
        assert await guard.get_or_load(name, loads[name], ttl=60) == f"value of {name}"
        assert loads[name].calls == 1
        assert await guard.peek(name) == f"value of {name}"
    async with guard.write(*names):  # write locks on three masters, in one global order
        for name in names:
            assert await guard.peek(name) is MISSING
    await guard.get_or_load(names[0], loads[names[0]], ttl=60)
    await guard.invalidate(*names)  # one pipeline per node
    for name in names:
        assert await guard.peek(name) is MISSING
    assert await guard.get_or_load(names[1], loads[names[1]], ttl=60) == f"value of {names[1]}"
    assert guard.stats().backend_errors == 0


@pytest.mark.slow
async def test_a_waiter_on_a_cluster_is_woken_by_the_fills_sharded_announcement(
    make: Make, redis_cluster: OwnedRedisCluster, cluster_ns: str
) -> None:
    # Every retry timer a minute long: only the SPUBLISH of the fill's end, heard on
    # the shard that owns the key, can wake the waiter within the test's deadline.
    filler = make(lease=60)
    waiter = make(lease=60, wait_timeout=120, on_timeout="raise")
    waiter.guard._state.wait_backoff = NO_TIMER_WAKE_UP
    for name in names_on_every_master(redis_cluster, cluster_ns):
        gate = threading.Event()
        slow = Loads(f"filled {name}", gate=gate)
        filling = asyncio.ensure_future(filler.get_or_load(name, slow, ttl=60))
        await started(slow)
        with waiting_in() as waits:  # the waiter subscribed, looked again, and waits
            waiting = asyncio.ensure_future(waiter.get_or_load(name, Loads("waiter"), ttl=60))
            assert await asyncio.to_thread(waits.wait, 10)
        channel = waiter.keys(name).released_channel
        assert shard_subscribers(redis_cluster, channel) >= 1  # on the key's shard
        gate.set()
        assert await asyncio.wait_for(waiting, 20) == f"filled {name}"
        assert await filling == f"filled {name}"


@pytest.mark.slow
async def test_l1_copies_are_dropped_by_an_invalidation_on_any_master(
    make: Make, redis_cluster: OwnedRedisCluster, cluster_ns: str
) -> None:
    # L1's channel is namespace-wide: PUBLISH from the invalidate script on the key's
    # master reaches the listener, whichever node it listens on.
    reader = make(l1_maxsize=100, l1_ttl=600)
    writer = make()
    for name in names_on_every_master(redis_cluster, cluster_ns):
        for _ in range(200):  # L1 keeps a copy once its feed is subscribed
            await reader.get_or_load(name, lambda: "cached", ttl=60)
            if name in reader.guard._state.l1:  # type: ignore[operator]
                break
            await asyncio.sleep(0.01)
        assert name in reader.guard._state.l1  # type: ignore[operator]
        await writer.invalidate(name)
        assert await asyncio.to_thread(
            wait_until,
            lambda name=name: name not in reader.guard._state.l1,  # type: ignore[operator]
            10,
        )


@pytest.mark.parametrize("kind", KINDS)
async def test_a_call_outside_the_clients_slot_map_goes_again_after_reading_it_anew(
    kind: str, redis_cluster: OwnedRedisCluster, cluster_ns: str
) -> None:
    # A slot map read while a node was down (or before a failover ended) lacks some
    # slots: a script call in such a slot goes again once the client reads the map
    # anew, instead of failing while the node serving it is up.
    port = redis_cluster.masters()[0].port
    key = f"{cluster_ns}:wm"
    calls = [(NEXT_STAMP, [key], [])]
    if kind == "sync":
        client = redis.cluster.RedisCluster(host="127.0.0.1", port=port)
        try:
            client.nodes_manager.slots_cache.pop(client.keyslot(key))
            assert run_pipelined(client, calls) == [1]
        finally:
            client.close()
    else:
        aclient = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=port)
        try:
            await aclient.initialize()
            aclient.nodes_manager.slots_cache.pop(aclient.keyslot(key))
            assert await arun_pipelined(aclient, calls) == [1]
        finally:
            await aclient.aclose()


def test_a_lock_on_a_cluster_excludes_and_wakes_its_waiter_by_sharded_pubsub(
    redis_cluster: OwnedRedisCluster, cluster_ns: str
) -> None:
    client = redis_cluster.client()
    try:
        lock = RedisRWLock(
            client, "menu:7", namespace=cluster_ns, lease=30, backoff=NO_TIMER_WAKE_UP
        )
        writer = lock.acquire_write(owner="writer")
        assert lock.try_acquire_read(owner="reader") is None
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(lock.acquire_read(30, owner="r")))
        with waiting_in(waiter) as waits:  # it subscribed, tried again, and waits
            waiter.start()
            assert waits.wait(10)
        assert shard_subscribers(redis_cluster, lock.keys.released_channel) >= 1
        writer.release()
        waiter.join(20)
        assert len(got) == 1
        got[0].release()
    finally:
        client.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
async def test_a_batch_with_a_dead_shard_bypasses_only_that_shards_names(
    kind: str, cluster_ns: str
) -> None:
    # The batch's GETs go one pipeline per node: the dead master's failure is charged
    # to its own breaker (one failure opens it here) and bypasses its names only,
    # while the names of the other masters are still served from Redis.
    cluster = OwnedRedisCluster(replicas_per_master=0)
    made: list[Guard] = []
    try:
        settings: dict[str, Any] = {
            "namespace": cluster_ns,
            "breaker_failures": 1,
            "breaker_cooldown": 600,
            "ttl_jitter": 0,
        }
        url = cluster_url(cluster)
        guard = Guard(kind, guard_from_url(kind, url, socket_timeout=2, **settings))
        made.append(guard)

        def port_of(name: str) -> int:
            return cluster.master_for_key(ResourceKeys(cluster_ns, name).value).port

        names = [f"item:{i}" for i in range(30)]
        ports = {port_of(name) for name in names}
        assert len(ports) == 3
        sequence_port = cluster.master_for_key(f"{cluster_ns}:wm").port  # kept alive
        doomed_port = next(port for port in sorted(ports) if port != sequence_port)
        healthy = [name for name in names if port_of(name) != doomed_port]
        doomed = [name for name in names if port_of(name) == doomed_port]
        names = healthy + doomed  # the first name's node is a healthy one
        asked: list[list[str]] = []

        def load_many(keys: list[str]) -> dict[str, str]:
            asked.append(list(keys))
            return {key: f"value of {key}" for key in keys}

        expected = {name: f"value of {name}" for name in names}
        assert await guard.get_or_load_many(names, load_many, ttl=600) == expected
        assert asked == [names]
        cluster.kill(next(node for node in cluster.masters() if node.port == doomed_port))
        assert await guard.get_or_load_many(names, load_many, ttl=600) == expected
        assert asked[1:] == [doomed]  # the healthy masters' names: hits
        stats = guard.stats()
        assert (stats.backend_errors, stats.bypasses) == (1, len(doomed))
        assert await guard.get_or_load_many(names, load_many, ttl=600) == expected
        assert asked == [names, doomed, doomed]  # its circuit is open; the others stay closed
        assert guard.stats().backend_errors == 1
    finally:
        for made_guard in made:
            await made_guard.close()
        cluster.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
async def test_a_dead_shard_bypasses_only_its_own_keys(
    kind: str, redis_server_binary: str, cluster_ns: str
) -> None:
    # One breaker per node: with a master dead (no replica to take over), its keys go
    # to the loader while every other master's keys keep hitting, and writes of keys
    # on healthy shards still succeed.
    cluster = OwnedRedisCluster(replicas_per_master=0)
    made: list[Guard] = []
    try:
        url = cluster_url(cluster)
        settings: dict[str, Any] = {
            "namespace": cluster_ns,
            "breaker_failures": 2,
            "breaker_cooldown": 600,
            "wait_timeout": 5,
        }
        guard = Guard(kind, guard_from_url(kind, url, socket_timeout=2, **settings))
        made.append(guard)
        names = names_on_every_master(cluster, cluster_ns)
        sequence = f"{cluster_ns}:wm"  # the namespace's sequence: not the shard we kill
        doomed = next(
            name
            for name in names
            if cluster.master_for_key(ResourceKeys(cluster_ns, name).value).port
            != cluster.master_for_key(sequence).port
        )
        healthy = [name for name in names if name != doomed]
        loads = {name: Loads(f"value of {name}") for name in names}
        for name in names:
            await guard.get_or_load(name, loads[name], ttl=600)
        cluster.kill(cluster.master_for_key(ResourceKeys(cluster_ns, doomed).value))
        for _ in range(20):
            for name in names:
                assert await guard.get_or_load(name, loads[name], ttl=600) == f"value of {name}"
        assert loads[doomed].calls == 21  # every call after the kill went to the loader
        assert [loads[name].calls for name in healthy] == [1, 1]  # still hitting
        assert guard.stats().backend_errors == 2  # then the dead node's circuit opened
        async with guard.write(*healthy):
            pass
        for name in healthy:
            assert await guard.peek(name) is MISSING
    finally:
        for made_guard in made:
            await made_guard.close()
        cluster.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
async def test_writes_go_on_while_the_invalidation_sequence_shard_is_dead(
    kind: str, redis_server_binary: str, cluster_ns: str
) -> None:
    # The namespace's invalidation sequence lives on one shard. With that shard dead
    # (no replica to take over), writes of keys on the other shards still succeed:
    # their invalidations poison the keys' versions, so no fill from a known database
    # snapshot stores them (a fill that read no snapshot still does). When the shard
    # is back, the next write of a key heals its version.
    cluster = OwnedRedisCluster(replicas_per_master=0)
    made: list[Guard] = []
    try:
        url = cluster_url(cluster)
        settings: dict[str, Any] = {
            "namespace": cluster_ns,
            "breaker_failures": 2,
            "breaker_cooldown": 0.5,
            "wait_timeout": 5,
        }
        guard = Guard(kind, guard_from_url(kind, url, socket_timeout=2, **settings))
        made.append(guard)
        sequence = cluster.master_for_key(f"{cluster_ns}:wm")

        def port_of(name: str) -> int:
            return cluster.master_for_key(ResourceKeys(cluster_ns, name).value).port

        tracked_name, untracked_name = [
            n for n in names_on_every_master(cluster, cluster_ns) if port_of(n) != sequence.port
        ]
        names = (tracked_name, untracked_name)
        before = await guard.watermark()  # a snapshot taken before the writes
        for name in names:
            assert await guard.get_or_load(name, lambda: "old", ttl=600) == "old"
        cluster.kill(sequence)
        for _ in range(4):  # past breaker_failures: the sequence's circuit opens too
            async with guard.write(*names):
                pass
            for name in names:
                assert await guard.peek(name) is MISSING
        with pytest.raises(BackendUnavailable):
            await guard.watermark()  # the SQLAlchemy hooks then refuse every fill

        def tracked() -> str:
            note_snapshot(before)
            return "from an old snapshot"

        assert await guard.get_or_load(tracked_name, tracked, ttl=600) == "from an old snapshot"
        assert await guard.peek(tracked_name) is MISSING  # refused: it predates the writes
        assert await guard.get_or_load(untracked_name, lambda: "new", ttl=600) == "new"
        assert await guard.peek(untracked_name) == "new"

        def version(name: str) -> int:
            node = cluster.master_for_key(ResourceKeys(cluster_ns, name).version)
            with redis.Redis(port=node.port) as direct:
                return int(direct.get(ResourceKeys(cluster_ns, name).version) or 0)

        assert version(tracked_name) >= POISON_FLOOR
        cluster.restart(sequence)  # back, empty (no persistence): the sequence restarts
        cluster.wait_healthy(timeout=30)

        async def healed() -> bool:
            try:
                async with guard.write(tracked_name):
                    pass
            except BackendUnavailable:
                return False  # the client has not seen the node back yet
            return version(tracked_name) < POISON_FLOOR

        deadline = time.monotonic() + 30
        while not await healed():
            assert time.monotonic() < deadline, "no write healed the poisoned version"
            await asyncio.sleep(0.2)
        now = await guard.watermark()

        def current() -> str:
            note_snapshot(now)
            return "from a current snapshot"

        assert await guard.get_or_load(tracked_name, current, ttl=600) == "from a current snapshot"
        assert await guard.peek(tracked_name) == "from a current snapshot"
    finally:
        for made_guard in made:
            await made_guard.close()
        cluster.close()


@pytest.mark.slow
def test_a_cold_key_stampede_across_processes_on_a_cluster_loads_once(
    redis_cluster: OwnedRedisCluster, cluster_ns: str
) -> None:
    """4 processes x 25 threads ask for one cold key on every master at once."""
    names = names_on_every_master(redis_cluster, cluster_ns)
    start_at = time.time() + 2.0  # all threads start together, after the spawns
    results = run_processes(
        cache_workers.stampede_worker,
        [(cluster_url(redis_cluster), cluster_ns, 25, names, 0.1, start_at)] * 4,
    )
    assert len([v for per_process in results for v in per_process]) == 100 * len(names)
    client = redis_cluster.client()
    try:
        for name in names:
            assert int(client.get(f"{cluster_ns}:loads:{name}")) == 1
    finally:
        client.close()


@pytest.mark.slow
def test_a_waiter_in_another_process_on_a_cluster_is_woken_by_the_announcement(
    redis_cluster: OwnedRedisCluster, cluster_ns: str
) -> None:
    """As tests/test_cache_processes.py's test of the name, on a cluster: every timer
    that could wake the waiting process is a minute long, so only the fill's sharded
    announcement, heard on the key's shard, answers it within 20 s."""
    url = cluster_url(redis_cluster)
    for name in names_on_every_master(redis_cluster, cluster_ns):
        filler = CacheGuard.from_url(url, namespace=cluster_ns, lease=60)
        release, fill = start_gated_fill(filler, name, "filled", hold=60)
        in_wait = CTX.Event()
        child, results = start_process_reporting(
            cache_workers.wait_for_announced_fill, url, cluster_ns, name, in_wait
        )
        try:
            assert in_wait.wait(60), "the waiting process never started waiting"
            release.set()
            fill.join(10)
            got = result_within(results, 20, "the waiter was not woken by the announcement")
            assert got == {"value": "filled", "loads": 0}
        finally:
            release.set()
            child.join(5)
            if child.is_alive():
                child.kill()
            filler.client.close()


def cluster_connections(cluster: OwnedRedisCluster) -> int:
    """Client connections on every node, besides the one asking."""
    total = 0
    for node in cluster.nodes:
        with redis.Redis(port=node.port, socket_timeout=2) as direct:
            total += len(direct.client_list()) - 1
    return total


@pytest.mark.parametrize("kind", KINDS)
async def test_closing_a_from_url_guard_closes_its_connections_on_every_node(
    kind: str, redis_cluster: OwnedRedisCluster, cluster_ns: str
) -> None:
    """The cluster client from_url made, every node's pool and the sharded
    notifiers' connections: all closed by close()/aclose() (issue #23)."""
    before = cluster_connections(redis_cluster)
    guard = Guard(kind, guard_from_url(kind, cluster_url(redis_cluster), namespace=cluster_ns))
    names = names_on_every_master(redis_cluster, cluster_ns)
    assert [await guard.get_or_load(n, lambda: 1, ttl=60) for n in names] == [1] * len(names)
    async with guard.write(*names):
        pass
    assert cluster_connections(redis_cluster) > before
    if isinstance(guard.guard, CacheGuard):
        guard.guard.close()
    else:
        await guard.guard.aclose()
    assert wait_until(lambda: cluster_connections(redis_cluster) <= before)


@pytest.mark.slow
async def test_a_new_asyncio_cluster_client_with_no_node_answering_is_redis_down(
    redis_server_binary: str, cluster_ns: str
) -> None:
    """A fresh asyncio cluster client reads its slot map before its first batch: when
    no startup node answers, that batch (the watermark read, confirmed by WAIT) is
    Redis down (BackendUnavailable), not a batch of unanswered calls."""
    cluster = OwnedRedisCluster(replicas_per_master=0)
    port = cluster.nodes[0].port
    cluster.close()  # every node gone before the client's first command
    client = redis.asyncio.cluster.RedisCluster(
        host="127.0.0.1", port=port, socket_connect_timeout=0.5
    )
    guard = AsyncCacheGuard(client, namespace=cluster_ns, on_backend_error="raise")
    try:
        with pytest.raises(BackendUnavailable):
            await guard.watermark()
    finally:
        await guard.aclose()


async def test_a_batch_reads_its_hits_with_one_pipeline_per_node(
    make: Make, redis_cluster: OwnedRedisCluster, cluster_ns: str
) -> None:
    guard = make()
    names = names_on_every_master(redis_cluster, cluster_ns) + [f"menu:x{i}" for i in range(9)]
    asked: list[list[str]] = []

    def load_many(keys: list[str]) -> dict[str, str]:
        asked.append(keys)
        return {key: f"value of {key}" for key in keys}

    expected = {name: f"value of {name}" for name in names}
    assert await guard.get_or_load_many(names, load_many, ttl=60) == expected
    assert asked == [names]  # one load for the keys of every master

    def gets_per_master() -> dict[int, int]:
        counts = {}
        for master in redis_cluster.masters():
            with redis.Redis(port=master.port) as direct:
                stats = direct.info("commandstats").get("cmdstat_get", {"calls": 0})
                counts[master.port] = int(stats["calls"])
        return counts

    per_master: dict[int, int] = {}
    for name in names:
        port = redis_cluster.master_for_key(guard.keys(name).value).port
        per_master[port] = per_master.get(port, 0) + 1
    assert len(per_master) == 3
    client = guard.guard.client
    pipeline, sent = client.pipeline, []
    client.pipeline = lambda **kwargs: sent.append(kwargs) or pipeline(**kwargs)
    client.get = None  # no single GET may be sent
    before = gets_per_master()
    assert await guard.get_or_load_many(names, load_many, ttl=60) == expected
    after = gets_per_master()
    assert len(sent) == 3  # one pipeline per node, each with its own keys
    assert {port: after[port] - before[port] for port in after} == per_master
    assert asked == [names]


@pytest.mark.slow
def test_overlapping_batches_across_processes_on_a_cluster_load_each_key_once(
    redis_cluster: OwnedRedisCluster, cluster_ns: str
) -> None:
    """tests/test_batch.py's test of the name, on a cluster: keys on every master."""
    names = [f"item:{i}" for i in range(24)]
    masters = {redis_cluster.master_for_key(ResourceKeys(cluster_ns, n).value).port for n in names}
    assert len(masters) == 3
    start_at = time.time() + 2.0  # the children's imports done, they start together
    runs = [
        (cluster_url(redis_cluster), cluster_ns, kind, 3, names, start_at)
        for kind in ("sync", "async", "sync")
    ]
    results = run_processes(cache_workers.batch_worker, runs, timeout=90)
    for per_process in results:
        for got in per_process:
            assert got == {name: {"name": name} for name in got}
    client = redis_cluster.client()
    try:
        loads = {name: int(client.get(f"{cluster_ns}:loads:{name}") or 0) for name in names}
    finally:
        client.close()
    assert loads == dict.fromkeys(names, 1)
