"""ZooKeeperRWLock against a real ZooKeeper: what the contract suite does not cover.

The common rules run in tests/test_lock_contract.py (store "zookeeper"). Here: the
server restarted under holders and waiters, a session expired, a holder process
SIGKILLed (fencing across its death), the queue left clean by a timeout and a
``try_acquire``, the downgrade waking readers already queued, owners shared per
kazoo client, lock names that are not plain znode names, and bad input.

One standalone server for the module (``cacheguard.testing.zookeeper_server``);
each test has clients of its own. Sessions are 4 s here (a restarted server must
find the holder's session alive), 1 s for the killed child.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cacheguard_testing.zookeeper import OwnedZooKeeperServer
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry

from cacheguard.exceptions import BackendUnavailable, LockLostError, LockTimeout
from cacheguard.locks.zookeeper.rwlock import ZooKeeperRWLock
from tests.lock_stores import held_briefly, in_thread, token_of, zookeeper_or_skip
from tests.procs import CTX, start_process

SESSION = 4.0


@pytest.fixture(scope="module")
def server() -> Iterator[OwnedZooKeeperServer]:
    with zookeeper_or_skip() as owned:
        yield owned


@pytest.fixture
def connect(server: OwnedZooKeeperServer) -> Iterator[Callable[..., KazooClient]]:
    """Started kazoo clients (each its own session), stopped after the test."""
    clients: list[KazooClient] = []

    def make(session: float = SESSION, listed: int = 1) -> KazooClient:
        client = _client(",".join([server.hosts] * listed), session)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.stop()
        client.close()


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    return f"zk-{request.node.name}-{os.getpid()}-{time.monotonic_ns()}"


# -- the server restarted, a session expired, a holder killed ------------------------


@pytest.mark.slow
def test_a_restart_marks_holders_lost_deletes_their_nodes_and_waiters_get_in(
    server: OwnedZooKeeperServer, connect: Callable[..., KazooClient], name: str
) -> None:
    # Sessions that outlive a restart on a loaded machine (a JVM can take longer
    # than SESSION to start again): the test is of a suspension, not an expiry.
    # A server still starting can accept a reconnect and never answer it; kazoo waits
    # session / len(hosts) for the answer, so the server is listed three times: a
    # stuck handshake costs 10 s and a new try, not the whole session (seen under load:
    # the waiter's deadline passed, or the holder's session expired, meanwhile).
    holder_client, waiter_client, bystander = (connect(30.0, listed=3) for _ in range(3))
    lost = threading.Event()
    holder = ZooKeeperRWLock(holder_client, name, on_lost=lambda _handle: lost.set())
    handle = holder.acquire_write(timeout=5)
    session = holder_client.client_id
    # The waiter's deadline outlasts a stuck handshake or two (giving up while
    # disconnected is the lock's right answer, but not the one under test here).
    waiter = in_thread(lambda: token_of(ZooKeeperRWLock(waiter_client, name).write(timeout=45)))
    _wait_until(lambda: len(_queue(holder_client, holder)) == 2, "the waiter never queued")

    server.kill()
    _wait_until(lambda: bystander.state != KazooState.CONNECTED, "the bystander saw nothing")
    with pytest.raises(BackendUnavailable):  # ZooKeeper down: no hang, no false grant
        ZooKeeperRWLock(bystander, f"{name}-other").acquire_write(timeout=0.5)
    down_at = time.monotonic()
    server.start()
    restart = f"restarting the server took {time.monotonic() - down_at:.1f} s"

    assert lost.wait(10), "the holder was never told"
    assert handle.lost
    assert "suspended" in handle.lost_reason
    # The session outlived the restart, and with it the holder's znode: the holder
    # deleted it itself once reconnected, and the waiter (whose node survived too)
    # got in.
    token = waiter.result(55)
    assert isinstance(token, int), f"{token!r}; {restart}"
    assert token > handle.token
    # A loaded machine can drop the holder's connection again after the restart
    # (a read time-out); the session is judged once it is connected.
    _wait_until(lambda: holder_client.connected, "the holder never reconnected", within=30)
    assert holder_client.client_id == session
    with pytest.raises(LockLostError):
        handle.release()
    with holder.write(timeout=5) as again:  # the owner starts afresh
        assert again.token > token


@pytest.mark.slow
def test_an_expired_session_loses_the_holding_and_frees_the_lock(
    server: OwnedZooKeeperServer, connect: Callable[..., KazooClient], name: str
) -> None:
    holder_client, other = connect(), connect()
    lost = threading.Event()
    holder = ZooKeeperRWLock(holder_client, name, on_lost=lambda _handle: lost.set())
    handle = holder.acquire_write(timeout=5)

    expired = holder_client.client_id[0]
    _expire(server, holder_client)
    assert lost.wait(10), "the holder was never told"  # (at the suspension before the loss)
    assert handle.lost
    with ZooKeeperRWLock(other, name).write(timeout=5) as taken:
        assert taken.token > handle.token
    with pytest.raises(LockLostError, match="lost before release"):
        handle.release()
    # kazoo opens a new session; the owner takes the lock again on it.
    with holder.write(timeout=15) as again:
        assert again.token > taken.token
    assert holder_client.client_id[0] != expired


def test_a_waiter_whose_session_expired_queues_again(
    server: OwnedZooKeeperServer, connect: Callable[..., KazooClient], name: str
) -> None:
    waiter_client, holder_client = connect(), connect()
    holder = ZooKeeperRWLock(holder_client, name)
    reader = holder.acquire_read(timeout=5)
    waiter = in_thread(lambda: token_of(ZooKeeperRWLock(waiter_client, name).write(timeout=45)))
    _wait_until(lambda: len(_queue(holder_client, holder)) == 2, "the waiter never queued")

    expired = waiter_client.client_id[0]
    _expire(server, waiter_client)  # its node goes with its session

    def queued_again() -> bool:  # a node of the waiter's new session is in the queue
        owners = {_owner(holder_client, holder, child) for child in _queue(holder_client, holder)}
        return expired not in owners and len(owners - {0, holder_client.client_id[0]}) == 1

    _wait_until(queued_again, "the waiter never queued again", within=20)
    reader.release()
    assert isinstance(waiter.result(30), int)


@pytest.mark.slow  # over a second: the whole suite runs it, -m 'not slow' does not
def test_a_killed_holder_frees_the_lock_and_the_next_token_is_higher(
    server: OwnedZooKeeperServer, connect: Callable[..., KazooClient], name: str
) -> None:
    client = connect()
    lock = ZooKeeperRWLock(client, name)
    tokens = CTX.Queue()
    child = start_process(_hold_write, server.hosts, name, tokens)
    dead_token = tokens.get(timeout=30)
    assert len(_queue(client, lock)) == 1
    os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    child.join(10)
    # The child's session (1 s) expires; its ephemeral node goes with it.
    with lock.write(timeout=15) as handle:
        assert handle.token > dead_token
        assert len(_queue(client, lock)) == 1


# -- the queue ------------------------------------------------------------------------


def test_a_timed_out_writer_and_a_failed_try_leave_nothing_queued(
    connect: Callable[..., KazooClient], name: str
) -> None:
    client = connect()
    lock = ZooKeeperRWLock(client, name)
    with lock.read(timeout=5):
        late = in_thread(lambda: held_briefly(ZooKeeperRWLock(client, name).write(timeout=0.3)))
        assert isinstance(late.result(30), LockTimeout)
        assert in_thread(lock.try_acquire_write).result(30) is None
        assert len(_queue(client, lock)) == 1
        # No writer's node holds new readers off.
        joined = in_thread(lambda: held_briefly(lock.read(timeout=0.5)))
        assert joined.result(30) == "held"
    assert client.exists(lock.path) is None  # the directory went with its last node


def test_a_downgrade_lets_in_the_readers_already_waiting(
    connect: Callable[..., KazooClient], name: str
) -> None:
    client, other = connect(), connect()
    lock = ZooKeeperRWLock(client, name)
    outer = lock.acquire_write(timeout=5)
    waiting = in_thread(lambda: held_briefly(ZooKeeperRWLock(other, name).read(timeout=5)))
    _wait_until(lambda: len(_queue(client, lock)) == 2, "the reader never queued")
    inner = lock.acquire_read(timeout=5)
    outer.release()  # now only a reader: the waiting reader comes in
    assert waiting.result(30) == "held"
    assert in_thread(lambda: ZooKeeperRWLock(other, name).try_acquire_write()).result(30) is None
    inner.release()
    assert in_thread(lambda: held_briefly(lock.write(timeout=5))).result(30) == "held"


# -- owners -----------------------------------------------------------------------------


@pytest.mark.slow
def test_owners_are_counted_per_client_across_lock_objects(
    connect: Callable[..., KazooClient], name: str
) -> None:
    client, other = connect(), connect()
    first = ZooKeeperRWLock(client, name).acquire_write(timeout=5)
    second = ZooKeeperRWLock(client, name).acquire_write(timeout=0.5)  # the same owner
    assert second.token == first.token
    shared = in_thread(lambda: ZooKeeperRWLock(client, name).acquire_write(timeout=0.5))
    assert isinstance(shared.result(30), LockTimeout)  # another thread: another owner
    owner = first.owner
    # The same owner string on another client is another session: it waits.
    with pytest.raises(LockTimeout):
        ZooKeeperRWLock(other, name).acquire_write(timeout=0.3, owner=owner)
    by_name = in_thread(lambda: ZooKeeperRWLock(client, name).acquire_write(0.5, owner=owner))
    third = by_name.result(30)  # an explicit owner shares the holding between threads
    assert third.token == first.token
    for handle in (third, second, first):
        handle.release()
    # The timed-out waiters' nodes are gone too (a create whose answer came after its
    # deadline is swept on a thread of its own, not always by the time we look).
    _wait_until(lambda: not _queue(client, ZooKeeperRWLock(client, name)), "nodes left behind")


def test_a_create_answered_after_its_deadline_leaves_no_node_in_the_queue(
    connect: Callable[..., KazooClient], name: str
) -> None:
    """An acquire whose deadline passes before ZooKeeper answers its create cannot
    know whether its node exists: it must not stay in the queue until its session's
    next acquire (which may never come), blocking every taker behind it."""
    holder_client, quitter, quitters, taker = connect(), connect(), connect(), connect()
    held = ZooKeeperRWLock(holder_client, name).acquire_write(timeout=5)
    # Deadlines too short for any answer: the creates' fates are unknown. One alone
    # (no later acquire of its session sweeps for it), then several in a row (each
    # recorded while the sweep of the one before may still run).
    with pytest.raises(LockTimeout):
        ZooKeeperRWLock(quitter, name).acquire_write(timeout=1e-9)
    for _ in range(5):
        with pytest.raises(LockTimeout):
            ZooKeeperRWLock(quitters, name).acquire_write(timeout=1e-9)
    held.release()
    # The quitters never take a lock again; the taker still gets in.
    with ZooKeeperRWLock(taker, name).write(timeout=20) as handle:
        assert handle.token > held.token
    _wait_until(lambda: not _queue(taker, ZooKeeperRWLock(taker, name)), "nodes left behind")


def test_names_are_escaped_into_one_znode_each(
    connect: Callable[..., KazooClient], name: str
) -> None:
    client = connect()
    names = [f"{name}/a", f"{name}%2Fa", ".", "..", "é/{x}"]
    locks = [ZooKeeperRWLock(client, each, namespace=f"ns-{name}") for each in names]
    assert len({lock.path for lock in locks}) == len(names)
    handles = [lock.acquire_write(timeout=5) for lock in locks]  # none blocks another
    for handle in handles:
        handle.release()


# -- bad input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"name": ""}, ValueError),
        ({"name": 7}, TypeError),
        ({"root": "locks"}, ValueError),
        ({"root": "/locks/"}, ValueError),
        ({"timeout": 0}, ValueError),
        ({"request_timeout": -1}, ValueError),
        ({"namespace": "{x}"}, ValueError),
    ],
)
def test_bad_arguments_are_refused(
    connect: Callable[..., KazooClient], kwargs: dict[str, Any], error: type[Exception]
) -> None:
    arguments: dict[str, Any] = {"name": "ok", **kwargs}
    with pytest.raises(error):
        ZooKeeperRWLock(connect(), **arguments)


def test_misuse_raises_clear_errors(
    server: OwnedZooKeeperServer, connect: Callable[..., KazooClient], name: str
) -> None:
    client = connect()
    handle = ZooKeeperRWLock(client, name).acquire_write(timeout=5)
    with pytest.raises(ValueError, match="another lock"):
        ZooKeeperRWLock(client, name).release(handle)
    handle.release()
    handle.release()  # twice: nothing more
    idle = KazooClient(hosts=server.hosts)  # never started
    with pytest.raises(BackendUnavailable, match="not started"):
        ZooKeeperRWLock(idle, name).acquire_write(timeout=1)
    assert _queue(client, ZooKeeperRWLock(client, name)) == []


# -- helpers ------------------------------------------------------------------------------


def _client(hosts: str, session: float) -> KazooClient:
    # Reconnect attempts every 50-250 ms, so a restarted server is found at once.
    retry = KazooRetry(max_tries=-1, delay=0.05, max_delay=0.25)
    client = KazooClient(hosts=hosts, timeout=session, connection_retry=retry)
    client.start(timeout=15)
    return client


def _hold_write(hosts: str, name: str, tokens: Any) -> None:
    """Child: take the write lock on a 1 s session, report the token, hold it."""
    handle = ZooKeeperRWLock(_client(hosts, 1.0), name).acquire_write(timeout=10)
    tokens.put(handle.token)
    threading.Event().wait()  # held until the parent kills us


def _expire(server: OwnedZooKeeperServer, client: KazooClient) -> None:
    """End ``client``'s session from outside: another client joins it and closes it."""
    session_id, password = client.client_id
    intruder = KazooClient(hosts=server.hosts, client_id=(session_id, password))
    intruder.start(timeout=15)
    intruder.stop()
    intruder.close()


def _queue(client: KazooClient, lock: ZooKeeperRWLock) -> list[str]:
    try:
        return sorted(client.get_children(lock.path))
    except NoNodeError:
        return []


def _owner(client: KazooClient, lock: ZooKeeperRWLock, child: str) -> int:
    """The session that owns a node of the lock (0 if it is gone)."""
    stat = client.exists(f"{lock.path}/{child}")
    return 0 if stat is None else int(stat.ephemeralOwner)


def _wait_until(condition: Callable[[], bool], what: str, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not condition():  # a condition polled with a deadline
        assert time.monotonic() < deadline, what
        time.sleep(0.01)
