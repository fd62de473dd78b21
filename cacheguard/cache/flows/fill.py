"""The read-through algorithm, with no I/O in it.

Two pieces, both pure:

* :func:`judge`, the hit path's choice for a value read from Redis: serve it,
  serve it and refresh it early (XFetch), serve it stale and reload it in the
  background, or treat it as a miss. A plain function, so a hit builds no
  generator.
* :func:`fill_flow`, run after a miss by the one caller of a process that leads
  the key's single flight. It yields steps and gets each answer sent back in
  (I/O errors are thrown in), like :mod:`cacheguard.locks.protocol`; the sync
  driver (:mod:`cacheguard.cache.driver`) and the asyncio driver
  (:mod:`cacheguard.cache.async_driver`) only carry the steps out.

The fill:

1. take the key's local read lock (``HoldLocal``): local writers and fills exclude;
2. ``Seal`` the single flight (what the next call answers is valid for the
   followers that joined before) and run fill_begin: it returns the value if
   it appeared meanwhile, or makes us the key's one filler (a read hold, so no
   writer is inside), or says who is busy;
3. as the filler: ``Adopt`` the hold (renewed while the loader runs, up to
   ``max_load_time``), ``Load``, then end the fill with a compare-and-set store
   against the key's invalidation version, which also releases and announces
   the entry. A failing load still ends the fill (storing nothing), then raises;
4. while another process fills or a writer works: ``Subscribe`` to the key's
   channel, look once more (the fill may have ended before we subscribed), then
   ``Wait``. The announcement carries the entry itself when small, so waiters
   need no further round trip; on an abort or a release they try again, on a
   timer they try again (a dead filler is taken over as its lease ends);
5. at ``wait_timeout`` the ``on_timeout`` policy decides: load without the lock
   (``load``: one load shared by the process's timed-out callers of the key, see
   :mod:`cacheguard.cache.outage.shared_loads`), raise :class:`LockTimeout` (``raise``),
   or serve the last stored value (``stale``).

Every loop is bounded by the deadline and by ``max_fill_retries``; none recurses.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Final, Literal

from cacheguard.backoff import Backoff
from cacheguard.cache.entry import MISSING, Entry, Missing, pack_entry
from cacheguard.cache.outage.shared_loads import AwaitLoad, LoadShared, SharedLoads, shared_load
from cacheguard.cache.settings import GuardSettings
from cacheguard.cache.wire import (
    Begin,
    Decode,
    Message,
    fill_begin_call,
    fill_end_call,
    parse_fill_begin,
    parse_message,
)
from cacheguard.exceptions import BackendUnavailable, FillFailed, LockTimeout, SerializationError
from cacheguard.redis.keys import ResourceKeys
from cacheguard.redis.scripts import ScriptCall
from cacheguard.steps import Subscribe, Wait

__all__ = [
    "Adopt",
    "Call",
    "Disown",
    "Drain",
    "FillJob",
    "HoldLocal",
    "Load",
    "LoadUnlocked",
    "Lookup",
    "Outcome",
    "ReadStamps",
    "ReleaseLater",
    "Seal",
    "Step",
    "fill_flow",
    "timed_out_flow",
]

log = logging.getLogger("cacheguard")

Source = Literal["l2", "loaded", "peer", "unlocked", "stale", "skipped"]

RETRY_MARGIN: Final = 0.002  # after a busy lease's end, so the retry lands after it
SUBSCRIBE_WAIT_CAP: Final = 1.0  # with pub/sub down the confirmation never comes
# The safety-net timer of a waiting fill. The filler's announcement wakes waiters;
# a dead filler is retried when its lease ends (the begin script says when). The
# timer only covers a lost announcement, so it need not fire during a normal load.
WAIT_BACKOFF: Final = functools.partial(Backoff, initial=0.5, cap=1.0)


# -- the fill's steps -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    value: Any
    source: Source
    entry: Entry | None = None  # the stored entry served ("l2", "peer"): its expiry
    private: bool = False  # for this caller only: followers must not share it


@dataclass(frozen=True, slots=True)
class HoldLocal:
    """Step: take the key's local read lock within ``timeout`` s. Answer: None, or
    :class:`LockTimeout` thrown in. The driver releases it when the flow ends."""

    timeout: float


@dataclass(frozen=True, slots=True)
class Seal:
    """Step: seal the single flight: the answer of the next call serves only the
    followers that joined before. Answer: None."""


@dataclass(frozen=True, slots=True)
class Drain:
    """Step: forget the messages received so far (the next call re-reads the state
    they were about). Answer: None."""


@dataclass(frozen=True, slots=True)
class Call:
    """Step: run one script call. Answer: its raw reply."""

    call: ScriptCall


@dataclass(frozen=True, slots=True)
class Lookup:
    """Step: GET the key's value. Answer: the raw bytes, None, or the error a
    non-string key gave (WRONGTYPE: someone else's key)."""


@dataclass(frozen=True, slots=True)
class ReadStamps:
    """Step: GET each of ``keys`` (prefix stamps). Answer: their raw values."""

    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Adopt:
    """Step: keep the fill's read hold of ``epoch`` renewed (for at most
    ``renew_for`` s) until :class:`Disown`. Answer: None."""

    epoch: int
    renew_for: float


@dataclass(frozen=True, slots=True)
class Disown:
    """Step: stop renewing the fill's hold (the end script releases it). Answer: None."""


@dataclass(frozen=True, slots=True)
class ReleaseLater:
    """Step: the end script failed: release the fill's hold in the background until
    it goes through or its lease would have ended anyway. Answer: None."""


@dataclass(frozen=True, slots=True)
class Load:
    """Step: run the loader, collecting the database snapshots it read. Answer:
    ``(value, seconds, snapshot watermark or None)``, or its exception thrown in."""


@dataclass(frozen=True, slots=True)
class LoadUnlocked:
    """Step: run the loader without any lock (timeout policy). Answer: the value."""


Step = (
    HoldLocal
    | Seal
    | Drain
    | Call
    | Lookup
    | ReadStamps
    | Adopt
    | Disown
    | ReleaseLater
    | Load
    | LoadUnlocked
    | LoadShared
    | AwaitLoad
    | Subscribe
    | Wait
)

SEAL: Final = Seal()
DRAIN: Final = Drain()
LOOKUP: Final = Lookup()
LOAD: Final = Load()
LOAD_UNLOCKED: Final = LoadUnlocked()
DISOWN: Final = Disown()
RELEASE_LATER: Final = ReleaseLater()


Count = Callable[..., None]  # StatsRecorder.count(kind, key, seconds=0.0, error=None)


@dataclass(frozen=True, slots=True)
class FillJob:
    """Everything a fill of one key needs to decide, I/O excluded."""

    name: str
    keys: ResourceKeys
    owner: str
    settings: GuardSettings
    ttl: float
    none_ttl: float | Missing | None
    writing_here: bool  # this caller holds the key's write lock (its load may be uncommitted)
    # Asked only when a load's snapshot is known: the stamp keys of the prefixes this
    # process checks that cover the name, and their floor (see invalidation.Prefixes).
    stamps: Callable[[], tuple[tuple[str, ...], int]]
    timer: Callable[[], float]
    clock: Callable[[], float]  # the server's clock (see cache/server_clock.py)
    rng: Callable[[], float]
    count: Count
    decode: Decode  # counts what does not decode
    decode_quiet: Decode  # bytes already counted by the GET before
    backend_failed: Callable[[str, BaseException], None]
    shared_loads: SharedLoads  # the unlocked loads of timed-out callers, shared per key
    backoff: Callable[[], Backoff] = WAIT_BACKOFF  # the timer behind announcements
    # (server seconds, timer then): fill_begin read the server's clock
    saw_server_clock: Callable[[float, float], None] = lambda server, at: None
    # Outbox replays are pending: nothing stored in Redis may be served (cache/outage/recovery.py)
    replay_pending: Callable[[], bool] = lambda: False
    # Stores are checked against the loads' database snapshots (a gutter's are not)
    checks_snapshots: bool = True


def fill_flow(
    job: FillJob,
    *,
    refresh: bool,
    background: bool,
    stale: Entry | None,
    budget: float,
    since: Callable[[], float] | None = None,
) -> Generator[Step, Any, Outcome]:
    """Yield steps until the key has a value for the caller; return it.

    ``refresh`` fills even when a value exists, and does not settle for another
    fill's value: it waits for that fill to end, then loads itself (a refresh
    means "load now"). ``background`` gives up at once when someone else is
    filling (a background refresh is best effort). ``stale`` is the expired entry
    the caller saw (for ``on_timeout="stale"``); ``budget`` the seconds it may wait;
    ``since`` when the newest of the callers sharing its outcome began (see
    :func:`timed_out_flow`).
    """
    settings, timer = job.settings, job.timer
    if job.writing_here:
        # guard.write or a tracked transaction of this caller: what it loads may be
        # uncommitted. Serve it to this caller only and store nothing.
        return Outcome((yield LOAD_UNLOCKED), "unlocked", private=True)
    start = timer()
    deadline = start + max(budget, 1e-3)
    try:
        yield HoldLocal(max(budget, 1e-3))
    except LockTimeout:  # a local writer holds the key: the same policy as any wait
        if background:
            raise
        return (yield from timed_out_flow(job, stale, timer() - start, since))

    waited_from: float | None = None
    force = refresh
    replacing: bytes | None = None  # the unusable bytes a forced begin may overwrite
    aborts = 0
    delays: Backoff | None = None
    try:
        while True:
            yield SEAL
            if waited_from is not None:
                yield DRAIN  # announcements before this begin are moot
            sent = timer()
            reply = yield Call(
                fill_begin_call(
                    job.keys,
                    owner=job.owner,
                    lease_ms=settings.lease_ms,
                    refresh=force,
                    version_ttl_ms=settings.version_ttl_ms,
                    replacing=replacing,
                )
            )
            begin = parse_fill_begin(reply, job.decode_quiet, job.clock())
            if begin.kind == "fill":  # its reply carries the server's clock
                job.saw_server_clock(begin.begun_ms / 1000, (sent + timer()) / 2)
            if begin.kind == "hit":
                assert begin.entry is not None
                return Outcome(begin.entry.value, "l2", begin.entry)
            if begin.kind in ("corrupt", "expired"):  # bytes not to serve: overwrite them
                # ... unless another caller replaces them first (its fill ended between
                # our two begins): then its value is the answer, not a second load.
                force, replacing = True, begin.raw
                continue
            replacing = None
            if begin.kind == "fill":
                return (yield from _fill(job, begin))

            # Busy: someone else is filling, or a writer is at work.
            if background:
                return Outcome(None, "skipped")
            if waited_from is None:
                waited_from = timer()
                yield Subscribe(min(settings.wait_timeout, SUBSCRIBE_WAIT_CAP))
                if not refresh:
                    entry = _fresh(job, job.decode((yield LOOKUP)))
                    if entry is not None:
                        return Outcome(entry.value, "peer", entry)
            remaining = deadline - timer()
            if remaining <= 0:
                return (yield from timed_out_flow(job, stale, timer() - start, since))
            if delays is None:
                delays = job.backoff()
            delay = min(delays.next_delay(), remaining)
            if begin.wait > 0:
                delay = min(delay, begin.wait + RETRY_MARGIN)
            messages = [parse_message(m, job.decode) for m in (yield Wait(delay))]
            for message in messages if not refresh else ():
                served = yield from _served_by(job, begin, message)
                if served is not None:
                    return served
            aborts += sum(1 for m in messages if m.kind == "aborted")
            if aborts > settings.max_fill_retries:
                raise FillFailed(key=job.name, attempts=aborts)
            force = refresh
    finally:
        if waited_from is not None:
            job.count("lock_waits", job.name, timer() - waited_from)


def _served_by(
    job: FillJob, begin: Begin, message: Message
) -> Generator[Step, Any, Outcome | None]:
    """The value an announcement gives a waiter, if any. Only from the fill we saw
    under way, or a later one: an older fill's announcement, delivered late, may
    predate an invalidation we have seen."""
    entry = message.entry
    if message.kind == "value" and entry is not None:
        if message.fill_began_us >= begin.since_us and entry.version >= int(begin.version):
            return Outcome(entry.value, "peer", entry)
        return None
    if message.kind == "stored":
        entry = _fresh(job, job.decode((yield LOOKUP)))
        if entry is not None:
            return Outcome(entry.value, "peer", entry)
    return None


def _fresh(job: FillJob, entry: Entry | None) -> Entry | None:
    return entry if entry is not None and job.clock() < entry.expires_at else None


def _fill(job: FillJob, begin: Begin) -> Generator[Step, Any, Outcome]:
    """We hold the key's read hold and its fill: load, store, release, announce."""
    yield Adopt(int(begin.epoch), job.settings.max_load_time)
    try:
        value, seconds, snapshot = yield LOAD
    except GeneratorExit:
        raise  # the driver closed us mid-load: no more steps may be asked for
    except BaseException:
        yield from _end(job, begin, None, 0.0, failed=True, snapshot=None)
        raise
    if job.checks_snapshots:
        snapshot = yield from _oldest_allowed(job, snapshot)
    else:  # a gutter: never invalidated, its versions another Redis's
        snapshot = None
    yield from _end(job, begin, value, seconds, failed=False, snapshot=snapshot)
    return Outcome(value, "loaded")


def _oldest_allowed(job: FillJob, snapshot: int | None) -> Generator[Step, Any, int | None]:
    """``snapshot``, or -1 (refuse the store) when a prefix invalidation covering
    the key is newer than the snapshot, or the stamps cannot be read, or a prefix
    invalidation newer than the snapshot is no longer remembered (the floor)."""
    if snapshot is None or snapshot < 0:
        return snapshot
    stamp_keys, floor = job.stamps()
    if floor > snapshot:
        return -1  # a prefix invalidation newer than the snapshot was forgotten here
    if not stamp_keys:
        return snapshot
    try:
        raw = yield ReadStamps(stamp_keys)
        stamps = [int(r) for r in raw if r is not None]
    except Exception as exc:  # the load is done and its value returned: just do not store
        log.info("prefix stamps of %r unreadable, its fill will not store: %s", job.name, exc)
        return -1
    return -1 if stamps and max(stamps) > snapshot else snapshot


def _end(
    job: FillJob,
    begin: Begin,
    value: Any,
    seconds: float,
    *,
    failed: bool,
    snapshot: int | None,
) -> Generator[Step, Any, bool]:
    """End our fill (store or not) and release its hold; True if stored."""
    yield SEAL  # our load serves the followers that joined before our hold ends
    yield DISOWN
    data, lifetime, error = b"", 0.0, None
    if not failed:
        try:
            data, lifetime = plan_store(job, value, seconds, int(begin.version))
        except BaseException as exc:  # the fill still ends (no store), then this raises
            error = exc
    settings = job.settings
    try:
        stored = yield Call(
            fill_end_call(
                job.keys,
                owner=job.owner,
                begin=begin,
                version_ttl_ms=settings.version_ttl_ms,
                data=data,
                px=max(1, int(settings.kept_for(lifetime) * 1000)),
                announce_limit=settings.announce_value_bytes,
                failed=failed or error is not None,
                snapshot=snapshot,
            )
        )
    except BaseException as exc:
        yield RELEASE_LATER
        if not isinstance(exc, BackendUnavailable):
            raise
        # The load is done: keep its value (or its error); never load again.
        job.backend_failed(job.name, exc)
        stored = None  # no answer: not a rejection (counted as a backend error)
    if error is not None:
        raise error
    if data and stored == 0:
        job.count("stores_rejected", job.name)
        log.info(
            "store of %r rejected: invalidated while loading, loaded from a snapshot "
            "older than the last invalidation, or lease lost",
            job.name,
        )
    return bool(stored == 1)


def plan_store(job: FillJob, value: Any, seconds: float, version: int) -> tuple[bytes, float]:
    """The entry to store for a loaded ``value`` (b"" for none) and its lifetime."""
    settings = job.settings
    none_ttl = settings.none_ttl if job.none_ttl is MISSING else job.none_ttl
    if value is None and none_ttl is None:
        return b"", 0.0  # negative caching off: return None, store nothing
    lifetime = job.ttl if value is not None else float(none_ttl)  # type: ignore[arg-type]
    if settings.ttl_jitter > 0:
        lifetime *= 1 + settings.ttl_jitter * (2 * job.rng() - 1)
    try:
        data = pack_entry(
            settings.codec,
            value,
            created=job.clock(),
            ttl=lifetime,
            version=version,
            load_duration=seconds,
            compress=settings.compress,
            compress_min_size=settings.compress_min_size,
        )
    except SerializationError as exc:
        raise SerializationError(f"cannot cache {job.name!r}: {exc}", key=job.name) from exc
    if len(data) > settings.max_value_bytes:
        job.count("values_too_large", job.name)
        log.warning(
            "value of %r is %d bytes, over max_value_bytes=%d: returned, not cached",
            job.name,
            len(data),
            settings.max_value_bytes,
        )
        return b"", 0.0
    return data, lifetime


def timed_out_flow(
    job: FillJob,
    stale: Entry | None,
    waited: float,
    since: Callable[[], float] | None = None,
) -> Generator[Step, Any, Outcome]:
    """A wait for ``job``'s key took too long: apply the ``on_timeout`` policy.
    ``stale``: an expired entry the caller already has, if any; ``since``, asked
    right after the seal: when the newest of the callers its outcome serves began
    (the caller and the followers that joined before the seal); without it, the
    time of the seal itself (an upper bound of theirs).

    The load without the lock is shared with the other callers of this process
    whose waits timed out (see :mod:`cacheguard.cache.outage.shared_loads`). Never the
    writer's own load: :func:`fill_flow` serves that before any wait."""
    job.count("wait_timeouts", job.name, waited)
    policy = job.settings.on_timeout
    if policy == "raise":
        raise LockTimeout(name=job.name, mode="read", waited=waited)
    if policy == "stale" and not job.replay_pending():
        if stale is None:
            try:
                stale = job.decode((yield LOOKUP))  # even past its expiry
            except BackendUnavailable:
                stale = None
        if stale is not None:
            job.count("stale_served", job.name)
            return Outcome(stale.value, "stale")
    yield SEAL  # an unlocked load serves only the followers that joined before
    began = (since or job.timer)()  # the load it takes must begin after they all began
    value = yield from shared_load(job.shared_loads, job.name, began, job.count)
    return Outcome(value, "unlocked")
