"""Codecs: values round-trip as docs/guide.md's value-type table says (the table is
read from the guide and checked cell by cell against a real Redis); values that
would not decode are refused at the store; guards with different codecs on one
namespace read each other's entries."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import redis

from cacheguard import (
    MISSING,
    CacheGuard,
    JsonCodec,
    MsgpackCodec,
    PickleCodec,
    SerializationError,
)
from tests.helpers import make_guard

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guide.md"
KEY = b"k" * 16


class Color(enum.IntEnum):
    RED = 1


class Tag(str):
    pass


@dataclass
class Point:
    x: int
    y: int


NAMES = {
    "Color": Color,
    "Tag": Tag,
    "Point": Point,
    "datetime": datetime,
    "date": date,
    "timezone": timezone,
    "Decimal": Decimal,
    "UUID": UUID,
}
CODECS = {"MsgpackCodec": MsgpackCodec, "JsonCodec": JsonCodec, "PickleCodec": PickleCodec}


def _cell(text: str) -> str:
    match = re.fullmatch(r"`(.*)`(?: \(.*\))?", text.strip())
    return match.group(1) if match else text.strip()


def table_rows() -> list[tuple[str, str, str]]:
    """(loaded value, codec name, expected cell) for every cell of the table."""
    text = GUIDE.read_text(encoding="utf-8")
    block = text.split("<!-- value-types:begin -->")[1].split("<!-- value-types:end -->")[0]
    lines = [line for line in block.strip().splitlines() if line.startswith("|")]
    header = [c.strip().strip("`").split(" ")[0] for c in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        values = cells[0].split("`, `")  # "`None`, `True`" lists several values
        for loaded in values if len(values) == 1 else [f"`{v.strip('`')}`" for v in values]:
            for codec_name, expected in zip(header[1:], cells[1:], strict=True):
                rows.append((_cell(loaded), codec_name.strip("`"), expected))
    return rows


ROWS = table_rows()


def test_the_table_covers_every_codec_and_the_type_changes() -> None:
    assert {codec for _, codec, _ in ROWS} == set(CODECS)
    loaded = {value for value, _, _ in ROWS}
    for needed in ('(1, "a")', '{1: "a"}', '{(1, 2): "a"}', "Color.RED"):
        assert needed in loaded


def _same(got: Any, want: Any) -> bool:
    if type(got) is not type(want):
        return False
    return bool(got == want)


@pytest.mark.parametrize(("loaded", "codec_name", "expected"), ROWS)
def test_the_value_type_table_holds(
    client: redis.Redis, namespace: str, loaded: str, codec_name: str, expected: str
) -> None:
    codec = CODECS[codec_name](KEY) if codec_name == "PickleCodec" else CODECS[codec_name]()
    writer = make_guard(client, namespace, codec=codec)
    reader = make_guard(client, namespace, codec=codec)
    value = eval(loaded, dict(NAMES))
    if expected == "refused":
        with pytest.raises(SerializationError):
            writer.get_or_load("k", lambda: value, ttl=60)
        assert not client.exists(writer.keys("k").value)
        assert not client.exists(writer.keys("k").lock)
        return
    want = value if expected == "same" else eval(_cell(expected), dict(NAMES))
    assert writer.get_or_load("k", lambda: value, ttl=60) is value  # the loader's own object
    got = reader.get_or_load("k", lambda: pytest.fail("reloaded"), ttl=60)
    assert _same(got, want), f"{loaded} via {codec_name}: got {got!r}, table says {want!r}"


def test_a_value_that_would_not_decode_is_refused_once_and_nothing_is_left(
    client: redis.Redis, namespace: str
) -> None:
    guard = make_guard(client, namespace)
    with pytest.raises(SerializationError, match="not decode"):
        guard.get_or_load("k", lambda: {(1, 2): "pair"}, ttl=60)
    assert not client.exists(guard.keys("k").lock)
    assert guard.stats().corrupt_entries == 0
    assert guard.get_or_load("k", lambda: {"1,2": "pair"}, ttl=60) == {"1,2": "pair"}
    assert guard.peek("k") == {"1,2": "pair"}


@pytest.mark.parametrize(
    ("first", "second"),
    [(MsgpackCodec(), JsonCodec()), (JsonCodec(), MsgpackCodec())],
    ids=["msgpack then json", "json then msgpack"],
)
def test_guards_with_different_codecs_read_each_others_entries(
    client: redis.Redis, namespace: str, first: Any, second: Any
) -> None:
    writer = make_guard(client, namespace, codec=second)
    reader = make_guard(client, namespace, codec=first)
    assert writer.get_or_load("k", lambda: {"a": [1, 2]}, ttl=60) == {"a": [1, 2]}
    assert reader.get_or_load("k", lambda: pytest.fail("reloaded"), ttl=60) == {"a": [1, 2]}
    assert reader.stats().corrupt_entries == 0


def test_a_pickle_entry_stays_unreadable_without_its_key(
    client: redis.Redis, namespace: str
) -> None:
    writer = make_guard(client, namespace, codec=PickleCodec(KEY))
    writer.get_or_load("k", lambda: {1, 2}, ttl=60)
    other_key = make_guard(client, namespace, codec=PickleCodec(b"o" * 16))
    msgpack_reader = make_guard(client, namespace)
    assert other_key.peek("k") is MISSING
    assert other_key.get_or_load("k", lambda: "reloaded", ttl=60) == "reloaded"
    writer.get_or_load("j", lambda: {3}, ttl=60)
    assert msgpack_reader.get_or_load("j", lambda: "reloaded", ttl=60) == "reloaded"


@pytest.mark.parametrize("unsigned", [MsgpackCodec(), JsonCodec()], ids=["msgpack", "json"])
def test_a_pickle_guard_reads_no_unsigned_entry(
    client: redis.Redis, namespace: str, unsigned: Any
) -> None:
    # Whoever can write to Redis can write a msgpack or JSON entry: no code runs, but
    # its value is theirs. A signing codec's guard refuses it, as it refuses a forgery.
    writer = make_guard(client, namespace, codec=unsigned)
    assert writer.get_or_load("k", lambda: {"admin": True}, ttl=60) == {"admin": True}
    signed = make_guard(client, namespace, codec=PickleCodec(KEY))
    assert signed.peek("k") is MISSING
    assert signed.get_or_load("k", lambda: {"admin": False}, ttl=60) == {"admin": False}
    assert signed.stats().corrupt_entries >= 1
    assert signed.get_or_load("k", lambda: pytest.fail("reloaded"), ttl=60) == {"admin": False}


class Borrowed:
    codec_id = 1  # msgpack's

    def encode(self, value: Any) -> bytes:
        return b""

    def decode(self, data: bytes | memoryview) -> Any:
        return None


class NoId:
    def encode(self, value: Any) -> bytes:
        return b""

    def decode(self, data: bytes | memoryview) -> Any:
        return None


def test_custom_codecs_are_checked(client: redis.Redis) -> None:
    with pytest.raises(ValueError, match="belongs to"):
        CacheGuard(client, codec=Borrowed())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="codec_id"):
        CacheGuard(client, codec=NoId())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="encode"):
        CacheGuard(client, codec=object())  # type: ignore[arg-type]
