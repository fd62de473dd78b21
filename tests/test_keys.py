from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from cacheguard.keys import ResourceKeys, check_namespace


@given(st.text(min_size=1, max_size=60))
def test_every_key_of_a_resource_shares_one_slot(name: str) -> None:
    keys = ResourceKeys("cg", name)
    slots = {key_slot(k.encode()) for k in (keys.lock, keys.fence, keys.released_channel)}
    assert len(slots) == 1


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
