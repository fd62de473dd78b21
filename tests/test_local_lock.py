from __future__ import annotations

import gc
import threading
import time

import pytest

from cacheguard import LocalRWLock, LockNotHeldError, LockTimeout, LockUpgradeError, WeakRegistry


def test_readers_share_and_writer_excludes() -> None:
    lock = LocalRWLock("x")
    inside = []
    both_in = threading.Barrier(3, timeout=5)
    may_leave = threading.Event()

    def reader() -> None:
        with lock.read(timeout=5):
            inside.append(1)
            both_in.wait()  # only passes if both readers are inside together
            may_leave.wait(5)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    both_in.wait()
    with pytest.raises(LockTimeout):
        lock.acquire_write(timeout=0.05)  # readers are inside
    may_leave.set()
    for t in threads:
        t.join()
    lock.acquire_write(timeout=1)
    lock.release_write()
    assert lock.is_free()


def test_waiting_writer_holds_off_new_readers() -> None:
    lock = LocalRWLock("x")
    lock.acquire_read()
    writer_in = threading.Event()

    def writer() -> None:
        with lock.write(timeout=5):
            writer_in.set()

    t = threading.Thread(target=writer)
    t.start()
    deadline = time.monotonic() + 5
    while lock._waiting_writers == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert lock._waiting_writers == 1

    # A new reader (another thread) must queue behind the waiting writer.
    got = []
    r = threading.Thread(target=lambda: got.append(_try_read(lock, 0.1)))
    r.start()
    r.join()
    assert got == [False]

    # The existing reader may still re-enter (else it would deadlock the writer).
    lock.acquire_read(timeout=0.1)
    lock.release_read()
    lock.release_read()
    t.join(5)
    assert writer_in.is_set()


def _try_read(lock: LocalRWLock, timeout: float) -> bool:
    try:
        lock.acquire_read(timeout=timeout)
    except LockTimeout:
        return False
    lock.release_read()
    return True


def test_reentrancy_downgrade_and_upgrade() -> None:
    lock = LocalRWLock("x")
    lock.acquire_write()
    lock.acquire_write()  # reentrant
    lock.acquire_read()  # downgrade step 1: the writer may read
    lock.release_write()
    lock.release_write()  # downgrade step 2: only the read hold is left
    assert lock.read_depth_of_me() == 1
    assert not lock.is_write_held_by_me()
    # Another reader can join now, a writer cannot.
    assert _in_thread(lambda: _try_read(lock, 1))
    with pytest.raises(LockUpgradeError):
        lock.acquire_write(timeout=1)
    lock.release_read()
    assert lock.is_free()


def _in_thread(fn):  # type: ignore[no-untyped-def]
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def test_timeout_raises_with_context() -> None:
    lock = LocalRWLock("menu:list")
    lock.acquire_write()
    err = _in_thread(lambda: _catch(lambda: lock.acquire_read(timeout=0.05)))
    assert isinstance(err, LockTimeout)
    assert err.name == "menu:list"
    assert err.mode == "read"
    assert err.waited >= 0.05
    lock.release_write()


def _catch(fn):  # type: ignore[no-untyped-def]
    try:
        fn()
    except Exception as exc:
        return exc
    return None


def test_timed_out_writer_lets_held_off_readers_in() -> None:
    lock = LocalRWLock("x")
    lock.acquire_read()
    # Writer times out; afterwards a new reader must not stay blocked.
    assert isinstance(_in_thread(lambda: _catch(lambda: lock.acquire_write(0.05))), LockTimeout)
    assert _in_thread(lambda: _try_read(lock, 1))
    lock.release_read()


def test_release_without_hold_is_an_error() -> None:
    lock = LocalRWLock("x")
    with pytest.raises(LockNotHeldError):
        lock.release_read()
    with pytest.raises(LockNotHeldError):
        lock.release_write()
    lock.acquire_write()
    assert isinstance(_in_thread(lambda: _catch(lock.release_write)), LockNotHeldError)
    lock.release_write()


def test_mutual_exclusion_under_thread_contention() -> None:
    lock = LocalRWLock("x")
    state = {"count": 0, "writer_inside": False, "violations": 0}

    def writer() -> None:
        for _ in range(200):
            with lock.write(timeout=10):
                state["writer_inside"] = True
                value = state["count"]
                time.sleep(0)
                state["count"] = value + 1
                state["writer_inside"] = False

    def reader() -> None:
        for _ in range(200):
            with lock.read(timeout=10):
                if state["writer_inside"]:
                    state["violations"] += 1

    threads = [threading.Thread(target=writer) for _ in range(4)]
    threads += [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert state["count"] == 800
    assert state["violations"] == 0


def test_registry_shares_while_used_and_forgets_after() -> None:
    registry: WeakRegistry[LocalRWLock] = WeakRegistry(LocalRWLock)
    a = registry.get("k")
    assert registry.get("k") is a
    del a
    gc.collect()
    assert "k" not in registry


@pytest.mark.slow
def test_registry_memory_stays_bounded_over_many_keys() -> None:
    """200,000 names each locked once leave one lock behind: the one still referenced."""
    registry: WeakRegistry[LocalRWLock] = WeakRegistry(LocalRWLock)
    kept = registry.get("kept")
    for i in range(200_000):
        lock = registry.get(f"key:{i}")
        lock.acquire_read()
        lock.release_read()
    del lock
    gc.collect()
    assert len(registry) == 1
    assert registry.get("kept") is kept
