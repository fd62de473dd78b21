"""The read-write lock contract, written once and run against every lock store.

The rules are those of docs/locks.md: readers share, a writer excludes and waits
for the readers, ``LockTimeout`` at the deadline, reentrancy and downgrade for one
owner, upgrade refused with ``LockUpgradeError``, a holder that dies frees the lock
by itself; plus what a store offers on top (fencing tokens, writer preference,
a frozen holder taken over). Stores: tests/lock_stores.py.

Holds belong to holders, not threads (cacheguard/_identity.py): a store's default
owner is the context's holder, so "another owner" is another thread here (a new
thread starts with no holder), or another process; a hold handed between the
threads of a pool stays one hold, and the pool's next caller is another owner.
"""

from __future__ import annotations

import contextvars
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

from cacheguard.exceptions import LockTimeout, LockUpgradeError
from tests.lock_stores import STORES, Lock, Store, held_briefly, in_thread, token_of
from tests.procs import CTX, start_process


@pytest.fixture(scope="module", params=sorted(STORES))
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    with STORES[request.param]() as built:
        yield built


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    return f"contract-{request.node.name}-{os.getpid()}-{time.monotonic_ns()}"


def _hold_in_child(
    maker: Callable[..., Lock], args: tuple[Any, ...], name: str, mode: str, ready: Any
) -> None:
    """Child: take ``mode`` on the lock, say so, and hold it until killed."""
    lock = maker(*args, name)
    lock.acquire_write(10) if mode == "write" else lock.acquire_read(10)
    ready.set()
    threading.Event().wait()  # held until the parent kills or stops us


# -- sharing and excluding ----------------------------------------------------------


@pytest.mark.slow
def test_a_hold_handed_between_pool_threads_stays_one_owners(store: Store, name: str) -> None:
    """A ``with`` block entered on one pool worker and left on another (as ASGI
    servers run a sync dependency, each call in a copy of the caller's context):
    the worker that entered serves the next caller, who is another owner."""
    enter_pool, exit_pool = ThreadPoolExecutor(max_workers=1), ThreadPoolExecutor(max_workers=1)

    def on(pool: ThreadPoolExecutor, call: Callable[..., Any], *args: Any) -> Any:
        return pool.submit(contextvars.copy_context().run, call, *args).result(timeout=30)

    try:
        block = store.make(name).write(timeout=5)
        handle = on(enter_pool, block.__enter__)
        for take in ("try_acquire_write", "try_acquire_read"):
            # The same worker thread, the next request: no share of the hold.
            assert on(enter_pool, getattr(store.make(name), take)) is None, take
        on(exit_pool, block.__exit__, None, None, None)  # released from another thread
        assert handle.released
        again = on(enter_pool, store.make(name).try_acquire_write)
        assert again is not None
        on(exit_pool, again.release)
    finally:
        enter_pool.shutdown()
        exit_pool.shutdown()


def test_readers_share(store: Store, name: str) -> None:
    lock = store.make(name)
    with lock.read(timeout=5):
        other = in_thread(lambda: held_briefly(store.make(name).read(timeout=5)))
        assert other.result(10) == "held"


@pytest.mark.slow
def test_a_writer_excludes_readers_and_writers(store: Store, name: str) -> None:
    with store.make(name).write(timeout=5):
        for take in ("read", "write"):
            attempt = in_thread(
                lambda take=take: held_briefly(getattr(store.make(name), take)(timeout=0.5))
            )
            assert isinstance(attempt.result(30), LockTimeout), take


@pytest.mark.slow
def test_a_writer_waits_for_the_readers_then_gets_in(store: Store, name: str) -> None:
    reader = store.make(name).acquire_read(timeout=5)
    entered = threading.Event()

    def write() -> str:
        with store.make(name).write(timeout=30):
            entered.set()
        return "wrote"

    writer = in_thread(write)
    assert not entered.wait(0.5)  # (a bounded look: it must still be waiting)
    reader.release()
    assert writer.result(30) == "wrote"


@pytest.mark.slow
def test_timeout_raises_lock_timeout_naming_the_lock(store: Store, name: str) -> None:
    with store.make(name).write(timeout=5):
        attempt = in_thread(lambda: held_briefly(store.make(name).write(timeout=0.3)))
        error = attempt.result(30)
    assert isinstance(error, LockTimeout)
    assert name in str(error)


@pytest.mark.slow
def test_a_timedelta_timeout_is_its_seconds(store: Store, name: str) -> None:
    """Durations are seconds or a timedelta (issue #26): a wait given a timedelta
    ends at its deadline, and a bad one is refused as its number is."""
    with store.make(name).write(timeout=timedelta(seconds=5)):
        attempt = in_thread(
            lambda: held_briefly(store.make(name).write(timeout=timedelta(milliseconds=300)))
        )
        assert isinstance(attempt.result(30), LockTimeout)
        for bad in (timedelta(0), timedelta(seconds=-1), timedelta(days=3651)):
            refused = in_thread(lambda bad=bad: store.make(name).acquire_read(timeout=bad))
            error = refused.result(30)
            assert isinstance(error, ValueError), (bad, error)
            assert str(error).startswith("timeout must be"), error
    with store.make(name).read(timeout=timedelta(seconds=5)):
        pass


# -- one owner's holds ----------------------------------------------------------------


@pytest.mark.slow
def test_reentrant_and_downgrade(store: Store, name: str) -> None:
    lock = store.make(name)
    with lock.write(timeout=5), lock.write(timeout=5):
        pass  # a write hold nests
    outer = lock.acquire_write(timeout=5)
    inner = lock.acquire_read(timeout=5)  # downgrade: read while writing
    outer.release()
    # Still a reader: another reader may join, a writer may not.
    assert in_thread(lambda: held_briefly(store.make(name).read(timeout=5))).result(10) == "held"
    blocked = in_thread(lambda: held_briefly(store.make(name).write(timeout=0.3)))
    assert isinstance(blocked.result(30), LockTimeout)
    inner.release()
    assert in_thread(lambda: held_briefly(store.make(name).write(timeout=5))).result(10) == "held"


def test_upgrade_is_refused(store: Store, name: str) -> None:
    lock = store.make(name)
    with lock.read(timeout=5), pytest.raises(LockUpgradeError):
        lock.acquire_write(timeout=5)
    # The refusal left nothing behind: a writer gets in.
    assert in_thread(lambda: held_briefly(store.make(name).write(timeout=5))).result(10) == "held"


# -- the store's own offers -------------------------------------------------------------


@pytest.mark.slow
def test_writer_preference(store: Store, name: str) -> None:
    if store.writer_waiting is None:
        pytest.skip(f"{store.name} does not hold new readers off for a waiting writer")
    reader = store.make(name).acquire_read(timeout=5)
    writer_in = threading.Event()

    def write() -> None:
        with store.make(name).write(timeout=30):
            writer_in.set()

    writer = in_thread(write)
    _wait_until_a_writer_waits(store, name)
    late = in_thread(lambda: held_briefly(store.make(name).read(timeout=0.5)))
    assert isinstance(late.result(30), LockTimeout)
    reader.release()
    writer.result(30)
    assert writer_in.is_set()


def test_fencing_tokens_increase(store: Store, name: str) -> None:
    if not store.fencing:
        pytest.skip(f"{store.name} offers no fencing token")
    lock = store.make(name)
    tokens = []
    for _ in range(3):
        with lock.write(timeout=5) as handle:
            tokens.append(handle.token)
    tokens.append(in_thread(lambda: token_of(store.make(name).write(timeout=5))).result(10))
    assert tokens == sorted(set(tokens)), tokens


# -- dead and frozen holders ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["read", "write"])
def test_a_killed_holder_frees_the_lock(store: Store, name: str, mode: str) -> None:
    child = _holding_child(store, name, mode)
    os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    child.join(10)
    with store.make(name).write(timeout=store.recovers_within + 10):
        pass


@pytest.mark.slow
def test_a_frozen_holder(store: Store, name: str) -> None:
    child = _holding_child(store, name, "write")
    os.kill(child.pid, signal.SIGSTOP)  # type: ignore[arg-type]
    try:
        if store.frozen_holder == "taken over":
            with store.make(name).write(timeout=store.recovers_within + 10):
                pass
        else:
            with pytest.raises(LockTimeout):
                store.make(name).acquire_write(timeout=store.recovers_within + 1)
    finally:
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join(10)


# -- helpers ------------------------------------------------------------------------------------


def _wait_until_a_writer_waits(store: Store, name: str) -> None:
    assert store.writer_waiting is not None
    deadline = time.monotonic() + 10
    while not store.writer_waiting(name):  # a condition polled with a deadline
        assert time.monotonic() < deadline, "the writer never queued"
        time.sleep(0.01)


def _holding_child(store: Store, name: str, mode: str) -> Any:
    maker, args = store.maker
    ready = CTX.Event()
    child = start_process(_hold_in_child, maker, args, name, mode, ready)
    if not ready.wait(30):
        child.kill()
        raise AssertionError("the child never took the lock")
    return child
