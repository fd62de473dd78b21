"""The batch read flow, with no I/O in it: ``get_or_load_many``.

Each name gets what ``get_or_load`` gives it; the batch only shares round trips
and the load:

1. L1, when the guard has one, then one GET per name in a single round trip
   (:class:`GetMany`: a pipeline; on a cluster, one per node, a node that fails
   charged to its own breaker and bypassing its own names only), every reply
   judged by the single read's own :func:`~cacheguard.cache.flows.read.judge_read`
   (entries served but due for a refresh collected, for one :func:`refresh_many`);
2. the misses, in name order, each tried without waiting: the key's single flight
   led (else another caller of this process has it), its local read lock taken
   if free (:class:`TryHold`), and its fill flow run in background mode, which
   gives up at once when another process fills the key or a writer holds it.
   A fill we begin stops at its load (it is the key's one filler now);
3. one :class:`LoadMany` for every key we fill; each fill then ends as a single
   fill does (a version-checked store, its hold released, the value announced);
4. only then, with nothing of ours held, each name left over (filled elsewhere,
   led by another caller here, a writer at work) is read as ``get_or_load``
   reads it, one after another within the batch's wait budget: the waits wake
   on the announcements, and where ``get_or_load`` would load, that name is
   loaded by a ``load_many`` call of its own.

No caller waits while holding a fill or a flight of its own, so two batches with
overlapping names (in any order) cannot wait for each other. Redis unreachable
(or its circuit open) for the round trip: ``on_backend_error`` for every name,
then one ``load_many`` for them all, storing nothing. Redis failing a fill's
begin in step 2: no more fills are begun, and step 3's ``load_many`` also loads
every remaining miss, bypassed as above (nothing stored, no more attempts).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Final

from cacheguard.cache.entry import Entry
from cacheguard.cache.flows.fill import (
    HoldLocal,
    Load,
    LoadUnlocked,
    Outcome,
    Seal,
    Step,
)
from cacheguard.cache.flows.read import (
    _FRESH_SOURCES,
    REPLAY,
    Read,
    ReadStep,
    bypass,
    client_error,
    fill_flow_of,
    judge_read,
    keep_filled,
    read,
    timed_lookup,
)
from cacheguard.cache.flows.state import GuardState, Lock
from cacheguard.cache.l1 import ABSENT
from cacheguard.cache.outage.fallback import NOT_SEEN, from_loader
from cacheguard.cache.outage.recovery import ReplayFailed
from cacheguard.cache.singleflight import Flight
from cacheguard.exceptions import BackendUnavailable, GuardClosed, IncompleteLoad

__all__ = [
    "BatchFill",
    "BatchStep",
    "EndFill",
    "FillStep",
    "GetMany",
    "LoadMany",
    "ReadOne",
    "TryHold",
    "batch_read",
    "refresh_many",
]

log = logging.getLogger("cacheguard")


class BatchFill:
    """One key's fill inside a batch: its call, lock, the flight it leads, its fill
    flow, where that flow stopped, and the last seal (what followers may share)."""

    __slots__ = ("call", "flight", "flow", "lock", "sealed", "seen_ticket", "step")

    def __init__(
        self,
        call: Read,
        lock: Lock,
        flight: Flight,
        flow: Generator[Step, Any, Outcome],
        seen_ticket: int,
    ) -> None:
        self.call, self.lock, self.flight, self.flow = call, lock, flight, flow
        self.sealed = flight.generation
        self.seen_ticket = seen_ticket
        self.step: Step | None = None

    @property
    def name(self) -> str:
        return self.call.name


@dataclass(frozen=True, slots=True)
class GetMany:
    """Step: GET the value of each of ``names`` (keys of one node) in one round trip.
    Answer: the replies in order (bytes, None, or the error a key of another type
    gave); Redis being down is thrown in."""

    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LoadMany:
    """Step: call the batch's ``load_many`` once for ``names``. Answer: ``(values,
    seconds, snapshot watermark or None)``, ``values`` holding the names it
    returned; its error thrown in."""

    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TryHold:
    """Step: take ``fill``'s local read lock if it is free now. Answer: True if taken
    (the driver releases it at :class:`EndFill`), else False."""

    fill: BatchFill


@dataclass(frozen=True, slots=True)
class FillStep:
    """Step: carry out ``step`` of ``fill``'s flow as a fill driver does. Answer:
    the step's answer; its error thrown in."""

    fill: BatchFill
    step: Step


@dataclass(frozen=True, slots=True)
class EndFill:
    """Step: ``fill``'s flow ended: release what the driver holds for it. Answer: None."""

    fill: BatchFill


@dataclass(frozen=True, slots=True)
class ReadOne:
    """Step: run ``flow`` (a read of ``name`` alone) to its end with the guard's own
    driver. Answer: its value; its error thrown in."""

    flow: Generator[Any, Any, Any]
    name: str


BatchStep = GetMany | LoadMany | TryHold | FillStep | EndFill | ReadOne | ReadStep


class _Parked:
    def __repr__(self) -> str:
        return "PARKED"


PARKED: Final = _Parked()  # a fill stopped at its load: we are the key's filler
_SKIPPED: Final = Outcome(None, "skipped")


def batch_read(
    state: GuardState, calls: list[Read], due: list[Read] | None = None
) -> Generator[BatchStep, Any, dict[str, Any]]:
    """``get_or_load_many`` over ``calls`` (distinct names, checked): name -> value.
    ``due``: gets the calls whose entries were served but are due for a refresh
    (early refresh, the stale window), for one :func:`refresh_many` of them all;
    without it, each is refreshed alone."""
    start = state.timer()
    for call in calls:  # before anything is led or held
        state.loads.refuse_recursion(call.name, call.template)
    values: dict[str, Any] = {}
    pending = calls
    l1 = state.l1
    if l1 is not None and not state.recovery.pending:  # L1 may predate outbox writes
        pending = []
        for call in calls:
            kept = l1.tier.get(call.name)
            if kept is ABSENT:
                pending.append(call)
            else:
                state.recorder.count("l1_hits", call.name, 0.0, None, call.template)
                values[call.name] = kept
    if pending:
        try:
            yield from _read_pending(state, pending, values, start, due)
        except Exception as exc:
            _stale_if_error(state, pending, values, exc)
    return values


def _stale_if_error(
    state: GuardState, calls: list[Read], values: dict[str, Any], exc: Exception
) -> None:
    """Under ``stale_if_error``, a failing load or Redis being down is answered, as for
    ``get_or_load``, by the last values seen here, if recent enough: only when every
    name without a value has one (else ``exc`` is raised)."""
    window, seen = state.settings.stale_if_error, state.last_seen
    if not window or seen is None or not (isinstance(exc, BackendUnavailable) or from_loader(exc)):
        raise exc
    kept = {call: seen.within(call.name, window) for call in calls if call.name not in values}
    if any(value is NOT_SEEN for value in kept.values()):
        raise exc
    for call, value in kept.items():
        state.recorder.count("stale_on_error", call.name, 0.0, exc, call.template)
        values[call.name] = value
    log.info("served the last values seen of %d keys instead of %r", len(kept), exc)


def _read_pending(
    state: GuardState,
    calls: list[Read],
    values: dict[str, Any],
    start: float,
    due: list[Read] | None,
) -> Generator[BatchStep, Any, None]:
    allowed: dict[int, bool] = {}  # asked once per breaker: a half-open one allows one probe
    reachable: list[Read] = []
    refused: list[Read] = []
    for call in calls:
        breaker = state.breaker(call.name)
        ok = allowed.get(id(breaker))
        if ok is None:
            ok = allowed[id(breaker)] = breaker.allow()
        (reachable if ok else refused).append(call)
    if refused:
        yield from _bypass_all(state, refused, None, values)
    if not reachable:
        return
    l1_seen = state.l1_seen() if state.l1 is not None else None  # before the GET
    tickets = {call.name: state.seen_ticket(call.name) for call in reachable}
    raws, failed, error = yield from _get_by_node(state, reachable, sample=True)
    if failed:  # those nodes' names only, each node's failure charged to its breaker
        yield from _bypass_all(state, failed, error, values, counted=True)
        reachable = [call for call in reachable if call.name in raws]
        if not reachable:
            return
    if state.recovery.pending:
        reread = yield from _replayed_then_reread(state, reachable)
        if reread is None:  # nothing read from Redis may be served yet
            yield from _bypass_all(state, reachable, None, values, fallbacks=False)
            return
        raws = reread
    misses: list[tuple[Read, Entry | None]] = []
    for call in reachable:
        raw, ticket = raws[call.name], tickets[call.name]
        refresh = None if due is None else due.append
        served, entry = judge_read(state, call, raw, l1_seen, ticket, refresh)
        if served:
            values[call.name] = entry.value  # type: ignore[union-attr]
        else:
            misses.append((call, entry))
    if misses:
        yield from _fill_many(state, misses, values, l1_seen, start)


def _get_by_node(
    state: GuardState, calls: list[Read], *, sample: bool = False
) -> Generator[BatchStep, Any, tuple[dict[str, Any], list[Read], BaseException | None]]:
    """GET the value of each call's key, one :class:`GetMany` per node (per breaker:
    one on a single Redis): the replies by name, the calls of the nodes that
    failed (each failure counted once, on its own node's breaker) and the first
    failure. ``sample``: the server's clock is sampled first when due."""
    groups: dict[int, list[Read]] = {}
    for call in calls:
        groups.setdefault(id(state.breaker(call.name)), []).append(call)
    raws: dict[str, Any] = {}
    failed: list[Read] = []
    error: BaseException | None = None
    for group in groups.values():
        names = tuple(call.name for call in group)
        try:
            if sample and state.timer() >= state.server_clock.resample_at:
                yield from timed_lookup(state, names[0])  # samples the server's clock
            replies = yield GetMany(names)
        except BackendUnavailable as exc:
            error = error or client_error(exc)
            state.backend_failed(names[0], client_error(exc), template=group[0].template)
            failed.extend(group)
            continue
        sample = False
        state.breaker(names[0]).success()  # closing, it marks the recovery pending
        raws.update(zip(names, replies, strict=True))
    return raws, failed, error


def _replayed_then_reread(
    state: GuardState, calls: list[Read]
) -> Generator[BatchStep, Any, dict[str, Any] | None]:
    """The batch's :func:`~cacheguard.cache.flows.read.replayed_then_reread`: None
    when the replays or the GETs after them failed."""
    first = calls[0]
    try:
        yield REPLAY
    except Exception as exc:
        state.recorder.count("replay_failures", first.name, 0.0, exc, first.template)
        if not isinstance(exc, ReplayFailed):
            log.warning("outbox replay failed, a batch is not served from Redis: %s", exc)
        return None
    raws, failed, _ = yield from _get_by_node(state, calls)
    return None if failed else raws


def _bypass_all(
    state: GuardState,
    calls: list[Read],
    exc: BaseException | None,
    values: dict[str, Any],
    *,
    fallbacks: bool = True,
    counted: bool = False,
) -> Generator[BatchStep, Any, None]:
    """Redis is down (``exc``, one failure for the batch's one round trip; with
    ``counted``, failures counted already, per node) or a circuit is open (None):
    a value seen within ``outage_ttl`` per name, then ``on_backend_error`` (raise,
    or one ``load_many`` for the rest, storing nothing). With a gutter, each name
    goes through it as ``get_or_load`` does."""
    if fallbacks and state.gutter is not None:
        if exc is not None and not counted:
            state.backend_failed(calls[0].name, exc, template=calls[0].template)
        for call in calls:
            values[call.name] = yield ReadOne(bypass(state, call, None, fallbacks=True), call.name)
        return
    direct = _bypassed_calls(state, calls, exc, values, fallbacks=fallbacks, counted=counted)
    if not direct:
        return
    tickets = [state.seen_ticket(call.name) for call in direct]
    names = tuple(call.name for call in direct)
    loaded, _, _ = yield LoadMany(names)
    _check_complete(names, loaded)
    _keep_bypassed(state, direct, tickets, loaded, values)


def _bypassed_calls(
    state: GuardState,
    calls: list[Read],
    exc: BaseException | None,
    values: dict[str, Any],
    *,
    fallbacks: bool = True,
    counted: bool = False,
) -> list[Read]:
    """The bypass of ``calls`` up to its load (Redis failed with ``exc``, counted
    once here unless ``counted``, or a circuit is open): a value seen within
    ``outage_ttl`` served, else ``on_backend_error`` (raise, or count a bypass).
    The calls to load directly, storing nothing."""
    if exc is not None and not counted:
        state.backend_failed(calls[0].name, exc, template=calls[0].template)
    direct: list[Read] = []
    seen = state.last_seen
    for call in calls:
        if fallbacks and seen is not None:
            value = seen.within(call.name, state.settings.outage_ttl)
            if value is not NOT_SEEN:
                state.recorder.count("outage_reuses", call.name, 0.0, None, call.template)
                values[call.name] = value
                continue
        state.refuse_bypass(call.name, exc, call.template, failure_counted=True)
        direct.append(call)
    return direct


def _keep_bypassed(
    state: GuardState,
    direct: list[Read],
    tickets: list[int],
    loaded: dict[str, Any],
    values: dict[str, Any],
) -> None:
    """The values loaded for bypassed ``direct`` calls: served and remembered, not stored."""
    seen = state.last_seen
    for call, ticket in zip(direct, tickets, strict=True):
        value = values[call.name] = loaded[call.name]
        if seen is not None and not state.rwlock(call.name).local.is_write_held_by_me():
            seen.note(call.name, value, ticket)


def _check_complete(names: tuple[str, ...], loaded: dict[str, Any]) -> None:
    missing = tuple(name for name in names if name not in loaded)
    if missing:
        raise IncompleteLoad(missing)


def _fill_many(
    state: GuardState,
    misses: list[tuple[Read, Entry | None]],
    values: dict[str, Any],
    l1_seen: tuple[int, object] | None,
    start: float,
) -> Generator[BatchStep, Any, None]:
    """Steps 2 to 4 of the module docstring."""
    later: list[Read] = []  # read alone once our own fills ended
    led: list[BatchFill] = []  # flights we lead, until finished
    parked: list[BatchFill] = []  # fills we begun, stopped at their load
    unbegun: list[Read] = []  # misses left once Redis failed a fill's begin
    down: BackendUnavailable | None = None
    try:
        for call, stale in sorted(misses, key=lambda miss: miss[0].name):
            if down is not None:  # Redis failed: no more fills begun, no more attempts
                unbegun.append(call)
                continue
            flight = state.flights.lead(call.name, start)
            if flight is None:  # another caller of this process reads it: follow it later
                later.append(call)
                continue
            lock = state.rwlock(call.name)
            flow = fill_flow_of(
                state,
                call,
                lock,
                refresh=False,
                stale=stale,
                background=True,  # never waits: busy elsewhere ends it at once
                budget=state.settings.wait_timeout - (state.timer() - start),
                since=_newest_start(flight),
            )
            fill = BatchFill(call, lock, flight, flow, state.seen_ticket(call.name))
            led.append(fill)
            try:
                outcome = yield from _advance(state, fill, functools.partial(next, flow))
            except BackendUnavailable as exc:  # before any load: bypassed with the rest
                yield EndFill(fill)
                led.remove(fill)
                state.flights.finish(call.name, flight, valid_below=0)  # followers go on
                down = exc
                unbegun.append(call)
                continue
            if outcome is PARKED:
                parked.append(fill)
                continue
            yield EndFill(fill)
            led.remove(fill)
            assert isinstance(outcome, Outcome)
            if outcome.source == "skipped":  # someone else fills it, or a writer is at work
                state.flights.finish(call.name, flight, valid_below=0)  # followers go on
                later.append(call)
            else:
                _done(state, fill, outcome, values, l1_seen)
        direct: list[Read] = []
        if down is not None and state.gutter is None:
            direct = _bypassed_calls(state, unbegun, client_error(down), values)
        if parked or direct:
            position = {call.name: i for i, (call, _) in enumerate(misses)}
            parked.sort(key=lambda fill: position[fill.name])  # load_many: the caller's order
            direct.sort(key=lambda call: position[call.name])
            yield from _load_parked(state, parked, led, values, l1_seen, direct)
        if down is not None and state.gutter is not None:  # each through it, nothing held
            yield from _bypass_all(state, unbegun, client_error(down), values)
    except BaseException as exc:
        if not isinstance(exc, GeneratorExit):
            for fill in parked:  # whose fills are still ours: end them, storing nothing
                if fill.step is not None:
                    yield from _end_failed(state, fill, exc)
        for fill in led:
            if isinstance(exc, Exception) and not isinstance(exc, IncompleteLoad):
                state.flights.finish(fill.name, fill.flight, error=exc)
            else:  # an interrupt, or a name left out: not an outcome to share
                state.flights.finish(fill.name, fill.flight, valid_below=0)
        raise
    for call in later:
        values[call.name] = yield ReadOne(read(state, call, since=start), call.name)


def _newest_start(flight: Flight) -> Callable[[], float]:
    return lambda: flight.newest_start


def _advance(
    state: GuardState,
    fill: BatchFill,
    resume: Callable[[], Step],
    *,
    park: bool = True,
) -> Generator[BatchStep, Any, Outcome | _Parked]:
    """Run ``fill``'s flow from ``resume()`` to its outcome; with ``park``, stop at
    its load (:data:`PARKED`) and end it as skipped where it would wait for the
    key's local lock. Seals are answered here: the flight is the batch's."""
    flow = fill.flow
    try:
        step = resume()
        while True:
            if step.__class__ is Seal:
                fill.sealed = state.flights.seal(fill.flight)
                step = flow.send(None)
                continue
            if park:
                if isinstance(step, (Load, LoadUnlocked)):
                    fill.step = step
                    return PARKED
                if isinstance(step, HoldLocal):
                    if (yield TryHold(fill)):
                        step = flow.send(None)
                        continue
                    flow.close()  # a local writer holds the key: read it alone later
                    return _SKIPPED
            try:
                reply = yield FillStep(fill, step)
            except GeneratorExit:
                flow.close()
                raise
            except BaseException as exc:
                step = flow.throw(exc)
            else:
                step = flow.send(reply)
    except StopIteration as done:
        outcome: Outcome = done.value
        return outcome


def _load_parked(
    state: GuardState,
    parked: list[BatchFill],
    led: list[BatchFill],
    values: dict[str, Any],
    l1_seen: tuple[int, object] | None,
    direct: list[Read],
) -> Generator[BatchStep, Any, None]:
    """One ``load_many`` for the fills we begun and the ``direct`` (bypassed) calls,
    then each fill ends with its value (stored version-checked, announced); a name
    it left out ends failed. Nothing is stored for the ``direct`` calls."""
    tickets = [state.seen_ticket(call.name) for call in direct]
    names = tuple(fill.name for fill in parked) + tuple(call.name for call in direct)
    loaded, seconds, snapshot = yield LoadMany(names)
    missing = tuple(name for name in names if name not in loaded)
    incomplete = IncompleteLoad(missing) if missing else None
    error: BaseException | None = None
    for fill in list(parked):
        step, fill.step = fill.step, None
        parked.remove(fill)
        flow = fill.flow
        if fill.name in missing:
            resume: Callable[[], Step] = functools.partial(flow.throw, incomplete)
        elif isinstance(step, LoadUnlocked):  # our own write's key: ours alone
            resume = functools.partial(flow.send, loaded[fill.name])
        else:
            resume = functools.partial(flow.send, (loaded[fill.name], seconds, snapshot))
        try:
            outcome = yield from _advance(state, fill, resume, park=False)
        except Exception as exc:  # its store failed (SerializationError), or left out
            yield EndFill(fill)
            led.remove(fill)
            if exc is incomplete:
                state.flights.finish(fill.name, fill.flight, valid_below=0)
            else:
                state.flights.finish(fill.name, fill.flight, error=exc)
            error = error or exc
            continue
        yield EndFill(fill)
        led.remove(fill)
        assert isinstance(outcome, Outcome)
        _done(state, fill, outcome, values, l1_seen)
    if error is not None:
        raise error
    if incomplete is not None:  # only bypassed names were left out
        raise incomplete
    _keep_bypassed(state, direct, tickets, loaded, values)


def _end_failed(
    state: GuardState, fill: BatchFill, error: BaseException
) -> Generator[BatchStep, Any, None]:
    """End a parked fill as failed (its hold released, nothing stored)."""
    fill.step = None
    try:
        yield from _advance(state, fill, functools.partial(fill.flow.throw, error), park=False)
    except BaseException as exc:
        if exc is not error:
            raise
    yield EndFill(fill)


def _done(
    state: GuardState,
    fill: BatchFill,
    outcome: Outcome,
    values: dict[str, Any],
    l1_seen: tuple[int, object] | None,
) -> None:
    """A fill of the batch ended with ``outcome``: as the end of a single read's fill."""
    call = fill.call
    state.recorder.count("misses", call.name, 0.0, None, call.template)
    keep_filled(state, call.name, outcome, l1_seen, call.ttl)
    if state.last_seen is not None and not outcome.private and outcome.source in _FRESH_SOURCES:
        state.last_seen.note(call.name, outcome.value, fill.seen_ticket)
    valid_below = 0 if outcome.private else fill.sealed
    state.flights.finish(call.name, fill.flight, outcome.value, valid_below=valid_below)
    values[call.name] = outcome.value


def refresh_many(state: GuardState, calls: list[Read]) -> Generator[BatchStep, Any, dict[str, Any]]:
    """The background refresh of the entries a batch served that were due for one:
    the names no refresh of this process runs yet, each refilled as a single
    background refresh is (its fill begun without waiting, given up when the key
    is busy elsewhere), with one ``load_many`` for all the fills begun. Failures
    are logged; nothing is returned."""
    led: list[tuple[Read, Flight]] = []
    if not state.closed:
        for call in calls:
            flight, leader, _ = state.refreshes.join(call.name)
            if leader:
                led.append((call, flight))
    try:
        yield from _refresh_led(state, led)
    except GuardClosed:
        log.debug("background refresh of %d keys dropped: the guard closed", len(led))
    except Exception:
        log.exception("background refresh of %d keys failed", len(led))
    finally:
        for call, flight in led:
            state.refreshes.finish(call.name, flight)
    return {}


def _refresh_led(
    state: GuardState, led: list[tuple[Read, Flight]]
) -> Generator[BatchStep, Any, None]:
    parked: list[BatchFill] = []
    try:
        for call, flight in led:
            lock = state.rwlock(call.name)
            flow = fill_flow_of(state, call, lock, refresh=True, stale=None, background=True)
            fill = BatchFill(call, lock, flight, flow, 0)
            try:
                outcome = yield from _advance(state, fill, functools.partial(next, flow))
            except BackendUnavailable:  # before any load: the next read goes on as usual
                yield EndFill(fill)
                break
            if outcome is PARKED:
                parked.append(fill)
            else:
                yield EndFill(fill)
        if parked:
            yield from _refresh_parked(state, parked)
    except BaseException as exc:
        if not isinstance(exc, GeneratorExit):
            for fill in parked:  # whose fills are still ours: end them, storing nothing
                if fill.step is not None:
                    yield from _end_failed(state, fill, exc)
        raise


def _refresh_parked(state: GuardState, parked: list[BatchFill]) -> Generator[BatchStep, Any, None]:
    """One ``load_many`` for the refreshes begun, then each ends as its fill does."""
    names = tuple(fill.name for fill in parked)
    loaded, seconds, snapshot = yield LoadMany(names)
    missing = tuple(name for name in names if name not in loaded)
    incomplete = IncompleteLoad(missing) if missing else None
    error: BaseException | None = None
    for fill in parked:
        fill.step = None
        if fill.name in missing:
            resume: Callable[[], Step] = functools.partial(fill.flow.throw, incomplete)
        else:
            resume = functools.partial(fill.flow.send, (loaded[fill.name], seconds, snapshot))
        try:
            outcome = yield from _advance(state, fill, resume, park=False)
        except Exception as exc:  # its store failed, or its name was left out
            error = error or exc
        else:
            assert isinstance(outcome, Outcome)
            if outcome.source == "loaded":
                state.recorder.count("early_refreshes", fill.name, 0.0, None, fill.call.template)
        yield EndFill(fill)
    if error is not None:
        raise error
