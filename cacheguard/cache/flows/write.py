"""The write path's flows, with no I/O in them: ``write``, ``invalidate``,
``invalidate_prefix``, ``watermark``.

As for the read path (:mod:`cacheguard.cache.flows.read`), each public call of
both guards is one generator function here, over the guard's state (a
:class:`~cacheguard.cache.flows.state.GuardState`); the guards only carry out its steps.
``write`` yields :data:`BODY` where the caller's ``with`` block runs: the
driver suspends the flow there, runs the block, and resumes it with the
block's error thrown in, if any.

``write``: the keys' write locks in one global order (two writers on
overlapping keys cannot deadlock), invalidate, the body, invalidate again
(also when the body raised; a failing closing invalidation is attached to the
body's error, not raised in its place), release (always); then a lock lost
meanwhile (its handle marked lost by a renewal, or its release finding the
holding gone) raises :class:`LockLostError`, or is attached to the error
already on its way out.

``invalidate``: one number from the namespace's sequence for the whole call,
taken first (the keys' scripts then run in their own slots), then every key is
stamped with it and deleted; a version that ran ahead lifts the sequence. On a
cluster whose sequence node is down the keys are stamped with a poison instead
(:mod:`cacheguard.cache.invalidation`), healed by a later invalidation.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import Any, Final

from redis.exceptions import OutOfMemoryError

from cacheguard.cache.flows.fill import Call
from cacheguard.cache.flows.read import client_error
from cacheguard.cache.flows.state import GuardState, add_note, closing_failed_note
from cacheguard.cache.invalidation import SCAN_BATCH
from cacheguard.checks import Seconds, check_positive
from cacheguard.exceptions import BackendUnavailable, LockLostError, WriteNotConfirmed
from cacheguard.redis.errors import REDIS_DOWN, backend_down
from cacheguard.redis.scripts import Confirm, ScriptCall

__all__ = [
    "BODY",
    "AcquireWrite",
    "Body",
    "Command",
    "Pipelined",
    "ReleaseWrites",
    "Scan",
    "WriteStep",
    "invalidate_flow",
    "invalidate_prefix_flow",
    "watermark_flow",
    "write_flow",
    "write_lock_lost",
]

log = logging.getLogger("cacheguard")


@dataclass(frozen=True, slots=True)
class Command:
    """Step: send one Redis command (``("INCR", key)``). Answer: its reply."""

    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Pipelined:
    """Step: run script calls in one round trip, then WAIT for ``confirm``'s replicas
    (None: no WAIT). Answer: their replies, errors in place (unacknowledged calls:
    :class:`WriteNotConfirmed`)."""

    calls: tuple[ScriptCall, ...]
    confirm: Confirm | None = None


@dataclass(frozen=True, slots=True)
class Scan:
    """Step: every key matching ``pattern`` (SCAN). Answer: ``list[bytes]``."""

    pattern: str


@dataclass(frozen=True, slots=True)
class AcquireWrite:
    """Step: take ``lock`` for writing within ``timeout`` s (None: the lock's own).
    Answer: what ``acquire_write`` returned (the hold's handle, when the lock gives
    one), or :class:`LockTimeout` thrown in."""

    lock: Any
    timeout: float | None
    holder: Any = None  # whom the hold is for (sync: a Holder; asyncio: the task's)


@dataclass(frozen=True, slots=True)
class ReleaseWrites:
    """Step: release ``locks``' write holds taken by ``holder`` (the sync guard's
    :class:`~cacheguard._identity.Holder`, or the task that entered), last first,
    each even if another fails. Runs to its end even when the caller is cancelled
    meanwhile. Answer: for each of ``locks`` (in their order), the exception its
    release raised, or None."""

    locks: tuple[Any, ...]
    holder: Any


@dataclass(frozen=True, slots=True)
class Body:
    """Step: run the caller's ``with`` block. Answer: None, or its error thrown in."""


BODY: Final = Body()

WriteStep = Command | Pipelined | Call | Scan | AcquireWrite | ReleaseWrites | Body


def write_flow(
    state: GuardState, names: Iterable[str], timeout: Seconds | None, holder: Any
) -> Generator[WriteStep, Any, None]:
    """``write``: ``holder`` is whom the holds are for (the exit may run in another
    thread than the enter: ASGI servers run a sync dependency's enter and exit in
    two worker threads, so the holds are the holder's, not a thread's). ``timeout``
    (seconds or a timedelta) is checked before any lock is asked for."""
    ordered = sorted(set(names))
    if not ordered:
        raise ValueError("write() needs at least one key name")
    limit = None if timeout is None else check_positive("timeout", timeout)
    # Dropped before Redis is asked: a write refused because Redis is down may
    # still reach the database (an outbox, a caller's fallback), so this
    # process must not reuse what it saw of the names (outage_ttl).
    state.forget_here(ordered)
    # The nodes of the write's keys; not the invalidation sequence's (without it
    # the invalidations poison instead, see stamp_flow).
    closed = state.circuit_open(f"writing {', '.join(map(repr, ordered))}", ordered)
    if closed is not None:
        raise closed
    held: list[Any] = []
    handles: list[Any] = []  # what each acquisition returned (a handle, or None)
    try:
        for name in ordered:
            lock = state.write_lock(name)
            try:
                handle = yield AcquireWrite(lock, limit, holder)
            except BackendUnavailable as exc:  # the lock layer's: count it here too
                state.backend_failed(name, client_error(exc))
                raise
            held.append(lock)
            handles.append(handle)
        yield from invalidate_flow(state, ordered, checked=True)
        try:
            yield BODY
        except BaseException as body_error:
            # The body's error is what the caller must see; a failing closing
            # invalidation is attached to it, not raised in its place.
            try:
                yield from invalidate_flow(state, ordered, checked=True)
            except Exception as closing_error:
                add_note(body_error, closing_failed_note(ordered, closing_error))
            raise
        yield from invalidate_flow(state, ordered, checked=True)
    except BaseException as error:
        if held:  # the error wins; a lost lock is attached to it
            for lost in (yield from release_writes(state, held, handles, holder)):
                add_note(error, f"cacheguard: {lost}")
                log.warning("%s (while the write raised %r)", lost, error)
        raise
    # The closing invalidation ran: a lock lost meanwhile is the caller's error now
    # (another writer may have run between the invalidations, its body with ours).
    losses = yield from release_writes(state, held, handles, holder)
    if losses:
        for other in losses[1:]:
            add_note(losses[0], f"cacheguard: also {other}")
        raise losses[0]


def release_writes(
    state: GuardState, held: list[Any], handles: list[Any], holder: Any
) -> Generator[WriteStep, Any, list[LockLostError]]:
    """Release ``held`` (last first); the losses: locks whose release found the
    holding gone, or whose handle a renewal had marked lost."""
    errors = yield ReleaseWrites(tuple(held), holder)
    losses: list[LockLostError] = []
    for lock, handle, error in zip(held, handles, errors or [None] * len(held), strict=True):
        if error is not None and not isinstance(error, LockLostError):
            log.error("releasing the write lock of %r failed", lock.name, exc_info=error)
        if isinstance(error, LockLostError) or getattr(handle, "lost", False):
            losses.append(write_lock_lost(lock.name, handle, error))
    return losses


def invalidate_flow(
    state: GuardState,
    names: list[str] | tuple[str, ...],
    *,
    checked: bool = False,
    template: str | None = None,
) -> Generator[WriteStep, Any, None]:
    """``invalidate``: stamp ``names`` with the next invalidation number and delete
    them. Every fill in flight for them fails its store, and so does every later
    fill from an older database snapshot; L1 copies everywhere are dropped.
    ``checked``: the caller (a write) asked the circuit already; asking again
    would refuse the write's own probe of a half-open circuit. ``template``
    (the names' key template, if known) labels the events."""
    if not names:
        return
    state.forget_here(names)
    what = f"invalidating {', '.join(map(repr, names))}"
    closed = None if checked else state.circuit_open(what, names)
    if closed is not None:
        raise closed
    invalidation = state.invalidation
    stamp = yield from stamp_flow(state, what, names, template=template)
    try:
        results = yield Pipelined(tuple(invalidation.calls(names, stamp)), state.confirm())
    except BackendUnavailable as exc:
        failure = unavailable(state, what, exc, names[0], template=template)
        raise failure from client_error(exc)
    finally:
        # Sent (perhaps applied even if its reply failed): loads of the names under
        # way here may predate it, so later calls must not wait for them nor share them.
        state.written(names)
    # On a cluster each call stands alone: one whose node is down or failing over
    # is that call's error (and its node's breaker's), while the others went through.
    failed: BackendUnavailable | None = None
    for name, result in zip(names, results, strict=True):
        if isinstance(result, WriteNotConfirmed):  # the master is up: no breaker failure
            state.recorder.count("backend_errors", name, 0.0, result, template)
            failed = result
        elif isinstance(result, REDIS_DOWN):
            failed = unavailable(state, what, backend_down(name, result), name, template=template)
            failed.__cause__ = result
        elif not isinstance(result, Exception):
            state.breaker(name).success()
    if stamp is not None:  # also when some keys failed: those that went through count
        yield from tend_sequence(state, names, results, stamp)
    if failed is not None:
        raise failed
    for result in results:
        if isinstance(result, Exception):
            raise result


def stamp_flow(
    state: GuardState,
    what: str,
    names: list[str] | tuple[str, ...],
    *,
    required: bool = False,
    template: str | None = None,
) -> Generator[WriteStep, Any, int | None]:
    """The sequence's next number, confirmed like the invalidations (a number a
    failover could hand out again is never used); None when the sequence's node
    is down, refusing or unconfirmed, or its circuit is open: the caller poisons.
    Only on a cluster: on one server (or a Sentinel master) the keys live on that
    node too, so its failure is the caller's; ``required``: the caller needs a
    number (a prefix stamp)."""
    invalidation = state.invalidation
    sequence = invalidation.watermark_key
    breaker = state.breakers.of(sequence)
    strict = required or state.breakers.single
    if not any(state.breaker(name) is breaker for name in names):  # not asked yet
        closed = state.circuit_open(what, key=sequence)
        if closed is not None:
            if strict:
                raise closed
            log.warning("%s: the invalidation sequence's circuit is open, poisoning", what)
            return None
    try:
        (result,) = yield Pipelined((invalidation.next_stamp(),), state.confirm())
    except BackendUnavailable as exc:
        result = exc
    if isinstance(result, OutOfMemoryError) and not required:
        # Full under noeviction: the INCR is refused, the invalidation's deletes are
        # not (see INVALIDATE), so poison (also on one server) rather than leave the
        # value and the fills in flight be. The node answered: no breaker failure.
        log.warning("%s: Redis is out of memory (%s), poisoning", what, result)
        return None
    if isinstance(result, REDIS_DOWN):
        result = backend_down(sequence, result)
    if not isinstance(result, BackendUnavailable):
        breaker.success()  # the node answered (a half-open circuit's probe reports)
    if isinstance(result, int):
        return result
    if isinstance(result, WriteNotConfirmed):  # the master is up: no breaker failure
        subject = names[0] if names else sequence
        state.recorder.count("backend_errors", subject, 0.0, result, template)
        if strict:
            raise result
        log.warning("%s: the invalidation number is unconfirmed, poisoning", what)
        return None
    if not isinstance(result, BackendUnavailable):
        if strict:  # not a node failure (e.g. the sequence key holds no number)
            raise result
        log.warning("%s: no invalidation number (%s), poisoning", what, result)
        return None
    if strict:
        raise unavailable(
            state, what, result, names[0] if names else sequence, key=sequence, template=template
        ) from client_error(result)
    if breaker not in [state.breaker(name) for name in names]:
        # (On a node of the keys too, their own failing calls count it.)
        state.backend_failed(
            names[0] if names else sequence, result, key=sequence, template=template
        )
    log.warning("%s: the invalidation sequence's node is unreachable, poisoning", what)
    return None


def tend_sequence(
    state: GuardState, names: list[str] | tuple[str, ...], results: list[Any], stamp: int
) -> Generator[WriteStep, Any, None]:
    """After an invalidation that went through: lift the sequence to a version
    that ran ahead of ``stamp``, and heal the versions it found poisoned, with a
    number taken after its own poisoned write (see INVALIDATE). Best effort: a
    version left poisoned only keeps tracked fills of its key from storing."""
    invalidation = state.invalidation
    try:
        lift = invalidation.lift(results, stamp)
        if lift is not None:  # a version ran ahead of the sequence: lift the sequence
            yield Call(lift)
        poisoned = invalidation.poisoned(names, results)
        if poisoned:
            heal = yield from stamp_flow(state, "healing poisoned versions", names)
            if heal is not None:
                healed = yield Pipelined(
                    tuple(invalidation.heal_calls(poisoned, heal)), state.confirm()
                )
                # A heal to the real version a poison carried may be above the number.
                lift = invalidation.lift(healed, heal)
                if lift is not None:
                    yield Call(lift)
    except Exception as exc:  # the invalidation itself went through
        log.warning("the invalidation sequence was not tended: %s", exc)


def invalidate_prefix_flow(state: GuardState, prefix: str) -> Generator[WriteStep, Any, int]:
    """``invalidate_prefix``: every key whose name starts with ``prefix`` (a SCAN
    of the whole keyspace); returns how many."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
    invalidation = state.invalidation
    names: set[str] = set()
    what = f"scanning {prefix!r}*"
    if state.last_seen is not None:  # names this process saw that SCAN may miss
        state.last_seen.drop_prefix(prefix)
    # Stamped first: a fill of a key the SCAN cannot see (no value, no fill yet)
    # from a snapshot older than this stamp will not store. The stamp must be a
    # number: a prefix stamp cannot be poisoned.
    stamp = yield from stamp_flow(state, what, (), required=True)
    assert stamp is not None
    # This process's fills check the stamp from before it is stored until it
    # expires (remembered again once stored: its version_ttl starts then).
    invalidation.remember(prefix, stamp)
    try:
        yield Command(
            ("SET", invalidation.stamp_key(prefix), stamp, "PX", state.settings.version_ttl_ms)
        )
        invalidation.remember(prefix, stamp)
        for raw in (yield Scan(invalidation.scan_pattern(prefix))):
            name = invalidation.name_of(raw.decode("utf-8", "surrogateescape"))
            if name is not None:
                names.add(name)
    except BackendUnavailable as exc:
        raise unavailable(state, what, exc, prefix) from client_error(exc)
    ordered = sorted(names)
    for start in range(0, len(ordered), SCAN_BATCH):
        yield from invalidate_flow(state, ordered[start : start + SCAN_BATCH])
    return len(ordered)


def watermark_flow(state: GuardState) -> Generator[WriteStep, Any, int]:
    """``watermark``: the namespace's invalidation sequence now, confirmed like the
    invalidations (a watermark counting numbers that a failover could lose would
    let an old snapshot's fill pass a later write's stamp)."""
    invalidation = state.invalidation
    key = invalidation.watermark_key
    what = "reading the watermark"
    closed = state.circuit_open(what, key=key)
    if closed is not None:
        raise closed
    try:
        (result,) = yield Pipelined((invalidation.read_watermark(),), state.confirm())
    except BackendUnavailable as exc:
        raise unavailable(state, what, exc, key, key=key) from client_error(exc)
    if isinstance(result, WriteNotConfirmed):
        state.recorder.count("backend_errors", key, error=result)
        raise result
    if isinstance(result, REDIS_DOWN):
        raise unavailable(state, what, backend_down(key, result), key, key=key) from result
    if isinstance(result, Exception):
        raise result
    state.breakers.of(key).success()
    return int(result)


def unavailable(
    state: GuardState,
    what: str,
    exc: BackendUnavailable,
    name: str,
    *,
    key: str | None = None,
    template: str | None = None,
) -> BackendUnavailable:
    """Count Redis failing ``name``'s call (on ``key``'s node, if given) and the
    error that says so, with the client's error as its cause."""
    cause = client_error(exc)
    state.backend_failed(name, cause, key=key, template=template)
    return BackendUnavailable(f"Redis unreachable {what}: {cause}")


def write_lock_lost(
    name: str,
    handle: Any,
    release_error: BaseException | None,
    then: str = "its keys were invalidated again after the block",
) -> LockLostError:
    """The error of a write lock lost while held: ``handle`` (what its acquisition
    returned, may be None) and the error its release raised, if any, say how;
    ``then``: what was done about it."""
    reason = getattr(handle, "lost_reason", "") or (
        str(release_error) if release_error is not None else "its holding was gone"
    )
    error = LockLostError(
        f"the write lock {name!r} was lost while it was held ({reason}): another writer "
        f"may have run at the same time; {then}",
        name=name,
        owner=getattr(handle, "owner", None) or getattr(release_error, "owner", None),
        mode="write",
    )
    error.__cause__ = release_error
    return error
