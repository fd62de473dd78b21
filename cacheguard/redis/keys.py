"""Redis key layout: every key of one resource lives in one hash slot.

A resource (a cache key, a lock) named ``menu:list`` in namespace ``cg`` owns::

    cg:{menu:list}:v        the cached value (an envelope, see cache/entry.py)
    cg:{menu:list}:ver      the invalidation version of the cached value
    cg:{menu:list}:rw       the read-write lock hash
    cg:{menu:list}:fence    the fencing counter (a day after its last token)
    cg:{menu:list}:rel      the pub/sub channel announcing releases and fills

A namespace also owns ``cg:wm``, its invalidation sequence (the one key that never
expires; see cache/watermark.py), the channel ``cg:l1`` and, per invalidated prefix ``p``,
``cg:{p}:ps`` (the prefix's stamp). Keys outside a hash tag are the namespace,
a colon and one colon-free word, and a namespace holds no braces: so two
namespaces, even nested ones (``x`` and ``x:ps``), never share a key.

The ``{...}`` hash tag makes Redis Cluster place a resource's keys in one slot, so one
Lua script may touch them all. Braces and ``%`` inside a name are
percent-encoded so the tag always ends where we put it: otherwise a name such
as ``}x`` would end the tag early and scatter one resource over several slots.

A name given to a guard's calls is checked by :func:`check_name` before Redis is
touched: a str (``TypeError`` otherwise), not empty and encodable as UTF-8 (a
lone surrogate is not; ``ValueError``), and shortened like a key template's
names when longer than the guard's ``max_key_length``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = [
    "ResourceKeys",
    "check_name",
    "check_namespace",
    "hash_tag",
    "invalidation_channel",
    "name_from_tag",
    "prefix_stamp_key",
    "shorten",
    "watermark_key",
]

_TAG_ESCAPES = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D"})


def hash_tag(name: str) -> str:
    """The hash-tag body for ``name``: the name with ``% { }`` percent-encoded."""
    return name.translate(_TAG_ESCAPES)


def name_from_tag(tag_body: str) -> str:
    """The resource name whose :func:`hash_tag` is ``tag_body``."""
    return tag_body.replace("%7B", "{").replace("%7D", "}").replace("%25", "%")


def check_namespace(namespace: str) -> str:
    """Validate a namespace: non-empty, no braces (they would move the hash tag)."""
    if not isinstance(namespace, str):
        raise TypeError(f"namespace must be a str, not {type(namespace).__name__}")
    if not namespace:
        raise ValueError("namespace must not be empty")
    if "{" in namespace or "}" in namespace:
        raise ValueError(f"namespace must not contain braces: {namespace!r}")
    return namespace


def shorten(name: str, max_length: int) -> str:
    """``name`` itself, or a prefix plus a digest when longer than ``max_length``."""
    if len(name) <= max_length:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    keep = max(max_length - len(digest) - 1, 0)
    return f"{name[:keep]}#{digest}"


def check_name(name: object, max_length: int, what: str = "a key name") -> str:
    """``name`` as a guard uses it: refused unless it is a non-empty str that encodes
    as UTF-8, shortened (prefix and digest, as :func:`shorten`
    does for template names) when longer than ``max_length``."""
    if not isinstance(name, str):
        hint = " (decode bytes first)" if isinstance(name, (bytes, bytearray)) else ""
        raise TypeError(f"{what} must be a str, not {type(name).__name__}{hint}")
    if not name:
        raise ValueError(f"{what} must not be empty")
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"{what} must be encodable as UTF-8: {name!r} has "
                f"{exc.reason} at position {exc.start}"
            ) from None
    return shorten(name, max_length)


@dataclass(frozen=True, slots=True)
class ResourceKeys:
    """The Redis keys and channel that belong to one named resource."""

    namespace: str
    name: str

    @property
    def tag(self) -> str:
        return f"{self.namespace}:{{{hash_tag(self.name)}}}"

    @property
    def value(self) -> str:
        return f"{self.tag}:v"

    @property
    def version(self) -> str:
        return f"{self.tag}:ver"

    @property
    def lock(self) -> str:
        return f"{self.tag}:rw"

    @property
    def fence(self) -> str:
        return f"{self.tag}:fence"

    @property
    def released_channel(self) -> str:
        return f"{self.tag}:rel"


def invalidation_channel(namespace: str) -> str:
    """The namespace-wide channel on which L1 invalidations are broadcast."""
    return f"{namespace}:l1"


def watermark_key(namespace: str) -> str:
    """The namespace's invalidation sequence counter (see cache/watermark.py)."""
    return f"{namespace}:wm"


def prefix_stamp_key(namespace: str, prefix: str) -> str:
    """The stamp of the last ``invalidate_prefix(prefix)`` (in the prefix's tag,
    like a resource: outside a tag it could spell a nested namespace's key)."""
    return f"{namespace}:{{{hash_tag(prefix)}}}:ps"
