"""The cache scripts' wire format: call builders and reply/message parsers, no I/O.

Each builder returns a :data:`~cacheguard.locks.redis.lua.ScriptCall` (script,
KEYS, ARGV) in the order the script's contract in :mod:`cacheguard.cache.scripts`
states; each parser turns a raw reply into a typed value. The fill flow uses
them, so the sync and asyncio drivers only send calls and hand back replies.
Scripted tests feed these parsers every reply shape, with no Redis.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cacheguard.cache.entry import Entry
from cacheguard.cache.scripts import (
    FILL_BEGIN,
    FILL_END,
    INVALIDATE,
    NEXT_STAMP,
    RAISE_WATERMARK,
    READ_WATERMARK,
    TIMED_GET,
)
from cacheguard.redis.keys import ResourceKeys
from cacheguard.redis.scripts import ScriptCall

__all__ = [
    "POISON_FLOOR",
    "Begin",
    "Decode",
    "Message",
    "fill_begin_call",
    "fill_end_call",
    "invalidate_call",
    "next_stamp_call",
    "parse_fill_begin",
    "parse_message",
    "parse_timed_get",
    "raise_watermark_call",
    "read_watermark_call",
    "timed_get_call",
]

# Versions at or above this are poisoned (see INVALIDATE): 2**52, far above what a
# sequence reaches (INCR once a microsecond: 142 years); a poisoned version carries
# a real one below 2**52 added to it, so it stays below 2**53, where Lua's doubles
# are exact.
POISON_FLOOR = 2**52

# Raw bytes (or the error a GET got, e.g. WRONGTYPE) -> an entry, None if unusable.
Decode = Callable[[Any], "Entry | None"]


@dataclass(frozen=True, slots=True)
class Begin:
    """The parsed reply of fill_begin."""

    # "expired": a value past its expiry that Redis still keeps (stale windows)
    kind: Literal["hit", "fill", "busy", "corrupt", "expired"]
    entry: Entry | None = None  # hit
    version: str = "0"  # fill: the version to compare at the store; busy: see since_us
    epoch: str = ""  # fill: our read hold's epoch
    begun_ms: int = 0  # fill: server time at the start
    # fill: when it began; busy: take announcements only of fills begun since then
    # whose entries are of ``version`` or newer
    since_us: int = 0
    wait: float = 0.0  # busy: seconds until worth retrying
    raw: bytes | None = None  # corrupt, expired: the bytes found unusable


@dataclass(frozen=True, slots=True)
class Message:
    """A parsed announcement on the key's channel."""

    kind: Literal["value", "stored", "not_stored", "aborted", "released"]
    entry: Entry | None = None
    fill_began_us: int = 0  # value: when the fill that stored it began


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def fill_begin_call(
    keys: ResourceKeys,
    *,
    owner: str,
    lease_ms: int,
    refresh: bool,
    version_ttl_ms: int,
    replacing: bytes | None = None,
) -> ScriptCall:
    """``replacing`` (with ``refresh``): the bytes found unusable, overwritten only if
    the key still holds them (else the reply is the value that replaced them)."""
    args: list[Any] = [owner, lease_ms, "1" if refresh else "0", version_ttl_ms]
    if replacing is not None:
        args.append(replacing)
    return FILL_BEGIN, [keys.value, keys.lock, keys.version], args


def timed_get_call(keys: ResourceKeys) -> ScriptCall:
    return (TIMED_GET, [keys.value], [])


def parse_timed_get(reply: Sequence[Any]) -> tuple[Any, float]:
    """The value's raw reply (bytes, None, or the error a GET of another type of key
    gave) and the server's clock in seconds."""
    return reply[0], int(reply[1]) + int(reply[2]) / 1e6


def parse_fill_begin(reply: Sequence[Any], decode: Decode, now: float) -> Begin:
    """``now``: the server's clock (seconds), to tell a live value from one kept
    past expiry."""
    status = int(reply[0])
    if status == 0:
        entry = decode(reply[1])
        if entry is None:
            return Begin("corrupt", raw=reply[1])
        if now >= entry.expires_at:  # kept only for stale serving
            return Begin("expired", raw=reply[1])
        return Begin("hit", entry=entry)
    if status == 1:
        return Begin(
            "fill",
            version=_text(reply[1]),
            epoch=_text(reply[2]),
            begun_ms=int(reply[3]),
            since_us=int(reply[4]),
        )
    return Begin(
        "busy",
        wait=max(int(reply[1]), 0) / 1000.0,
        since_us=int(reply[3]),
        version=_text(reply[4]),
    )


def fill_end_call(
    keys: ResourceKeys,
    *,
    owner: str,
    begin: Begin,
    version_ttl_ms: int,
    data: bytes,
    px: int,
    announce_limit: int,
    failed: bool,
    snapshot: int | None,
) -> ScriptCall:
    return (
        FILL_END,
        [keys.value, keys.lock, keys.version],
        [
            owner,
            begin.epoch,
            begin.version,
            begin.begun_ms,
            version_ttl_ms,
            data,
            px,
            keys.released_channel,
            announce_limit,
            "1" if failed else "0",
            "" if snapshot is None else snapshot,
            begin.since_us,
        ],
    )


def parse_message(payload: bytes, decode: Decode) -> Message:
    kind = payload[:1]
    if kind == b"V":
        began, _, data = payload[1:].partition(b":")
        entry = decode(data) if began.isdigit() else None
        if entry is None:
            return Message("stored")  # read it from the key instead
        return Message("value", entry, int(began))
    if kind == b"S":
        return Message("stored")
    if kind == b"A":
        return Message("aborted")
    if kind == b"N":
        return Message("not_stored")
    return Message("released")


def invalidate_call(
    keys: ResourceKeys,
    *,
    version_ttl_ms: int,
    l1_channel: str,
    name: str,
    stamp: int | None,
    heals: int | None = None,
) -> ScriptCall:
    """``stamp`` None: the sequence is unreachable, poison the version; ``heals``: the
    poisoned version this caller wrote, which ``stamp`` replaces if still there."""
    return (
        INVALIDATE,
        [keys.value, keys.version, keys.lock],
        [
            version_ttl_ms,
            l1_channel,
            name,
            "" if stamp is None else stamp,
            "" if heals is None else heals,
            POISON_FLOOR,
        ],
    )


def next_stamp_call(watermark_key: str) -> ScriptCall:
    return (NEXT_STAMP, [watermark_key], [])


def read_watermark_call(watermark_key: str) -> ScriptCall:
    return (READ_WATERMARK, [watermark_key], [])


def raise_watermark_call(watermark_key: str, highest: int) -> ScriptCall:
    return (RAISE_WATERMARK, [watermark_key], [highest])
