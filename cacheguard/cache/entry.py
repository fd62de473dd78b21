"""The envelope stored per cache entry.

Layout: a fixed 35-byte header, then the codec's payload::

    magic  b"\\xcb\\x01"   2 bytes   format version 1
    codec  uint8          1         which codec wrote the payload
    created  float64      8         when the value was loaded: seconds by the Redis
                                    server's clock (see cache/server_clock.py)
    ttl      float64      8         logical lifetime in seconds
    version  int64        8         the key's invalidation version at fill time
    load     float64      8         how long the load took (seconds)

The header is read with one ``struct.unpack``, so a cache hit costs one GET plus
the payload's own decode. Bytes that do not match (corrupt, truncated, foreign,
another codec) raise ``ValueError``; the cache treats that as a miss.
"""

from __future__ import annotations

import struct
from typing import Any, Final, NamedTuple

from cacheguard.cache.codec import Codec, reader_for

__all__ = ["HEADER_SIZE", "MISSING", "Entry", "Missing", "pack_entry", "unpack_entry"]

_MAGIC = b"\xcb\x01"
_HEADER = struct.Struct("<2sBddqd")
HEADER_SIZE = _HEADER.size


class Missing:
    """The type of :data:`MISSING`: "nothing cached" from ``peek``, "the guard's
    default" for a ``none_ttl`` argument."""

    _instance: Missing | None = None

    def __new__(cls) -> Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Final = Missing()


class Entry(NamedTuple):
    """A decoded cache entry (a tuple: built on every hit, so it must be cheap)."""

    value: Any
    created: float
    ttl: float
    version: int
    load_duration: float

    @property
    def expires_at(self) -> float:
        return self.created + self.ttl


_new_entry = tuple.__new__


def pack_entry(
    codec: Codec,
    value: Any,
    *,
    created: float,
    ttl: float,
    version: int,
    load_duration: float,
) -> bytes:
    """Encode ``value`` with its metadata; :class:`SerializationError` if it cannot."""
    payload = codec.encode(value)
    return _HEADER.pack(_MAGIC, codec.codec_id, created, ttl, version, load_duration) + payload


def unpack_entry(codec: Codec, data: bytes) -> Entry:
    """Decode an envelope; ``ValueError`` if the bytes are not one of ours."""
    if len(data) < HEADER_SIZE:
        raise ValueError(f"entry too short ({len(data)} bytes)")
    magic, codec_id, created, ttl, version, load_duration = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise ValueError("not a cacheguard entry (bad magic)")
    reader = codec if codec_id == codec.codec_id else reader_for(codec, codec_id)
    if reader is None:
        raise ValueError(f"entry written by codec {codec_id}, which this guard cannot read")
    value = reader.decode(memoryview(data)[HEADER_SIZE:])  # no copy of the payload
    # tuple.__new__: the NamedTuple's own __new__ is Python code, on every hit
    return _new_entry(Entry, (value, created, ttl, version, load_duration))
