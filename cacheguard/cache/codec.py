"""Codecs: how a cached value becomes bytes and back.

* :class:`MsgpackCodec` (default): msgpack plus extension types for
  ``datetime``, ``date``, ``Decimal`` and ``UUID``. Never executes code on load.
  Tuples come back as lists, like JSON.
* :class:`JsonCodec`: plain JSON (same extensions, tagged objects).
* :class:`PickleCodec`: any picklable value, **only** with an HMAC key: every
  payload is signed, and unsigned or tampered bytes are refused before
  unpickling (unpickling untrusted bytes runs arbitrary code).

A codec raises :class:`SerializationError` when it cannot encode a value, and
``ValueError`` when bytes do not decode; the cache treats the latter as a miss.
The msgpack and JSON codecs also refuse, at encode time, a value whose bytes
would not decode (a dict with tuple keys, a dict that spells JSON's type tag
wrongly): stored, it would fail on every read and reload every time.

Every entry names its codec (``codec_id``). A guard reads entries of its own
codec and of the built-in codecs that need no configuration (msgpack, JSON), so
guards with different codecs on one namespace read each other's entries instead
of reloading; a pickle entry needs the same HMAC key.

A *signing* codec (``signed = True``, with ``sign`` and ``verified``: the
:class:`PickleCodec`) reads its own entries only: an unsigned msgpack or JSON
entry runs no code, but whoever can write to Redis could put any value of their
choosing there, which the signature exists to refuse. Its compressed entries
are signed as stored, so the signature is checked before anything is inflated
(see :mod:`cacheguard.cache.entry`).
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import hmac
import json
import pickle
import uuid
from typing import Any, ClassVar, Protocol

import msgpack

from cacheguard.exceptions import SerializationError

__all__ = [
    "Codec",
    "JsonCodec",
    "MsgpackCodec",
    "PickleCodec",
    "SigningCodec",
    "check_codec",
    "reader_for",
    "signing",
]


class Codec(Protocol):
    """Encodes values to bytes and back; ``codec_id`` is stored with every entry."""

    codec_id: ClassVar[int]

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes | memoryview) -> Any: ...


class SigningCodec(Codec, Protocol):
    """A codec whose payloads are signed (``signed = True``): it reads its own entries
    only, and signs compressed payloads as stored (checked before inflating)."""

    signed: ClassVar[bool]

    def sign(self, data: bytes) -> bytes:
        """``data`` with its signature in front."""
        ...

    def verified(self, data: bytes | memoryview) -> bytes:
        """What :meth:`sign` signed, its signature checked; ``ValueError`` if it does
        not match (unsigned, tampered, another key's)."""
        ...


def signing(codec: object) -> SigningCodec | None:
    """``codec`` if it is a signing codec, else None."""
    if getattr(codec, "signed", False) is True:
        return codec  # type: ignore[return-value]
    return None


# msgpack extension type codes
_EXT_DATETIME, _EXT_DATE, _EXT_DECIMAL, _EXT_UUID = 1, 2, 3, 4


def _msgpack_default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return msgpack.ExtType(_EXT_DATETIME, value.isoformat().encode())
    if isinstance(value, dt.date):
        return msgpack.ExtType(_EXT_DATE, value.isoformat().encode())
    if isinstance(value, decimal.Decimal):
        return msgpack.ExtType(_EXT_DECIMAL, str(value).encode())
    if isinstance(value, uuid.UUID):
        return msgpack.ExtType(_EXT_UUID, value.bytes)
    raise TypeError(f"cannot serialize {type(value).__name__}")


def _msgpack_ext(code: int, data: bytes) -> Any:
    if code == _EXT_DATETIME:
        return dt.datetime.fromisoformat(data.decode())
    if code == _EXT_DATE:
        return dt.date.fromisoformat(data.decode())
    if code == _EXT_DECIMAL:
        return decimal.Decimal(data.decode())
    if code == _EXT_UUID:
        return uuid.UUID(bytes=data)
    raise ValueError(f"unknown msgpack extension type {code}")


class MsgpackCodec:
    """msgpack with datetime, date, Decimal and UUID; the default."""

    codec_id: ClassVar[int] = 1

    def encode(self, value: Any) -> bytes:
        try:
            data: bytes = msgpack.packb(value, default=_msgpack_default, use_bin_type=True)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise SerializationError(f"msgpack cannot encode the value: {exc}") from exc
        _check_round_trip(self, data)
        return data

    def decode(self, data: bytes | memoryview) -> Any:
        try:
            return msgpack.unpackb(data, ext_hook=_msgpack_ext, raw=False, strict_map_key=False)
        except Exception as exc:  # any malformed payload (bad ext data too) is a miss
            raise ValueError(f"not a msgpack payload: {exc}") from exc


_JSON_TAG = "__cg__"


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return {_JSON_TAG: "datetime", "v": value.isoformat()}
    if isinstance(value, dt.date):
        return {_JSON_TAG: "date", "v": value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return {_JSON_TAG: "decimal", "v": str(value)}
    if isinstance(value, uuid.UUID):
        return {_JSON_TAG: "uuid", "v": str(value)}
    raise TypeError(f"cannot serialize {type(value).__name__}")


def _json_object_hook(obj: dict[str, Any]) -> Any:
    kind = obj.get(_JSON_TAG)
    if kind is None or len(obj) != 2:
        return obj
    value = obj["v"]
    if kind == "datetime":
        return dt.datetime.fromisoformat(value)
    if kind == "date":
        return dt.date.fromisoformat(value)
    if kind == "decimal":
        return decimal.Decimal(value)
    if kind == "uuid":
        return uuid.UUID(value)
    return obj


class JsonCodec:
    """JSON with the same extension types as the msgpack codec (tagged objects)."""

    codec_id: ClassVar[int] = 2

    def encode(self, value: Any) -> bytes:
        try:
            data = json.dumps(value, default=_json_default, separators=(",", ":")).encode()
        except (TypeError, ValueError, RecursionError) as exc:
            raise SerializationError(f"JSON cannot encode the value: {exc}") from exc
        _check_round_trip(self, data)
        return data

    def decode(self, data: bytes | memoryview) -> Any:
        try:
            return json.loads(bytes(data), object_hook=_json_object_hook)
        except Exception as exc:  # any malformed payload (bad tagged values too) is a miss
            raise ValueError(f"not a JSON payload: {exc}") from exc


class PickleCodec:
    """pickle, signed with HMAC-SHA256; refuses unsigned or tampered bytes.

    Only for values that the other codecs cannot carry, and only when every
    process sharing the namespace holds the key.
    """

    codec_id: ClassVar[int] = 3
    # Reads no other codec's entries, and signs compressed payloads as stored.
    signed: ClassVar[bool] = True
    _DIGEST = 32

    def __init__(self, hmac_key: bytes) -> None:
        if not isinstance(hmac_key, bytes) or len(hmac_key) < 16:
            raise SerializationError("PickleCodec needs an HMAC key of at least 16 bytes")
        self._key = hmac_key

    def _digest(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()

    def sign(self, data: bytes) -> bytes:
        """``data`` with its HMAC-SHA256 in front."""
        return self._digest(data) + data

    def verified(self, data: bytes | memoryview) -> bytes:
        """The bytes :meth:`sign` signed; ``ValueError`` if the signature does not match."""
        data = bytes(data)
        signature, payload = data[: self._DIGEST], data[self._DIGEST :]
        if len(signature) != self._DIGEST or not hmac.compare_digest(
            signature, self._digest(payload)
        ):
            raise ValueError("pickle payload is unsigned or its signature does not match")
        return payload

    def encode(self, value: Any) -> bytes:
        try:
            payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise SerializationError(f"pickle cannot encode the value: {exc}") from exc
        return self.sign(payload)

    def decode(self, data: bytes | memoryview) -> Any:
        payload = self.verified(data)
        try:
            return pickle.loads(payload)  # signed by a key we hold
        except Exception as exc:
            raise ValueError(f"signed pickle payload does not load: {exc}") from exc


def _check_round_trip(codec: MsgpackCodec | JsonCodec, data: bytes) -> None:
    """Refuse bytes that would not decode. Paid once per store (a miss), never on a
    hit; a store is rare next to the load before it."""
    try:
        codec.decode(data)
    except ValueError as exc:
        raise SerializationError(
            f"{type(codec).__name__} can encode the value but not decode it again "
            f"({exc.__cause__ or exc}); e.g. dict keys must be str, int, float, bool, "
            "None or bytes, not tuples"
        ) from exc


# The codecs any guard can read without configuration, by the id an entry carries.
_BUILT_IN: dict[int, type[Any]] = {1: MsgpackCodec, 2: JsonCodec, 3: PickleCodec}
_READERS: dict[int, Codec] = {1: MsgpackCodec(), 2: JsonCodec()}


def reader_for(codec: Codec, codec_id: int) -> Codec | None:
    """The codec that decodes an entry tagged ``codec_id`` for a guard using
    ``codec``: its own, a configuration-free built-in (not for a signing codec:
    unsigned entries are refused), or None (a miss)."""
    if codec_id == codec.codec_id:
        return codec
    if signing(codec) is not None:
        return None
    return _READERS.get(codec_id)


def check_codec(codec: object) -> Codec:
    """``codec`` if it is usable by a guard, else ``TypeError``/``ValueError``."""
    for method in ("encode", "decode"):
        if not callable(getattr(codec, method, None)):
            raise TypeError(f"codec {codec!r} has no {method}() method")
    codec_id = getattr(codec, "codec_id", None)
    if isinstance(codec_id, bool) or not isinstance(codec_id, int) or not 0 <= codec_id <= 255:
        raise ValueError(f"codec_id must be an int in 0..255 (one header byte), got {codec_id!r}")
    built_in = _BUILT_IN.get(codec_id)
    if built_in is not None and not isinstance(codec, built_in):
        raise ValueError(
            f"codec_id {codec_id} belongs to cacheguard's {built_in.__name__}; "
            f"give {type(codec).__name__} an id of its own (16..255)"
        )
    return codec  # type: ignore[return-value]
