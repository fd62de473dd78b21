"""The read path's flows, with no I/O in them: ``get_or_load``, ``refresh``, ``peek``.

Each public read of both guards is one generator here; the sync guard and the
asyncio guard only carry out its steps (:class:`Lookup`, :class:`LoadNow`,
:class:`WaitFlight`, :class:`RunFill`) and send the answers back in. Redis
being down reaches a flow as :class:`BackendUnavailable` with the client's error
as its ``__cause__``.

``get_or_load``:

1. L1, when the guard has one: a hit sends nothing;
2. the key's single flight: one caller per process goes on (the leader); the
   others wait for its outcome, or read again if they joined after the read it
   shares was sent (see :mod:`cacheguard.cache.singleflight`). A caller that
   holds the key's write lock loads its own view at once;
3. the leader's one GET, judged by :func:`judge`; on a
   miss the fill flow runs (one filler across processes);
4. Redis down, or the circuit open: a value this process saw within
   ``outage_ttl``, else the gutter's single flight (``gutter=``), else
   ``on_backend_error`` (load directly, or raise); see ``docs/outage.md``;
5. after an outage, the guard's outbox replays run before a value read from
   Redis is served (:class:`Replay`, :mod:`cacheguard.cache.outage.recovery`), and the
   key is read again after them (their invalidations may have deleted it).

With ``stale_if_error``, an error the call would raise (the loader's, or
:class:`BackendUnavailable`) is answered by the last value this process saw,
if seen recently enough (:mod:`cacheguard.cache.outage.fallback`).

A leader that fails shares its error with its followers; one that is
interrupted (cancelled, KeyboardInterrupt) does not: they go on without it.

**The hit path.** Nearly every call is a hit: the leader's one GET answers a
value to serve. Each driver sends that GET without building the flow
(:func:`hit_lead`, then :func:`hit`), on the flow's own
terms: only when the flow would go straight to a plain GET (no L1, no fallback
memory, no outage being handled or behind, the server's clock sampled, no other
caller of the key under way), and what it read is served through the flow's own
functions (:func:`judge`, :func:`serve`). Anything
else (a miss, an error, outbox replays pending) goes on in the flow from the
GET's answer (:class:`Sent`), so every decision stays written once.
"""

from __future__ import annotations

import enum
import functools
import logging
import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Final

from cacheguard.cache.entry import MISSING, Entry, Missing, unpack_entry
from cacheguard.cache.flows.fill import (
    LOOKUP,
    Call,
    FillJob,
    Lookup,
    Outcome,
    Step,
    fill_flow,
    timed_out_flow,
)
from cacheguard.cache.flows.state import GuardState, Lock
from cacheguard.cache.l1 import ABSENT
from cacheguard.cache.outage.fallback import NOT_SEEN, from_loader
from cacheguard.cache.outage.recovery import ReplayFailed
from cacheguard.cache.settings import GuardSettings
from cacheguard.cache.singleflight import VALID_FOR_ALL, Flight
from cacheguard.cache.wire import parse_timed_get, timed_get_call
from cacheguard.checks import Seconds, check_positive
from cacheguard.exceptions import BackendUnavailable, GuardClosed

__all__ = [
    "FRESH",
    "MISS",
    "REFRESH",
    "REPLAY",
    "STALE",
    "Gutter",
    "LoadNow",
    "Read",
    "ReadStep",
    "Replay",
    "RunFill",
    "Sent",
    "Verdict",
    "WaitFlight",
    "client_error",
    "judge",
    "read_call",
    "valid_for_all",
]

log = logging.getLogger("cacheguard")

LATE_FOLLOWER_REREADS: Final = 2  # shared re-reads for late joiners; stragglers read themselves


# -- a hit's verdict --------------------------------------------------------------------

# XFetch refreshes with probability exp(-time_left / (beta * load_duration)).
XFETCH_HORIZON: Final = 40.0


class Verdict(enum.IntEnum):
    """What :func:`judge` says of an entry read from Redis (ordered: serving ones first)."""

    FRESH = 0  # serve it
    REFRESH = 1  # serve it, and refresh it in the background (early refresh)
    STALE = 2  # past its life but within the stale window: serve, reload in the background
    MISS = 3  # fill the key


# The hit path compares them: module-level names, so no enum lookup per hit.
FRESH, REFRESH, STALE, MISS = Verdict.FRESH, Verdict.REFRESH, Verdict.STALE, Verdict.MISS


def judge(entry: Entry, now: float, settings: GuardSettings, rng: Callable[[], float]) -> Verdict:
    """What to do with ``entry`` read at ``now`` (the server's clock, as the entry's
    ``created``): :data:`FRESH` (serve),
    :data:`REFRESH` (serve, refresh in the background), :data:`STALE` (serve within
    the stale window, reload in the background) or :data:`MISS`."""
    left = entry.created + entry.ttl - now
    if left > 0:
        scale = settings.early_refresh_beta * entry.load_duration
        if scale <= 0 or left > XFETCH_HORIZON * scale:
            return FRESH  # a chance below e**-40: not worth a random draw on every hit
        draw = rng()
        if draw > 0 and -scale * math.log(draw) >= left:
            return REFRESH
        return FRESH
    return STALE if settings.stale_ttl > 0 else MISS


class Read:
    """One read of one key (``get_or_load``, ``refresh``): what its flow, and every
    step that runs its loader, need to know. Made by :func:`read_call`."""

    __slots__ = ("fits", "load", "name", "none_ttl", "template", "ttl")

    def __init__(
        self,
        name: str,
        load: Callable[[], Any],
        ttl: float,
        none_ttl: float | Missing | None,
        template: str | None,
        fits: Callable[[Any], bool] | None = None,
    ) -> None:
        self.name = name
        self.load = load
        self.ttl = ttl
        self.none_ttl = none_ttl
        self.template = template  # labels the call's events (see cache/stats.py)
        # A typed read's check of a stored value (cache/typed.py): one that does not
        # fit the type read is a miss, as bytes that do not decode are.
        self.fits = fits

    def __repr__(self) -> str:
        return f"Read({self.name!r}, ttl={self.ttl!r})"


def read_call(
    state: GuardState,
    name: str,
    load: Callable[[], Any],
    ttl: Seconds,
    none_ttl: Seconds | Missing | None,
    template: str | None = None,
    fits: Callable[[Any], bool] | None = None,
) -> Read:
    """The record of a read of ``name`` (already checked), its lifetimes checked and
    made seconds (a timedelta too): ``ttl``, and ``none_ttl`` unless MISSING (the
    setting's) or None (never cached). ``fits``: see :class:`Read`."""
    lifetime = (
        none_ttl
        if isinstance(none_ttl, Missing) or none_ttl is None
        else check_positive("none_ttl", none_ttl)
    )
    return Read(name, load, state.checked_ttl(ttl), lifetime, template, fits)


@dataclass(frozen=True, slots=True)
class WaitFlight:
    """Step: wait up to ``timeout`` s for ``flight``'s leader to finish. Answer:
    ``True`` once it finished, ``False`` at the timeout."""

    flight: Flight
    timeout: float


@dataclass(frozen=True, slots=True)
class RunFill:
    """Step: drive ``flow`` (a fill flow of the key) under ``lock``; ``seal`` seals
    the caller's single flight. Answer: ``(Outcome, generation below which
    followers may share it)``, or the flow's error thrown in."""

    lock: Lock
    flow: Generator[Step, Any, Outcome]
    seal: Callable[[], int]
    call: Read  # whose loader the fill runs, and whose label its events carry


@dataclass(frozen=True, slots=True)
class Gutter:
    """Step: ``get_or_load`` the call's key on the gutter guard (its own single flight
    across processes) with these lifetimes. Answer: the value, or the gutter guard's
    error (:class:`BackendUnavailable` when the gutter is unreachable too) thrown in."""

    call: Read
    ttl: float
    none_ttl: float | None


@dataclass(frozen=True, slots=True)
class LoadNow:
    """Step: run the call's loader now, under no lock and storing nothing (Redis is
    down, or the key's write is our own). Answer: its value, or its error thrown in."""

    call: Read


@dataclass(frozen=True, slots=True)
class Replay:
    """Step: run the guard's outbox replays if still pending (see
    :mod:`cacheguard.cache.outage.recovery`). Answer: None, or their error thrown in."""


REPLAY: Final = Replay()


@dataclass(frozen=True, slots=True)
class Sent:
    """The leader's GET that a driver's hit path sent: its reply (``value``), or the
    ``error`` the driver would have thrown into the flow at that step."""

    value: Any = None
    error: BaseException | None = None

    def reply(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class _NotReplayed:
    """What :func:`replayed_then_reread` gives when the replays failed."""

    def __repr__(self) -> str:
        return "NOT_REPLAYED"


NOT_REPLAYED: Final = _NotReplayed()

ReadStep = Lookup | Call | LoadNow | WaitFlight | RunFill | Gutter | Replay

# Outcomes fresh from Redis or the loader: worth remembering for outage_ttl/stale_if_error.
_FRESH_SOURCES: Final = frozenset({"l2", "loaded", "peer", "unlocked"})


def client_error(exc: BackendUnavailable) -> BaseException:
    """The client's own error behind a :class:`BackendUnavailable` a driver threw in."""
    return exc.__cause__ or exc


def valid_for_all() -> int:
    """The seal of a fill that no single flight shares."""
    return VALID_FOR_ALL


def read(
    state: GuardState, call: Read, since: float | None = None
) -> Generator[ReadStep, Any, Any]:
    """The flow of ``get_or_load``: :func:`read_flow`, answered by the last value
    seen instead of an error under ``stale_if_error``. ``since``: when the call
    began, if before now (a batch's names read one by one share its wait budget)."""
    flow = read_flow(state, call, since=since)
    if state.settings.stale_if_error:
        return stale_if_error(state, flow, call)
    return flow


def stale_if_error(
    state: GuardState, flow: Generator[ReadStep, Any, Any], call: Read
) -> Generator[ReadStep, Any, Any]:
    name, template = call.name, call.template
    try:
        return (yield from flow)
    except Exception as exc:
        if not (isinstance(exc, BackendUnavailable) or from_loader(exc)):
            raise  # the cache's own refusals (LockTimeout, bad input...) stand
        assert state.last_seen is not None
        value = state.last_seen.within(name, state.settings.stale_if_error)
        if value is NOT_SEEN:
            raise
        state.recorder.count("stale_on_error", name, 0.0, exc, template)
        log.info("served the last value seen of %r instead of %r", name, exc)
        return value


def read_flow(
    state: GuardState,
    call: Read,
    led: tuple[Flight, float, Sent] | None = None,
    since: float | None = None,
) -> Generator[ReadStep, Any, Any]:
    """``get_or_load``: the cached value of the call's key, loaded once if missing.
    ``led``: the flight a driver's hit path leads, when its call began, and the GET
    it sent; the flow goes on from that GET's answer. ``since``: see :func:`read`."""
    name, template = call.name, call.template
    if led is not None:
        flight, start, sent = led
    else:
        sent = None
        l1 = state.l1
        if l1 is not None and not state.recovery.pending:  # L1 may predate outbox writes
            kept = l1.tier.get(name)
            if kept is not ABSENT:
                state.recorder.count("l1_hits", name, 0.0, None, template)
                return kept
        start = state.timer() if since is None else since
        while True:  # bounded: every pass waits on a leader that was already running
            flight, leader, joined = state.flights.join(name, start)
            if leader:
                break
            state.loads.refuse_recursion(name, template)  # the leader may be our loader
            lock = state.rwlock(name)
            if lock.local.is_write_held_by_me():
                # Our own write: the leader waits for us, and what it loads is not our
                # view. Load privately (see fill_flow's writing_here), storing nothing.
                flow = fill_flow_of(state, call, lock, refresh=False, stale=None)
                return (yield RunFill(lock, flow, valid_for_all, call))[0].value
            waiting = state.timer()
            left = state.settings.wait_timeout - (waiting - start)
            finished = yield WaitFlight(flight, left)
            state.waited_for_leader(name, waiting)
            if not finished:
                waited = state.timer() - start
                job = fill_job(state, call, lock)
                flow = timed_out_flow(job, None, waited, since=lambda: start)
                return (yield RunFill(lock, flow, valid_for_all, call))[0].value
            if flight.serves(joined):
                if flight.error is not None:
                    raise flight.error
                return flight.result
            # We joined after the leader's read was sent (it may predate a write that
            # ended before we started), or the leader was interrupted: read again.
    try:
        # The leader's read. The hit is written out here, not in a sub-flow: a
        # generator less for the calls that take the flow (L1 on, say).
        breaker = state.breaker(name)
        if sent is not None or breaker.allow():  # a sent GET was allowed already
            l1_seen = state.l1_seen() if state.l1 is not None else None  # before the GET
            seen_ticket = state.seen_ticket(name) if state.last_seen is not None else 0
            sealed = flight.generation  # flights are born sealed for this first GET
            try:
                if sent is not None:
                    raw = sent.reply()
                elif state.timer() < state.server_clock.resample_at:
                    raw = yield LOOKUP
                else:  # the same round trip also samples the server's clock
                    raw = yield from timed_lookup(state, name)
            except BackendUnavailable as exc:
                value, valid_below = yield from bypassed(state, call, flight, exc.__cause__)
            else:
                breaker.success()  # closing, it marks the recovery pending
                if state.recovery.pending:
                    raw = yield from replayed_then_reread(state, name, template)
                if raw is NOT_REPLAYED:
                    # Redis may hold values the outbox's writes replaced: not served,
                    # nor a value remembered or the gutter's (Redis answers: no outage).
                    value, valid_below = yield from bypassed(
                        state, call, flight, None, fallbacks=False
                    )
                else:
                    served, entry = judge_read(state, call, raw, l1_seen, seen_ticket)
                    if served:
                        value, valid_below = entry.value, sealed  # type: ignore[union-attr]
                    else:
                        value, valid_below = yield from fill_missing(
                            state, call, flight, entry, l1_seen, start
                        )
        else:
            value, valid_below = yield from bypassed(state, call, flight, None)
        if flight.has_followers_from(valid_below):
            value, valid_below = yield from reread_for_late_followers(
                state, name, flight, value, valid_below, template
            )
    except BaseException as exc:
        leader_failed(state, name, flight, exc)
        raise
    state.flights.finish(name, flight, value, valid_below=valid_below)
    return value


def leader_failed(state: GuardState, name: str, flight: Flight, exc: BaseException) -> None:
    """The leader of ``flight`` raised ``exc``: an error is its followers' too; a
    cancellation or an interrupt is not an outcome to share (they go on)."""
    if isinstance(exc, Exception):
        state.flights.finish(name, flight, error=exc)
    else:
        state.flights.finish(name, flight, valid_below=0)


def hit_lead(state: GuardState, call: Read) -> tuple[Flight, float] | None:
    """The hit path's start (see the module docstring), before its GET: the new
    flight of the call's key this call leads and when the call began, when the flow
    would go straight to a plain GET; None when the flow runs from its start."""
    name = call.name
    if (
        state.l1 is not None
        or state.last_seen is not None
        or state.recovery.pending
        or not state.breaker(name).closed
    ):
        return None
    start = state.timer()
    if start >= state.server_clock.resample_at:  # the flow's GET samples the clock
        return None
    flight = state.flights.lead(name, start)
    return None if flight is None else (flight, start)


def hit(
    state: GuardState,
    call: Read,
    lead: tuple[Flight, float],
    raw: Any,
    error: BaseException | None,
) -> tuple[Any, Generator[ReadStep, Any, Any] | None]:
    """The hit path's end, after its GET (``raw``, or the ``error`` as a driver
    throws it into the flow): ``(value, None)`` when the flow would serve
    ``raw`` at once, else ``(None, flow)``: the flow from that GET's answer, for
    the driver to run. No I/O; the decisions are the flow's own functions."""
    flight, start = lead
    name = call.name
    try:
        entry = hit_entry(state, name, raw, error)
        if entry is not None and (call.fits is None or call.fits(entry.value)):
            now = state.server_clock.now()
            verdict = judge(entry, now, state.settings, state.rng)
            if verdict != MISS:
                serve(state, call, entry, verdict, now, None, 0)
                sealed = flight.generation  # born sealed for this GET; only we seal
                if flight.has_followers_from(sealed):
                    return None, share(state, name, flight, entry.value, sealed, call.template)
                state.flights.finish(name, flight, entry.value, valid_below=sealed)
                return entry.value, None
    except BaseException as exc:
        leader_failed(state, name, flight, exc)
        raise
    sent = Sent(raw, error)
    return None, read_flow(state, call, (flight, start, sent))


def hit_entry(state: GuardState, name: str, raw: Any, error: BaseException | None) -> Entry | None:
    """The entry the hit path's GET read, if the flow would judge it next: the GET
    answered (the circuit is told, as the flow does), no outbox replay is pending,
    and the bytes decode (what does not is the flow's to count)."""
    if error is not None:
        return None
    state.breaker(name).success()
    if raw.__class__ is not bytes or state.recovery.pending:
        return None
    try:
        return unpack_entry(state.settings.codec, raw)
    except ValueError:
        return None


def share(
    state: GuardState, name: str, flight: Flight, value: Any, valid_below: int, template: str | None
) -> Generator[ReadStep, Any, Any]:
    """The end of :func:`read_flow` for a value the hit path served: followers
    joined after its GET was sent (see :func:`reread_for_late_followers`)."""
    try:
        value, valid_below = yield from reread_for_late_followers(
            state, name, flight, value, valid_below, template
        )
    except BaseException as exc:
        leader_failed(state, name, flight, exc)
        raise
    state.flights.finish(name, flight, value, valid_below=valid_below)
    return value


def fill_missing(
    state: GuardState,
    call: Read,
    flight: Flight,
    stale: Entry | None,
    l1_seen: tuple[int, object] | None,
    start: float,
) -> Generator[ReadStep, Any, tuple[Any, int]]:
    """The leader's GET missed (the call began at ``start``): fill ``name`` (once
    across processes); the value and the generation below which followers may
    take it. ``stale`` is the expired entry, if any, for the stale policy."""
    name = call.name
    state.recorder.count("misses", name, 0.0, None, call.template)
    lock = state.rwlock(name)  # one instance for the job and the driver: one owner
    seen_ticket = state.seen_ticket(name)
    flow = fill_flow_of(
        state,
        call,
        lock,
        refresh=False,
        stale=stale,
        budget=state.settings.wait_timeout - (state.timer() - start),
        since=lambda: flight.newest_start,  # of the followers it serves, and its own
    )
    try:
        outcome, valid_below = yield RunFill(
            lock, flow, functools.partial(state.flights.seal, flight), call
        )
    except BackendUnavailable as exc:  # raised before any load ran (see fill_flow)
        return (yield from bypassed(state, call, flight, exc))
    keep_filled(state, name, outcome, l1_seen, call.ttl)
    if state.last_seen is not None and not outcome.private and outcome.source in _FRESH_SOURCES:
        state.last_seen.note(name, outcome.value, seen_ticket)
    return outcome.value, valid_below


def timed_lookup(state: GuardState, name: str) -> Generator[ReadStep, Any, Any]:
    """The GET of ``name``'s value with the server's clock, sampled for judging
    entries' ages (see :mod:`cacheguard.cache.server_clock`): one round trip."""
    sent = state.timer()
    raw, server = parse_timed_get((yield Call(timed_get_call(state.keys(name)))))
    state.server_clock.sample(server, (sent + state.timer()) / 2)
    return raw


def bypassed(
    state: GuardState,
    call: Read,
    flight: Flight,
    exc: BaseException | None,
    *,
    fallbacks: bool = True,
) -> Generator[ReadStep, Any, tuple[Any, int]]:
    """:func:`bypass` for the flight's leader: its value, for the followers that
    joined before it was sought (sealed first: one who joins during the load may
    have started after a write the load did not see, and must load again)."""
    if state.rwlock(call.name).local.is_write_held_by_me():
        # Our own write's key (guard.write, a tracked transaction): what we load
        # may be uncommitted. Ours alone: not remembered, not shared, no gutter.
        state.refuse_bypass(call.name, exc, call.template)
        return (yield LoadNow(call)), 0
    sealed = state.flights.seal(flight)
    return (yield from bypass(state, call, exc, fallbacks=fallbacks)), sealed


def replayed_then_reread(
    state: GuardState, name: str, template: str | None
) -> Generator[ReadStep, Any, Any]:
    """Run the pending outbox replays, then GET ``name`` again: the value read
    before them may be one the outbox's writes replaced (their invalidation
    deleted it since). :data:`NOT_REPLAYED` if the replays or the GET failed
    (then nothing read from Redis may be served yet)."""
    try:
        yield REPLAY
    except Exception as exc:
        state.recorder.count("replay_failures", name, 0.0, exc, template)
        # Logged once per failed run; the reads it turns away meanwhile are counted.
        if not isinstance(exc, ReplayFailed):
            log.warning("outbox replay failed, %r is not served from Redis: %s", name, exc)
        return NOT_REPLAYED
    try:
        return (yield LOOKUP)
    except BackendUnavailable as exc:
        state.backend_failed(name, client_error(exc), template=template)
        return NOT_REPLAYED


def reread_for_late_followers(
    state: GuardState, name: str, flight: Flight, value: Any, valid_below: int, template: str | None
) -> Generator[ReadStep, Any, tuple[Any, int]]:
    """Some followers joined after our read was sent; one more shared GET serves
    them all (instead of each re-reading). Bounded; stragglers read themselves."""
    for _ in range(LATE_FOLLOWER_REREADS):
        if state.recovery.pending:
            break  # not before the outbox replays ran: late followers read themselves
        sealed = state.flights.seal(flight)
        try:
            entry = state.decode(name, (yield LOOKUP), template=template)
        except BackendUnavailable:
            break
        if entry is None or state.server_clock.now() >= entry.expires_at:
            break  # invalidated again: late followers must load it themselves
        value, valid_below = entry.value, sealed
        if not flight.has_followers_from(sealed):
            break
    return value, valid_below


def bypass(
    state: GuardState, call: Read, exc: BaseException | None, *, fallbacks: bool
) -> Generator[ReadStep, Any, Any]:
    """Redis is down (``exc``) or the circuit is open (None). With ``fallbacks`` (a
    read; a refresh means "load now") a value this process saw within
    ``outage_ttl`` is reused, else the gutter asked; then ``on_backend_error``:
    load directly, or raise."""
    name, template = call.name, call.template
    counted = False
    if fallbacks:
        if exc is not None:
            state.backend_failed(name, exc, template=template)
            counted = True
        seen = state.last_seen
        if seen is not None:
            value = seen.within(name, state.settings.outage_ttl)
            if value is not NOT_SEEN:
                state.recorder.count("outage_reuses", name, 0.0, None, template)
                return value
        if state.gutter is not None:
            try:
                value = yield Gutter(call, *gutter_lifetimes(state, call.ttl, call.none_ttl))
            except BackendUnavailable as gutter_down:
                log.info("the gutter is unreachable too for %r: %s", name, gutter_down)
            else:
                # Not remembered: it may be gutter_ttl old already.
                state.recorder.count("gutter_reads", name, 0.0, None, template)
                return value
    state.refuse_bypass(name, exc, template, failure_counted=counted)
    seen_ticket = state.seen_ticket(name)
    value = yield LoadNow(call)
    if state.last_seen is not None:
        state.last_seen.note(name, value, seen_ticket)
    return value


def gutter_lifetimes(
    state: GuardState, ttl: float, none_ttl: float | Missing | None
) -> tuple[float, float | None]:
    """A read's lifetimes cut to ``gutter_ttl``: the gutter's staleness bound."""
    cap = state.settings.gutter_ttl
    lifetime = state.settings.none_ttl if isinstance(none_ttl, Missing) else none_ttl
    return min(ttl, cap), None if lifetime is None else min(lifetime, cap)


def refresh_flow(state: GuardState, call: Read) -> Generator[ReadStep, Any, Any]:
    """``refresh``: load the call's key now (under its locks, once across processes)
    and store it; Redis down or the circuit open: ``on_backend_error``."""
    state.loads.refuse_recursion(call.name, call.template)
    if not state.breaker(call.name).allow():
        return (yield from bypass(state, call, None, fallbacks=False))
    lock = state.rwlock(call.name)
    flow = fill_flow_of(state, call, lock, refresh=True, stale=None)
    try:
        outcome, _ = yield RunFill(lock, flow, valid_for_all, call)
    except BackendUnavailable as exc:  # raised before any load ran (see fill_flow)
        return (yield from bypass(state, call, exc, fallbacks=False))
    return outcome.value


def peek_flow(
    state: GuardState, name: str, template: str | None = None
) -> Generator[ReadStep, Any, Any]:
    """``peek``: the cached value of ``name`` or MISSING; never loads, never locks."""
    if state.l1 is not None and not state.recovery.pending:
        value = state.l1.tier.get(name)
        if value is not ABSENT:
            return value
    raising = state.settings.on_backend_error == "raise"
    closed = state.circuit_open(f"reading {name!r}", (name,))
    if closed is not None:
        if raising:
            raise closed
        return MISSING
    try:
        raw = (
            (yield LOOKUP)
            if not state.server_clock.due()
            else (yield from timed_lookup(state, name))
        )
        entry = state.decode(name, raw, template=template)
    except BackendUnavailable as exc:
        state.backend_failed(name, client_error(exc), template=template)
        if raising:
            raise BackendUnavailable(
                f"Redis unreachable reading {name!r}: {client_error(exc)}"
            ) from client_error(exc)
        return MISSING
    state.breaker(name).success()
    if state.recovery.pending:
        raw = yield from replayed_then_reread(state, name, template)
        if raw is NOT_REPLAYED:
            if raising:
                raise BackendUnavailable(f"outbox replay failed before reading {name!r}")
            return MISSING
        entry = state.decode(name, raw, template=template)
    return peeked(state, entry)


def peek_entry_flow(state: GuardState, name: str) -> Generator[ReadStep, Any, Any]:
    """``peek_entry``: the stored entry even past its expiry, or None (also while
    pending outbox replays fail: what Redis holds may be replaced)."""
    try:
        raw = yield LOOKUP
    except BackendUnavailable:
        return None
    if state.recovery.pending:
        raw = yield from replayed_then_reread(state, name, None)
        if raw is NOT_REPLAYED:
            return None
    return state.decode(name, raw)


def refresh_in_background(state: GuardState, call: Read) -> None:
    """Start one background refresh of the call's key per process (loop), unless one
    runs."""
    if state.closed:
        return
    flight, leader, _ = state.refreshes.join(call.name)
    if not leader:
        return
    flow = background_refresh_flow(state, call, flight)
    if not state.run_in_background(flow, call.name):
        flow.close()
        state.refreshes.finish(call.name, flight)


def background_refresh_flow(
    state: GuardState, call: Read, flight: Flight
) -> Generator[ReadStep, Any, None]:
    name = call.name
    try:
        lock = state.rwlock(name)
        flow = fill_flow_of(state, call, lock, refresh=True, stale=None, background=True)
        outcome, _ = yield RunFill(lock, flow, valid_for_all, call)
        if outcome.source == "loaded":
            state.recorder.count("early_refreshes", name, 0.0, None, call.template)
    except GuardClosed:
        log.debug("background refresh of %r dropped: the guard closed", name)
    except Exception:
        log.exception("background refresh of %r failed", name)
    finally:
        state.refreshes.finish(name, flight)


def judge_read(
    state: GuardState,
    call: Read,
    raw: Any,
    l1_seen: tuple[int, object] | None,
    seen_ticket: int,
    refresh: Callable[[Read], None] | None = None,
) -> tuple[bool, Entry | None]:
    """What a GET of ``name`` answered is good for: ``(True, entry)`` to serve
    the entry, ``(False, entry or None)`` for a miss (the entry, if any, is kept
    past its expiry for the stale policy). ``seen_ticket``: :meth:`GuardState.seen_ticket`,
    taken before the GET. ``refresh``: what a served entry due for a refresh is
    given to (a batch's: refreshed together); else refreshed alone."""
    entry = state.decode(call.name, raw, template=call.template, fits=call.fits)
    if entry is None:
        return False, None
    now = state.server_clock.now()
    verdict = judge(entry, now, state.settings, state.rng)
    kept = serve(state, call, entry, verdict, now, l1_seen, seen_ticket, refresh)
    return kept, entry


def serve(
    state: GuardState,
    call: Read,
    entry: Entry,
    verdict: Verdict,
    now: float,
    l1_seen: tuple[int, object] | None,
    seen_ticket: int,
    refresh: Callable[[Read], None] | None = None,
) -> bool:
    """Act on :func:`judge`'s ``verdict`` for ``entry`` (judged at ``now``): count
    it, refresh it in the background (``refresh``: see :func:`judge_read`), keep
    it in L1 and the fallback memory, as the verdict says; True to serve it, False
    for a miss."""
    name, template = call.name, call.template
    if verdict <= REFRESH:
        state.recorder.count("l2_hits", name, 0.0, None, template)
        if state.last_seen is not None:
            state.last_seen.note(name, entry.value, seen_ticket)
        if verdict == REFRESH:
            refresh_in_background(state, call) if refresh is None else refresh(call)
        if l1_seen is not None:
            state.l1.keep(name, entry.value, entry.expires_at - now, l1_seen)  # type: ignore[union-attr]
        return True
    if verdict == STALE:  # inside the stale window: serve, reload in the background
        state.recorder.count("stale_served", name, 0.0, None, template)
        refresh_in_background(state, call) if refresh is None else refresh(call)
        return True
    return False


def keep_filled(
    state: GuardState, name: str, outcome: Outcome, l1_seen: tuple[int, object] | None, ttl: float
) -> None:
    """Keep a fill's outcome in L1, for as long as its entry lives."""
    if l1_seen is None or outcome.source not in ("l2", "loaded", "peer"):
        return
    if outcome.entry is not None:
        lifetime = outcome.entry.expires_at - state.server_clock.now()
    else:  # our own store: its TTL was jittered, never below this floor
        lifetime = ttl * (1 - state.settings.ttl_jitter)
    if lifetime > 0:
        state.l1.keep(name, outcome.value, lifetime, l1_seen)  # type: ignore[union-attr]


def peeked(state: GuardState, entry: Entry | None) -> Any:
    if entry is None or state.server_clock.now() >= entry.expires_at:
        return MISSING
    return entry.value


def fill_flow_of(
    state: GuardState,
    call: Read,
    lock: Lock,
    *,
    refresh: bool,
    stale: Entry | None,
    background: bool = False,
    budget: float | None = None,
    since: Callable[[], float] | None = None,
) -> Generator[Step, Any, Outcome]:
    """The fill flow of the call's key for either driver (a loader asking for its
    own key is refused here, before any wait); ``since``: see :func:`fill_flow`."""
    state.loads.refuse_recursion(call.name, call.template)
    return fill_flow(
        fill_job(state, call, lock),
        refresh=refresh,
        background=background,
        stale=stale,
        budget=state.settings.wait_timeout if budget is None else budget,
        since=since,
    )


def fill_job(state: GuardState, call: Read, lock: Lock) -> FillJob:
    # The flow counts by name; the template rides along in the callbacks.
    name, template = call.name, call.template
    return FillJob(
        name=name,
        keys=lock.remote.keys,
        owner=lock.owner,
        settings=state.settings,
        ttl=call.ttl,
        none_ttl=call.none_ttl,
        writing_here=lock.local.is_write_held_by_me(),
        stamps=functools.partial(state.invalidation.stamps_for, name),
        timer=state.timer,
        clock=state.server_clock.now,
        saw_server_clock=state.server_clock.sample,
        rng=state.rng,
        count=functools.partial(state.recorder.count, template=template),
        decode=functools.partial(state.decode, name, template=template, fits=call.fits),
        decode_quiet=functools.partial(state.decode, name, count=False, fits=call.fits),
        backend_failed=functools.partial(state.backend_failed, template=template),
        shared_loads=state.shared_loads,
        backoff=state.wait_backoff,
        replay_pending=state.replay_pending,
        checks_snapshots=state.checks_snapshots,
    )
    # -- what each guard provides --------------------------------------------------------
