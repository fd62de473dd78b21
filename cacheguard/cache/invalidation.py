"""What an invalidation sends, and which prefix stamps a fill must honour; no I/O.

An invalidation takes one number from the namespace's sequence (``<ns>:wm``,
NEXT_STAMP) and stamps every named key's version with it (one script per key,
so each runs in its own cluster slot); a version that was already ahead lifts
the sequence (RAISE_WATERMARK).

The sequence lives on one node. When that node is unreachable an invalidation
still goes through: it *poisons* the versions instead (see INVALIDATE), so that
no fill from a known database snapshot stores those keys, and the next
invalidation that gets a number *heals* them. Writes of keys on healthy nodes
never depend on the sequence's node. A prefix invalidation also stores its number under
the prefix's stamp key; fills of keys under a watched prefix refuse to store a
value loaded from an older database snapshot. The drivers send what this
module builds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from cacheguard.cache.wire import (
    POISON_FLOOR,
    invalidate_call,
    next_stamp_call,
    raise_watermark_call,
    read_watermark_call,
)
from cacheguard.keys import (
    ResourceKeys,
    hash_tag,
    invalidation_channel,
    name_from_tag,
    prefix_stamp_key,
    watermark_key,
)
from cacheguard.locks.scripts import ScriptCall

__all__ = ["Invalidation"]

SCAN_BATCH = 500  # names invalidated per pipelined round trip by invalidate_prefix


class Invalidation:
    """One namespace's invalidation layout and watched prefixes."""

    def __init__(self, namespace: str, version_ttl_ms: int) -> None:
        self.namespace = namespace
        self.version_ttl_ms = version_ttl_ms
        self.l1_channel = invalidation_channel(namespace)
        self.watermark_key = watermark_key(namespace)
        self._watched: tuple[str, ...] = ()
        self._mutex = threading.Lock()

    def next_stamp(self) -> ScriptCall:
        return next_stamp_call(self.watermark_key)

    def read_watermark(self) -> ScriptCall:
        return read_watermark_call(self.watermark_key)

    def calls(self, names: Iterable[str], stamp: int | None) -> list[ScriptCall]:
        """One invalidate script call per name, all with ``stamp`` (None: poison)."""
        return [self._call(name, stamp, None) for name in names]

    def heal_calls(self, poisoned: Iterable[tuple[str, int]], stamp: int) -> list[ScriptCall]:
        """Calls that heal each ``(name, version)``'s poisoned version with ``stamp`` (or
        the real version it carries + 1, if higher), if the version still is the one
        this caller wrote."""
        return [self._call(name, stamp, version) for name, version in poisoned]

    def _call(self, name: str, stamp: int | None, heals: int | None) -> ScriptCall:
        return invalidate_call(
            ResourceKeys(self.namespace, name),
            version_ttl_ms=self.version_ttl_ms,
            l1_channel=self.l1_channel,
            name=name,
            stamp=stamp,
            heals=heals,
        )

    @staticmethod
    def poisoned(names: Iterable[str], results: Iterable[object]) -> list[tuple[str, int]]:
        """The ``(name, version)`` pairs whose new version is poisoned."""
        return [
            (name, result)
            for name, result in zip(names, results, strict=True)
            if isinstance(result, int) and result >= POISON_FLOOR
        ]

    def lift(self, results: list[object], stamp: int) -> ScriptCall | None:
        """The call that lifts the sequence when a version ran ahead of ``stamp``
        (poisoned versions are not numbers of the sequence: never lift to them)."""
        highest = max(
            (r for r in results if isinstance(r, int) and r < POISON_FLOOR), default=stamp
        )
        return raise_watermark_call(self.watermark_key, highest) if highest > stamp else None

    # -- prefixes ---------------------------------------------------------------------

    def watch(self, prefix: str) -> None:
        with self._mutex:
            if prefix not in self._watched:
                self._watched = (*self._watched, prefix)

    def stamp_key(self, prefix: str) -> str:
        return prefix_stamp_key(self.namespace, prefix)

    def stamp_keys_for(self, name: str) -> tuple[str, ...]:
        """The stamp keys of the watched prefixes that cover ``name``."""
        return tuple(self.stamp_key(p) for p in self._watched if name.startswith(p))

    def scan_pattern(self, prefix: str) -> str:
        """A SCAN MATCH pattern for every key of a name starting with ``prefix``."""
        return _glob_escape(f"{self.namespace}:{{{hash_tag(prefix)}") + "*"

    def name_of(self, key: str) -> str | None:
        """The resource name of a scanned key that is a value or a lock hash (a
        fill under way), else None."""
        head = f"{self.namespace}:{{"
        for suffix in ("}:v", "}:rw"):
            if key.startswith(head) and key.endswith(suffix):
                return name_from_tag(key[len(head) : -len(suffix)])
        return None

    def reset_after_fork(self) -> None:
        self._mutex = threading.Lock()


def _glob_escape(text: str) -> str:
    """``text`` as a literal in a Redis MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
