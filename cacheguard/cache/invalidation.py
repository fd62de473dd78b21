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

Which prefixes a fill checks is :class:`Prefixes`: bounded however many distinct
prefixes a process ever invalidates (see its docstring).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Final

from cacheguard.cache.wire import (
    POISON_FLOOR,
    invalidate_call,
    next_stamp_call,
    raise_watermark_call,
    read_watermark_call,
)
from cacheguard.redis.keys import (
    ResourceKeys,
    hash_tag,
    invalidation_channel,
    name_from_tag,
    prefix_stamp_key,
    watermark_key,
)
from cacheguard.redis.scripts import ScriptCall

__all__ = ["Invalidation", "Prefixes"]

SCAN_BATCH = 500  # names invalidated per pipelined round trip by invalidate_prefix
# The most prefixes of its own invalidate_prefix calls a process keeps checking (see
# Prefixes): past it the oldest is forgotten and its stamp raises the floor.
RECENT_PREFIXES: Final = 1024


class Invalidation:
    """One namespace's invalidation layout and watched prefixes."""

    def __init__(
        self,
        namespace: str,
        version_ttl_ms: int,
        *,
        timer: Callable[[], float] = time.monotonic,
        recent_prefixes: int | None = None,
    ) -> None:
        self.namespace = namespace
        self.version_ttl_ms = version_ttl_ms
        self.l1_channel = invalidation_channel(namespace)
        self.watermark_key = watermark_key(namespace)
        self.prefixes = Prefixes(
            version_ttl_ms / 1000,
            timer,
            RECENT_PREFIXES if recent_prefixes is None else recent_prefixes,
        )

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
        """Fills of keys under ``prefix`` check its stamp from now on, for good."""
        self.prefixes.watch(prefix)

    def remember(self, prefix: str, stamp: int) -> None:
        """This process stamped ``prefix`` with ``stamp`` (now, for ``version_ttl``):
        its fills check that stamp for as long as it may live in Redis."""
        self.prefixes.remember(prefix, stamp)

    def stamp_key(self, prefix: str) -> str:
        return prefix_stamp_key(self.namespace, prefix)

    def stamps_for(self, name: str) -> tuple[tuple[str, ...], int]:
        """What a fill of ``name`` from a known snapshot checks: the stamp keys of the
        prefixes covering it, and the floor (a snapshot older than it must not store:
        a prefix whose stamp is above it was forgotten, and may cover ``name``)."""
        covering, floor = self.prefixes.covering(name)
        return tuple(self.stamp_key(p) for p in covering), floor

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
        self.prefixes.reset_after_fork()


class Prefixes:
    """The prefixes whose stamps a process's fills check, in bounded memory and with
    a bounded cost per fill, however many distinct prefixes it ever invalidates.

    *Watched* prefixes (``watch_prefix``: the SQLAlchemy hooks' templates, a
    service's own) are kept for good: there are as many as the code names.
    *Recent* prefixes, those of the process's own ``invalidate_prefix`` calls, may
    be made of data (one per tenant, per user). Each is kept only while its stamp
    can still be in Redis (``lifetime``, the stamp's ``version_ttl``, from the
    call; timed by ``timer``) and at most ``capacity`` of them: past that the
    oldest is forgotten early and its stamp raises :attr:`floor`. A fill whose
    snapshot is older than the floor does not store, whatever its key (it may be
    under the forgotten prefix): forgetting costs at most some stores of fills
    from old snapshots, never a stale value.

    Registering is O(1) amortised (an ordered dict, oldest first). A fill looks
    up the prefixes of its own name, one per distinct prefix length in use (at
    most ``max_key_length + 1``), not every prefix kept.
    """

    def __init__(self, lifetime: float, timer: Callable[[], float], capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity!r}")
        self.lifetime = lifetime
        self.capacity = capacity
        self.floor = 0  # the newest stamp of a recent prefix forgotten before its end
        self._timer = timer
        self._watched: set[str] = set()
        self._recent: OrderedDict[str, tuple[int, float]] = OrderedDict()  # (stamp, ends)
        self._lengths: dict[int, int] = {}  # prefix length -> prefixes kept of that length
        self._mutex = threading.Lock()

    def __len__(self) -> int:
        """How many prefixes are kept (watched and recent)."""
        return len(self._watched) + len(self._recent)

    @property
    def lengths(self) -> int:
        """How many distinct prefix lengths a fill looks up."""
        return len(self._lengths)

    def watch(self, prefix: str) -> None:
        with self._mutex:
            if prefix in self._watched:
                return
            self._watched.add(prefix)
            if self._recent.pop(prefix, None) is None:
                self._count(prefix, 1)

    def remember(self, prefix: str, stamp: int) -> None:
        now = self._timer()
        with self._mutex:
            if prefix in self._watched:
                return  # checked for good already
            kept = self._recent.pop(prefix, None)
            if kept is None:
                self._count(prefix, 1)
            else:
                stamp = max(stamp, kept[0])
            self._recent[prefix] = (stamp, now + self.lifetime)  # the newest: last
            recent = self._recent
            while recent:
                oldest = next(iter(recent))
                old_stamp, ends = recent[oldest]
                if ends > now and len(recent) <= self.capacity:
                    break
                del recent[oldest]
                self._count(oldest, -1)
                if ends > now:  # its stamp may still be in Redis: fills must not miss it
                    self.floor = max(self.floor, old_stamp)

    def covering(self, name: str) -> tuple[list[str], int]:
        """The kept prefixes that ``name`` starts with, and the floor."""
        now = self._timer()
        found: list[str] = []
        with self._mutex:
            for length in self._lengths:
                if length > len(name):
                    continue
                prefix = name[:length]
                if prefix in self._watched:
                    found.append(prefix)
                else:
                    kept = self._recent.get(prefix)
                    if kept is not None and kept[1] > now:
                        found.append(prefix)
            return found, self.floor

    def _count(self, prefix: str, change: int) -> None:
        length = len(prefix)
        left = self._lengths.get(length, 0) + change
        if left:
            self._lengths[length] = left
        else:
            del self._lengths[length]

    def reset_after_fork(self) -> None:
        self._mutex = threading.Lock()


def _glob_escape(text: str) -> str:
    """``text`` as a literal in a Redis MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
