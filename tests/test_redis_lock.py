"""The distributed lock in one process: semantics, leases, watchdog, loss, errors."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cacheguard import (
    BackendUnavailable,
    LockHandle,
    LockLostError,
    LockTimeout,
    LockUpgradeError,
    RedisRWLock,
    Watchdog,
)
from cacheguard.locks.redis.lua import FENCE_TTL_MS
from cacheguard.testing import free_port
from tests.helpers import wait_until


def make(client: redis.Redis, namespace: str, name: str = "res", **kw: object) -> RedisRWLock:
    return RedisRWLock(client, name, namespace=namespace, **kw)  # type: ignore[arg-type]


def fields(client: redis.Redis, lock: RedisRWLock) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in client.hgetall(lock.keys.lock).items()}


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"name": ""}, ValueError),
        ({"name": 5}, TypeError),
        ({"lease": 0}, ValueError),
        ({"lease": -1}, ValueError),
        ({"lease": float("nan")}, ValueError),
        ({"lease": "30"}, TypeError),
        ({"timeout": 0}, ValueError),
        ({"namespace": "a{b"}, ValueError),
        ({"namespace": ""}, ValueError),
    ],
)
def test_bad_arguments_fail_at_construction(
    client: redis.Redis, kwargs: dict[str, object], error: type[Exception]
) -> None:
    args: dict[str, object] = {"name": "res", **kwargs}
    name = args.pop("name")
    with pytest.raises(error):
        RedisRWLock(client, name, **args)  # type: ignore[arg-type]


def test_bad_timeout_at_acquire(client: redis.Redis, namespace: str) -> None:
    lock = make(client, namespace)
    with pytest.raises(ValueError, match="timeout"):
        lock.acquire_write(timeout=0)
    with pytest.raises(ValueError, match="timeout"):
        lock.acquire_read(timeout=-1)
    assert not client.exists(lock.keys.lock)


def test_write_lock_layout_and_release(client: redis.Redis, namespace: str) -> None:
    lock = make(client, namespace)
    with lock.write(timeout=5) as handle:
        f = fields(client, lock)
        assert f["mode"] == "write"
        assert f[f"w:{handle.owner}"] == "1"
        assert f["token"] == str(handle.token)
        assert 0 < client.pttl(lock.keys.lock) <= 30_000
        assert handle.token == int(client.get(lock.keys.fence))
    assert not client.exists(lock.keys.lock)
    # The fencing counter outlives the release: a day after its last token.
    assert 0 < client.pttl(lock.keys.fence) <= FENCE_TTL_MS


def test_reentrant_counts_downgrade_and_upgrade(client: redis.Redis, namespace: str) -> None:
    lock = make(client, namespace)
    outer = lock.acquire_write()
    inner = lock.acquire_write()
    assert inner.token == outer.token
    assert fields(client, lock)[f"w:{outer.owner}"] == "2"
    read = lock.acquire_read()  # a writer may read: the first step of a downgrade
    inner.release()
    outer.release()
    f = fields(client, lock)
    assert f["mode"] == "read"
    assert f"w:{outer.owner}" not in f
    assert f[f"r:{outer.owner}"] == "1"
    # Another owner may read now, but nobody may write.
    other = lock.acquire_read(owner="other")
    assert lock.try_acquire_write(owner="third") is None
    with pytest.raises(LockUpgradeError):
        lock.acquire_write(timeout=1)  # we hold read: upgrade refused at once
    read.release()
    other.release()
    # The failed "third" writer left a waiting mark only; no holds remain.
    assert "mode" not in fields(client, lock)


def test_readers_overlap_and_writer_excluded(client: redis.Redis, namespace: str) -> None:
    lock = make(client, namespace)
    a = lock.acquire_read(owner="a")
    b = lock.acquire_read(owner="b")
    f = fields(client, lock)
    assert f["r:a"] == "1"
    assert f["r:b"] == "1"
    with pytest.raises(LockTimeout) as info:
        lock.acquire_write(timeout=0.2, owner="w")
    assert info.value.name == "res"
    assert info.value.mode == "write"
    a.release()
    b.release()
    with lock.write(timeout=5, owner="w"):
        pass


def queue_writer(lock: RedisRWLock, owner: str) -> bool:
    """One step of a blocking write acquisition: granted, or queued with a mark."""
    return lock._attempt("write", owner, queue=True).granted


def test_waiting_writer_blocks_new_readers(client: redis.Redis, namespace: str) -> None:
    lock = make(client, namespace)
    reader = lock.acquire_read(owner="r1")
    assert not queue_writer(lock, "w")  # leaves a waiting mark
    assert lock.try_acquire_read(owner="r2") is None  # held off by the mark
    again = lock.try_acquire_read(owner="r1")  # a holder may re-enter
    assert again is not None
    again.release()
    reader.release()
    assert queue_writer(lock, "w")
    assert "q:w" not in fields(client, lock)  # got in: no longer waiting
    lock.release(lock._granted("write", "w", int(fields(client, lock)["token"])))
    assert lock.try_acquire_read(owner="r2") is not None


def test_one_shot_try_does_not_queue(client: redis.Redis, namespace: str) -> None:
    lock = make(client, namespace)
    reader = lock.acquire_read(owner="r1")
    assert lock.try_acquire_write(owner="w") is None
    assert not any(k.startswith("q:") for k in fields(client, lock))
    assert lock.try_acquire_read(owner="r2") is not None
    reader.release()


def test_writer_that_times_out_withdraws_its_mark(client: redis.Redis, namespace: str) -> None:
    lock = make(client, namespace)
    reader = lock.acquire_read(owner="r1")
    with pytest.raises(LockTimeout):
        lock.acquire_write(timeout=0.2, owner="w")
    assert not any(k.startswith("q:") for k in fields(client, lock))
    assert lock.try_acquire_read(owner="r2") is not None  # not held off any more
    reader.release()


def test_writers_queue_in_ticket_order(client: redis.Redis, namespace: str) -> None:
    lock = make(client, namespace)
    holder = lock.acquire_write(owner="h")
    assert not queue_writer(lock, "first")
    assert not queue_writer(lock, "second")
    holder.release()
    assert not queue_writer(lock, "second")  # "first" queued earlier
    assert queue_writer(lock, "first")
    token = int(fields(client, lock)["token"])
    lock.release(lock._granted("write", "first", token))
    assert queue_writer(lock, "second")


def test_fencing_tokens_strictly_increase(client: redis.Redis, namespace: str) -> None:
    lock = make(client, namespace)
    tokens = []
    for _ in range(5):
        with lock.write() as h:
            tokens.append(h.token)
    assert tokens == sorted(set(tokens))


def server_us(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


def test_fencing_tokens_increase_after_the_counter_expired(
    client: redis.Redis, namespace: str
) -> None:
    lock = make(client, namespace)
    before = server_us(client)
    with lock.write() as first:
        pass
    assert first.token >= before  # a new counter starts from the server clock (µs)
    with lock.write() as second:
        pass
    assert second.token == first.token + 1  # then counts up
    ttl = client.pttl(lock.keys.fence)
    assert 0 < ttl <= FENCE_TTL_MS
    client.pexpire(lock.keys.fence, 1)  # the counter expires (unused for a day)
    assert wait_until(lambda: not client.exists(lock.keys.fence), 5)
    with lock.write() as third:
        pass
    assert third.token > second.token
    with lock.write() as fourth:
        pass
    assert fourth.token == third.token + 1


def test_a_counter_without_a_lifetime_gets_one_on_its_next_token(
    client: redis.Redis, namespace: str
) -> None:
    """A counter left by an older version (no TTL, a small number) counts on, and
    from then on expires; once it has, the clock takes over, far above it."""
    lock = make(client, namespace)
    client.set(lock.keys.fence, 57)
    with lock.write() as handle:
        assert handle.token == 58
    assert 0 < client.pttl(lock.keys.fence) <= FENCE_TTL_MS
    client.delete(lock.keys.fence)
    with lock.write() as handle:
        assert handle.token > 58


def test_lock_timeout_within_deadline(client: redis.Redis, namespace: str) -> None:
    lock = make(client, namespace)
    holder = lock.acquire_write(owner="holder")
    start = time.monotonic()
    with pytest.raises(LockTimeout) as info:
        lock.acquire_read(timeout=0.5)
    elapsed = time.monotonic() - start
    assert info.value.waited >= 0.5
    assert elapsed < 0.5 + 1.0  # the deadline holds (generous margin for a noisy host)
    holder.release()


def test_blocked_waiter_wakes_on_release(client: redis.Redis, namespace: str) -> None:
    lock = make(client, namespace)
    holder = lock.acquire_write(owner="holder")
    got: list[LockHandle] = []
    t = threading.Thread(target=lambda: got.append(lock.acquire_write(timeout=10)))
    t.start()
    assert wait_until(lambda: "q:" in str(fields(client, lock)))
    holder.release()
    t.join(10)
    assert got
    assert got[0].token > holder.token
    got[0].release()


def test_release_from_another_thread(client: redis.Redis, namespace: str) -> None:
    lock = make(client, namespace)
    handle = lock.acquire_write()
    t = threading.Thread(target=handle.release)
    t.start()
    t.join()
    assert handle.released
    assert not client.exists(lock.keys.lock)


@pytest.mark.slow
def test_watchdog_keeps_live_holder_then_stops(client: redis.Redis, namespace: str) -> None:
    dog = Watchdog()
    lock = make(client, namespace, lease=0.5, watchdog=dog)
    handle = lock.acquire_write()
    time.sleep(1.6)  # more than 3 leases
    assert not handle.lost
    assert dog.renewals >= 3
    assert lock.try_acquire_write(owner="rival") is None
    handle.release()
    assert not dog.watching(handle)
    assert not client.exists(lock.keys.lock)
    time.sleep(0.6)  # past a lease: nothing re-created it
    assert not client.exists(lock.keys.lock)


def test_without_watchdog_the_lease_expires(client: redis.Redis, namespace: str) -> None:
    lock = make(client, namespace, lease=0.3, watchdog=False)
    handle = lock.acquire_write()
    time.sleep(0.45)
    assert not client.exists(lock.keys.lock)
    other = lock.try_acquire_write(owner="other")
    assert other is not None
    with pytest.raises(LockLostError):
        handle.release()
    assert fields(client, lock)["w:other"] == "1"  # the new holder is untouched
    other.release()


def test_lost_lock_is_reported_and_release_spares_new_holder(
    client: redis.Redis, namespace: str
) -> None:
    lost: list[LockHandle] = []
    lock = make(client, namespace, lease=0.6, watchdog=Watchdog(), on_lost=lost.append)
    handle = lock.acquire_write()
    client.delete(lock.keys.lock)  # behind the holder's back
    assert wait_until(lambda: handle.lost, timeout=3)
    # on_lost runs in a thread of its own, just after the handle is marked lost.
    assert wait_until(lambda: lost == [handle], timeout=3)
    assert "gone" in handle.lost_reason
    newcomer = lock.acquire_write(owner="newcomer", timeout=2)
    with pytest.raises(LockLostError) as info:
        handle.release()
    assert info.value.name == "res"
    f = fields(client, lock)
    assert f["w:newcomer"] == "1"
    assert f["token"] == str(newcomer.token)
    assert newcomer.token > handle.token
    newcomer.release()


def test_same_owner_stale_handle_cannot_release_new_holding(
    client: redis.Redis, namespace: str
) -> None:
    lock = make(client, namespace, lease=0.3, watchdog=False)
    old = lock.acquire_write()
    time.sleep(0.4)
    new = lock.acquire_write()  # same thread, same owner: a new epoch
    with pytest.raises(LockLostError):
        old.release()
    assert fields(client, lock)[f"w:{new.owner}"] == "1"
    new.release()


@pytest.mark.slow
def test_context_manager_reports_loss(client: redis.Redis, namespace: str) -> None:
    lock = make(client, namespace, lease=0.3, watchdog=False)
    with pytest.raises(LockLostError), lock.write():
        time.sleep(0.4)

    def body_fails_after_loss() -> None:
        with lock.write():
            time.sleep(0.4)
            raise KeyError("body")

    # A body exception is not masked by the loss.
    with pytest.raises(KeyError, match="body"):
        body_fails_after_loss()


def test_crashed_reader_stops_counting_when_its_lease_ends(
    client: redis.Redis, namespace: str
) -> None:
    lock = make(client, namespace, lease=5, watchdog=False)
    live = lock.acquire_read(owner="live")
    crashed_lock = make(client, namespace, lease=0.3, watchdog=False)
    crashed_lock.acquire_read(owner="crashed")  # never released, never renewed
    time.sleep(0.4)
    lock.renew(live)  # keeps the hash alive; the crashed reader must still drop out
    assert "r:crashed" not in fields(client, lock)
    assert "r:live" in fields(client, lock)
    live.release()
    assert lock.try_acquire_write(owner="w") is not None


def test_dead_holder_taken_over_after_its_lease(client: redis.Redis, namespace: str) -> None:
    dead = make(client, namespace, lease=0.5, watchdog=False)
    dead.acquire_write(owner="dead")
    lock = make(client, namespace)
    start = time.monotonic()
    with lock.write(timeout=3):
        waited = time.monotonic() - start
    assert waited < 0.5 + 1.0


def test_scripts_reload_after_flush(client: redis.Redis, namespace: str) -> None:
    lock = make(client, namespace)
    with lock.write():
        pass
    client.script_flush()
    with lock.write() as h:
        assert h.renew()


def _no_retry_client(port: int, **kw: float) -> redis.Redis:
    # cacheguard adds no retries of its own: the client's policy is the whole story.
    return redis.Redis(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0), **kw)


def test_backend_unavailable_on_a_closed_port() -> None:
    lock = RedisRWLock(_no_retry_client(free_port(), socket_connect_timeout=1), "res")
    start = time.monotonic()
    with pytest.raises(BackendUnavailable) as info:
        lock.acquire_write(timeout=5)
    assert time.monotonic() - start < 2
    assert isinstance(info.value.__cause__, redis.ConnectionError)
    assert "res" in str(info.value)


def test_backend_unavailable_on_a_black_hole() -> None:
    """A server that accepts but never answers: bounded by the socket timeout, no hang."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(16)  # connections complete in the backlog; nothing is ever read
        port = hole.getsockname()[1]
        lock = RedisRWLock(
            _no_retry_client(port, socket_connect_timeout=0.5, socket_timeout=0.5), "res"
        )
        start = time.monotonic()
        with pytest.raises(BackendUnavailable) as info:
            lock.acquire_read(timeout=5)
        assert time.monotonic() - start < 2
        assert isinstance(info.value.__cause__, redis.TimeoutError)
