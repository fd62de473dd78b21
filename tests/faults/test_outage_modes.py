"""Real Redis outages under the outage settings (``outage_ttl``, ``stale_if_error``,
``gutter=``), for both guards.

The outages: a killed ``redis-server`` (connection refused; back empty), a
SIGSTOPped one (a partition: data kept, replies never come) and a black-holed
address (a proxy that accepts and swallows everything); a cluster shard's master
down; a Sentinel master killed and failed over. The bounds are counted, never
timed: loads per key per process per ``outage_ttl`` window, loads per key across
processes per ``gutter_ttl`` window, one refill per key across processes once
Redis is back, and every read's staleness against the writes committed before
it began. Child processes are in ``tests/outage_workers.py``.
"""

from __future__ import annotations

import queue
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from cacheguard_testing.deployments import OwnedRedisCluster, OwnedSentinelSet

from cacheguard import BackendUnavailable, CacheGuard
from cacheguard.redis.keys import ResourceKeys
from cacheguard.testing import OwnedRedisServer
from tests.guard_drivers import KINDS, Guard, guard_from_url
from tests.outage_support import (
    FAST_FAIL,
    OUTAGES,
    WINDOW,
    Clock,
    Counted,
    Make,
    Outage,
    gutter_commands,
    many,
    read,
    reset_stats,
    value_key,
)
from tests.outage_workers import (
    Log,
    Shared,
    Spec,
    read_through_outage,
    refill_after_outage,
    write_through_outage,
)
from tests.procs import CTX, results_of, start_processes, stop_processes
from tests.test_cluster import cluster_url, names_on_every_master
from tests.test_failovers import sentinel_url

pytest_plugins = ["tests.deployment_fixtures", "tests.outage_fixtures"]

PROCESSES = 4
# Children fail fast on a dead server and probe it again soon.
CHILD_SETTINGS: dict[str, Any] = {
    "connect_timeout": 0.25,
    "socket_timeout": 0.25,
    "breaker_failures": 2,
    "breaker_cooldown": 0.5,
    "ttl_jitter": 0,
}


@pytest.fixture
def outage(request: pytest.FixtureRequest, primary: OwnedRedisServer) -> Iterator[Outage]:
    made = Outage(request.param, primary)
    yield made
    made.close()


# -- each outage kind, in one process ---------------------------------------------------------


@pytest.mark.slow  # over a second: the whole suite runs it, -m 'not slow' does not
@pytest.mark.parametrize("outage", OUTAGES, indirect=True)
async def test_reuse_stale_values_and_the_gutter_through_the_outage(
    outage: Outage, make: Make, gutter: OwnedRedisServer, clock: Clock
) -> None:
    quick = {"socket_timeout": 0.25, "connect_timeout": 0.25}
    reusing = make(outage.url, outage_ttl=WINDOW, **quick)
    stale = make(outage.url, stale_if_error=WINDOW, on_backend_error="raise", **quick)
    guttered = make(outage.url, gutter=gutter.url, **quick)
    menu, other = Counted("menu"), Counted("other")
    for guard in (reusing, stale, guttered):
        assert await read(guard, menu) == "menu-1"  # loaded once, then hits
    reset_stats(gutter)
    outage.begin()
    assert await many(reusing, menu) == ["menu-1"] * 8
    assert await many(stale, menu, 4) == ["menu-1"] * 4
    assert await many(guttered, other) == ["other-1"] * 8
    assert await read(guttered, other) == "other-1"  # the gutter's entry
    assert (menu.calls, other.calls) == (1, 1)
    assert reusing.stats().outage_reuses >= 1
    assert stale.stats().stale_on_error >= 1
    assert guttered.stats().gutter_reads >= 2
    outage.end()
    # Back (empty, if it was killed): a newer value stored there is what every guard
    # reads once its breaker lets it ask, well within outage_ttl and stale_if_error.
    peer = make(outage.url)
    await peer.invalidate("menu")
    assert await peer.get_or_load("menu", lambda: "from redis", ttl=600) == "from redis"
    clock.advance(FAST_FAIL["breaker_cooldown"])
    reset_stats(gutter)
    for guard in (reusing, stale, guttered):
        assert await read(guard, menu) == "from redis"
        assert await read(guard, menu) == "from redis"
    assert gutter_commands(gutter) == {}
    assert menu.calls == 1


# -- many processes ---------------------------------------------------------------------------


class Run:
    """``PROCESSES`` children reading through an outage the test causes."""

    def __init__(self, spec: Spec, *, writers: int = 0, writer_spec: Spec | None = None) -> None:
        self.spec = spec
        self.shared = Shared(
            db=CTX.Array("q", len(spec.keys)),
            target=CTX.Value("q", 0),
            stop=CTX.Event(),
            reports=CTX.Queue(),
        )
        jobs: list[Any] = [(i, spec, self.shared) for i in range(PROCESSES)]
        self.readers = start_processes(read_through_outage, jobs)
        self.writers = (
            start_processes(
                write_through_outage,
                [(PROCESSES + i, writer_spec or spec, self.shared) for i in range(writers)],
            )
            if writers
            else None
        )
        self.fresh_at: dict[int, float] = {}
        self.expect("warm", PROCESSES + writers)

    def expect(self, what: str, count: int, timeout: float = 60) -> None:
        """Wait for ``count`` reports ``what`` from the children."""
        seen: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(seen) < count:
            try:
                report = self.shared.reports.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{len(seen)} of {count} children reported {what!r}") from None
            if report[0] == what and (what != "fresh" or report[2] >= self.shared.target.value):
                seen.add(report[1])
                if what == "fresh":
                    self.fresh_at.setdefault(report[1], time.monotonic())

    def fresh(self, target: int, timeout: float = 30) -> None:
        """Every reader read ``target`` (or newer) for every key with its breaker
        closed."""
        self.shared.target.value = target
        self.fresh_at.clear()
        self.expect("fresh", PROCESSES, timeout)

    def stop(self) -> tuple[list[Log], list[dict[str, Any]]]:
        self.shared.stop.set()
        logs = results_of(self.readers, timeout=60)
        written = results_of(self.writers, timeout=60) if self.writers else []
        return logs, written

    def kill(self) -> None:
        self.shared.stop.set()
        stop_processes(self.readers[0])
        if self.writers:
            stop_processes(self.writers[0])


def commit_after_recovery(url: str, keys: tuple[str, ...], shared: Shared, version: int) -> None:
    """``guard.write`` around every key's commit of ``version``, from a guard of the
    test's, as soon as Redis takes it."""
    guard = CacheGuard.from_url(url, namespace=SPEC_NAMESPACE, **CHILD_SETTINGS)
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                with guard.write(*keys), shared.db.get_lock():
                    for slot in range(len(keys)):
                        shared.db[slot] = version
                return
            except BackendUnavailable:
                assert time.monotonic() < deadline, "Redis never took the write"
                time.sleep(0.05)
    finally:
        guard.close()


SPEC_NAMESPACE = "outages"
HOT_KEYS = ("menu:1", "menu:2", "menu:3")
OUTAGE_SECONDS = 3.0


def loads_within(logs: list[Log], began: float, ended: float) -> dict[tuple[int, str], int]:
    """Loads that began in [began, ended], by (process, key)."""
    counted: dict[tuple[int, str], int] = defaultdict(int)
    for index, log in enumerate(logs):
        for key, started, _, _ in log.loads:
            if began <= started <= ended:
                counted[index, key] += 1
    return counted


@pytest.mark.slow
@pytest.mark.parametrize("how", ["killed", "stopped"])
@pytest.mark.parametrize("kind", KINDS)
def test_outage_ttl_loads_each_key_once_per_process_per_window(
    kind: str, how: str, primary: OwnedRedisServer
) -> None:
    outage_ttl = 1.0
    outage = Outage(how, primary)
    settings = {**CHILD_SETTINGS, "namespace": SPEC_NAMESPACE, "outage_ttl": outage_ttl}
    run = Run(Spec(kind, outage.url, settings, HOT_KEYS))
    try:
        down = time.monotonic()
        outage.begin()
        time.sleep(OUTAGE_SECONDS)  # the outage's length is the subject
        up = time.monotonic()
        outage.end()
        commit_after_recovery(outage.url, HOT_KEYS, run.shared, 1)
        run.fresh(1)  # after recovery, every process reads the new values from Redis
        logs, _ = run.stop()
    finally:
        run.kill()
        outage.close()
    bound = int((up - down) / outage_ttl) + 1  # one per window, one more at a boundary
    counted = loads_within(logs, down, up)
    reads = sum(log.read_count for log in logs)
    reuses = sum(log.stats["outage_reuses"] for log in logs)
    print(
        f"\noutage_ttl ({kind}, {how}): {up - down:.1f} s down, loads per process and key "
        f"{sorted(counted.values())} (bound {bound}), {reads} reads, {reuses} reuses"
    )
    assert counted, "no load during the outage: did the values outlive outage_ttl?"
    assert max(counted.values()) <= bound, dict(counted)
    assert all(not log.errors for log in logs), [log.errors for log in logs]
    assert all(log.regressions == 0 for log in logs), [log.regressions for log in logs]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_the_gutter_loads_each_key_once_per_window_across_processes(
    kind: str, primary: OwnedRedisServer, gutter: OwnedRedisServer
) -> None:
    gutter_ttl = 1.0
    outage = Outage("killed", primary)
    settings = {**CHILD_SETTINGS, "namespace": SPEC_NAMESPACE, "gutter_ttl": gutter_ttl}
    reset_stats(gutter)  # the server's start-up PING
    run = Run(Spec(kind, outage.url, settings, HOT_KEYS, gutter=gutter.url))
    lifetimes: list[int] = []
    try:
        assert gutter_commands(gutter) == {}  # nothing but reads of the primary so far
        down = time.monotonic()
        outage.begin()
        with redis.Redis(port=gutter.port) as direct:
            while time.monotonic() < down + OUTAGE_SECONDS:  # the outage's length
                lifetimes += [
                    direct.pttl(value_key(key, f"{SPEC_NAMESPACE}-gutter")) for key in HOT_KEYS
                ]
                time.sleep(0.05)
        up = time.monotonic()
        outage.end()
        commit_after_recovery(outage.url, HOT_KEYS, run.shared, 1)
        run.fresh(1)
        # Every breaker closed: from now on the gutter is not asked, whatever is read.
        reset_stats(gutter)
        commit_after_recovery(outage.url, HOT_KEYS, run.shared, 2)
        run.fresh(2)
        after_recovery = gutter_commands(gutter)
        logs, _ = run.stop()
    finally:
        run.kill()
        outage.close()
    per_key: dict[str, int] = defaultdict(int)
    for (_, key), count in loads_within(logs, down, up).items():
        per_key[key] += count
    bound = gutter_bound(up - down, gutter_ttl)
    gutter_reads = sum(log.stats["gutter_reads"] for log in logs)
    print(
        f"\ngutter ({kind}): {up - down:.1f} s down, loads per key across "
        f"{PROCESSES} processes {dict(per_key)} (bound {bound}), {gutter_reads} gutter "
        f"reads, longest PTTL {max(lifetimes)} ms"
    )
    assert per_key, "no load during the outage"
    assert max(per_key.values()) <= bound, dict(per_key)
    assert gutter_reads > sum(per_key.values())
    assert 0 < max(lifetimes) <= gutter_ttl * 1000  # seen, and never longer
    assert after_recovery == {}
    assert all(not log.errors for log in logs), [log.errors for log in logs]
    assert all(log.regressions == 0 for log in logs), [log.regressions for log in logs]


def gutter_bound(down: float, gutter_ttl: float) -> int:
    """Loads of a key across processes while the primary was down ``down`` s: one per
    gutter_ttl window, one more at a boundary. An entry's end is judged on each
    process's estimate of the gutter's clock (off by a round trip at most): the
    windows get 0.1 s for it."""
    return int((down + 0.1) / gutter_ttl) + 1


def reported(shared: Shared, what: str, timeout: float = 60) -> None:
    """Wait until every child reported ``what``."""
    for _ in range(PROCESSES):
        report = shared.reports.get(timeout=timeout)
        assert report[0] == what, report


REFILL_KEYS = tuple(f"dish:{i}" for i in range(10))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["killed", "stopped"])
@pytest.mark.parametrize("kind", KINDS)
def test_recovery_refills_each_key_once_across_processes(
    kind: str, how: str, primary: OwnedRedisServer
) -> None:
    # The values live 1 s: a stopped server's expire during the outage, a killed one's
    # are gone (as if invalidated). The processes read through the outage (their
    # loads then are outage_ttl's), stop reading before Redis is back, probe until
    # their breaker has closed (the half-open window: a probe at a time, the other
    # calls still bypass) and meet at a barrier: after it, with Redis theirs again,
    # every worker of every process reads every key, and each key is loaded once
    # across processes. lease < wait_timeout: a fill begun by a script that the
    # paused server ran only when resumed (its caller gone) holds the key at most a
    # lease, and its waiters outwait it instead of loading on their own.
    outage = Outage(how, primary)
    settings = {
        **CHILD_SETTINGS,
        "namespace": SPEC_NAMESPACE,
        "outage_ttl": 0.5,
        "lease": 2.0,
        "wait_timeout": 5.0,
    }
    spec = Spec(kind, outage.url, settings, REFILL_KEYS, workers=4, ttl=1.0, pause=0.01)
    shared = Shared(
        db=CTX.Array("q", len(REFILL_KEYS)),
        target=CTX.Value("q", 0),
        stop=CTX.Event(),
        reports=CTX.Queue(),
    )
    halt, probed = CTX.Event(), CTX.Barrier(PROCESSES)
    children = start_processes(
        refill_after_outage,
        [(i, spec, shared, halt, probed, 60.0) for i in range(PROCESSES)],
    )
    try:
        reported(shared, "warm")
        outage.begin()
        time.sleep(2.0)  # longer than the values live
        halt.set()
        reported(shared, "halted")
        outage.end()
        results = results_of(children, timeout=90)
    finally:
        halt.set()
        stop_processes(children[0])
        outage.close()
    loads: dict[str, int] = defaultdict(int)
    for result in results:
        for key, _ in result["after"]:
            loads[key] += 1
    print(f"\nrefill after the outage ({kind}, {how}): loads per key {dict(loads)}")
    assert dict(loads) == dict.fromkeys(REFILL_KEYS, 1)


# -- staleness ----------------------------------------------------------------------------------

STALE_KEYS = ("menu:1", "menu:2", "menu:3", "menu:4")
CONFIGS = {
    "outage_ttl": ({"outage_ttl": 1.0}, 1.0),
    "gutter": ({"gutter_ttl": 1.0}, 1.0),
    "stale_if_error": ({"stale_if_error": 1.5, "on_backend_error": "raise"}, 1.5),
}
# What a bound may be exceeded by: the load that produced the value (a commit may
# land while it runs) and the scheduling of two busy cores.
SLACK = 0.5


def staleness(reads: list[tuple[str, float, int]], commits: list[Any]) -> list[float]:
    """For each read older than a commit made before it began: how long before it
    began its version was replaced."""
    replaced: dict[tuple[str, int], float] = {}  # (key, version) -> when the next committed
    newest: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for key, version, at in commits:
        replaced[key, version - 1] = at
        newest[key].append((at, version))
    found = []
    for key, began, version in reads:
        committed = max((v for at, v in newest[key] if at < began), default=0)
        if version < committed:
            found.append(began - replaced[key, version])
    return found


@pytest.mark.slow
@pytest.mark.parametrize("how", ["stopped", "killed"])
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("kind", KINDS)
def test_no_read_is_older_than_a_committed_write_beyond_the_bound(
    kind: str, config: str, how: str, primary: OwnedRedisServer, gutter: OwnedRedisServer
) -> None:
    # A writer process commits through guard.write, readers in three more, Redis down
    # for 3 s. Stopped: its data is kept, and a write Redis refuses commits nothing.
    # Killed: it comes back empty, and a refused write commits anyway (writes keep
    # flowing, as with an outbox), so values seen before those commits are served
    # meanwhile. Every read may be older than the newest commit before it began by
    # at most the setting's bound; once its process has read the newest values with
    # its breaker closed, by nothing. A short lease: a write lock whose release the
    # outage swallowed holds its key a lease long afterwards.
    settings, bound = CONFIGS[config]
    outage = Outage(how, primary)
    options = {
        **CHILD_SETTINGS,
        "namespace": SPEC_NAMESPACE,
        "lease": 1.0,
        "wait_timeout": 2.0,
        **settings,
    }
    spec = Spec(
        kind,
        outage.url,
        options,
        STALE_KEYS,
        gutter=gutter.url if config == "gutter" else None,
        workers=4,
        pause=0.01,
        load_seconds=0.01,
        record_reads=True,
    )
    writer = Spec(kind, outage.url, options, STALE_KEYS, pause=0.02, commit_anyway=how == "killed")
    run = Run(spec, writers=1, writer_spec=writer)
    try:
        time.sleep(1.0)  # reads and writes with Redis up
        down = time.monotonic()
        outage.begin()
        time.sleep(OUTAGE_SECONDS)
        up = time.monotonic()
        outage.end()
        time.sleep(0.5)  # writes go on
        run.fresh(min(run.shared.db[:]))
        logs, written = run.stop()
    finally:
        run.kill()
        outage.close()
    commits = written[0]["commits"]
    during = [c for c in commits if down <= c[2] <= up]
    ages = [age for log in logs for age in staleness(log.reads, commits) if age > 0]
    late = [
        age
        for index, log in enumerate(logs)
        for age in staleness([r for r in log.reads if r[1] > run.fresh_at[index]], commits)
    ]
    reads = sum(log.read_count for log in logs)
    errors = sum(sum(log.errors.values()) for log in logs)
    print(
        f"\nstaleness ({kind}, {config}, {how}): {reads} reads, {errors} refused, "
        f"{len(commits)} commits ({len(during)} during the outage; writes refused "
        f"{dict(written[0]['refused'])}), {len(ages)} reads older than a commit, the "
        f"oldest by {max(ages, default=0):.3f} s (bound {bound} s); outage {up - down:.1f} s"
    )
    assert commits, "nothing was committed"
    if how == "killed":
        assert during, "nothing was committed during the outage"
    assert max(ages, default=0.0) <= bound + SLACK, sorted(ages)[-5:]
    assert late == [], late[:5]
    for log in logs:
        assert set(log.errors) <= {"BackendUnavailable"}, log.errors
        assert log.regressions == 0


# -- a cluster shard, a Sentinel failover -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
async def test_a_dead_cluster_shard_sends_only_its_own_keys_to_reuse_and_the_gutter(
    kind: str, redis_server_binary: str, gutter: OwnedRedisServer
) -> None:
    # One breaker per node: with one master dead (no replica to take over), its key is
    # reused (outage_ttl) or read through the gutter, while every other master's keys
    # keep hitting their shard; the gutter holds that one key.
    cluster = OwnedRedisCluster(replicas_per_master=0)
    made: list[Guard] = []
    namespace = f"cg-outage-{uuid.uuid4().hex[:8]}"
    try:
        url = cluster_url(cluster)
        settings: dict[str, Any] = {
            "namespace": namespace,
            "breaker_failures": 2,
            "breaker_cooldown": 600,
            "ttl_jitter": 0,
        }
        reusing = Guard(
            kind, guard_from_url(kind, url, socket_timeout=2, outage_ttl=600, **settings)
        )
        guttered = Guard(
            kind,
            guard_from_url(
                kind, url, socket_timeout=2, gutter=gutter.url, gutter_ttl=600, **settings
            ),
        )
        made += [reusing, guttered]
        events: dict[str, set[tuple[str, str]]] = {"reusing": set(), "guttered": set()}
        for label, guard in (("reusing", reusing), ("guttered", guttered)):
            guard.guard.add_event_hook(
                lambda event, seen=events[label]: seen.add((event.kind, event.key))
            )
        names = names_on_every_master(cluster, namespace)
        sequence = cluster.master_for_key(f"{namespace}:wm").port
        doomed = next(
            name
            for name in names
            if cluster.master_for_key(ResourceKeys(namespace, name).value).port != sequence
        )
        loads = {name: Counted(name) for name in names}
        for guard in (reusing, guttered):
            for name in names:
                assert await read(guard, loads[name]) == f"{name}-1"
        reset_stats(gutter)
        cluster.kill(cluster.master_for_key(ResourceKeys(namespace, doomed).value))
        for _ in range(10):
            for name in names:
                assert await read(reusing, loads[name]) == f"{name}-1"
                expected = f"{name}-2" if name == doomed else f"{name}-1"
                assert await read(guttered, loads[name]) == expected  # one gutter fill
        assert [loads[name].calls for name in names] == [
            2 if name == doomed else 1 for name in names
        ]
        for label, kinds in (("reusing", {"outage_reuses"}), ("guttered", {"gutter_reads"})):
            fallbacks = {key for event, key in events[label] if event in kinds}
            assert fallbacks == {doomed}, (label, fallbacks)
            hits = {key for event, key in events[label] if event == "l2_hits"}
            assert set(names) - {doomed} <= hits
        with redis.Redis(port=gutter.port) as direct:
            gutter_namespace = f"{namespace}-gutter"  # the gutter guard's keys
            stored = {key.decode() for key in direct.scan_iter(match=f"{gutter_namespace}:*")}
        assert stored == {ResourceKeys(gutter_namespace, doomed).value}
    finally:
        for guard in made:
            await guard.close()
        cluster.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_the_gutter_serves_while_sentinel_fails_the_master_over(
    kind: str, redis_server_binary: str, gutter: OwnedRedisServer
) -> None:
    # 4 processes read through a Sentinel master's SIGKILL and the failover that
    # follows: meanwhile the gutter serves, one load per key per gutter_ttl across
    # processes; afterwards every process reads the new master, and the gutter is
    # left alone.
    gutter_ttl = 1.0
    with OwnedSentinelSet() as sentinels:
        url = sentinel_url(sentinels)
        settings = {**CHILD_SETTINGS, "namespace": SPEC_NAMESPACE, "gutter_ttl": gutter_ttl}
        reset_stats(gutter)
        run = Run(Spec(kind, url, settings, HOT_KEYS, gutter=gutter.url))
        try:
            assert gutter_commands(gutter) == {}
            down = time.monotonic()
            old = sentinels.kill_master()
            new = sentinels.wait_for_new_master(old, timeout=30)
            promoted = time.monotonic()
            # Back as the new master's replica: writes need one to confirm them.
            sentinels.restart(sentinels.server_at(old))
            sentinels.wait_healthy(timeout=30)
            commit_after_recovery(url, HOT_KEYS, run.shared, 1)
            run.fresh(1)
            reset_stats(gutter)
            commit_after_recovery(url, HOT_KEYS, run.shared, 2)
            run.fresh(2)
            after_failover = gutter_commands(gutter)
            logs, _ = run.stop()
        finally:
            run.kill()
    per_key: dict[str, int] = defaultdict(int)
    for (_, key), count in loads_within(logs, down, promoted).items():
        per_key[key] += count
    bound = gutter_bound(promoted - down, gutter_ttl)
    gutter_reads = sum(log.stats["gutter_reads"] for log in logs)
    print(
        f"\nsentinel failover ({kind}): master {old} killed, {new} promoted "
        f"{promoted - down:.1f} s later; loads per key across {PROCESSES} processes "
        f"{dict(per_key)} (bound {bound}), {gutter_reads} gutter reads"
    )
    assert gutter_reads > 0
    assert max(per_key.values(), default=0) <= bound, dict(per_key)
    assert after_failover == {}
    assert all(not log.errors for log in logs), [log.errors for log in logs]
    assert all(log.regressions == 0 for log in logs), [log.regressions for log in logs]
