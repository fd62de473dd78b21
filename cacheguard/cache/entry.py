"""The envelope stored per cache entry.

Layout: a fixed 35-byte header, then the codec's payload::

    magic    b"\\xcb" + uint8   2 bytes   then the format: how the payload is stored,
                                          1 as the codec wrote it, 2 zlib, 3 zstd
    codec    uint8              1         which codec wrote the payload
    created  float64            8         when the value was loaded: seconds by the
                                          Redis server's clock (cache/server_clock.py)
    ttl      float64            8         logical lifetime in seconds
    version  int64              8         the key's invalidation version at fill time
    load     float64            8         how long the load took (seconds)

The header is read with one ``struct.unpack``, so a cache hit costs one GET plus
the payload's own decode. Bytes that do not match (corrupt, truncated, foreign,
another codec) raise ``ValueError``; the cache treats that as a miss.

Format 1 is the only one there was before compression (``compress``, see
:mod:`cacheguard.cache.compression`): entries written before it read as ever,
and a payload below ``compress_min_size``, or one compression would not shrink,
is still stored that way. The plain format's magic is what a hit compares first,
so a hit of an uncompressed entry costs what it did; every guard reads every
format, whatever its own setting. A version without compression reads a
compressed entry as a corrupt one (a miss, reloaded and stored uncompressed).

A signing codec's compressed payload (:func:`~cacheguard.cache.codec.signing`:
the :class:`~cacheguard.cache.codec.PickleCodec`) is signed as stored, the
compressed bytes, and checked before anything is inflated: bytes without the
key's signature cost one HMAC, never an inflation (a small hostile payload may
inflate to :data:`~cacheguard.cache.compression.MAX_INFLATED`). The payload
inside is the codec's own, signed too. (Versions before this signed only the
inflated payload: their compressed pickle entries are misses, reloaded once.)
"""

from __future__ import annotations

import struct
from typing import Any, Final, NamedTuple

from cacheguard.cache.codec import Codec, reader_for, signing
from cacheguard.cache.compression import Compress, deflate, inflate

__all__ = ["HEADER_SIZE", "MISSING", "Entry", "Missing", "pack_entry", "unpack_entry"]

_MAGIC = b"\xcb\x01"  # format 1: the payload as the codec wrote it
_COMPRESSED_MAGIC: dict[Compress, bytes] = {"zlib": b"\xcb\x02", "zstd": b"\xcb\x03"}
_COMPRESSED_BY_MAGIC: dict[bytes, Compress] = {m: n for n, m in _COMPRESSED_MAGIC.items()}
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
    compress: Compress | None = None,
    compress_min_size: int = 1024,
) -> bytes:
    """Encode ``value`` with its metadata; :class:`SerializationError` if it cannot.
    With ``compress``, a payload of ``compress_min_size`` bytes or more is stored
    compressed when that makes it smaller."""
    payload = codec.encode(value)
    magic = _MAGIC
    if compress is not None and len(payload) >= compress_min_size:
        packed = deflate(compress, payload)
        if packed is not None:
            signer = signing(codec)
            if signer is not None:  # checked before inflating (see the module docstring)
                packed = signer.sign(packed)
            magic, payload = _COMPRESSED_MAGIC[compress], packed
    return _HEADER.pack(magic, codec.codec_id, created, ttl, version, load_duration) + payload


def unpack_entry(codec: Codec, data: bytes) -> Entry:
    """Decode an envelope; ``ValueError`` if the bytes are not one of ours."""
    if len(data) < HEADER_SIZE:
        raise ValueError(f"entry too short ({len(data)} bytes)")
    magic, codec_id, created, ttl, version, load_duration = _HEADER.unpack_from(data)
    reader = codec if codec_id == codec.codec_id else reader_for(codec, codec_id)
    if magic != _MAGIC:  # the plain format goes on at once: the hit path's only check
        value = _compressed_value(magic, reader, codec_id, data)
    else:
        if reader is None:
            raise ValueError(f"entry written by codec {codec_id}, which this guard cannot read")
        value = reader.decode(memoryview(data)[HEADER_SIZE:])  # no copy of the payload
    # tuple.__new__: the NamedTuple's own __new__ is Python code, on every hit
    return _new_entry(Entry, (value, created, ttl, version, load_duration))


def _compressed_value(magic: bytes, reader: Codec | None, codec_id: int, data: bytes) -> Any:
    """The value of a compressed entry; ``ValueError`` if the magic is not one of
    ours, the codec unknown here, or the payload does not inflate."""
    name = _COMPRESSED_BY_MAGIC.get(magic)
    if name is None:
        raise ValueError("not a cacheguard entry (bad magic)")
    if reader is None:
        raise ValueError(f"entry written by codec {codec_id}, which this guard cannot read")
    packed: bytes | memoryview = memoryview(data)[HEADER_SIZE:]
    signer = signing(reader)
    if signer is not None:  # authentic before anything is inflated
        packed = signer.verified(packed)
    return reader.decode(inflate(name, memoryview(packed)))
