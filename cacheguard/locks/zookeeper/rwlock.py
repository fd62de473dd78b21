"""The read-write lock on ZooKeeper, through kazoo: ephemeral sequential znodes.

::

    client = KazooClient(hosts="127.0.0.1:2181")
    client.start()
    lock = ZooKeeperRWLock(client, "menu:7")
    with lock.write(timeout=5) as handle:
        write_to_db(fencing_token=handle.token)

Same contract as :class:`~cacheguard.locks.RedisRWLock` (docs/locks.md): readers
share, a writer excludes, writer preference, reentrancy and downgrade per owner,
upgrade refused, ``LockTimeout`` at the deadline, and a holder that dies frees the
lock by itself. No lease: a holding is an ephemeral znode, which ZooKeeper deletes
when the holder's session ends.

The queue
    Each fresh holding is one znode ``<root>/<namespace>/<name>/<guid>-<mode>-<seq>``,
    ephemeral and sequential: ZooKeeper numbers the children of the lock's directory
    in creation order. A writer holds the lock when no node is before its own; a
    reader when no *write* node is before its own. So a queued writer holds off the
    readers that come after it (writer preference), and everyone is served in
    arrival order. A waiter watches one node: a writer its nearest predecessor, a
    reader the nearest write node before it; it looks again when that node changes
    or goes. The ``guid`` lets a create whose answer was lost be found (and deleted)
    later. The directory is deleted when its last node goes.

Owners, reentrancy, downgrade
    ZooKeeper knows sessions, not owners: the holdings of owners (by default the
    calling thread) are counted in this process, per kazoo client and lock, so every
    :class:`ZooKeeperRWLock` of one client and name shares them. An owner that holds
    the write lock may take it, or the read lock, again without a new node. When its
    last write hold ends while read holds remain, the node's data turns from
    ``write`` to ``read`` (its place in the queue stays) and the readers behind it
    are woken: that is the downgrade. A read holder asking for the write lock gets
    :class:`LockUpgradeError`.

Fencing
    ``handle.token`` is the ``czxid`` of the holding's node: the id of the
    transaction that created it. ZooKeeper orders all its transactions in one
    sequence and zxids only grow (a new leader starts a higher epoch), and a writer
    is granted only once every node before it is gone, so each write holding's
    node, and token, is younger than those of all earlier write holdings of the
    lock, across clients and across the deletion of the lock's directory. (The
    node's sequence number would restart with a new directory: it is not used.)

Sessions
    A handle is marked ``lost`` as soon as the client's connection is SUSPENDED
    (it may come back with the session, or the session may expire and another
    client take the lock: from here on nobody can tell) or the session is LOST.
    Kazoo notices a silent connection within two thirds of the session timeout,
    and the server lets a session expire only after the whole timeout, so the mark
    comes before anyone else can enter. A lost holding is forgotten at once; if the
    session survives, its node is deleted when the connection is back. Releasing a
    lost handle raises :class:`LockLostError`. Waiters ride a suspension out until
    their deadline and queue again if their node went with an expired session.

kazoo is synchronous: there is no asyncio twin; run the blocking calls in a
thread with an explicit owner (docs/locks.md).
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn
from urllib.parse import quote

from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState

from cacheguard._identity import thread_owner
from cacheguard.backoff import Backoff
from cacheguard.checks import Seconds, check_positive
from cacheguard.exceptions import (
    BackendUnavailable,
    LockTimeout,
    LockUpgradeError,
)
from cacheguard.locks.protocol import Mode
from cacheguard.locks.shape import RWLockShape, ThreadedHandle
from cacheguard.redis.keys import check_namespace

__all__ = ["ZooKeeperLockHandle", "ZooKeeperRWLock"]

log = logging.getLogger("cacheguard.lock")

LostCallback = Callable[["ZooKeeperLockHandle"], None]

# <guid>-<mode>-<sequence>: ZooKeeper appends the sequence as %010d.
_NODE: Final = re.compile(r"^(?P<guid>[0-9a-f]{32})-(?P<mode>read|write)-(?P<seq>-?\d{10})$")
_DISCONNECTED: Final = (ConnectionLoss, SessionExpiredError)


class ZooKeeperLockHandle(ThreadedHandle):
    """One acquisition of a :class:`ZooKeeperRWLock`.

    ``token`` is the czxid of the holding's znode: for write holds it is strictly
    greater than the token of every earlier write hold of the lock. ``lost`` turns
    true when the client's connection is suspended or its session lost;
    ``lost_reason`` says which.
    """

    __slots__ = ("_holding",)

    gone_at_release = "its znode was gone"
    after_loss = (
        "its znode went (or goes once the connection is back) with the holding, "
        "and whoever holds the lock now was left alone"
    )

    lock: ZooKeeperRWLock

    def __init__(
        self,
        lock: ZooKeeperRWLock,
        holding: _Holding,
        mode: Mode,
        owner: str,
        on_lost: LostCallback | None,
    ) -> None:
        super().__init__(mode, owner, holding.token, on_lost)
        self.lock = lock
        self._holding = holding


@dataclass(eq=False)
class _Holding:
    """An owner's holding of one lock in this process: one znode, counted holds."""

    owner: str
    node: str  # the znode's full path
    token: int
    reads: int = 0
    writes: int = 0
    handles: list[ZooKeeperLockHandle] = field(default_factory=list)
    lost: bool = False


class _Session:
    """What this process knows about one kazoo client's session: the owners'
    holdings, the waiters to wake on a state change, and the znodes to delete once
    the connection is back (``orphans``: a directory and the guid of a node that
    may or may not exist). One per client, kept on the client itself."""

    def __init__(self, client: Any) -> None:
        self.mutex = threading.Lock()
        self.holdings: dict[tuple[str, str], _Holding] = {}
        self.acquiring: dict[tuple[str, str], threading.Event] = {}
        self.waiters: set[threading.Event] = set()
        self.orphans: set[tuple[str, str]] = set()
        self.generation = 0  # bumped on every suspension or loss
        self.connected = threading.Event()
        if client.connected:
            self.connected.set()
        self._sweeping = False
        self._client = client
        client.add_listener(self._on_state)

    def _on_state(self, state: str) -> None:
        """kazoo's state listener (on its connection thread: must not block)."""
        lost: list[_Holding] = []
        with self.mutex:
            if state == KazooState.CONNECTED:
                self.connected.set()
            else:
                self.generation += 1
                self.connected.clear()
                lost = list(self.holdings.values())
                self.holdings.clear()
                for holding in lost:
                    holding.lost = True
                    self.orphans.add(_orphan(holding.node))
                if state == KazooState.LOST:
                    self.orphans.clear()  # the session's ephemeral nodes are gone
            waiters = list(self.waiters)
        reason = (
            "the ZooKeeper session was lost (expired or closed)"
            if state == KazooState.LOST
            else "the connection to ZooKeeper was suspended"
        )
        for holding in lost:
            for handle in holding.handles:
                handle._mark_lost(reason)
        for waiter in waiters:
            waiter.set()
        if state == KazooState.CONNECTED:
            self.sweep()

    def sweep(self) -> None:
        """Delete the orphans, on a thread of its own (one at a time)."""
        with self.mutex:
            if self._sweeping or not self.orphans or not self.connected.is_set():
                return
            self._sweeping = True
        threading.Thread(target=self._sweep, name="cacheguard-zk-sweep", daemon=True).start()

    def _sweep(self) -> None:
        # What fails stays for the next sweep: the next acquire or reconnection. Orphans
        # added while this runs (their sweep() found it running) are taken in turn: the
        # sweep ends, under the mutex, only once it has tried every orphan there is.
        tried: set[tuple[str, str]] = set()
        done = False
        try:
            while True:
                with self.mutex:
                    orphans = [orphan for orphan in self.orphans if orphan not in tried]
                    if not orphans:
                        self._sweeping = False
                        done = True
                        return
                tried.update(orphans)
                self._delete_orphans(orphans)
        finally:
            if not done:
                with self.mutex:
                    self._sweeping = False

    def _delete_orphans(self, orphans: list[tuple[str, str]]) -> None:
        for directory, guid in orphans:
            try:
                for child in _wait_for(self._client.get_children_async(directory), 10.0):
                    if child.startswith(guid):
                        _ignore_no_node(self._client.delete_async(f"{directory}/{child}"))
            except NoNodeError:
                pass
            except (KazooException, KazooTimeoutError) as exc:
                log.info("could not delete an orphaned lock znode yet: %r", exc)
                continue
            with self.mutex:
                self.orphans.discard((directory, guid))


_SESSIONS_MUTEX = threading.Lock()


def _session_of(client: Any) -> _Session:
    """The client's :class:`_Session`, made on first use (kept on the client)."""
    with _SESSIONS_MUTEX:
        session: _Session | None = getattr(client, "_cacheguard_session", None)
        if session is None:
            session = _Session(client)
            client._cacheguard_session = session
        return session


def _orphan(node: str) -> tuple[str, str]:
    directory, _, name = node.rpartition("/")
    return directory, name[:32]


def _wait_for(result: Any, timeout: float) -> Any:
    return result.get(timeout=max(timeout, 0.0))


def _ignore_no_node(result: Any, timeout: float = 10.0) -> None:
    with suppress(NoNodeError):
        _wait_for(result, timeout)


def _encode(part: str) -> str:
    """A lock name or namespace as one znode name: ``/`` and ``%`` escaped, and the
    names ``.`` and ``..`` (which ZooKeeper refuses) escaped too."""
    encoded = quote(part, safe="")
    return encoded.replace(".", "%2E") if encoded in (".", "..") else encoded


class _Expired(Exception):
    """A request outlived the acquisition's deadline."""


class ZooKeeperRWLock(RWLockShape[ZooKeeperLockHandle]):
    """A read-write lock shared by every thread of every process using one ZooKeeper.

    ``client``: a started ``kazoo.client.KazooClient``; its session timeout decides
    how soon a dead or frozen holder's lock is freed. ``timeout`` (s): the default
    deadline of blocking acquisitions. ``request_timeout`` (s): how long a release
    waits for ZooKeeper's answer. ``root`` and ``namespace`` place the lock's
    znodes: ``<root>/<namespace>/<name>``. ``on_lost`` is called (on a thread of its
    own) with each handle whose holding is lost.
    """

    def __init__(
        self,
        client: Any,
        name: str,
        *,
        namespace: str = "cg",
        root: str = "/cacheguard",
        timeout: Seconds = 30.0,
        request_timeout: Seconds = 10.0,
        on_lost: LostCallback | None = None,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"lock name must be a str, not {type(name).__name__}")
        if not name:
            raise ValueError("lock name must not be empty")
        if not isinstance(root, str) or not root.startswith("/") or root.endswith("/"):
            raise ValueError(f"root must be an absolute znode path such as '/locks': {root!r}")
        self.client = client
        self.name = name
        self.timeout = check_positive("timeout", timeout)
        self.request_timeout = check_positive("request_timeout", request_timeout)
        self.path = f"{root}/{_encode(check_namespace(namespace))}/{_encode(name)}"
        self._on_lost = on_lost
        self._timer = timer
        self._session = _session_of(client)

    # -- acquiring ---------------------------------------------------------------------

    def _try_once(self, mode: Mode, owner: str | None) -> ZooKeeperLockHandle | None:
        """One look, no waiting: the handle, or ``None`` if the lock is busy (nothing
        is left in the queue)."""
        return self._acquire_or_none(mode, None, owner, blocking=False)

    def _acquire(
        self, mode: Mode, timeout: Seconds | None, owner: str | None
    ) -> ZooKeeperLockHandle:
        handle = self._acquire_or_none(mode, timeout, owner, blocking=True)
        assert handle is not None
        return handle

    def _acquire_or_none(
        self, mode: Mode, timeout: Seconds | None, owner: str | None, *, blocking: bool
    ) -> ZooKeeperLockHandle | None:
        owner = owner or thread_owner()
        limit = self.timeout if timeout is None else check_positive("timeout", timeout)
        start = self._timer()
        deadline = start + (limit if blocking else self.request_timeout)
        session = self._session
        key = (self.path, owner)
        while True:
            with session.mutex:
                holding = session.holdings.get(key)
                if holding is not None:
                    return self._reenter(holding, mode, owner)
                busy = session.acquiring.get(key)
                if busy is None:  # this thread queues for the owner
                    session.acquiring[key] = threading.Event()
                    break
            # Another thread of the same owner is queueing: share its outcome.
            if not busy.wait(max(deadline - self._timer(), 0.0)):
                self._give_up(mode, owner, start, blocking)
        try:
            session.sweep()
            return self._queue_up(mode, owner, start, deadline, blocking=blocking)
        finally:
            with session.mutex:
                session.acquiring.pop(key).set()

    def _reenter(self, holding: _Holding, mode: Mode, owner: str) -> ZooKeeperLockHandle:
        """One more hold on the owner's holding (called under the session's mutex)."""
        if mode == "write":
            if holding.writes == 0 and holding.reads > 0:
                raise LockUpgradeError(name=self.name, owner=owner)
            holding.writes += 1
        else:
            holding.reads += 1  # a read inside a write hold: the downgrade's first half
        handle = ZooKeeperLockHandle(self, holding, mode, owner, self._on_lost)
        holding.handles.append(handle)
        return handle

    def _queue_up(
        self, mode: Mode, owner: str, start: float, deadline: float, *, blocking: bool
    ) -> ZooKeeperLockHandle | None:
        """Create our node and wait for our turn; the first handle of the new holding,
        or None (not ``blocking``, and not our turn)."""
        session = self._session
        woken = threading.Event()

        def wake(_event: object) -> None:  # a watch fired: our blocker changed or went
            woken.set()

        delays = Backoff(initial=0.01, cap=0.5)
        guid = ""
        node = ""
        token = 0
        with session.mutex:
            session.waiters.add(woken)
        try:
            while True:
                woken.clear()  # before looking: a change after the look wakes the wait
                generation = session.generation
                try:
                    if not node:
                        guid, token = uuid.uuid4().hex, 0
                        node, token = self._create(guid, mode, owner, deadline)
                    ahead = self._blocker(node, mode, wake, deadline)
                except _DISCONNECTED:
                    # Suspended: wait for the connection (our node may survive with
                    # the session; if not, the next look queues us again).
                    self._wait_connected(deadline, delays, mode, owner, start, blocking)
                    continue
                except _Expired:
                    self._give_up(mode, owner, start, blocking)
                except NoNodeError:  # our node went with an expired session
                    node = ""
                    if self._timer() >= deadline:
                        self._give_up(mode, owner, start, blocking)
                    continue
                if ahead is None:
                    with session.mutex:
                        if session.generation == generation:
                            holding = _Holding(owner, node, token)
                            session.holdings[(self.path, owner)] = holding
                            node = ""  # ours now: not to be withdrawn
                            return self._reenter(holding, mode, owner)
                    continue  # the connection wavered since the look: look again
                if not blocking:
                    return None
                remaining = deadline - self._timer()
                if remaining <= 0:
                    self._give_up(mode, owner, start, blocking)
                woken.wait(remaining)
        finally:
            with session.mutex:
                session.waiters.discard(woken)
            if node:
                self._withdraw(node)
            elif guid and not token:  # a create whose outcome we never learnt
                with session.mutex:
                    session.orphans.add((self.path, guid))
                # Now, not at this session's next acquire (which may never come): a
                # node left in the queue would block every lock taker behind it.
                # ZooKeeper serves a session's requests in order, so the sweep's
                # listing sees the create if it was applied.
                session.sweep()

    def _create(self, guid: str, mode: Mode, owner: str, deadline: float) -> tuple[str, int]:
        """Our ephemeral sequential node (with the lock's directory, if missing)."""
        while True:
            try:
                created = self._request(
                    self.client.create_async(
                        f"{self.path}/{guid}-{mode}-",
                        f"{mode}:{owner}".encode(),
                        ephemeral=True,
                        sequence=True,
                        makepath=True,
                        include_data=True,
                    ),
                    deadline,
                )
            except NoNodeError:
                # The directory went (its last node's release) just now: again.
                if self._timer() >= deadline:
                    raise _Expired from None
                continue
            path, stat = created
            return str(path), int(stat.czxid)

    def _blocker(
        self, node: str, mode: Mode, wake: Callable[[Any], None], deadline: float
    ) -> str | None:
        """The node we wait for, watched (``wake`` on its change), or None: our turn.

        A writer waits for its nearest predecessor, a reader for the nearest write
        node before it whose data still says ``write`` (not downgraded). NoNodeError
        if our own node is gone."""
        children = self._request(self.client.get_children_async(self.path), deadline)
        queue = sorted(
            (int(match["seq"]), match["mode"], child)
            for child in children
            if (match := _NODE.match(child))
        )
        mine = node.rpartition("/")[2]
        position = next((i for i, entry in enumerate(queue) if entry[2] == mine), None)
        if position is None:
            raise NoNodeError(node)
        for _, kind, child in reversed(queue[:position]):
            path = f"{self.path}/{child}"
            if mode == "write":
                if self._request(self.client.exists_async(path, watch=wake), deadline):
                    return path
                continue  # gone meanwhile: the next one
            if kind != "write":
                continue
            try:
                data, _ = self._request(self.client.get_async(path, watch=wake), deadline)
            except NoNodeError:
                continue
            if not bytes(data).startswith(b"read:"):
                return path
        return None

    def _wait_connected(
        self, deadline: float, delays: Backoff, mode: Mode, owner: str, start: float, blocking: bool
    ) -> None:
        """Wait until the connection is back (or give up at the deadline)."""
        connected = self._session.connected
        # Set already: kazoo raised before its state listener ran; do not spin.
        pause = delays.next_delay() if connected.is_set() else 0.0
        remaining = deadline - self._timer()
        if remaining <= pause or not connected.wait(remaining):
            self._give_up(mode, owner, start, blocking)
        if pause:
            time.sleep(pause)

    def _give_up(self, mode: Mode, owner: str, start: float, blocking: bool) -> NoReturn:
        if not blocking or not self._session.connected.is_set():
            raise BackendUnavailable(
                f"ZooKeeper unreachable while waiting for the {mode} lock {self.name!r}"
            )
        raise LockTimeout(name=self.name, mode=mode, waited=self._timer() - start, owner=owner)

    def _withdraw(self, node: str) -> None:
        """Take our node out of the queue (a timeout, an error) without waiting for
        the answer, so a deadline is never overrun: ZooKeeper applies a session's
        requests in order, so our next request already finds it gone. If the delete
        fails (no connection), the session's sweep deletes the node once it can."""
        session = self._session

        def done(result: Any) -> None:  # on kazoo's callback thread: must not block
            if not result.successful() and not isinstance(result.exception, NoNodeError):
                with session.mutex:
                    session.orphans.add(_orphan(node))

        self.client.delete_async(node).rawlink(done)

    # -- releasing ---------------------------------------------------------------------

    def release(self, handle: ZooKeeperLockHandle) -> None:
        """Release one hold; :class:`LockLostError` if the holding was lost."""
        if not isinstance(handle, ZooKeeperLockHandle) or handle.lock is not self:
            raise ValueError("this handle belongs to another lock")
        holding = handle._holding
        session = self._session
        with session.mutex:
            if handle.released:
                return
            handle.released = True
            holding.handles.remove(handle)
            if holding.lost:
                raise handle._lost_at_release()
            if handle.mode == "write":
                holding.writes -= 1
            else:
                holding.reads -= 1
            done = holding.writes == 0 and holding.reads == 0
            downgrade = not done and handle.mode == "write" and holding.writes == 0
            if done:
                del session.holdings[(self.path, holding.owner)]
        if done:
            self._delete(holding)
        elif downgrade:
            self._downgrade(holding)

    def _delete(self, holding: _Holding) -> None:
        deadline = self._timer() + self.request_timeout
        # The directory goes with its last node (pipelined; refused while others queue).
        removed = self.client.delete_async(holding.node)
        self.client.delete_async(self.path)
        try:
            self._request(removed, deadline)
        except NoNodeError:
            pass
        except (_Expired, *_DISCONNECTED) as exc:
            with self._session.mutex:
                self._session.orphans.add(_orphan(holding.node))
            raise BackendUnavailable(
                f"ZooKeeper did not confirm the release of lock {self.name!r} ({exc!r}); "
                "its znode is deleted once the connection is back, or goes with the session"
            ) from exc

    def _downgrade(self, holding: _Holding) -> None:
        """The last write hold ended, read holds remain: the node turns ``read`` in
        place and wakes the readers watching it."""
        try:
            self._request(
                self.client.set_async(holding.node, f"read:{holding.owner}".encode()),
                self._timer() + self.request_timeout,
            )
        except (_Expired, NoNodeError, *_DISCONNECTED, BackendUnavailable) as exc:
            # Still held, only more exclusively than needed; a lost session marks it.
            log.warning("could not downgrade the lock %r in ZooKeeper: %r", self.name, exc)

    # -- plumbing --------------------------------------------------------------------

    def _request(self, result: Any, deadline: float) -> Any:
        """Wait for a kazoo request until ``deadline``; kazoo's errors become ours,
        except NoNodeError and the disconnections the callers handle."""
        try:
            return _wait_for(result, deadline - self._timer())
        except KazooTimeoutError:
            raise _Expired from None
        except ConnectionClosedError as exc:  # (a SessionExpiredError: first)
            raise BackendUnavailable(
                f"the kazoo client of lock {self.name!r} is not started or was stopped"
            ) from exc
        except (NoNodeError, *_DISCONNECTED):
            raise
        except KazooException as exc:
            raise BackendUnavailable(
                f"ZooKeeper refused a request for lock {self.name!r}: {exc!r}"
            ) from exc

    def __repr__(self) -> str:
        return f"<ZooKeeperRWLock {self.name!r} path={self.path!r}>"
