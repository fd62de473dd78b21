"""The cache in one process: read path, write path, entries, expiry, failures."""

from __future__ import annotations

import datetime as dt
import decimal
import threading
import time
import uuid
from collections.abc import Callable, Generator
from typing import Any

import pytest
import redis

from cacheguard import (
    MISSING,
    BackendUnavailable,
    CacheGuard,
    CacheLoader,
    FillFailed,
    JsonCodec,
    KeyTemplateError,
    LockTimeout,
    PickleCodec,
    SerializationError,
    cached_with_lock,
)
from cacheguard.cache.entry import pack_entry
from cacheguard.redis.keys import ResourceKeys
from cacheguard.testing import free_port
from tests.helpers import make_guard, start_gated_fill, subscribers, wait_until, waiting_in


def lock_is_free(client: redis.Redis, guard: CacheGuard, name: str) -> bool:
    return not client.exists(guard.keys(name).lock)


# -- API and keys -------------------------------------------------------------------------


def test_loader_get_invalidate_refresh_peek(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace)
    calls: list[int] = []

    def load_menu(menu_id: int) -> dict[str, Any]:
        calls.append(menu_id)
        return {"id": menu_id, "n": len(calls)}

    menu = CacheLoader(guard, key="menu:{menu_id}", load=load_menu, ttl=60)
    assert menu.peek(menu_id=7) is MISSING
    assert menu.get(menu_id=7) == {"id": 7, "n": 1}
    assert menu.get(7) == {"id": 7, "n": 1}  # positional works too, same key
    assert menu.key(menu_id=7) == "menu:7"
    assert menu.peek(menu_id=7) == {"id": 7, "n": 1}
    menu.invalidate(menu_id=7)
    assert menu.peek(menu_id=7) is MISSING
    assert menu.refresh(menu_id=7) == {"id": 7, "n": 2}
    assert menu.get(menu_id=7) == {"id": 7, "n": 2}
    assert calls == [7, 7]
    assert lock_is_free(client, guard, "menu:7")


def test_decorator_on_functions_and_methods(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace)
    calls: list[str] = []

    @cached_with_lock(guard, key="menu:list", ttl=60)
    def list_menus() -> list[dict[str, int]]:
        """All menus."""
        calls.append("list")
        return [{"id": 1}]

    class Repo:
        def __init__(self, prefix: str) -> None:
            self.prefix = prefix

        @cached_with_lock(guard, key="menu:{menu_id}", ttl=60)
        def get(self, menu_id: int) -> str:
            calls.append(f"get{menu_id}")
            return f"{self.prefix}{menu_id}"

    assert list_menus() == list_menus() == [{"id": 1}]
    assert list_menus.__name__ == "list_menus"
    assert list_menus.__doc__ == "All menus."
    repo = Repo("m")
    assert repo.get(3) == repo.get(menu_id=3) == "m3"
    repo.get.invalidate(3)
    assert repo.get.peek(3) is MISSING
    assert calls == ["list", "get3"]


def test_key_template_errors(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace)
    with pytest.raises(KeyTemplateError, match="not a parameter"):
        CacheLoader(guard, key="menu:{id}", load=lambda menu_id: menu_id, ttl=60)
    with pytest.raises(KeyTemplateError, match="positions"):
        CacheLoader(guard, key="menu:{0}", load=lambda menu_id: menu_id, ttl=60)
    with pytest.raises(KeyTemplateError, match="no name that is stable"):
        CacheLoader(guard, key=None, load=lambda menu_id: menu_id, ttl=60)


def test_explicit_refresh_waits_for_a_fill_in_progress(client: redis.Redis, namespace: str) -> None:
    """A refresh means "load now": it does not settle for the value of a fill already
    under way elsewhere, it waits for that fill to end and then loads itself."""
    filler = make_guard(client, namespace)
    other = make_guard(client, namespace)  # another "process"
    release, fill = start_gated_fill(filler, "k", "filled")
    seen_at_load: list[Any] = []

    def load() -> str:
        seen_at_load.append(other.peek("k"))
        return "refreshed"

    got: list[str] = []
    refresher = threading.Thread(target=lambda: got.append(other.refresh("k", load, ttl=60)))
    refresher.start()
    # Subscribed to the key's channel: the refresh found the fill busy and waits.
    assert wait_until(lambda: subscribers(client, other.keys("k").released_channel) >= 1)
    assert seen_at_load == []
    release.set()
    fill.join(5)
    refresher.join(10)
    assert got == ["refreshed"]
    assert seen_at_load == ["filled"]  # its own load ran after the fill had stored
    assert other.peek("k") == "refreshed"


def test_template_values_cannot_forge_keys(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace)
    pair = CacheLoader(guard, key="p:{a}:{b}", load=lambda a, b: f"{a}|{b}", ttl=60)
    assert pair.key(a="1:2", b="3") != pair.key(a="1", b="2:3")
    assert pair.get(a="1:2", b="3") == "1:2|3"
    assert pair.get(a="1", b="2:3") == "1|2:3"


def test_long_keys_are_hashed(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace)

    def length(x: str) -> int:
        return len(x)

    loader = CacheLoader(guard, key="k:{x}", load=length, ttl=60)
    name = loader.key(x="y" * 5000)
    assert len(name) == guard.settings.max_key_length
    assert loader.get(x="y" * 5000) == 5000
    assert loader.key(x="y" * 4999) != name


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"lease": 0}, "lease"),
        ({"wait_timeout": -1}, "wait_timeout"),
        ({"on_timeout": "maybe"}, "on_timeout"),
        ({"on_backend_error": "ignore"}, "on_backend_error"),
        ({"ttl_jitter": 1.5}, "ttl_jitter"),
        ({"none_ttl": 0}, "none_ttl"),
        ({"stale_ttl": -1}, "stale_ttl"),
        ({"l1_maxsize": -1}, "l1_maxsize"),
        ({"namespace": "a{b"}, "namespace"),
    ],
)
def test_bad_settings(
    client: redis.Redis, namespace: str, settings: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        CacheGuard(client, **{"namespace": namespace, **settings})


def test_bad_ttl(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace)
    with pytest.raises(ValueError, match="ttl"):
        CacheLoader(guard, key="k", load=lambda: 1, ttl=0)
    with pytest.raises(ValueError, match="ttl"):
        guard.get_or_load("k", lambda: 1, ttl=-5)


# -- entries and codecs ------------------------------------------------------------------


def test_msgpack_round_trips_rich_types(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace)
    value = {
        "when": dt.datetime(2026, 11, 21, 5, 4, tzinfo=dt.timezone.utc),
        "day": dt.date(2026, 11, 21),
        "price": decimal.Decimal("12.30"),
        "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "nested": [1, 2.5, None, True, "x", b"raw"],
    }
    guard.get_or_load("rich", lambda: value, ttl=60)
    assert guard.peek("rich") == value


def test_json_and_signed_pickle_codecs(client: redis.Redis, namespace: str) -> None:
    as_json = make_guard(client, namespace, codec=JsonCodec())
    as_json.get_or_load("j", lambda: {"d": decimal.Decimal("1.5")}, ttl=60)
    assert as_json.peek("j") == {"d": decimal.Decimal("1.5")}

    key = b"k" * 32
    pickled = make_guard(client, namespace + "p", codec=PickleCodec(key))
    pickled.get_or_load("p", lambda: {1, 2, 3}, ttl=60)
    assert pickled.peek("p") == {1, 2, 3}
    # Tampered or foreign-keyed bytes are refused (a miss), never unpickled.
    other = make_guard(client, namespace + "p", codec=PickleCodec(b"x" * 32))
    assert other.peek("p") is MISSING
    assert other.stats().corrupt_entries == 1
    with pytest.raises(SerializationError, match="HMAC"):
        PickleCodec(b"short")


def test_unserialisable_value_raises_and_leaves_nothing(
    client: redis.Redis, namespace: str
) -> None:
    guard = make_guard(client, namespace)
    with pytest.raises(SerializationError) as info:
        guard.get_or_load("bad", lambda: {"x": object()}, ttl=60)
    assert info.value.key == "bad"
    assert guard.peek("bad") is MISSING
    assert lock_is_free(client, guard, "bad")
    assert guard.get_or_load("bad", lambda: "fine", ttl=60) == "fine"  # proceeds at once


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"\x00",
        b"not ours at all",
        b"\xcb\x01\x01" + b"\x00" * 10,
        b"\xcb\x01\x09" + b"\x00" * 40,
    ],
)
def test_corrupt_entries_are_misses(client: redis.Redis, namespace: str, garbage: bytes) -> None:
    guard = make_guard(client, namespace)
    client.set(guard.keys("c").value, garbage)
    assert guard.peek("c") is MISSING
    assert guard.get_or_load("c", lambda: "reloaded", ttl=60) == "reloaded"
    assert guard.peek("c") == "reloaded"
    assert guard.stats().corrupt_entries >= 1


def test_value_too_large_is_returned_not_cached(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace, max_value_bytes=1000)
    assert guard.get_or_load("big", lambda: "x" * 5000, ttl=60) == "x" * 5000
    assert guard.peek("big") is MISSING
    assert guard.stats().values_too_large == 1
    assert lock_is_free(client, guard, "big")


# -- expiry ------------------------------------------------------------------------------


def test_negative_caching(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace, none_ttl=0.3)
    calls: list[int] = []

    def missing() -> None:
        calls.append(1)

    assert guard.get_or_load("none", missing, ttl=60) is None
    assert guard.get_or_load("none", missing, ttl=60) is None
    assert calls == [1]  # the None was cached
    assert 0 < client.pttl(guard.keys("none").value) <= 300
    off = make_guard(client, namespace + "off", none_ttl=None)
    off.get_or_load("none", missing, ttl=60)
    off.get_or_load("none", missing, ttl=60)
    assert calls == [1, 1, 1]  # not cached with none_ttl=None


def test_ttl_jitter_spreads_expiry(client: redis.Redis, namespace: str) -> None:
    guard = CacheGuard(client, namespace=namespace, ttl_jitter=0.1)
    ttls = []
    for i in range(40):
        guard.get_or_load(f"j{i}", lambda: 1, ttl=100)
        ttls.append(client.pttl(guard.keys(f"j{i}").value))
    assert all(89_000 <= t <= 110_000 for t in ttls)
    assert max(ttls) - min(ttls) > 5_000  # really spread, not one value


def test_early_refresh_reloads_in_background(client: redis.Redis, namespace: str) -> None:
    # beta 100: a 10 ms load looks 1 s long, so a 2 s entry is inside XFetch's horizon
    guard = make_guard(client, namespace, early_refresh_beta=100.0, rng=lambda: 1e-300)
    versions = iter(range(100))

    def load() -> int:
        time.sleep(0.01)  # a load duration, so XFetch has a delta to work with
        return next(versions)

    assert guard.get_or_load("x", load, ttl=2) == 0
    # draw 1e-300: -log(draw) * 10 ms load = 6.9 s > the 2 s TTL, so the next hit
    # refreshes early (a draw of 1.0 never would).
    assert guard.get_or_load("x", load, ttl=2) == 0  # the caller still gets the current value
    # Counted once the refresh's fill has ended (stored, hold released).
    assert wait_until(lambda: guard.stats().early_refreshes == 1)
    assert guard.peek("x") == 1
    assert lock_is_free(client, guard, "x")  # the refresh left no hold behind


def test_stale_while_revalidate(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace, stale_ttl=30, early_refresh_beta=0)
    versions = iter(range(100))
    release = threading.Event()

    def load() -> int:
        value = next(versions)
        if value == 1:
            release.wait(5)  # hold the background reload until we checked
        return value

    assert guard.get_or_load("s", load, ttl=0.2) == 0
    time.sleep(0.3)  # logically expired, still inside the stale window
    assert guard.get_or_load("s", load, ttl=0.2) == 0  # served stale, at once
    assert guard.stats().stale_served == 1
    release.set()
    deadline = time.monotonic() + 5
    while (guard.peek_entry("s") or 0) and guard.peek_entry("s").value == 0:  # type: ignore[union-attr]
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert guard.peek_entry("s").value == 1  # type: ignore[union-attr]


# -- failures --------------------------------------------------------------------------------


def test_loader_exception_reaches_caller_and_waiters(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace)
    started = threading.Event()

    def failing() -> str:
        started.set()
        time.sleep(0.2)
        raise KeyError("db down")

    errors: list[BaseException] = []

    def call() -> None:
        try:
            guard.get_or_load("f", failing, ttl=60)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(errors) == 5
    assert all(isinstance(e, KeyError) for e in errors)
    assert guard.peek("f") is MISSING
    assert lock_is_free(client, guard, "f")
    assert guard.get_or_load("f", lambda: "ok", ttl=60) == "ok"
    assert guard.stats().load_errors == 1


def test_write_waits_for_fill_and_fill_waits_for_write(
    client: redis.Redis, other_client: redis.Redis, namespace: str
) -> None:
    filler = make_guard(client, namespace)
    # Another "process": its own owner and its own pub/sub connection, so the
    # filler's subscription below is visible on its own.
    writer = make_guard(other_client, namespace)
    keys = filler.keys("k")
    order: list[str] = []
    loading, finish_load = threading.Event(), threading.Event()

    def gated_load() -> str:
        loading.set()
        finish_load.wait(10)
        order.append("fill ends")
        return "v1"

    def write(body: Callable[[], None] = lambda: None) -> None:
        with writer.write("k", timeout=10):
            order.append("write starts")
            body()
            order.append("write ends")

    t = threading.Thread(target=lambda: filler.get_or_load("k", gated_load, ttl=60))
    t.start()
    assert loading.wait(5)
    w = threading.Thread(target=write)
    w.start()
    try:
        # The writer is queued behind the fill's read hold, not inside.
        assert wait_until(lambda: client.hexists(keys.lock, f"q:{writer.rwlock('k').owner}"))
        assert order == []
    finally:
        finish_load.set()
    t.join(5)
    w.join(5)
    assert order == ["fill ends", "write starts", "write ends"]

    order.clear()
    holding, leave = threading.Event(), threading.Event()

    def hold() -> None:
        holding.set()
        assert leave.wait(10)

    w = threading.Thread(target=write, args=(hold,))
    w.start()
    assert holding.wait(5)

    def load_after_write() -> str:
        order.append("load starts")
        return "v2"

    r = threading.Thread(target=lambda: filler.get_or_load("k", load_after_write, ttl=60))
    try:
        # The fill's thread waits for a release: it found the writer. (Not the count
        # of the channel's subscribers: the writer's subscription from above may still
        # be open, and a fill that ignored the writer would load unseen while it raced.)
        with waiting_in(r) as fill_waits:
            r.start()
            assert wait_until(lambda: fill_waits.is_set() or "load starts" in order)
        assert order == ["write starts"]
    finally:
        leave.set()
    w.join(5)
    r.join(5)
    assert order == ["write starts", "write ends", "load starts"]
    assert filler.peek("k") == "v2"


def test_overlapping_writers_do_not_deadlock(client: redis.Redis, namespace: str) -> None:
    a = make_guard(client, namespace)
    b = make_guard(client, namespace)
    done: list[int] = []

    def writer(guard: CacheGuard, keys: tuple[str, ...]) -> None:
        for _ in range(20):
            with guard.write(*keys, timeout=10):
                pass
        done.append(1)

    threads = [
        threading.Thread(target=writer, args=(a, ("x", "y", "z"))),
        threading.Thread(target=writer, args=(b, ("z", "y", "x"))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert done == [1, 1]


def test_reads_inside_a_write_are_served_but_never_stored(
    client: redis.Redis, namespace: str
) -> None:
    """The writing thread may read what it has not committed; nobody else may."""
    guard = make_guard(client, namespace)
    with guard.write("k"):
        assert guard.get_or_load("k", lambda: "uncommitted", ttl=60) == "uncommitted"
        assert guard.refresh("k", lambda: "uncommitted", ttl=60) == "uncommitted"
        assert guard.peek("k") is MISSING
    assert guard.peek("k") is MISSING
    assert guard.get_or_load("k", lambda: "committed", ttl=60) == "committed"


def test_invalidation_stamps_rise_and_never_go_down(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace)
    before = guard.watermark()
    guard.invalidate("a", "b")
    stamp = guard.watermark()
    assert stamp == before + 1
    assert int(client.get(guard.keys("a").version)) == stamp
    # A stamp that arrives late (a slower writer) still moves the version up.
    keys = guard.keys("a")
    late = _invalidate(client, keys, stamp - 1)
    assert late == stamp + 1
    # A sequence that lost increments (a failover) is lifted to the versions in use,
    # and every invalidation still changes the version (fills in flight fail).
    client.set(f"{namespace}:wm", 0)
    guard.invalidate("a")
    assert int(client.get(keys.version)) == stamp + 2
    assert guard.watermark() == stamp + 2


def _invalidate(
    client: redis.Redis, keys: ResourceKeys, stamp: int | None, heals: int | None = None
) -> int:
    from cacheguard.cache.wire import invalidate_call

    script, keys_, args = invalidate_call(
        keys, version_ttl_ms=60_000, l1_channel="", name=keys.name, stamp=stamp, heals=heals
    )
    return int(script(client, keys_, args))


def test_a_poisoned_version_refuses_tracked_fills_until_a_heal(
    client: redis.Redis, namespace: str
) -> None:
    # The invalidation sequence's node was down: the invalidation poisoned the version
    # (the INVALIDATE script, on a real server; the flow's choice is scripted in
    # test_write_path_scripted.py).
    from cacheguard.cache.watermark import note_snapshot
    from cacheguard.cache.wire import POISON_FLOOR

    guard = make_guard(client, namespace)
    keys = guard.keys("k")
    client.set(f"{namespace}:wm", 9)
    guard.invalidate("k")
    assert int(client.get(keys.version)) == 10
    old = guard.watermark()  # a snapshot taken now: it does not see the writes below
    assert old == 10
    guard.get_or_load("k", lambda: "before", ttl=60)
    poisoned = _invalidate(client, keys, None)
    assert poisoned == POISON_FLOOR + 11  # carries the real version it replaced, + 1
    assert guard.peek("k") is MISSING  # the value is gone all the same
    again = _invalidate(client, keys, None)
    assert again == poisoned + 1  # every invalidation changes it (fills in flight fail)

    def loaded_from(watermark: int) -> Callable[[], str]:
        def load() -> str:
            note_snapshot(watermark)  # a load that read a snapshot with this watermark
            return f"from snapshot {watermark}"

        return load

    assert guard.get_or_load("k", loaded_from(old), ttl=60) == "from snapshot 10"
    assert guard.peek("k") is MISSING  # no known snapshot is newer than a poison
    assert guard.stats().stores_rejected == 1
    # The sequence restarts from 0 (a node restarted without persistence).
    client.set(f"{namespace}:wm", 0)
    # A later real number does not lower it (it may predate the poisoning commit) ...
    assert _invalidate(client, keys, 1) == again + 1
    # ... nor does a heal of a version that is no longer the healer's own ...
    assert _invalidate(client, keys, 2, heals=again) == again + 2
    # ... a heal of the healer's own poisoned version does, but never below the real
    # version the poison carried: the old snapshot still cannot store.
    healed = _invalidate(client, keys, 2, heals=again + 2)
    assert healed == again + 2 - POISON_FLOOR + 1
    assert healed > old
    assert guard.get_or_load("k", loaded_from(old), ttl=60) == "from snapshot 10"
    assert guard.peek("k") is MISSING
    client.set(f"{namespace}:wm", healed)  # the flow lifts the sequence to the heal
    now = guard.watermark()
    assert guard.get_or_load("k", loaded_from(now), ttl=60) == f"from snapshot {now}"
    assert guard.peek("k") == f"from snapshot {now}"
    # A heal to a number above the carried version takes the number.
    assert _invalidate(client, keys, 100, heals=_invalidate(client, keys, None)) == 100
    # A fill that read no known snapshot stores under a poisoned version too.
    _invalidate(client, keys, None)
    assert guard.get_or_load("k", lambda: "untracked", ttl=60) == "untracked"
    assert guard.peek("k") == "untracked"


def test_write_body_exception_still_invalidates_and_releases(
    client: redis.Redis, namespace: str
) -> None:
    guard = make_guard(client, namespace)
    guard.get_or_load("k", lambda: "cached", ttl=60)
    with pytest.raises(RuntimeError, match="rollback"), guard.write("k"):
        raise RuntimeError("rollback")
    assert guard.peek("k") is MISSING
    assert lock_is_free(client, guard, "k")


def test_invalidation_during_fill_rejects_the_store(client: redis.Redis, namespace: str) -> None:
    """The version check alone (no write lock): a lock-free invalidation mid-load."""
    guard = make_guard(client, namespace)
    proceed, t = start_gated_fill(guard, "k", "loaded before the invalidation")
    guard.invalidate("k")
    proceed.set()
    t.join(5)
    assert guard.peek("k") is MISSING
    assert guard.stats().stores_rejected == 1


def test_a_version_moved_without_the_fill_mark_rejects_the_store(
    client: redis.Redis, namespace: str
) -> None:
    """The version check on its own: an invalidation that moves the version but leaves
    the fill's ``fs`` mark (an older cacheguard's script, in a rolling upgrade)."""
    guard = make_guard(client, namespace)
    keys = guard.keys("k")
    proceed, t = start_gated_fill(guard, "k", "loaded before the invalidation")
    client.set(keys.version, 41, px=60_000)
    assert client.hget(keys.lock, "fs") == b"1"
    proceed.set()
    t.join(5)
    assert guard.peek("k") is MISSING
    assert guard.stats().stores_rejected == 1


@pytest.mark.slow
def test_wait_timeout_policies(client: redis.Redis, namespace: str) -> None:
    blocker = make_guard(client, namespace)
    entered = threading.Event()
    leave = threading.Event()

    def hold_write() -> None:
        with blocker.write("k"):
            entered.set()
            leave.wait(10)

    t = threading.Thread(target=hold_write)
    t.start()
    assert entered.wait(5)
    try:
        raising = make_guard(client, namespace, wait_timeout=0.3, on_timeout="raise")
        with pytest.raises(LockTimeout):
            raising.get_or_load("k", lambda: "x", ttl=60)
        loading = make_guard(client, namespace, wait_timeout=0.3)  # default: "load"
        assert loading.get_or_load("k", lambda: "unlocked", ttl=60) == "unlocked"
        assert loading.peek("k") is MISSING  # loaded without the lock: not stored
        assert loading.stats().wait_timeouts == 1
    finally:
        leave.set()
        t.join(5)


def test_stale_window_serves_the_old_entry_while_a_writer_blocks(
    client: redis.Redis, namespace: str
) -> None:
    guard = make_guard(client, namespace, stale_ttl=30, wait_timeout=0.3, on_timeout="stale")
    guard.get_or_load("k", lambda: "old", ttl=0.1)
    time.sleep(0.2)
    other = make_guard(client, namespace)
    entered = threading.Event()
    leave = threading.Event()

    def hold_write_keep_value() -> None:
        lock = other.rwlock("k")
        with lock.write():  # a writer (not invalidating) blocks the fill
            entered.set()
            leave.wait(10)

    t = threading.Thread(target=hold_write_keep_value)
    t.start()
    assert entered.wait(5)
    try:
        # Stale window: served at once without waiting (stale-while-revalidate).
        assert guard.get_or_load("k", lambda: "new", ttl=60) == "old"
    finally:
        leave.set()
        t.join(5)


def test_fill_failed_after_repeated_aborts(client: redis.Redis, namespace: str) -> None:
    """Waiters in other processes retry a bounded number of times."""
    failing = make_guard(client, namespace)
    waiting = make_guard(client, namespace, max_fill_retries=0)
    loading, fail = threading.Event(), threading.Event()

    def gated_failure() -> str:
        loading.set()
        fail.wait(10)
        raise ValueError("no")

    def fill_and_fail() -> None:
        with pytest.raises(ValueError, match="no"):
            failing.get_or_load("k", gated_failure, ttl=60)

    t = threading.Thread(target=fill_and_fail)
    t.start()
    assert loading.wait(5)
    errors: list[BaseException] = []

    def wait_for_it() -> None:
        try:
            waiting.get_or_load("k", lambda: "should not run", ttl=60)
        except BaseException as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    # The waiter saw the fill under way and listens for its end.
    assert wait_until(lambda: subscribers(client, waiting.keys("k").released_channel) >= 1)
    fail.set()
    t.join(5)
    waiter.join(10)
    assert [type(e) for e in errors] == [FillFailed]
    assert isinstance(errors[0], FillFailed)
    assert errors[0].key == "k"


def test_bypass_when_redis_is_down() -> None:
    guard = CacheGuard.from_url(f"redis://127.0.0.1:{free_port()}/0", breaker_failures=2)
    calls: list[int] = []

    def load() -> str:
        calls.append(1)
        return "from the database"

    for _ in range(4):
        assert guard.get_or_load("k", load, ttl=60) == "from the database"
    assert len(calls) == 4
    stats = guard.stats()
    assert stats.backend_errors == 2  # then the circuit opened: no more connect attempts
    assert guard._state.breaker("k").state in ("open", "half-open")
    assert guard.peek("k") is MISSING

    raising = CacheGuard.from_url(f"redis://127.0.0.1:{free_port()}/0", on_backend_error="raise")
    with pytest.raises(BackendUnavailable):
        raising.get_or_load("k", load, ttl=60)


def test_breaker_recovers_when_redis_returns(client: redis.Redis, namespace: str) -> None:
    now = [0.0]
    guard = make_guard(
        client, namespace, breaker_failures=1, breaker_cooldown=5, timer=lambda: now[0]
    )
    guard._state.breaker("k").failure()  # as if Redis had just failed
    assert guard._state.breaker("k").state == "open"
    assert guard.get_or_load("k", lambda: "bypassed", ttl=60) == "bypassed"
    assert guard.peek("k") is MISSING  # the open circuit skipped Redis
    now[0] = 6.0  # cooldown over: the next call probes, succeeds, closes the circuit
    assert guard.get_or_load("k", lambda: "cached", ttl=60) == "cached"
    assert guard._state.breaker("k").state == "closed"
    assert guard.peek("k") == "cached"


def test_l1_hits_and_cross_guard_invalidation(client: redis.Redis, namespace: str) -> None:
    first = make_guard(client, namespace, l1_maxsize=100, l1_ttl=60)
    second = make_guard(
        redis.Redis(connection_pool=redis.ConnectionPool.from_url(_url(client))),
        namespace,
        l1_maxsize=100,
        l1_ttl=60,
    )
    assert first.get_or_load("k", lambda: "v1", ttl=60) == "v1"
    assert second.get_or_load("k", lambda: "unused", ttl=60) == "v1"
    assert second.get_or_load("k", lambda: "unused", ttl=60) == "v1"
    assert second.stats().l1_hits == 1
    with first.write("k"):
        pass
    deadline = time.monotonic() + 5
    while "k" in second._state.l1 and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.01)
    assert second.get_or_load("k", lambda: "v2", ttl=60) == "v2"  # the broadcast reached it
    first.close()
    second.close()


def _url(client: redis.Redis) -> str:
    kw = client.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/{kw.get('db', 0)}"


def test_envelope_fields(client: redis.Redis, namespace: str) -> None:
    guard = make_guard(client, namespace)
    guard.get_or_load("e", lambda: [1, 2], ttl=60)
    entry = guard.peek_entry("e")
    assert entry is not None
    assert entry.value == [1, 2]
    assert entry.ttl == 60
    assert entry.version == 0
    assert entry.load_duration >= 0
    assert abs(entry.created - time.time()) < 60
    raw = pack_entry(guard.settings.codec, "x", created=1.0, ttl=2.0, version=3, load_duration=0.5)
    assert raw[:2] == b"\xcb\x01"


# -- the hit path's cost ----------------------------------------------------------------------


class _SentCommands:
    """A client whose connections record every command they send, with the sending
    thread (pipelines included)."""

    def __init__(self, url: str) -> None:
        sent: list[tuple[int, tuple[str, ...]]] = []
        self.sent = sent

        def text(arg: Any) -> str:
            return arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)

        class Recording(redis.Connection):
            def send_command(self, *args: Any, **kwargs: Any) -> None:
                sent.append((threading.get_ident(), tuple(text(a) for a in args)))
                super().send_command(*args, **kwargs)

            def pack_commands(self, commands: Any) -> Any:
                for command in commands:
                    sent.append((threading.get_ident(), tuple(text(a) for a in command)))
                return super().pack_commands(commands)

        pool = redis.ConnectionPool.from_url(url, connection_class=Recording)
        self.client = redis.Redis(connection_pool=pool)

    def by_this_thread(self, since: int) -> list[tuple[str, ...]]:
        me = threading.get_ident()
        return [command for thread, command in self.sent[since:] if thread == me]


def test_a_warm_hit_is_one_get(redis_url: str, namespace: str) -> None:
    """get_or_load, CacheLoader.get and a @cached_with_lock function: a hit sends one
    GET of the value key and nothing else (no lock, no script, no subscription)."""
    recording = _SentCommands(redis_url)
    # rng 0.5: the early-refresh draw is far from expiry (a 60 s TTL, a ~0 s load), so
    # no hit refreshes in the background; the refresh itself stays on (default beta).
    guard = make_guard(recording.client, namespace, rng=lambda: 0.5)
    loader = CacheLoader(guard, key="menu:{menu_id}", load=lambda menu_id: menu_id, ttl=60)

    @cached_with_lock(guard, key="menus", ttl=60)
    def menus() -> list[int]:
        return [1, 2]

    hits: dict[str, tuple[str, Callable[[], Any], Any]] = {
        "get_or_load": ("plain", lambda: guard.get_or_load("plain", lambda: "v", ttl=60), "v"),
        "CacheLoader.get": ("menu:7", lambda: loader.get(menu_id=7), 7),
        "cached_with_lock": ("menus", menus, [1, 2]),
    }
    for what, (name, call, value) in hits.items():
        assert call() == value  # the miss: fills the key
        mark = len(recording.sent)
        assert call() == value, what
        assert recording.by_this_thread(mark) == [("GET", guard.keys(name).value)], what
    assert guard.stats().l2_hits == 3
    recording.client.close()


def test_an_l1_hit_sends_nothing(redis_url: str, namespace: str) -> None:
    recording = _SentCommands(redis_url)
    guard = make_guard(recording.client, namespace, l1_maxsize=100, l1_ttl=60, rng=lambda: 0.5)
    assert guard.get_or_load("k", lambda: "v", ttl=60) == "v"
    mark = len(recording.sent)
    assert guard.get_or_load("k", lambda: "unused", ttl=60) == "v"
    assert recording.by_this_thread(mark) == []
    assert not [command for _, command in recording.sent[mark:] if command[0] == "GET"]
    assert guard.stats().l1_hits == 1
    guard.close()
    recording.client.close()


def test_a_refresh_begun_as_the_guard_closes_starts_no_pool(
    client: redis.Redis, namespace: str
) -> None:
    """A call that passed the closed check before close() and asks for a background
    refresh afterwards: no new pool of refresh threads (close() already ran, so it
    would never be shut down)."""
    guard = make_guard(client, namespace)
    guard.close()
    ran: list[str] = []

    def flow() -> Generator[Any, Any, None]:
        ran.append("refresh")
        yield from ()

    before = {t.name for t in threading.enumerate()}
    assert guard._start_background(flow(), "x") is False
    assert guard._executor is None
    assert not [
        t.name
        for t in threading.enumerate()
        if t.name.startswith("cacheguard-refresh") and t.name not in before
    ]
    assert ran == []


def test_unusable_bytes_replaced_by_another_fill_meanwhile_are_not_loaded_again(
    client: redis.Redis, other_client: redis.Redis, namespace: str
) -> None:
    """Bytes a reader cannot use (here: of a type the read no longer accepts) are
    overwritten by a fill of its own, unless another process replaced them between
    the reader's look and its fill: that value is served, not loaded a second time
    (after a deploy that changed a type, each process's first reader otherwise
    loaded the key again)."""
    reader = make_guard(client, namespace)
    other = make_guard(other_client, namespace)
    other.get_or_load("k", lambda: {"shape": "old"}, ttl=60)
    looks = 0

    def fits(value: Any) -> bool:
        nonlocal looks
        looks += 1
        usable = value == {"shape": "new"}
        if not usable and looks == 2:  # fill_begin found the old bytes: now the other fills
            filler = threading.Thread(
                target=lambda: other.refresh("k", lambda: {"shape": "new"}, ttl=60)
            )
            filler.start()
            filler.join(30)
        return usable

    loads: list[int] = []

    def load() -> dict[str, str]:
        loads.append(1)
        return {"shape": "mine"}

    assert reader._get_or_load("k", load, 60, MISSING, None, fits) == {"shape": "new"}
    assert looks == 3  # the GET, the first begin, the forced begin's answer
    assert loads == []
    assert other.peek("k") == {"shape": "new"}
