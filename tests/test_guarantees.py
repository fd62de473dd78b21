"""Guarantees pinned on their mechanism rather than on timing.

Each test here fails when the guarantee it names is removed (tools/mutants.py
removes them one by one): a waiter that can only be woken by the announcement,
a value that only the closing invalidation can remove, an announcement that only
the fill-start check can refuse.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import pytest
import redis

from cacheguard import MISSING, LockHandle, LockLostError, RedisRWLock
from cacheguard.backoff import Backoff
from cacheguard.cache.codec import MsgpackCodec
from cacheguard.cache.entry import pack_entry
from cacheguard.cache.scripts import FILL_BEGIN
from cacheguard.locks.notifier import Subscription
from tests.helpers import make_guard, start_gated_fill, subscribers, wait_until

# A retry timer of a minute: within a test's deadline only an announcement wakes.
_NO_TIMER_WAKE_UP = functools.partial(Backoff, initial=60.0, cap=60.0)


def test_lock_waiter_is_woken_by_the_release_announcement(
    client: redis.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder's lease and the waiter's retry timer both run for a minute, longer
    than the test waits for the waiter: only the release's PUBLISH can wake it. The
    release comes once the waiter waits (after its try that follows subscribing: a
    release before that try would let the try succeed without any message)."""
    in_wait = threading.Event()
    real_wait = Subscription.wait

    def wait(self: Subscription, seconds: float) -> list[bytes]:
        in_wait.set()  # a message that arrives from here on is kept for this wait
        return real_wait(self, seconds)

    monkeypatch.setattr(Subscription, "wait", wait)

    def lock() -> RedisRWLock:
        return RedisRWLock(
            client, "res", namespace=namespace, lease=60.0, backoff=_NO_TIMER_WAKE_UP
        )

    held = lock().acquire_write(owner="holder")
    got: list[LockHandle] = []
    waiter = threading.Thread(
        target=lambda: got.append(lock().acquire_write(timeout=60, owner="waiter")),
        daemon=True,  # under a broken wake-up it would outlive the test
    )
    waiter.start()
    keys = lock().keys
    assert wait_until(lambda: client.hexists(keys.lock, "q:waiter"))
    assert wait_until(lambda: subscribers(client, keys.released_channel) >= 1)
    assert in_wait.wait(10), "the waiter never started waiting"
    held.release()
    waiter.join(20)
    assert len(got) == 1
    assert got[0].token > held.token
    got[0].release()


@pytest.mark.parametrize("body_raises", [False, True], ids=["body returns", "body raises"])
def test_a_value_filled_while_the_writer_lost_its_lock_is_dropped_at_the_end(
    client: redis.Redis, namespace: str, body_raises: bool
) -> None:
    """A writer paused past its lease loses its lock mid-body; a reader then fills
    the key from the database as it was before the commit. The invalidation that
    closes the write path (also when the body raised) drops that value; then the
    loss is raised (LockLostError), unless the body's own error is."""
    writer = make_guard(client, namespace)
    reader = make_guard(client, namespace)  # another owner of the same keys

    class BodyFailed(Exception):
        pass

    def body() -> None:
        client.delete(writer.keys("k").lock)  # the lease ran out
        assert reader.get_or_load("k", lambda: "before the commit", ttl=60) == ("before the commit")
        assert reader.peek("k") == "before the commit"
        if body_raises:
            raise BodyFailed

    with pytest.raises(BodyFailed if body_raises else LockLostError), writer.write("k"):
        body()
    assert reader.peek("k") is MISSING
    assert reader.get_or_load("k", lambda: "after the commit", ttl=60) == "after the commit"


def test_an_older_fills_announcement_is_refused_even_at_the_same_version(
    client: redis.Redis, namespace: str
) -> None:
    """The key has never been invalidated (or its version key expired), so an entry
    announced by a fill of long ago carries the very version the waiter saw: only
    the check on the fill's start time refuses it."""
    filler = make_guard(client, namespace)
    waiter = make_guard(client, namespace)  # another owner: waits for the filler
    release, fill = start_gated_fill(filler, "k", "new")
    got: list[Any] = []
    reader = threading.Thread(
        target=lambda: got.append(waiter.get_or_load("k", lambda: "unlocked", ttl=60))
    )
    reader.start()
    channel = waiter.keys("k").released_channel
    assert wait_until(lambda: subscribers(client, channel) >= 1)
    old = pack_entry(MsgpackCodec(), "old", created=time.time(), ttl=60, version=0,
                     load_duration=0.0)  # fmt: skip
    client.spublish(channel, b"V1:" + old)  # began at µs 1: long before the fill under way
    release.set()
    fill.join(5)
    reader.join(5)
    assert got == ["new"]


def test_a_dead_fillers_fill_ends_with_its_lease_while_others_keep_the_lock_alive(
    client: redis.Redis, namespace: str
) -> None:
    """A filler that died leaves its fill in the key's lock hash; a reader holding the
    same lock keeps the hash (and its TTL) alive. The dead filler's fill must end with
    its own lease, so that the next caller fills the key."""
    guard = make_guard(client, namespace, wait_timeout=10.0)
    keys = guard.keys("k")
    begun = FILL_BEGIN(client, [keys.value, keys.lock, keys.version], ["dead", 200, "0", 60_000])
    assert int(begun[0]) == 1  # "dead" holds the fill for 200 ms and never ends it
    reader = RedisRWLock(client, "k", namespace=namespace, lease=60.0, watchdog=False)
    held = reader.acquire_read(owner="long reader")
    try:
        assert guard.get_or_load("k", lambda: "loaded", ttl=60) == "loaded"
        assert guard.peek("k") == "loaded"
    finally:
        held.release()
