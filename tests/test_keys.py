"""Key layout: one slot per resource, distinct names, braces that cannot escape the tag."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from cacheguard.redis.keys import ResourceKeys, check_namespace, hash_tag, name_from_tag


def resource_key_names() -> list[str]:
    """Every key and channel ``ResourceKeys`` derives (its properties), so one added
    later is covered without touching these tests."""
    return sorted(n for n, v in vars(ResourceKeys).items() if isinstance(v, property))


def cluster_hash_input(key: str) -> str:
    """What Redis Cluster hashes for ``key``: the text between the first ``{`` and the
    first ``}`` after it when that text is not empty, else the whole key."""
    start = key.find("{")
    if start != -1:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def test_the_derived_keys_are_enumerated() -> None:
    assert {"value", "version", "lock", "fence", "released_channel"} <= set(resource_key_names())


@given(st.text(min_size=1, max_size=60), st.sampled_from(["cg", "t:x", "a%b", "ns 1"]))
def test_every_key_of_a_resource_shares_one_slot(name: str, namespace: str) -> None:
    keys = ResourceKeys(namespace, name)
    derived = {attr: getattr(keys, attr) for attr in resource_key_names()}
    for attr, key in derived.items():
        # The tag Redis extracts is exactly the escaped name: nothing else moves the slot.
        assert cluster_hash_input(key) == hash_tag(name), attr
        assert name_from_tag(cluster_hash_input(key)) == name, attr
    slots = {attr: key_slot(key.encode()) for attr, key in derived.items()}
    assert set(slots.values()) == {key_slot(hash_tag(name).encode())}, slots


def test_hash_tag_rule_examples() -> None:
    assert cluster_hash_input("cg:{a}:v") == "a"
    assert cluster_hash_input("cg:{}:v") == "cg:{}:v"  # an empty tag hashes the whole key
    assert cluster_hash_input("cg:{a}{b}") == "a"  # the first tag only
    assert cluster_hash_input("cg:{a") == "cg:{a"
    # redis-py agrees: the slot of a tagged key is the slot of its tag.
    assert key_slot(b"x:{menu:list}:v") == key_slot(b"menu:list")


@given(st.text(min_size=1, max_size=30), st.text(min_size=1, max_size=30))
def test_distinct_names_get_distinct_keys(a: str, b: str) -> None:
    if a != b:
        assert ResourceKeys("cg", a).lock != ResourceKeys("cg", b).lock


def test_braces_cannot_end_the_tag_early() -> None:
    keys = ResourceKeys("cg", "}x{y}")
    assert keys.lock == "cg:{%7Dx%7By%7D}:rw"


@pytest.mark.parametrize("bad", ["", "a{b", "a}b"])
def test_bad_namespaces(bad: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        check_namespace(bad)
