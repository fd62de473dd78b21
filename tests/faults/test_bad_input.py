"""Bad input: random bytes in a cache key, odd and hostile key names, wrong settings."""

from __future__ import annotations

import contextlib

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cacheguard import MISSING, CacheGuard, CacheLoader, JsonCodec, MsgpackCodec
from cacheguard.cache.entry import pack_entry, unpack_entry
from cacheguard.redis.keys import ResourceKeys
from tests.helpers import make_guard

CODECS = [MsgpackCodec(), JsonCodec()]


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=200), codec=st.sampled_from(CODECS))
def test_the_entry_decoder_takes_any_bytes(data: bytes, codec: object) -> None:
    """Random bytes decode or raise ValueError (a miss); nothing else, nothing executed."""
    with contextlib.suppress(ValueError):
        unpack_entry(codec, data)  # type: ignore[arg-type]


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    value=st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text() | st.binary(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=10,
    ),
    cut=st.integers(0, 400),
)
def test_truncated_entries_are_refused(value: object, cut: int) -> None:
    codec = MsgpackCodec()
    data = pack_entry(codec, value, created=1.0, ttl=60.0, version=1, load_duration=0.0)
    if cut < len(data):
        with pytest.raises(ValueError, match=r"."):
            unpack_entry(codec, data[:cut])
    else:
        assert unpack_entry(codec, data).value == value


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(junk=st.binary(max_size=100))
def test_garbage_in_the_cache_is_a_miss_and_is_replaced(
    client: redis.Redis, namespace: str, junk: bytes
) -> None:
    guard = make_guard(client, namespace)
    client.set(ResourceKeys(namespace, "k").value, junk)
    assert guard.get_or_load("k", lambda: "loaded", ttl=60) == "loaded"
    assert guard.peek("k") == "loaded"
    probe = guard.rwlock("k").remote.try_acquire_write(owner="probe")
    assert probe is not None  # no lock left behind
    probe.release()


@pytest.mark.parametrize(
    "menu_id",
    ["with space", "unicodé ☃", "{braces}", "a:b", "*", "%7B", "x" * 5000, "", "#digest"],
)
def test_odd_key_arguments_stay_inside_the_namespace_and_apart(
    client: redis.Redis, namespace: str, menu_id: str
) -> None:
    guard = make_guard(client, namespace)
    loader = CacheLoader(guard, key="menu:{menu_id}", load=lambda menu_id: menu_id, ttl=60)
    assert loader.get(menu_id) == menu_id
    assert loader.peek(menu_id) == menu_id
    name = loader.key(menu_id)
    assert len(name) <= guard.settings.max_key_length
    keys = ResourceKeys(namespace, name)
    written = [k.decode("utf-8", "surrogateescape") for k in client.scan_iter(f"{namespace}:*")]
    assert written, "nothing was written"
    assert all(k.startswith(f"{namespace}:{{") for k in written)
    # Value and lock share one hash tag (one cluster slot), whatever the argument.
    tag = keys.value[: keys.value.index("}") + 1]
    assert keys.lock.startswith(tag)
    assert keys.value.count("{") == keys.value.count("}") == 1
    # A neighbouring argument is a different key.
    assert loader.peek(menu_id + "x") is MISSING


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("lease", 0),
        ("lease", -1),
        ("lease", "30"),
        ("wait_timeout", 0),
        ("ttl_jitter", 1.5),
        ("none_ttl", -5),
        ("max_value_bytes", 0),
        ("namespace", "a{b}"),
        ("namespace", ""),
        ("on_timeout", "wait"),
        ("on_backend_error", "ignore"),
    ],
)
def test_bad_settings_are_refused_at_construction(
    client: redis.Redis, setting: str, value: object
) -> None:
    with pytest.raises((ValueError, TypeError)):
        CacheGuard(client, **{setting: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), "60", None])
def test_bad_ttls_are_refused_and_leave_nothing_behind(
    client: redis.Redis, namespace: str, ttl: object
) -> None:
    guard = make_guard(client, namespace)
    with pytest.raises((ValueError, TypeError)):
        guard.get_or_load("k", lambda: "x", ttl=ttl)  # type: ignore[arg-type]
    assert list(client.scan_iter(f"{namespace}:*")) == []
