"""The read-through fill algorithm, with no I/O in it.

Run after a cache miss, by the one thread of a process that leads the key's
single flight. :func:`fill_flow` yields steps and gets each answer sent back in
(exceptions are thrown in), like :mod:`cacheguard.locks.protocol`:

1. ``BeginFill``: one script that returns the value if it appeared meanwhile,
   or makes us the key's one filler (a read hold, so no writer is inside), or
   says who is busy;
2. as the filler: ``Load``, then ``EndFill`` (a compare-and-set store against
   the key's invalidation version, which also releases and announces the
   entry). A failing load still ends the fill (storing nothing), then raises;
3. while another process fills or a writer works: ``Subscribe`` to the key's
   channel, look once more (the fill may have ended before we subscribed), then
   ``Wait``. The announcement carries the entry itself when small, so waiters
   need no further round trip; on an abort or a release they try again, on a
   timer they try again (a dead filler is taken over as its lease ends);
4. at ``wait_timeout`` the policy decides: load without the lock (``load``),
   raise :class:`LockTimeout` (``raise``), or serve a stale entry (``stale``).

Every loop is bounded by the deadline and by ``max_aborts``; none recurses.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Final, Literal

from cacheguard.backoff import Backoff
from cacheguard.cache.entry import Entry
from cacheguard.exceptions import FillFailed, LockTimeout

__all__ = [
    "Begin",
    "BeginFill",
    "EndFill",
    "Load",
    "LoadUnlocked",
    "Lookup",
    "Message",
    "Outcome",
    "Subscribe",
    "TimeoutPolicy",
    "Wait",
    "fill_flow",
]

TimeoutPolicy = Literal["load", "raise", "stale"]
Source = Literal["l2", "loaded", "peer", "unlocked", "stale", "skipped"]

RETRY_MARGIN: Final = 0.002


@dataclass(frozen=True, slots=True)
class Begin:
    """The answer to :class:`BeginFill`."""

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


@dataclass(frozen=True, slots=True)
class Message:
    """A decoded announcement on the key's channel."""

    kind: Literal["value", "stored", "not_stored", "aborted", "released"]
    entry: Entry | None = None
    fill_began_us: int = 0  # value: when the fill that stored it began


@dataclass(frozen=True, slots=True)
class Outcome:
    value: Any
    source: Source
    entry: Entry | None = None  # the stored entry served ("l2", "peer"): its expiry


@dataclass(frozen=True, slots=True)
class BeginFill:
    """Step: run fill_begin; ``refresh`` fills even if a value exists. Answer: Begin."""

    refresh: bool


@dataclass(frozen=True, slots=True)
class Load:
    """Step: run the loader; answer ``(value, seconds)`` or throw its exception in."""


@dataclass(frozen=True, slots=True)
class EndFill:
    """Step: run fill_end for ``begin``, storing ``value`` unless ``failed``. Answer: stored?"""

    begin: Begin
    value: Any
    load_seconds: float
    failed: bool


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Step: subscribe to the key's channel. Answer: ignored."""


@dataclass(frozen=True, slots=True)
class Lookup:
    """Step: read the value. Answer: an Entry or None."""


@dataclass(frozen=True, slots=True)
class Wait:
    """Step: wait for announcements or ``seconds``. Answer: list of Message."""

    seconds: float


@dataclass(frozen=True, slots=True)
class LoadUnlocked:
    """Step: run the loader without any lock (timeout policy). Answer: the value."""


Step = BeginFill | Load | EndFill | Subscribe | Lookup | Wait | LoadUnlocked


def fill_flow(
    *,
    name: str,
    refresh: bool,
    background: bool,
    wait_timeout: float,
    on_timeout: TimeoutPolicy,
    stale: Entry | None,
    max_aborts: int,
    timer: Callable[[], float],
    backoff: Callable[[], Backoff],
) -> Generator[Step, Any, Outcome]:
    """Yield steps until the key has a value for the caller; return it.

    ``refresh`` fills even when a value exists, and does not settle for another
    fill's value: it waits for that fill to end, then loads itself (a refresh
    means "load now"). ``background`` gives up at once when someone else is
    filling (a background refresh is best effort).
    """
    start = timer()
    deadline = start + wait_timeout
    subscribed = False
    force = refresh
    aborts = 0
    delays: Backoff | None = None

    while True:
        begin: Begin = yield BeginFill(force)
        if begin.kind == "hit":
            assert begin.entry is not None
            return Outcome(begin.entry.value, "l2", begin.entry)
        if begin.kind in ("corrupt", "expired"):  # bytes not to serve: overwrite them
            force = True
            continue
        if begin.kind == "fill":
            try:
                value, seconds = yield Load()
            except BaseException:
                yield EndFill(begin, None, 0.0, failed=True)
                raise
            yield EndFill(begin, value, seconds, failed=False)
            return Outcome(value, "loaded")

        # Busy: someone else is filling, or a writer is at work.
        if background:
            return Outcome(None, "skipped")
        if not subscribed:
            yield Subscribe()
            subscribed = True
            if not refresh:
                entry: Entry | None = yield Lookup()
                if entry is not None:
                    return Outcome(entry.value, "peer", entry)
        remaining = deadline - timer()
        if remaining <= 0:
            return (yield from _timed_out(name, on_timeout, stale, timer() - start))
        if delays is None:
            delays = backoff()
        delay = min(delays.next_delay(), remaining)
        if begin.wait > 0:
            delay = min(delay, begin.wait + RETRY_MARGIN)
        messages: list[Message] = yield Wait(delay)
        for message in messages if not refresh else ():
            # Only from the fill we saw under way, or a later one: an older fill's
            # announcement, delivered late, may predate an invalidation we have seen.
            entry = message.entry
            if message.kind == "value" and entry is not None:
                if message.fill_began_us >= begin.since_us and entry.version >= int(begin.version):
                    return Outcome(entry.value, "peer", entry)
                continue
            if message.kind == "stored":
                entry = yield Lookup()
                if entry is not None:
                    return Outcome(entry.value, "peer", entry)
        aborts += sum(1 for m in messages if m.kind == "aborted")
        if aborts > max_aborts:
            raise FillFailed(key=name, attempts=aborts)
        force = refresh


def _timed_out(
    name: str, policy: TimeoutPolicy, stale: Entry | None, waited: float
) -> Generator[Step, Any, Outcome]:
    if policy == "raise":
        raise LockTimeout(name=name, mode="read", waited=waited)
    if policy == "stale" and stale is not None:
        return Outcome(stale.value, "stale")
    value = yield LoadUnlocked()
    return Outcome(value, "unlocked")
