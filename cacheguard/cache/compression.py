"""Compression of entries' payloads: the ``compress`` setting (see docs/compression.md).

A guard with ``compress="zlib"`` or ``"zstd"`` compresses a codec's payload of
``compress_min_size`` bytes or more, and keeps the result only when it is
smaller. The entry's header says which (:mod:`cacheguard.cache.entry`), so every
guard reads every entry, whatever its own setting: plain, zlib, zstd, and those
written before compression existed.

zstd needs the ``zstandard`` package (extra ``zstd``), checked when a guard is
made; a guard without it reads a zstd entry as a corrupt entry (a miss).

Inflating is bounded: a payload must end exactly where its stream ends, pass the
stream's checksum (zlib's Adler-32, the zstd frame's own), and inflate to at most
:data:`MAX_INFLATED` bytes, so corrupt or hostile bytes are a ``ValueError`` (a
miss), never a wrong value nor an allocation of what a bad header claims.
"""

from __future__ import annotations

import threading
import zlib
from typing import Any, Final, Literal

__all__ = ["MAX_INFLATED", "NAMES", "Compress", "check_compress", "deflate", "inflate"]

Compress = Literal["zlib", "zstd"]
NAMES: Final = ("zlib", "zstd")

# Far above any value worth caching (max_value_bytes defaults to 8 MiB): a bound on
# what one read can be made to allocate; larger payloads are stored uncompressed.
MAX_INFLATED: Final = 256 * 1024 * 1024

_ZSTD_LEVEL: Final = 3  # zstd's own default: fast, and smaller than zlib's level 6
_ZSTD_MISSING: Final = "pip install 'cacheguard-redis[zstd]'"


def _zstandard() -> Any:
    """The zstandard module; ``ImportError`` naming the extra without it."""
    try:
        import zstandard  # noqa: PLC0415 - an optional extra, imported on first use
    except ImportError as exc:
        raise ImportError(f"compress='zstd' needs the zstandard package: {_ZSTD_MISSING}") from exc
    return zstandard


def check_compress(name: object) -> Compress | None:
    """``name`` if a guard can compress with it: None (off), ``"zlib"``, or
    ``"zstd"`` with zstandard installed (``ImportError`` naming the extra)."""
    if name is None:
        return None
    if not isinstance(name, str) or name not in NAMES:
        raise ValueError(f"compress must be None, 'zlib' or 'zstd', not {name!r}")
    if name == "zstd":
        _zstandard()
    return name  # type: ignore[return-value]


def deflate(name: Compress, payload: bytes) -> bytes | None:
    """``payload`` compressed with ``name``, or None when that would not make it
    smaller (or it is too large to inflate again within :data:`MAX_INFLATED`)."""
    if len(payload) > MAX_INFLATED:
        return None
    if name == "zlib":
        packed = zlib.compress(payload)
    else:
        # A context per call: one must not be shared by threads, and stores are rare.
        compressor = _zstandard().ZstdCompressor(level=_ZSTD_LEVEL, write_checksum=True)
        packed = compressor.compress(payload)  # its frame records the size, read back below
    return packed if len(packed) < len(payload) else None


def inflate(name: Compress, data: memoryview) -> bytes:
    """The payload ``data`` holds, compressed with ``name``; ``ValueError`` for
    anything but one whole, intact stream of at most :data:`MAX_INFLATED` bytes."""
    if name == "zlib":
        return _inflate_zlib(data)
    return _inflate_zstd(data)


def _inflate_zlib(data: memoryview) -> bytes:
    stream = zlib.decompressobj()
    try:
        payload = stream.decompress(data, MAX_INFLATED)
    except zlib.error as exc:
        raise ValueError(f"zlib payload does not inflate: {exc}") from exc
    if not stream.eof or stream.unused_data or stream.unconsumed_tail:
        raise ValueError("zlib payload is truncated, too large or followed by other bytes")
    return payload


class _Decompressors(threading.local):
    """One zstd context per thread (a context must not be used by two at once)."""

    def __init__(self) -> None:
        self.context: Any = None


_decompressors = _Decompressors()


def _inflate_zstd(data: memoryview) -> bytes:
    try:
        zstandard = _zstandard()
    except ImportError as exc:
        raise ValueError(f"a zstd-compressed entry: {exc}") from exc
    try:
        frame = zstandard.get_frame_parameters(data)
        size = frame.content_size
        # Our frames record their size and a checksum: a frame without them is not
        # ours, and a size past the bound would be what the read allocates.
        if not frame.has_checksum or not 0 <= size <= MAX_INFLATED:
            raise ValueError(f"zstd frame not ours (size {size}, checksum {frame.has_checksum})")
        context = _decompressors.context
        if context is None:
            context = _decompressors.context = zstandard.ZstdDecompressor()
        stream = context.decompressobj()
        payload: bytes = stream.decompress(data)
    except zstandard.ZstdError as exc:
        raise ValueError(f"zstd payload does not inflate: {exc}") from exc
    if not stream.eof or stream.unused_data or len(payload) != size:
        raise ValueError("zstd payload is truncated, of another size or followed by other bytes")
    return payload
