"""Regressions found in review of the cache: leaks, stale coalescing, edge inputs."""

from __future__ import annotations

import decimal
import struct
import threading
import time
from typing import Any

import msgpack
import pytest
import redis

from cacheguard import MISSING, CacheGuard, CacheLoader, cached_with_lock
from cacheguard.cache import wire
from cacheguard.cache.codec import Codec, MsgpackCodec
from cacheguard.cache.entry import pack_entry
from cacheguard.cache.flows import fill as flow
from tests.helpers import make_guard, start_gated_fill, subscribers, wait_until


def test_two_fills_in_one_process_leave_no_hold(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace)
    _, t = start_gated_fill(guard, "k", "v", hold=0.3)
    guard.refresh("k", lambda: "refreshed", ttl=60)  # same process, same owner
    t.join(5)
    assert wait_until(lambda: not client.exists(guard.keys("k").lock), timeout=3)
    with make_guard(client, namespace).write("k", timeout=2):  # not blocked by a leak
        pass


def test_unlocked_load_is_not_served_to_a_read_that_started_after_a_write(
    client: redis.Redis, namespace: str
) -> None:
    """A reader gives up on the write lock and loads without it ("old"); the write
    then ends; a second read of this process joins the unlocked load still in flight
    and must not take its "old" value: it began after the write ended."""
    db = {"value": "old"}
    writer = make_guard(client, namespace)
    reader = make_guard(client, namespace, wait_timeout=0.45, on_timeout="load")
    write_exited = threading.Event()
    in_write = threading.Event()
    old_load_runs = threading.Event()

    def write() -> None:
        with writer.write("k"):
            in_write.set()
            assert old_load_runs.wait(10)  # the first reader timed out and loads
            db["value"] = "new"
        write_exited.set()

    def second_read_joined() -> bool:
        flight = reader._state.flights._flights.get("k")
        return flight is not None and flight.event is not None

    def load() -> str:
        seen = db["value"]
        if seen == "old":
            old_load_runs.set()
            # Outlive the write, until the second read has joined this flight.
            assert wait_until(second_read_joined, 10)
        return seen

    w = threading.Thread(target=write)
    w.start()
    assert in_write.wait(5)
    first: list[str] = []
    a = threading.Thread(target=lambda: first.append(reader.get_or_load("k", load, ttl=60)))
    a.start()
    assert write_exited.wait(10)
    # Starts after the write exited, while the unlocked load of "old" is in flight.
    assert reader.get_or_load("k", load, ttl=60) == "new"
    a.join(5)
    w.join(5)
    assert first == ["old"]  # that caller started before the write ended: fine
    assert reader.stats().wait_timeouts == 1


class _ExplodingCodec(MsgpackCodec):
    def encode(self, value: Any) -> bytes:
        raise RuntimeError("codec bug")


def test_any_error_while_ending_a_fill_releases_it(client: redis.Redis, namespace: str) -> None:
    codec: Codec = _ExplodingCodec()
    guard = make_guard(client, namespace, codec=codec)
    with pytest.raises(RuntimeError, match="codec bug"):
        guard.get_or_load("k", lambda: "v", ttl=60)
    assert not client.exists(guard.keys("k").lock)
    assert make_guard(client, namespace).get_or_load("k", lambda: "ok", ttl=60) == "ok"


def test_deeply_nested_value_is_a_serialization_error(client: redis.Redis, namespace: str) -> None:
    from cacheguard import JsonCodec, SerializationError

    nested: Any = []
    for _ in range(100_000):
        nested = [nested]
    guard = make_guard(client, namespace, codec=JsonCodec())
    with pytest.raises(SerializationError):
        guard.get_or_load("k", lambda: nested, ttl=60)
    assert not client.exists(guard.keys("k").lock)


def test_redis_failing_at_fill_end_does_not_load_twice(
    client: redis.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    guard = make_guard(client, namespace)
    real_end = wire.FILL_END
    calls: list[int] = []

    def end_fails_once(client: redis.Redis, keys: list[str], args: list[Any]) -> Any:
        real_end(client, keys, args)  # releases in Redis, then the reply is "lost"
        raise redis.ConnectionError("injected: connection dropped at fill end")

    monkeypatch.setattr(wire, "FILL_END", end_fails_once)

    def load() -> str:
        calls.append(1)
        return "once"

    assert guard.get_or_load("k", load, ttl=60) == "once"
    assert calls == [1]
    assert guard.stats().backend_errors == 1


def test_corrupt_extension_payload_is_a_miss(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace)
    bad = msgpack.packb(msgpack.ExtType(3, b"not a number"))  # a "Decimal" that is not
    header = struct.pack("<2sBddqd", b"\xcb\x01", 1, time.time(), 60.0, 0, 0.0)
    client.set(guard.keys("k").value, header + bad)
    assert guard.get_or_load("k", lambda: decimal.Decimal("1.5"), ttl=60) == decimal.Decimal("1.5")
    assert guard.stats().corrupt_entries >= 1


def test_foreign_key_type_is_a_miss(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace)
    client.hset(guard.keys("k").value, "not", "ours")  # WRONGTYPE for GET
    assert guard.get_or_load("k", lambda: "ours now", ttl=60) == "ours now"
    assert guard.peek("k") == "ours now"


@pytest.mark.slow
def test_uncacheable_results_do_not_count_as_failed_fills(
    client: redis.Redis, namespace: str
) -> None:
    guards = [make_guard(client, namespace, none_ttl=None, max_fill_retries=0) for _ in range(8)]
    errors: list[BaseException] = []

    def read(guard: CacheGuard) -> None:
        try:
            for _ in range(5):
                assert (
                    guard.get_or_load("nothing", lambda: (time.sleep(0.02), None)[1], ttl=60)
                    is None
                )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(g,)) for g in guards]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []


def test_arguments_cannot_spell_a_shortened_key(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace)

    def echo(x: str) -> str:
        return x

    loader = CacheLoader(guard, key="k:{x}", load=echo, ttl=60)
    victim = loader.key(x="v" * 500)  # shortened: prefix + '#' + digest
    assert "#" in victim
    forged_argument = victim[len("k:") :]
    assert loader.key(x=forged_argument) != victim


def test_local_writer_timeout_follows_the_policy(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace, wait_timeout=0.2, on_timeout="load")
    lock = guard.rwlock("k")
    lock.acquire_write()  # a writer of this very process
    try:
        got: list[str] = []
        t = threading.Thread(target=lambda: got.append(guard.get_or_load("k", lambda: "v", ttl=60)))
        t.start()
        t.join(5)
        assert got == ["v"]  # loaded without the lock, not LockTimeout
        assert guard.stats().wait_timeouts == 1
    finally:
        lock.release_write()


def test_decorator_over_staticmethod_and_classmethod(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace)

    class Repo:
        scale = 10

        @cached_with_lock(guard, key="st:{x}", ttl=60)
        @staticmethod
        def st(x: int) -> int:
            return x * 2

        @cached_with_lock(guard, key="cm:{x}", ttl=60)
        @classmethod
        def cm(cls, x: int) -> int:
            return x * cls.scale

    assert Repo().st(2) == Repo.st(2) == 4
    assert Repo().cm(3) == Repo.cm(3) == 30
    assert Repo.cm.peek(3) == 30
    Repo.cm.invalidate(3)
    assert Repo.cm.peek(3) is MISSING


@pytest.mark.parametrize(
    "stamp",
    [1, int(time.time() + 3600) * 10**6],
    ids=["fill of long ago", "clock stepped back since"],
)
def test_a_late_announcement_from_before_an_invalidation_is_not_taken(
    client: redis.Redis, namespace: str, stamp: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An announcement carrying an entry stored before a write can reach a waiter late
    (a starved notifier thread): it comes from a fill that began before the one the
    waiter saw under way."""
    filler = make_guard(client, namespace)
    waiter = make_guard(client, namespace)  # another owner: waits for the filler
    with filler.write("k"):
        pass  # the key's version is now above 0
    release, fill = start_gated_fill(filler, "k", "new")
    decoded: list[Any] = []
    handled = threading.Event()
    real_message = flow.parse_message

    def message(payload: bytes, decode: Any) -> Any:
        decoded.append(real_message(payload, decode))
        handled.set()
        return decoded[-1]

    monkeypatch.setattr(flow, "parse_message", message)
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(waiter.get_or_load("k", str, ttl=60)))
    reader.start()
    # Subscribed (only the waiter subscribes): from now on a publish reaches its inbox.
    channel = waiter.keys("k").released_channel
    assert wait_until(lambda: subscribers(client, channel) >= 1)
    old = pack_entry(MsgpackCodec(), "old", created=time.time(), ttl=60, version=0,
                     load_duration=0.0)  # fmt: skip
    # A fill of long ago, or one stamped in the future by a clock that stepped back
    # since (then its entry's version still predates the write).
    client.spublish(channel, b"V%d:" % stamp + old)
    assert handled.wait(10)  # the waiter received and decoded it ...
    assert [(m.kind, m.entry.value) for m in decoded] == [("value", "old")]
    release.set()  # ... and still waits: only now does the real fill end
    fill.join(5)
    reader.join(5)
    assert got == ["new"]
