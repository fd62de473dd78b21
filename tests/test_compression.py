"""Compression (``compress``, ``compress_min_size``; cache/compression.py, cache/entry.py):
the entry's format byte, the threshold, every single-bit flip of a compressed payload
refused or harmless, bounded inflating; then both guards on the real Redis: every way
in reads and stores compressed entries, entries of every setting (and of the code
before compression) read by every guard without a reload, corrupt compressed entries
are counted misses, the announcement, the stale window and the gutter."""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import sys
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgpack
import pytest
import redis
import redis.asyncio
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheguard import MISSING, CacheGuard
from cacheguard.aio import AsyncCacheGuard
from cacheguard.cache import compression
from cacheguard.cache import entry as entry_module
from cacheguard.cache.codec import MsgpackCodec, PickleCodec
from cacheguard.cache.entry import HEADER_SIZE, pack_entry, unpack_entry
from cacheguard.cache.outage.gutter import gutter_settings
from cacheguard.cache.settings import GuardSettings
from cacheguard.testing import free_port
from tests.guard_drivers import KINDS, Guard, guard_from_url
from tests.helpers import subscribers, wait_until

Make = Callable[..., Guard]
CODEC = MsgpackCodec()
FORMATS = ("zlib", "zstd")
PLAIN, ZLIB, ZSTD = b"\xcb\x01", b"\xcb\x02", b"\xcb\x03"
MAGIC = {None: PLAIN, "zlib": ZLIB, "zstd": ZSTD}
# A 200-row menu list: about 9 KB encoded, a tenth of that compressed.
MENU = [
    {"id": i, "name": f"menu {i}", "parent_id": i // 10, "sort": i, "url": f"/m/{i}"}
    for i in range(200)
]


def server_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return seconds + micros / 1e6


def entry_of_before(value: Any, *, created: float, ttl: float) -> bytes:
    """An entry as the code before compression wrote it, built from its layout by
    hand: b"\\xcb\\x01", msgpack's codec id, created, ttl, version, load; the payload."""
    header = b"\xcb\x01" + bytes([1]) + struct.pack("<ddqd", created, ttl, 0, 0.01)
    return header + msgpack.packb(value, use_bin_type=True)


def packed(value: Any, compress: str | None = None, **kwargs: Any) -> bytes:
    return pack_entry(
        CODEC, value, created=1.0, ttl=60.0, version=0, load_duration=0.0,
        compress=compress, **kwargs,
    )  # fmt: skip


def of_size(size: int) -> bytes:
    """A value msgpack encodes in exactly ``size`` bytes (256..65537: bin 16)."""
    value = b"a" * (size - 3)
    assert len(CODEC.encode(value)) == size
    return value


# -- the format, no Redis --------------------------------------------------------------------


def test_entries_written_before_compression_still_decode() -> None:
    old = entry_of_before(MENU, created=5.0, ttl=60.0)
    for compress in (None, *FORMATS):  # the plain format is unchanged
        assert old == pack_entry(
            CODEC, MENU, created=5.0, ttl=60.0, version=0, load_duration=0.01,
            compress=compress, compress_min_size=len(old),  # type: ignore[arg-type]
        )  # fmt: skip
    entry = unpack_entry(CODEC, old)
    assert (entry.value, entry.created, entry.ttl, entry.version) == (MENU, 5.0, 60.0, 0)


@pytest.mark.parametrize("name", FORMATS)
def test_compressed_entries_name_their_format_and_decode_anywhere(name: str) -> None:
    data = packed(MENU, name)
    assert data[:2] == MAGIC[name]
    assert len(data) < len(packed(MENU)) / 4
    assert unpack_entry(CODEC, data).value == MENU


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("threshold", [300, 1024, 4096])
def test_the_threshold_is_the_smallest_payload_compressed(name: str, threshold: int) -> None:
    below = packed(of_size(threshold - 1), name, compress_min_size=threshold)
    at = packed(of_size(threshold), name, compress_min_size=threshold)
    assert below[:2] == PLAIN
    assert at[:2] == MAGIC[name]
    assert unpack_entry(CODEC, at).value == of_size(threshold)


def test_the_default_threshold_is_one_kib() -> None:
    assert GuardSettings().compress_min_size == 1024
    assert GuardSettings().compress is None


@pytest.mark.parametrize("name", FORMATS)
def test_a_payload_compression_would_not_shrink_is_stored_plain(name: str) -> None:
    noise = os.urandom(4000)
    data = packed(noise, name)
    assert data[:2] == PLAIN
    assert unpack_entry(CODEC, data).value == noise


@pytest.mark.parametrize("name", FORMATS)
def test_every_bit_flip_of_a_compressed_payload_is_refused_or_harmless(name: str) -> None:
    value = [{"row": i, "text": "menu item"} for i in range(60)]
    data = packed(value, name, compress_min_size=0)
    assert data[:2] == MAGIC[name]
    wrong = refused = 0
    for index in range(HEADER_SIZE, len(data)):
        for bit in range(8):
            flipped = bytearray(data)
            flipped[index] ^= 1 << bit
            try:
                got = unpack_entry(CODEC, bytes(flipped)).value
            except ValueError:
                refused += 1
                continue
            wrong += got != value
    assert wrong == 0
    assert refused > 0.9 * 8 * (len(data) - HEADER_SIZE)


@pytest.mark.parametrize("name", FORMATS)
def test_truncated_or_extended_compressed_payloads_are_refused(name: str) -> None:
    data = packed(MENU, name)
    for cut in range(HEADER_SIZE, len(data)):
        with pytest.raises(ValueError, match=r"."):
            unpack_entry(CODEC, data[:cut])
    with pytest.raises(ValueError, match="other bytes"):
        unpack_entry(CODEC, data + b"\x00")
    with pytest.raises(ValueError, match="other bytes"):
        unpack_entry(CODEC, data + data[HEADER_SIZE:])  # a second stream after the first


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(FORMATS), payload=st.binary(max_size=300))
def test_any_bytes_after_a_compressed_header_decode_or_raise_value_error(
    name: str, payload: bytes
) -> None:
    header = packed("x")[:HEADER_SIZE]
    with contextlib.suppress(ValueError):
        unpack_entry(CODEC, MAGIC[name] + header[2:] + payload)


def test_an_unknown_format_is_refused() -> None:
    data = packed(MENU, "zlib")
    with pytest.raises(ValueError, match="bad magic"):
        unpack_entry(CODEC, b"\xcb\x04" + data[2:])


@pytest.mark.parametrize("name", FORMATS)
def test_inflating_is_bounded(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bomb = packed(bytes(1 << 20), name)  # a MiB of zeros: a few KiB stored
    assert bomb[:2] == MAGIC[name]
    assert len(bomb) < 8 * 1024
    monkeypatch.setattr(compression, "MAX_INFLATED", 64 * 1024)
    with pytest.raises(ValueError, match=r"."):
        unpack_entry(CODEC, bomb)
    # Larger than the bound: stored as it is, never as an entry no reader takes.
    assert packed(bytes(65 * 1024), name)[:2] == PLAIN


@pytest.mark.parametrize("name", FORMATS)
def test_a_signed_compressed_entry_is_authenticated_before_it_is_inflated(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    codec = PickleCodec(b"k" * 32)
    inflated: list[int] = []
    real_inflate = entry_module.inflate

    def counted(how: Any, data: memoryview) -> bytes:
        inflated.append(len(data))
        return real_inflate(how, data)

    monkeypatch.setattr(entry_module, "inflate", counted)
    genuine = pack_entry(
        codec, MENU, created=0.0, ttl=60.0, version=0, load_duration=0.0, compress=name
    )
    assert genuine[:2] == MAGIC[name]
    assert unpack_entry(codec, genuine).value == MENU
    assert len(inflated) == 1
    # A bomb with the pickle codec's id but no signature over its compressed bytes: a
    # few KiB inflating to a MiB (up to MAX_INFLATED for a larger one), never inflated.
    bomb = packed(bytes(1 << 20), name)
    forged = bomb[:2] + bytes([codec.codec_id]) + bomb[3:]
    # The layout before: the codec's signed payload, compressed, unsigned outside.
    before = compression.deflate(name, codec.encode(bytes(1 << 20)))
    assert before is not None
    signed_inside = genuine[:HEADER_SIZE] + before
    other_key = pack_entry(
        PickleCodec(b"o" * 32),
        MENU,
        created=0.0,
        ttl=60.0,
        version=0,
        load_duration=0.0,
        compress=name,
    )
    tampered = genuine[:-1] + bytes([genuine[-1] ^ 1])
    for refused in (forged, signed_inside, other_key, tampered):
        with pytest.raises(ValueError, match="signature"):
            unpack_entry(codec, refused)
    assert len(inflated) == 1


def content_size_field(frame: bytes) -> tuple[int, int]:
    """Where a zstd frame header keeps its content size: (offset, length)."""
    descriptor = frame[4]
    single_segment = descriptor >> 5 & 1
    start = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]
    return start, (single_segment, 2, 4, 8)[descriptor >> 6]


def test_a_zstd_frame_that_lies_about_its_size_is_refused() -> None:
    payload = CODEC.encode([MENU] * 20)  # about 190 KB: a 4-byte content size
    frame = zstandard.ZstdCompressor(write_checksum=True).compress(payload)
    start, length = content_size_field(frame)
    assert length == 4
    assert int.from_bytes(frame[start : start + 4], "little") == len(payload)
    header = packed("x")[:HEADER_SIZE]
    for claimed in (100, len(payload) - 1, len(payload) + 1, 1 << 31):
        lying = frame[:start] + claimed.to_bytes(4, "little") + frame[start + 4 :]
        assert zstandard.get_frame_parameters(lying).content_size == claimed
        with pytest.raises(ValueError, match=r"."):
            unpack_entry(CODEC, ZSTD + header[2:] + lying)
    assert unpack_entry(CODEC, ZSTD + header[2:] + frame).value == [MENU] * 20
    unchecked = zstandard.ZstdCompressor(write_checksum=False).compress(payload)
    with pytest.raises(ValueError, match="not ours"):
        unpack_entry(CODEC, ZSTD + header[2:] + unchecked)


def test_a_zstd_entry_without_zstandard_is_refused_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = packed(MENU, "zstd")
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(ValueError, match=r"cacheguard-redis\[zstd\]"):
        unpack_entry(CODEC, data)
    assert unpack_entry(CODEC, packed(MENU, "zlib")).value == MENU


# -- settings ------------------------------------------------------------------------------


def made(kind: str, client: redis.Redis, redis_url: str, **settings: Any) -> None:
    """Make (and close) a guard of ``kind`` with ``settings``."""
    if kind == "sync":
        CacheGuard(client, **settings).close()
    else:
        AsyncCacheGuard(redis.asyncio.Redis.from_url(redis_url), **settings)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bad", ["gzip", "ZLIB", "", 1, True, b"zlib"])
def test_an_unknown_compression_is_refused_at_construction(
    kind: str, bad: object, client: redis.Redis, redis_url: str
) -> None:
    with pytest.raises(ValueError, match="compress must be None, 'zlib' or 'zstd'"):
        made(kind, client, redis_url, compress=bad)


@pytest.mark.parametrize("kind", KINDS)
def test_zstd_without_zstandard_is_refused_naming_the_extra(
    kind: str, client: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(ImportError, match=r"pip install 'cacheguard-redis\[zstd\]'"):
        made(kind, client, redis_url, compress="zstd")
    with pytest.raises(ImportError, match=r"cacheguard-redis\[zstd\]"):
        guard_from_url(kind, redis_url, compress="zstd")
    made(kind, client, redis_url, compress="zlib")  # zlib needs nothing


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1024", None])
def test_a_bad_threshold_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="compress_min_size"):
        GuardSettings(compress="zlib", compress_min_size=bad)  # type: ignore[arg-type]


def test_the_gutter_compresses_as_its_primary() -> None:
    primary = GuardSettings(compress="zlib", compress_min_size=10)
    gutter = GuardSettings(**gutter_settings(primary))
    assert (gutter.compress, gutter.compress_min_size) == ("zlib", 10)


# -- both guards on the real Redis ---------------------------------------------------------


@pytest.fixture(params=KINDS)
async def make(
    request: pytest.FixtureRequest, redis_url: str, namespace: str
) -> AsyncIterator[Make]:
    made: list[Guard] = []

    def build(url: str | None = None, **settings: Any) -> Guard:
        settings.setdefault("namespace", namespace)
        settings.setdefault("ttl_jitter", 0)
        if url is not None:  # a guard that owns its client (the gutter's tests)
            made.append(Guard(request.param, guard_from_url(request.param, url, **settings)))
        elif request.param == "sync":
            made.append(Guard("sync", CacheGuard(redis.Redis.from_url(redis_url), **settings)))
        else:
            client = redis.asyncio.Redis.from_url(redis_url)
            made.append(Guard("async", AsyncCacheGuard(client, **settings)))
        return made[-1]

    yield build
    for guard in made:
        if guard.guard._state.owns_client:
            if isinstance(guard.guard, AsyncCacheGuard):
                await guard.guard.aclose()
            else:
                guard.guard.close()
        else:
            await guard.close()


def never() -> Any:
    raise AssertionError("loaded, where the entry should have been read")


def raw(client: redis.Redis, guard: Guard, name: str) -> bytes:
    data = client.get(guard.keys(name).value)
    assert isinstance(data, bytes)
    return data


@pytest.mark.parametrize("name", FORMATS)
async def test_every_way_in_stores_and_reads_compressed_entries(
    make: Make, client: redis.Redis, name: str
) -> None:
    writer, reader = make(compress=name), make()  # the reader does not compress
    assert await writer.get_or_load("menu:list", lambda: MENU, ttl=60) == MENU
    assert raw(client, writer, "menu:list")[:2] == MAGIC[name]
    assert await reader.get_or_load("menu:list", never, ttl=60) == MENU  # the hit path
    assert await reader.peek("menu:list") == MENU
    assert await writer.peek("menu:list") == MENU

    menu = writer.loader(key="menu:{menu_id}", load=lambda menu_id: MENU[:menu_id], ttl=60)
    assert await menu.get(150) == MENU[:150]
    assert raw(client, writer, "menu:150")[:2] == MAGIC[name]
    assert (
        await reader.loader(key="menu:{menu_id}", load=lambda menu_id: never(), ttl=60).get(150)
        == MENU[:150]
    )
    assert await menu.peek(150) == MENU[:150]

    @writer.decorate(key="rows:{count}", ttl=60)
    def rows(count: int) -> list[dict[str, Any]]:
        return MENU[:count]

    assert await rows(120) == MENU[:120]
    assert raw(client, writer, "rows:120")[:2] == MAGIC[name]
    assert await rows.peek(120) == MENU[:120]

    assert await writer.refresh("menu:list", lambda: MENU[::-1], ttl=60) == MENU[::-1]
    assert raw(client, writer, "menu:list")[:2] == MAGIC[name]
    assert await reader.get_or_load("menu:list", never, ttl=60) == MENU[::-1]
    # Below the threshold, plain as ever.
    assert await writer.get_or_load("small", lambda: {"a": 1}, ttl=60) == {"a": 1}
    assert raw(client, writer, "small")[:2] == PLAIN
    assert reader.stats().corrupt_entries == writer.stats().corrupt_entries == 0
    assert reader.stats().loads == 0


async def test_entries_of_every_setting_read_in_every_guard(
    make: Make, client: redis.Redis
) -> None:
    writers = {str(name): make(compress=name) for name in (None, *FORMATS)}
    for setting, writer in writers.items():
        await writer.get_or_load(f"by-{setting}", lambda setting=setting: [setting, *MENU], ttl=60)
    some = writers["None"]
    old = entry_of_before(["before", *MENU], created=server_now(client), ttl=60)
    client.set(some.keys("by-before").value, old, ex=60)
    assert [raw(client, some, f"by-{s}")[:2] for s in ("None", "zlib", "zstd", "before")] == [
        PLAIN,
        ZLIB,
        ZSTD,
        PLAIN,
    ]
    for setting in (None, *FORMATS):
        reader = make(compress=setting)
        for written in ("None", "zlib", "zstd", "before"):
            assert await reader.get_or_load(f"by-{written}", never, ttl=60) == [written, *MENU]
            assert await reader.peek(f"by-{written}") == [written, *MENU]
        assert reader.stats().corrupt_entries == reader.stats().loads == 0


def flip_in_payload(data: bytes) -> bytes:
    middle = (HEADER_SIZE + len(data)) // 2
    return data[:middle] + bytes([data[middle] ^ 0x10]) + data[middle + 1 :]


CORRUPTIONS: dict[str, Callable[[bytes], bytes]] = {
    "flipped-byte": flip_in_payload,
    "truncated": lambda data: data[:-7],
    "garbage-after-the-header": lambda data: data[:HEADER_SIZE] + b"not a stream" * 20,
    "unknown-format": lambda data: b"\xcb\x09" + data[2:],
}


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("corruption", CORRUPTIONS)
async def test_a_corrupt_compressed_entry_is_a_counted_miss_and_is_replaced(
    make: Make, client: redis.Redis, name: str, corruption: str
) -> None:
    writer, reader = make(compress=name), make(compress=name)
    await writer.get_or_load("menu:list", lambda: MENU, ttl=60)
    key = writer.keys("menu:list").value
    client.set(key, CORRUPTIONS[corruption](raw(client, writer, "menu:list")), ex=60)
    assert await reader.peek("menu:list") is MISSING
    assert reader.stats().corrupt_entries == 1
    fresh = [{"reloaded": True}, *MENU]
    assert await reader.get_or_load("menu:list", lambda: fresh, ttl=60) == fresh
    assert reader.stats().corrupt_entries >= 2
    assert reader.stats().loads == 1
    assert raw(client, reader, "menu:list")[:2] == MAGIC[name]  # replaced, compressed again
    assert await writer.get_or_load("menu:list", never, ttl=60) == fresh
    assert writer.stats().corrupt_entries == 0


async def test_a_zstd_entry_read_without_zstandard_is_a_counted_miss(
    make: Make, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = make(compress="zstd")
    await writer.get_or_load("menu:list", lambda: MENU, ttl=60)
    reader = make()
    monkeypatch.setitem(sys.modules, "zstandard", None)  # a process without the extra
    assert await reader.get_or_load("menu:list", lambda: ["reloaded"], ttl=60) == ["reloaded"]
    assert reader.stats().corrupt_entries >= 1
    assert raw(client, reader, "menu:list")[:2] == PLAIN  # its own setting: not compressed


@pytest.mark.parametrize("name", FORMATS)
async def test_a_waiting_guard_takes_a_compressed_value_from_the_fill(
    make: Make, client: redis.Redis, name: str
) -> None:
    # Two guards on one namespace: two lock owners, as two processes; the second
    # waits for the first's fill and takes its (compressed) entry when it ends.
    filler, waiter = make(compress=name), make()
    gate, started = threading.Event(), threading.Event()

    def load() -> list[dict[str, Any]]:
        started.set()
        assert gate.wait(30)
        return MENU

    def load_on_the_loop() -> Any:
        if filler.kind == "sync":
            return load()

        async def gated() -> list[dict[str, Any]]:
            started.set()
            assert await asyncio.to_thread(gate.wait, 30)
            return MENU

        return gated()

    filling = asyncio.ensure_future(filler.get_or_load("menu:list", load_on_the_loop, ttl=60))
    assert await asyncio.to_thread(started.wait, 10)
    waiting = asyncio.ensure_future(waiter.get_or_load("menu:list", never, ttl=60))
    channel = waiter.keys("menu:list").released_channel
    assert await asyncio.to_thread(wait_until, lambda: subscribers(client, channel) >= 1, 10)
    gate.set()
    assert await filling == MENU
    assert await waiting == MENU
    assert waiter.stats().loads == 0
    assert waiter.stats().corrupt_entries == 0


@pytest.mark.parametrize("name", FORMATS)
async def test_a_stale_compressed_entry_is_served_while_it_is_refreshed(
    make: Make, client: redis.Redis, name: str
) -> None:
    guard = make(compress=name, stale_ttl=3600)
    aged = pack_entry(
        guard.guard.settings.codec, MENU, created=server_now(client) - 120, ttl=60,
        version=0, load_duration=0.01, compress=name,  # type: ignore[arg-type]
    )  # fmt: skip
    assert aged[:2] == MAGIC[name]
    client.set(guard.keys("menu:list").value, aged, ex=3600)
    newer = [{"refreshed": True}, *MENU]
    assert await guard.get_or_load("menu:list", lambda: newer, ttl=60) == MENU  # stale
    assert guard.stats().stale_served == 1
    assert await asyncio.to_thread(
        wait_until, lambda: client.get(guard.keys("menu:list").value) != aged, 10
    )
    assert await guard.get_or_load("menu:list", never, ttl=60) == newer
    assert raw(client, guard, "menu:list")[:2] == MAGIC[name]


async def test_the_gutter_stores_and_reads_compressed_entries(
    make: Make, client: redis.Redis, redis_url: str, namespace: str
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    options = {"gutter": redis_url, "connect_timeout": 0.5, "breaker_cooldown": 60.0}
    first = make(dead, compress="zlib", breaker_failures=1, **options)
    second = make(dead, breaker_failures=1, **options)  # reads what the first stored
    try:
        assert await first.get_or_load("menu:list", lambda: MENU, ttl=60) == MENU
        gutter_key = first.guard._state.gutter.keys("menu:list").value
        stored = client.get(gutter_key)
        assert isinstance(stored, bytes)
        assert stored[:2] == ZLIB
        assert await second.get_or_load("menu:list", never, ttl=60) == MENU
        assert second.stats().gutter_reads >= 1
    finally:
        keys = list(client.scan_iter(match=f"{namespace}-gutter:*"))
        if keys:
            client.delete(*keys)
