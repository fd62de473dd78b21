"""Throwaway Redis Cluster and Sentinel deployments for tests and benchmarks.

:class:`OwnedRedisCluster` runs a real Redis Cluster (three masters with one
replica each by default) and :class:`OwnedSentinelSet` a real master, its
replicas and three sentinels, all on free loopback ports, without persistence,
in temporary directories. Tests use them to kill a master with SIGKILL or to ask
for a failover under load, then to watch what cacheguard does.

Both are built on :class:`cacheguard.testing.OwnedRedisServer`. They ask the
running processes for the topology (CLUSTER NODES, SENTINEL ...) rather than
remember what they set up, since a failover changes it behind their back. Every
wait is bounded by a deadline and polls with short sleeps: the state waited on
lives in other processes, which announce nothing. ``close()`` kills every
process by PID and removes every temporary directory; it also runs at exit, so
an interrupted test run leaves nothing behind.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel

from cacheguard.exceptions import BackendUnavailable
from cacheguard.redis.errors import REDIS_UNREACHABLE
from cacheguard.testing import OwnedRedisServer, free_port

__all__ = ["OwnedClusterNode", "OwnedRedisCluster", "OwnedSentinelSet"]

HOST = "127.0.0.1"
SLOTS = 16384
Address = tuple[str, int]

_POLL = 0.1
_START_ATTEMPTS = 5
# How long a restart retries a port someone else holds for a moment (a client
# socket that happened to get it as its ephemeral port, say).
_RESTART_PATIENCE = 5.0
# Redis Cluster listens for its bus on the client port + 10000.
_BUS_OFFSET = 10000
# No persistence; and a replica's full sync starts at once instead of waiting 5 s
# for other replicas to share it (the diskless-sync default).
_DATA_NODE_ARGS = ("--appendonly", "no", "--save", "", "--repl-diskless-sync-delay", "0")
# Sentinel flags that mean an instance is unreachable or believed down.
_DOWN_FLAGS = frozenset({"s_down", "o_down", "disconnected"})
# Sentinel's test hooks (SENTINEL DEBUG), in ms. Hello every 0.5 s, not 2 s, and
# INFO every 1 s, not 10 s: sentinels find each other, and notice replicas come
# and go, within about a second. Peers asked about a master every 0.2 s, not 1 s:
# their "it is down" votes expire after 5 asks, and until then they count for the
# *new* master too, so one sentinel's hiccup just after a failover (a late PONG on
# a busy machine) would at once start a second failover.
_SENTINEL_PERIODS = ("info-period", 1000, "publish-period", 500, "ask-period", 200)
# Errors a poll treats as "not yet" rather than as the end.
_NOT_YET = (*REDIS_UNREACHABLE, redis.ResponseError, BackendUnavailable)


# --- talking to the servers ----------------------------------------------------


class _Clients:
    """One client per port, reused by every poll (a connection per poll would leave
    thousands of sockets in TIME_WAIT behind). Replies come back as the server sent
    them (RESP2, decoded, no redis-py reshaping), so the parsers below know their
    input. A dropped connection is retried once, at once; anything else fails fast:
    the pollers retry."""

    def __init__(self) -> None:
        self._by_port: dict[int, redis.Redis] = {}

    def call(self, port: int, *command: str | int) -> Any:
        client = self._by_port.get(port)
        if client is None:
            client = redis.Redis(
                host=HOST,
                port=port,
                protocol=2,
                decode_responses=True,
                socket_connect_timeout=0.5,
                socket_timeout=1.0,
                retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
            )
            client.response_callbacks.clear()
            self._by_port[port] = client
        return client.execute_command(*command)  # type: ignore[no-untyped-call]

    def info(self, port: int, section: str) -> dict[str, str]:
        return _parse_info(str(self.call(port, "INFO", section)))

    def role(self, port: int) -> tuple[str, int | None]:
        """ROLE: ("master", None) or ("slave", its master's port)."""
        reply = self.call(port, "ROLE")
        if reply[0] == "slave":
            return "slave", int(reply[2])
        return str(reply[0]), None

    def close(self) -> None:
        for client in self._by_port.values():
            client.close()
        self._by_port.clear()


def _parse_info(text: str) -> dict[str, str]:
    """INFO / CLUSTER INFO text: ``field:value`` lines."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and ":" in line:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    """A RESP2 field/value list as a dict."""
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


def _wait_until(what: str, problem: Callable[[], str | None], timeout: float) -> None:
    """Poll ``problem`` (None when all is well, else what is still wrong) until it
    returns None; raise with its last answer when ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            last = problem()
        except _NOT_YET as exc:
            last = f"{type(exc).__name__}: {exc}"
        if last is None:
            return
        if time.monotonic() >= deadline:
            raise BackendUnavailable(f"{what} did not happen within {timeout:g} s: {last}")
        time.sleep(_POLL)


# --- processes ---------------------------------------------------------------


class _Server(OwnedRedisServer):
    """An :class:`OwnedRedisServer` that logs to its directory, checks that the server
    answering on its port is its own process, and removes its directory when its
    very first start fails (the caller never gets the object to close)."""

    log_name = "redis.log"

    def __init__(self, *extra_args: str, port: int) -> None:
        self._started_once = False
        # Relative paths land in the workdir: redis-server changes into --dir first.
        super().__init__("--logfile", self.log_name, *extra_args, port=port)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def set_args(self, *extra_args: str) -> None:
        """Replace the extra arguments for the next start."""
        self.extra_args = ("--logfile", self.log_name, *extra_args)

    def start(self) -> None:
        try:
            self._launch()
            self._check_owned()
        except BackendUnavailable as exc:
            tail = self._log_tail()
            if not self._started_once:
                shutil.rmtree(self.workdir, ignore_errors=True)
            raise BackendUnavailable(f"{exc}; its log ends with: {tail}") from exc
        self._started_once = True

    def restart(self) -> None:
        """Start again on the same port, retrying for a few seconds while the port is
        taken (by a client socket, say); raise if it stays taken."""
        deadline = time.monotonic() + _RESTART_PATIENCE
        while True:
            try:
                self.start()
                return
            except BackendUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _launch(self) -> None:
        super().start()

    def _check_owned(self) -> None:
        # free_port() only says a port was free a moment ago: if another process took
        # it, the PING that said "started" was that process's answer.
        clients = _Clients()
        try:
            answering = clients.info(self.port, "server").get("process_id")
        except (*REDIS_UNREACHABLE, redis.ResponseError) as exc:
            answering = f"unknown ({exc})"
        finally:
            clients.close()
        if self.proc is None or answering != str(self.proc.pid):
            self.kill()
            raise BackendUnavailable(
                f"port {self.port} is served by another process (pid {answering})"
            )

    def _log_tail(self, lines: int = 5) -> str:
        try:
            with open(os.path.join(self.workdir, self.log_name), encoding="utf-8") as log:
                return " | ".join(line.strip() for line in log.readlines()[-lines:])
        except OSError:
            return "(no log)"


class _SentinelServer(_Server):
    """A ``redis-server --sentinel``. Sentinel insists on a config file it can rewrite,
    given as the first argument, which OwnedRedisServer's command line cannot carry."""

    log_name = "sentinel.log"

    def __init__(self, monitor_lines: Sequence[str], *, port: int) -> None:
        self._monitor_lines = tuple(monitor_lines)
        super().__init__(port=port)

    @property
    def config_path(self) -> str:
        return os.path.join(self.workdir, "sentinel.conf")

    def _launch(self) -> None:
        # Written once: on a restart the sentinel's own rewrite (its state) is kept.
        if not os.path.exists(self.config_path):
            lines = [
                f"port {self.port}",
                f"bind {HOST}",
                f'dir "{self.workdir}"',
                f'logfile "{self.log_name}"',
                *self._monitor_lines,
            ]
            with open(self.config_path, "w", encoding="utf-8") as config:
                config.write("\n".join(lines) + "\n")
        self.proc = subprocess.Popen(
            [self.binary, self.config_path, "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not self._answers():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.kill()
                raise BackendUnavailable(f"redis sentinel on port {self.port} did not start")
            time.sleep(0.02)


def _start_with_retries(start: Callable[[int], _Server], pick_port: Callable[[], int]) -> _Server:
    """Start a server on a fresh port, again on another one if it fails: a free port
    can be taken by someone else between free_port() and the server's bind."""
    last: BackendUnavailable | None = None
    for _ in range(_START_ATTEMPTS):
        try:
            return start(pick_port())
        except BackendUnavailable as exc:
            last = exc
    raise BackendUnavailable(f"redis-server did not start in {_START_ATTEMPTS} tries: {last}")


def _port_bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
        return True


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) exists and is free too."""
    for _ in range(100):
        port = free_port()
        if port + _BUS_OFFSET <= 65535 and _port_bindable(port + _BUS_OFFSET):
            return port
    raise BackendUnavailable("found no free port pair for a cluster node")


class _ExitGuard:
    """Runs ``close`` at interpreter exit unless cancelled; only in the process that
    started the servers (a forked child must not kill its parent's)."""

    def __init__(self, close: Callable[[], None]) -> None:
        self._owner = os.getpid()
        self._close = close
        atexit.register(self._at_exit)

    def _at_exit(self) -> None:
        if os.getpid() == self._owner:
            self._close()

    def cancel(self) -> None:
        atexit.unregister(self._at_exit)


# --- Redis Cluster --------------------------------------------------------------


@dataclass(frozen=True)
class _NodeView:
    """One line of CLUSTER NODES: how one node sees another."""

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    slots: tuple[tuple[int, int], ...]

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failing(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "handshake", "noaddr"})


def _parse_cluster_nodes(text: str) -> list[_NodeView]:
    # <id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...
    views = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        address = fields[1].split("@", 1)[0]
        slots = []
        for item in fields[8:]:
            if item.startswith("["):  # a slot being migrated: not owned yet
                continue
            first, _, last = item.partition("-")
            slots.append((int(first), int(last or first)))
        views.append(
            _NodeView(
                node_id=fields[0],
                port=int(address.rsplit(":", 1)[1]),
                flags=frozenset(fields[2].split(",")),
                master_id=None if fields[3] == "-" else fields[3],
                slots=tuple(slots),
            )
        )
    return views


def _slot_ranges(masters: int) -> list[tuple[int, int]]:
    """0..16383 split into ``masters`` contiguous, near-equal ranges."""
    bounds = [i * SLOTS // masters for i in range(masters + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(masters)]


@dataclass(eq=False)
class OwnedClusterNode:
    """One node of an :class:`OwnedRedisCluster` (master or replica: ask the cluster)."""

    server: _Server
    node_id: str
    host: str = HOST

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}"

    @property
    def alive(self) -> bool:
        return self.server.alive

    @property
    def pid(self) -> int | None:
        return None if self.server.proc is None else self.server.proc.pid

    def __repr__(self) -> str:
        return f"OwnedClusterNode(port={self.port}, id={self.node_id[:8]}, alive={self.alive})"


class OwnedRedisCluster:
    """A throwaway Redis Cluster on loopback: ``masters`` masters, each with
    ``replicas_per_master`` replicas, the 16384 slots split evenly among the masters.

    The constructor returns once every node reports ``cluster_state:ok``, all agree on
    the slot map and every replica's link to its master is up; it raises
    :class:`BackendUnavailable` naming what did not converge after
    ``startup_timeout`` seconds (and leaves nothing running).
    """

    def __init__(
        self,
        masters: int = 3,
        replicas_per_master: int = 1,
        node_timeout_ms: int = 1000,
        extra_args: Sequence[str] = (),
        *,
        startup_timeout: float = 30.0,
    ) -> None:
        if masters < 1 or replicas_per_master < 0:
            raise ValueError("need at least one master and no negative replica count")
        self.nodes: list[OwnedClusterNode] = []
        self._clients = _Clients()
        self._closed = False
        self._exit_guard = _ExitGuard(self.close)
        # What a killed master served, for wait_for_failover: the cluster forgets.
        self._slots_at_kill: dict[str, tuple[tuple[int, int], ...]] = {}
        args = (
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",  # in the workdir, kept across restarts
            "--cluster-node-timeout", str(node_timeout_ms),
            "--cluster-require-full-coverage", "no",
            "--cluster-replica-validity-factor", "0",
            # The replication PING every second instead of 10 moves a fresh replica's
            # offset past 0, without which CLUSTER SLOTS hides it from clients.
            "--repl-ping-replica-period", "1",
            *_DATA_NODE_ARGS,
            *extra_args,
        )  # fmt: skip
        deadline = time.monotonic() + startup_timeout
        try:
            for _ in range(masters * (1 + replicas_per_master)):
                server = _start_with_retries(lambda port: _Server(*args, port=port), _cluster_port)
                # Listed before its id is known: close() must find its process.
                node = OwnedClusterNode(server=server, node_id="")
                self.nodes.append(node)
                node.node_id = str(self._call(node, "CLUSTER", "MYID"))
            self._form(masters, deadline)
            self.wait_healthy(timeout=max(0.1, deadline - time.monotonic()))
        except BaseException:
            self.close()
            raise

    def _call(self, node: OwnedClusterNode, *command: str | int) -> Any:
        return self._clients.call(node.port, *command)

    def _cluster_nodes(self, node: OwnedClusterNode) -> list[_NodeView]:
        return _parse_cluster_nodes(str(self._call(node, "CLUSTER", "NODES")))

    def _form(self, masters: int, deadline: float) -> None:
        primaries, replicas = self.nodes[:masters], self.nodes[masters:]
        for node, (first, last) in zip(primaries, _slot_ranges(masters), strict=True):
            self._call(node, "CLUSTER", "ADDSLOTSRANGE", first, last)
        # Distinct config epochs up front, as redis-cli does: otherwise the nodes
        # resolve their epoch collision one bump at a time.
        for epoch, node in enumerate(self.nodes, start=1):
            self._call(node, "CLUSTER", "SET-CONFIG-EPOCH", epoch)
        for node in self.nodes[1:]:
            self._call(self.nodes[0], "CLUSTER", "MEET", HOST, node.port)
        # A replica can only REPLICATE a master it has heard of through gossip.
        pending = {r.node_id: (r, primaries[i % masters]) for i, r in enumerate(replicas)}

        def unassigned() -> str | None:
            for replica_id, (replica, master) in list(pending.items()):
                known = {view.node_id for view in self._cluster_nodes(replica)}
                if master.node_id in known:
                    self._call(replica, "CLUSTER", "REPLICATE", master.node_id)
                    del pending[replica_id]
            waiting = [replica.port for replica, _ in pending.values()]
            return f"replicas {waiting} have not heard of their masters" if waiting else None

        _wait_until("replica assignment", unassigned, max(0.1, deadline - time.monotonic()))

    # -- addresses

    @property
    def startup_nodes(self) -> list[ClusterNode]:
        return [
            ClusterNode(node.host, node.port)  # type: ignore[no-untyped-call]
            for node in self.nodes
        ]

    @property
    def url(self) -> str:
        """The URL of one running node (a cluster client discovers the rest from it)."""
        return self._live_nodes()[0].url

    def client(self, **kwargs: Any) -> RedisCluster:
        """A cluster client over all nodes, with short socket timeouts unless given."""
        kwargs.setdefault("socket_connect_timeout", 1.0)
        kwargs.setdefault("socket_timeout", 2.0)
        return RedisCluster(startup_nodes=self.startup_nodes, **kwargs)

    # -- the live topology

    def _live_nodes(self) -> list[OwnedClusterNode]:
        live = [node for node in self.nodes if node.alive]
        if not live:
            raise BackendUnavailable("no node of the cluster is running")
        return live

    def _by_id(self, node_id: str) -> OwnedClusterNode:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise BackendUnavailable(f"the cluster reports a node it did not start: {node_id}")

    def _view(self) -> list[_NodeView]:
        """CLUSTER NODES from the first running node that answers."""
        error: Exception | None = None
        for node in self._live_nodes():
            try:
                return self._cluster_nodes(node)
            except REDIS_UNREACHABLE as exc:
                error = exc
        raise BackendUnavailable(f"no cluster node answered CLUSTER NODES: {error}")

    def masters(self) -> list[OwnedClusterNode]:
        """The masters the cluster counts now (not flagged failing), by first slot."""
        views = [v for v in self._view() if v.is_master and not v.failing]
        views.sort(key=lambda v: v.slots[0][0] if v.slots else SLOTS)
        return [self._by_id(v.node_id) for v in views]

    def replicas(self) -> list[OwnedClusterNode]:
        """The replicas the cluster counts now (not flagged failing)."""
        return [self._by_id(v.node_id) for v in self._view() if not v.is_master and not v.failing]

    def replica_of(self, master: OwnedClusterNode) -> OwnedClusterNode:
        """A replica the cluster counts now for ``master``."""
        for view in self._view():
            if view.master_id == master.node_id and not view.failing:
                return self._by_id(view.node_id)
        raise BackendUnavailable(f"the cluster knows no healthy replica of {master}")

    def keyslot(self, key: str) -> int:
        return int(self._call(self._live_nodes()[0], "CLUSTER", "KEYSLOT", key))

    def master_for_key(self, key: str) -> OwnedClusterNode:
        """The master that serves ``key`` now, by CLUSTER KEYSLOT and the live slot map."""
        return self.master_for_slot(self.keyslot(key))

    def master_for_slot(self, slot: int) -> OwnedClusterNode:
        """The master that serves ``slot`` now, in the live slot map."""
        for view in self._view():
            if view.is_master and any(first <= slot <= last for first, last in view.slots):
                return self._by_id(view.node_id)
        raise BackendUnavailable(f"no master serves slot {slot}")

    # -- health

    def _health_problem(self) -> str | None:
        """None when every running node reports cluster_state:ok and sees a healthy
        cluster (see _node_picture), and all of them see the same one."""
        live = self._live_nodes()
        pictures: dict[int, tuple[object, ...]] = {}
        for node in live:
            picture = self._node_picture(node, live)
            if isinstance(picture, str):
                return picture
            pictures[node.port] = picture
        if len(set(pictures.values())) > 1:
            return f"nodes disagree on the slot map or roles: ports {sorted(pictures)}"
        return None

    def _node_picture(
        self, node: OwnedClusterNode, live: list[OwnedClusterNode]
    ) -> tuple[object, ...] | str:
        """What ``node`` sees (slot owners, roles), or what is wrong with it: all slots
        served by running masters, every running node known and not flagged failing,
        its own role as the others see it, its replication link up, and every
        running replica offered to clients in CLUSTER SLOTS."""
        state = _parse_info(str(self._call(node, "CLUSTER", "INFO"))).get("cluster_state")
        if state != "ok":
            return f"node {node.port} reports cluster_state:{state}"
        live_ids = {n.node_id for n in live}
        views = self._cluster_nodes(node)
        owners = tuple(sorted((r, v.node_id) for v in views if v.is_master for r in v.slots))
        covered = sum(last - first + 1 for (first, last), _ in owners)
        if covered != SLOTS:
            return f"node {node.port} sees {covered} of {SLOTS} slots assigned"
        dead_owners = {owner for _, owner in owners} - live_ids
        if dead_owners:
            return f"node {node.port} routes slots to stopped node(s) {sorted(dead_owners)}"
        seen = {v.node_id: v for v in views if v.node_id in live_ids}
        if seen.keys() != live_ids:
            missing = [n.port for n in live if n.node_id not in seen]
            return f"node {node.port} does not know node(s) {missing}"
        failing = [v.port for v in seen.values() if v.failing]
        if failing:
            return f"node {node.port} flags running node(s) {failing} as failing"
        replication = self._clients.info(node.port, "replication")
        own_role = replication.get("role")
        if own_role != ("master" if seen[node.node_id].is_master else "slave"):
            return f"node {node.port} says it is {own_role}, the cluster thinks otherwise"
        link = replication.get("master_link_status")
        if own_role == "slave" and link != "up":
            return f"replica {node.port} has master_link_status:{link}"
        # CLUSTER SLOTS (what clients read) leaves out a replica until its replication
        # offset is past 0, which the master's replication PING soon makes it.
        listed = {int(n[1]) for r in self._call(node, "CLUSTER", "SLOTS") for n in r[3:]}
        replicas = {v.port for v in seen.values() if not v.is_master}
        if listed != replicas:
            return f"node {node.port} offers replicas {sorted(listed)} of {sorted(replicas)}"
        roles = tuple(sorted((v.node_id, v.is_master, v.master_id) for v in seen.values()))
        return (owners, roles)

    def wait_healthy(self, timeout: float = 15.0) -> None:
        """Wait until the running nodes form a healthy cluster (see _node_picture)."""
        _wait_until("cluster convergence", self._health_problem, timeout)

    # -- faults

    def kill(self, node: OwnedClusterNode) -> None:
        """SIGKILL ``node`` (by PID: no shutdown, no goodbye to clients or the bus)."""
        try:
            slots = next((v.slots for v in self._view() if v.node_id == node.node_id), ())
        except _NOT_YET:
            slots = ()
        if slots:
            self._slots_at_kill[node.node_id] = slots
        node.server.kill()

    def restart(self, node: OwnedClusterNode) -> None:
        """Start a stopped node on its port again. Its nodes.conf survives in its
        workdir, so it rejoins as itself (a replaced master comes back as a replica)
        but with no data. Follow with :meth:`wait_healthy` to wait for it to settle."""
        if node.alive:
            raise ValueError(f"{node} is running")
        node.server.restart()

    def wait_for_failover(
        self, dead_master: OwnedClusterNode, timeout: float = 30.0
    ) -> OwnedClusterNode:
        """Wait until another node serves what ``dead_master`` served and the running
        nodes are a healthy cluster again; return that node, the new master."""
        slots = self._slots_at_kill.get(dead_master.node_id)
        if slots is None:
            slots = next((v.slots for v in self._view() if v.node_id == dead_master.node_id), ())
        if not slots:
            raise ValueError(f"{dead_master} served no slots: nothing to fail over")
        slot = slots[0][0]
        successor: list[OwnedClusterNode] = []

        def problem() -> str | None:
            owner = self.master_for_slot(slot)
            if owner is dead_master:
                return f"slot {slot} is still served by the dead master {dead_master.port}"
            successor[:] = [owner]
            return self._health_problem()

        _wait_until(f"failover of {dead_master}", problem, timeout)
        return successor[0]

    def flushall(self) -> None:
        """FLUSHALL on every master (replicas follow)."""
        for master in self.masters():
            self._call(master, "FLUSHALL")

    # -- clean-up

    def pids(self) -> list[int]:
        """The PIDs of the running nodes."""
        return [pid for node in self.nodes if node.alive and (pid := node.pid) is not None]

    def workdirs(self) -> list[str]:
        return [node.server.workdir for node in self.nodes]

    def close(self) -> None:
        """Kill every node by PID and remove their directories; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._exit_guard.cancel()
        self._clients.close()
        for node in self.nodes:
            node.server.close()

    def __enter__(self) -> OwnedRedisCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# --- Sentinel -------------------------------------------------------------------


class OwnedSentinelSet:
    """A throwaway master with ``replicas`` replicas watched by ``sentinels`` sentinels
    (quorum: a majority) on loopback, under the name ``master_name``.

    The constructor returns once every sentinel knows the master, its replicas and
    the other sentinels, and every replica's link is up; it raises
    :class:`BackendUnavailable` naming what did not converge after
    ``startup_timeout`` seconds (and leaves nothing running).
    """

    def __init__(
        self,
        master_name: str = "cacheguard",
        replicas: int = 1,
        sentinels: int = 3,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        extra_args: Sequence[str] = (),
        *,
        startup_timeout: float = 30.0,
    ) -> None:
        if replicas < 0 or sentinels < 1:
            raise ValueError("need at least one sentinel and no negative replica count")
        self.master_name = master_name
        self.extra_args = (*_DATA_NODE_ARGS, *extra_args)
        self.servers: list[_Server] = []
        self.sentinel_servers: list[_Server] = []
        self._clients = _Clients()
        self._closed = False
        self._exit_guard = _ExitGuard(self.close)
        deadline = time.monotonic() + startup_timeout
        try:
            master = self._start_data_node(replica_of=None)
            for _ in range(replicas):
                self._start_data_node(replica_of=master.port)
            # Sentinels find a master's replicas in its INFO, which they read at once
            # on connecting and then only now and then: so connect the replicas first.
            _wait_until("replica sync", self._replication_problem, deadline - time.monotonic())
            monitor = [
                f"sentinel monitor {master_name} {HOST} {master.port} {sentinels // 2 + 1}",
                f"sentinel down-after-milliseconds {master_name} {down_after_ms}",
                f"sentinel failover-timeout {master_name} {failover_timeout_ms}",
                f"sentinel parallel-syncs {master_name} 1",
            ]
            for _ in range(sentinels):
                sentinel = _start_with_retries(
                    lambda port: _SentinelServer(monitor, port=port), free_port
                )
                self.sentinel_servers.append(sentinel)
                self._clients.call(sentinel.port, "SENTINEL", "DEBUG", *_SENTINEL_PERIODS)
            self.wait_healthy(timeout=max(0.1, deadline - time.monotonic()))
        except BaseException:
            self.close()
            raise

    def _start_data_node(self, replica_of: int | None) -> _Server:
        args = self._data_args(replica_of)
        server = _start_with_retries(lambda port: _Server(*args, port=port), free_port)
        self.servers.append(server)
        return server

    def _data_args(self, replica_of: int | None) -> tuple[str, ...]:
        if replica_of is None:
            return self.extra_args
        return (*self.extra_args, "--replicaof", HOST, str(replica_of))

    # -- addresses

    @property
    def sentinel_addresses(self) -> list[Address]:
        return [(HOST, s.port) for s in self.sentinel_servers]

    def sentinel(self, **connection_kwargs: Any) -> Sentinel:
        """A new redis-py Sentinel over the sentinels, with short timeouts unless given."""
        connection_kwargs.setdefault("socket_connect_timeout", 0.5)
        connection_kwargs.setdefault("socket_timeout", 1.0)
        return Sentinel(  # type: ignore[no-untyped-call]
            self.sentinel_addresses,
            sentinel_kwargs={"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
            **connection_kwargs,
        )

    def _reported_masters(self) -> dict[int, Address | None]:
        """What each running sentinel answers to GET-MASTER-ADDR-BY-NAME."""
        reports: dict[int, Address | None] = {}
        for sentinel in self.sentinel_servers:
            if not sentinel.alive:
                continue
            try:
                reply = self._clients.call(
                    sentinel.port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name
                )
            except REDIS_UNREACHABLE:
                continue
            reports[sentinel.port] = None if reply is None else (str(reply[0]), int(reply[1]))
        return reports

    def master_address(self) -> Address:
        """The master's address as the sentinels report it (the majority's answer)."""
        reports = [a for a in self._reported_masters().values() if a is not None]
        if not reports:
            raise BackendUnavailable(f"no sentinel reports a master for {self.master_name!r}")
        return max(set(reports), key=reports.count)

    def server_at(self, address: Address) -> _Server:
        for server in self.servers:
            if server.port == address[1]:
                return server
        raise BackendUnavailable(f"no server of this set listens at {address}")

    def master_server(self) -> _Server:
        return self.server_at(self.master_address())

    # -- health

    def _replication_problem(self) -> str | None:
        """None when the sentinels' master runs as a master and every other running
        data node replicates it with its link up. Before sentinels exist: the first
        server is the master."""
        master = self.master_address() if self.sentinel_servers else (HOST, self.servers[0].port)
        if self._clients.role(master[1])[0] != "master":
            return f"{master} does not report itself as master"
        for server in self.servers:
            if not server.alive or server.port == master[1]:
                continue
            role, master_port = self._clients.role(server.port)
            if role != "slave" or master_port != master[1]:
                return f"server {server.port} is {role} of {master_port}, not a replica of {master}"
            link = self._clients.info(server.port, "replication").get("master_link_status")
            if link != "up":
                return f"replica {server.port} has master_link_status:{link}"
        return None

    def _sentinel_problem(self) -> str | None:
        """None when all running sentinels agree on the master, see it and every
        running replica healthy, and know all the other sentinels."""
        reports = self._reported_masters()
        if len(set(reports.values())) != 1 or None in reports.values():
            return f"sentinels disagree on the master: {reports}"
        master = self.master_address()
        replicas = {s.port for s in self.servers if s.alive and s.port != master[1]}
        for sentinel in self.sentinel_servers:
            if not sentinel.alive:
                continue
            problem = self._one_sentinel_problem(sentinel.port, replicas)
            if problem is not None:
                return problem
        return None

    def _one_sentinel_problem(self, port: int, replicas: set[int]) -> str | None:
        call = self._clients.call
        state = _pairs(call(port, "SENTINEL", "MASTER", self.master_name))
        if state.get("flags") != "master":
            return f"sentinel {port} flags the master {state.get('flags')}"
        seen: set[int] = set()
        for entry in call(port, "SENTINEL", "REPLICAS", self.master_name):
            replica = _pairs(entry)
            if int(replica["port"]) not in replicas:
                continue  # a stopped server, which sentinel keeps listing
            if replica["flags"] != "slave" or replica.get("master-link-status") != "ok":
                return f"sentinel {port} sees replica {replica['port']} as {replica['flags']}"
            seen.add(int(replica["port"]))
        if seen != replicas:
            return f"sentinel {port} knows replicas {sorted(seen)} of {sorted(replicas)}"
        peers = [_pairs(e) for e in call(port, "SENTINEL", "SENTINELS", self.master_name)]
        # Not "master_down": that is a peer's vote about a master, kept for 5 s
        # after a failover, not a fault of the peer.
        healthy = [p for p in peers if not _DOWN_FLAGS & set(p["flags"].split(","))]
        if len(healthy) != len(self.sentinel_servers) - 1:
            return f"sentinel {port} knows {len(healthy)} healthy other sentinels"
        return None

    def _health_problem(self) -> str | None:
        return self._replication_problem() or self._sentinel_problem()

    def wait_healthy(self, timeout: float = 15.0) -> None:
        """Wait until data nodes and sentinels agree and are healthy (see above)."""
        _wait_until("sentinel set convergence", self._health_problem, timeout)

    # -- faults

    def kill_master(self) -> Address:
        """SIGKILL the current master; return its address."""
        address = self.master_address()
        self.server_at(address).kill()
        return address

    def planned_failover(self) -> Address:
        """SENTINEL FAILOVER through one sentinel; return the old master's address.
        Sentinel does not tell the old master: it keeps taking writes until sentinel
        turns it into a replica, about 4 hello periods (2 s here) later."""
        address = self.master_address()
        sentinel = next(s for s in self.sentinel_servers if s.alive)
        self._clients.call(sentinel.port, "SENTINEL", "FAILOVER", self.master_name)
        return address

    def wait_for_new_master(self, old_address: Address, timeout: float = 30.0) -> Address:
        """Wait until every running sentinel reports one master other than
        ``old_address``, that node says it is master, and the old master, if it runs,
        says it is its replica. Return the new master's address."""
        result: list[Address] = []

        def problem() -> str | None:
            reports = set(self._reported_masters().values())
            if len(reports) != 1:
                return f"sentinels disagree on the master: {reports}"
            new = reports.pop()
            if new is None or new == old_address:
                return f"sentinels still report {new}"
            if self._clients.role(new[1])[0] != "master":
                return f"{new} does not report itself as master yet"
            old = self.server_at(old_address)
            if old.alive:
                role, master_port = self._clients.role(old.port)
                if role != "slave" or master_port != new[1]:
                    return f"the old master {old_address} is {role} of {master_port}"
            result[:] = [new]
            return None

        _wait_until(f"failover away from {old_address}", problem, timeout)
        return result[0]

    def restart(self, server: _Server) -> None:
        """Start a stopped data node on its port again, as a replica of the master the
        sentinels report (or as master if that is still itself): an empty node that
        came back as master would serve no data until sentinel demoted it."""
        if server.alive:
            raise ValueError(f"server on port {server.port} is running")
        master = self.master_address()
        server.set_args(*self._data_args(None if master[1] == server.port else master[1]))
        server.restart()

    # -- clean-up

    def pids(self) -> list[int]:
        """The PIDs of the running data nodes and sentinels."""
        return [s.proc.pid for s in (*self.servers, *self.sentinel_servers) if s.alive and s.proc]

    def workdirs(self) -> list[str]:
        return [s.workdir for s in (*self.servers, *self.sentinel_servers)]

    def close(self) -> None:
        """Kill every process by PID and remove their directories; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._exit_guard.cancel()
        self._clients.close()
        for server in (*self.sentinel_servers, *self.servers):
            server.close()

    def __enter__(self) -> OwnedSentinelSet:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
