"""Redlock's decisions, with no I/O in them: rounds, renewals, releases and tidy-ups
on a quorum of independent Redis masters.

The sync :mod:`cacheguard.locks.redlock.rwlock` and the asyncio
:mod:`cacheguard.locks.redlock.async_rwlock` drive the same code here; they only send
script calls to masters (all at once) and hand the answers back:

* :func:`round_flow` is one acquire *round*, a generator that yields a
  :class:`FanOut` (a script call per master) and is sent every master's reply, or
  the Redis error that master raised. It counts the grants, writes a writer's
  fencing token back, judges the validity left, and gives back what a failed round
  got; it returns a :class:`RoundResult`.
* :func:`renewal_calls` / :func:`settle_renewals`, :func:`release_calls` /
  :func:`settle_release`, :func:`tidy_plan`: the calls of a renewal, release or
  tidy-up, and what the answers mean.
* :class:`RedlockHandleState`, :class:`RedlockBook` and :func:`redlock_settings`:
  what both handles, both watchdogs and both locks keep and check.

The scripts are :mod:`cacheguard.locks.redis.lua`' (KEYS, ARGV in
:mod:`cacheguard.locks.redis.wire`), plus :data:`~cacheguard.locks.redlock.lua.RAISE_FENCE`.
The process's rounds in flight and live holdings are :mod:`cacheguard.locks.redlock.holdings`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

from cacheguard.backoff import Backoff
from cacheguard.checks import check_positive, check_ratio
from cacheguard.exceptions import BackendUnavailable
from cacheguard.locks.protocol import Attempt, Mode
from cacheguard.locks.redis import wire
from cacheguard.locks.redis.lease import LeaseBook, LeaseEntry
from cacheguard.locks.redis.rwlock import lock_settings
from cacheguard.locks.redlock.holdings import Holdings, process_holdings
from cacheguard.locks.redlock.lua import RAISE_FENCE
from cacheguard.locks.shape import HandleState
from cacheguard.redis.errors import REDIS_UNREACHABLE
from cacheguard.redis.keys import ResourceKeys
from cacheguard.redis.scripts import ScriptCall

__all__ = [
    "RETRY",
    "FanOut",
    "Grant",
    "RedlockBook",
    "RedlockCommon",
    "RedlockHandleState",
    "RedlockSettings",
    "Round",
    "RoundResult",
    "RoundVerdict",
    "Tidy",
    "majority",
    "master_connection_kwargs",
    "no_majority_message",
    "redlock_settings",
    "release_calls",
    "release_error",
    "renewal_calls",
    "renewal_verdict",
    "round_flow",
    "settle_release",
    "settle_renewals",
    "settle_round",
    "tally_round",
    "tidy_plan",
]

DEFAULT_INSTANCE_TIMEOUT: Final = 0.1  # s; capped at lease / 10
DRIFT_FLOOR: Final = 0.002  # s added to lease * clock_drift (Redlock's 2 ms)
RETRY_AFTER_ERROR: Final = 0.5  # s before a failed renewal, release or tidy-up is retried


# -- settings --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RedlockSettings:
    """A Redlock's checked settings (shared by the sync and the asyncio lock)."""

    name: str
    keys: ResourceKeys
    lease: float
    lease_ms: int
    timeout: float
    mark_ms: int
    instance_timeout: float
    clock_drift: float
    drift: float  # s taken off every validity: lease * clock_drift + DRIFT_FLOOR


def redlock_settings(
    name: object,
    lease: object,
    timeout: object,
    namespace: str,
    instance_timeout: object,
    clock_drift: object,
    backoff: Callable[[], Backoff],
) -> RedlockSettings:
    """Check a Redlock's constructor arguments, in the constructors' order
    (ValueError / TypeError)."""
    base = lock_settings(name, lease=lease, timeout=timeout, namespace=namespace, backoff=backoff)
    if instance_timeout is None:
        checked_timeout = min(DEFAULT_INSTANCE_TIMEOUT, base.lease / 10)
    else:
        checked_timeout = check_positive("instance_timeout", instance_timeout)
        if checked_timeout > base.lease / 10:
            raise ValueError(
                f"instance_timeout must be at most lease / 10 ({base.lease / 10:g} s), "
                f"got {instance_timeout!r}: a slow master would eat the lock's validity"
            )
    drift_ratio = check_ratio("clock_drift", clock_drift)
    return RedlockSettings(
        name=base.name,
        keys=base.keys,
        lease=base.lease,
        lease_ms=base.lease_ms,
        timeout=base.timeout,
        mark_ms=base.mark_ms,
        instance_timeout=checked_timeout,
        clock_drift=drift_ratio,
        drift=base.lease * drift_ratio + DRIFT_FLOOR,
    )


# Connection settings a pool adds by itself (maintenance notifications): not copied.
_POOL_MADE: Final = frozenset(
    {
        "maint_notifications_pool_handler",
        "oss_cluster_maint_notifications_handler",
        "orig_host_address",
        "orig_socket_timeout",
        "orig_socket_connect_timeout",
    }
)


def master_connection_kwargs(
    settings: Mapping[str, Any], instance_timeout: float, no_retries: object
) -> dict[str, Any]:
    """A master's connection settings for Redlock: the caller's, with the socket and
    connect timeouts capped at ``instance_timeout`` and ``no_retries`` (Redlock
    retries whole rounds itself: one answer or none within the timeout)."""
    kwargs = {k: v for k, v in settings.items() if k not in _POOL_MADE}
    for setting in ("socket_timeout", "socket_connect_timeout"):
        value = kwargs.get(setting)
        kwargs[setting] = instance_timeout if value is None else min(value, instance_timeout)
    kwargs["retry"] = no_retries
    return kwargs


def master_address(settings: Mapping[str, Any]) -> str:
    return str(settings.get("path") or f"{settings.get('host')}:{settings.get('port')}")


def check_master_list(clients: object, kind: str, client_kind: str) -> None:
    """``clients`` is a non-empty sequence (of ``client_kind``, checked one by one later)."""
    if isinstance(clients, (str, bytes)) or not isinstance(clients, Sequence):
        raise TypeError(f"{kind} takes a sequence of {client_kind} clients")
    if not clients:
        raise ValueError(f"{kind} needs at least one master")


def check_independent(addresses: Sequence[str]) -> None:
    repeated = sorted({a for a in addresses if addresses.count(a) > 1})
    if repeated:
        raise ValueError(
            f"the masters of a Redlock must be independent servers; given more than once: "
            f"{', '.join(repeated)}"
        )


def majority(masters: int) -> int:
    """How many of ``masters`` make a quorum: ``masters // 2 + 1``."""
    return masters // 2 + 1


# -- one round: what the masters answered and what it means ----------------------------------------


@dataclass
class Round:
    """What one acquire round came to, from every master's answer (see :func:`tally_round`)."""

    granted: dict[int, int] = field(default_factory=dict)  # master -> epoch
    refused: dict[int, float] = field(default_factory=dict)  # master -> s until it may grant
    marked: list[int] = field(default_factory=list)  # masters where a writer's mark was left
    upgrades: int = 0  # masters refusing because the owner holds the read lock there
    unanswered: list[int] = field(default_factory=list)  # no reply: the call may have run
    failed: int = 0  # masters that did not grant for an error (unanswered ones included)
    errors: list[str] = field(default_factory=list)

    @property
    def token(self) -> int:
        return max(self.granted.values(), default=0)

    def retry_in(self, quorum: int) -> float:
        """Seconds until enough refusing masters may grant (their soonest blocking
        leases end); 0 when unknown."""
        needed = quorum - len(self.granted)
        waits = sorted(self.refused.values())
        if needed <= 0 or needed > len(waits):
            return 0.0
        return waits[needed - 1]

    def has_majority(self, quorum: int) -> bool:
        return len(self.granted) >= quorum


@dataclass(frozen=True)
class RoundVerdict:
    """What a driver does after a round (see :func:`settle_round`)."""

    granted: bool
    split: bool = False  # granted by some masters, not a majority in time
    upgrade: bool = False  # LockUpgradeError
    unreachable: bool = False  # BackendUnavailable: too few masters answered
    withdraw: tuple[int, ...] = ()  # masters where the writer withdraws its mark
    retry_in: float = 0.0


def settle_round(
    outcome: Round, *, masters: int, quorum: int, fenced: bool, now: float, valid_until: float
) -> RoundVerdict:
    """A round is a grant when a majority granted it, a write's token was written
    back (``fenced``) and time is left (``now < valid_until``). Otherwise its grants
    are given back; a writer that was granted anything (a split vote, or a majority
    too late), refused as an upgrade or short of masters also withdraws its marks."""
    if outcome.has_majority(quorum) and fenced and now < valid_until:
        return RoundVerdict(granted=True)
    split = bool(outcome.granted)
    upgrade = outcome.upgrades > masters - quorum
    unreachable = outcome.failed > masters - quorum
    return RoundVerdict(
        granted=False,
        split=split,
        upgrade=upgrade,
        unreachable=unreachable,
        withdraw=tuple(outcome.marked) if (split or upgrade or unreachable) else (),
        retry_in=outcome.retry_in(quorum),
    )


def no_majority_message(name: str, quorum: int, outcome: Round) -> str:
    return (
        f"no majority of the masters of lock {name!r} could be reached ({quorum} needed): "
        f"{'; '.join(outcome.errors)}"
    )


def tally_round(
    replies: Mapping[int, Any], *, mode: Mode, queued: bool, describe: Callable[[int], str]
) -> Round:
    """Sort each master's reply to the acquire script: a granted epoch, a refusal,
    an upgrade refused, an error reply (the script did not run) or no reply (it
    may have run: the master is tidied later)."""
    outcome = Round()
    for index, reply in sorted(replies.items()):
        if isinstance(reply, BaseException):
            outcome.failed += 1
            outcome.errors.append(f"{describe(index)}: {reply}")
            if isinstance(reply, REDIS_UNREACHABLE):
                outcome.unanswered.append(index)
            continue
        attempt = wire.parse_attempt(reply)
        if attempt.granted:
            outcome.granted[index] = attempt.epoch
        elif attempt.upgrade:
            outcome.upgrades += 1
        else:
            outcome.refused[index] = attempt.retry_in
            if mode == "write" and queued:
                outcome.marked.append(index)
    return outcome


@dataclass(frozen=True)
class FanOut:
    """Step: run ``calls[i]`` on master ``i``, all at once; answer with each master's
    reply, or the Redis error it raised (a master left out is not asked)."""

    calls: dict[int, ScriptCall]


@dataclass
class Grant:
    epochs: list[int | None]  # per master: the epoch of the holding there, or None
    token: int
    valid_until: float


@dataclass
class RoundResult:
    """What a round came to: the attempt for the acquire flow, the grant if a
    majority granted in time, the masters whose state it changed back (their
    announcements are our own), whether it was a split vote, and the error to raise
    once the masters to tidy are registered."""

    attempt: Attempt
    grant: Grant | None = None
    undone: set[int] = field(default_factory=set)
    split: bool = False
    error: BackendUnavailable | None = None


def round_flow(
    keys: ResourceKeys,
    *,
    masters: int,
    owner: str,
    mode: Mode,
    lease: float,
    lease_ms: int,
    mark_ms: int,
    drift: float,
    timer: Callable[[], float],
    describe: Callable[[int], str],
    unanswered: list[int],
) -> Generator[FanOut, dict[int, Any], RoundResult]:
    """One acquire round on every master (``mark_ms`` 0: a try that leaves no mark).

    The acquire script goes to every master; a writer granted by a majority then
    writes its token back to the granting masters' fencing counters (a majority must
    confirm) and withdraws its marks elsewhere. The round is judged by
    :func:`settle_round`; a round that is not a grant releases its grants and
    withdraws the marks the verdict names, on every master concerned.

    Masters that did not answer a call that may have run there are added to
    ``unanswered`` as the round goes (the driver's list: a round cut short still
    names them), for the driver to have them tidied.
    """
    quorum = majority(masters)
    queued = mark_ms > 0
    call = wire.acquire_call(keys, owner, mode, lease_ms=lease_ms, mark_ms=mark_ms)
    start = timer()
    replies = yield FanOut(dict.fromkeys(range(masters), call))
    outcome = tally_round(replies, mode=mode, queued=queued, describe=describe)
    unanswered += outcome.unanswered
    fenced = True
    if outcome.has_majority(quorum) and mode == "write":
        raise_call: ScriptCall = (RAISE_FENCE, [keys.fence], [outcome.token])
        calls = {i: raise_call for i in outcome.granted}
        calls.update({i: wire.withdraw_call(keys, owner) for i in outcome.marked})
        raised = yield FanOut(calls)
        fenced = sum(not isinstance(raised[i], BaseException) for i in outcome.granted) >= quorum
    valid_until = start + lease - drift
    verdict = settle_round(
        outcome, masters=masters, quorum=quorum, fenced=fenced, now=timer(), valid_until=valid_until
    )
    if verdict.granted:
        epochs: list[int | None] = [outcome.granted.get(i) for i in range(masters)]
        grant = Grant(epochs, outcome.token, valid_until)
        return RoundResult(Attempt(granted=True, epoch=outcome.token), grant)
    undo = give_back_calls(keys, owner, mode, outcome.granted, verdict.withdraw)
    if undo:
        answers = yield FanOut(undo)
        unanswered += [i for i in outcome.granted if isinstance(answers[i], REDIS_UNREACHABLE)]
    result = RoundResult(
        Attempt(granted=False, retry_in=verdict.retry_in, upgrade=verdict.upgrade),
        undone=set(undo),
        split=verdict.split,
    )
    if verdict.unreachable and not verdict.upgrade:
        result.error = BackendUnavailable(no_majority_message(keys.name, quorum, outcome))
    return result


def give_back_calls(
    keys: ResourceKeys, owner: str, mode: Mode, granted: Mapping[int, int], marked: Iterable[int]
) -> dict[int, ScriptCall]:
    """Release the grants and withdraw the marks of a round that failed (or whose
    caller gave up): per master, the call that changes it back."""
    calls: dict[int, ScriptCall] = {
        i: wire.release_call(keys, owner, mode, epoch) for i, epoch in granted.items()
    }
    for i in marked:  # a master that granted has no mark of ours: its release will do
        calls.setdefault(i, wire.withdraw_call(keys, owner))
    return calls


def withdraw_calls(keys: ResourceKeys, owner: str, masters: int) -> dict[int, ScriptCall]:
    """A writer gives up: remove its mark on every master (best effort: marks expire)."""
    return dict.fromkeys(range(masters), wire.withdraw_call(keys, owner))


def abandoned_round_calls(
    result: RoundResult, keys: ResourceKeys, owner: str, mode: Mode, *, masters: int, queued: bool
) -> dict[int, ScriptCall]:
    """The caller gave up (a cancelled task) while its round ran: what takes back what
    the finished round got (its grant released, a queued writer's marks withdrawn)."""
    marked = range(masters) if mode == "write" and queued else range(0)
    if result.grant is None:
        return withdraw_calls(keys, owner, masters) if marked else {}
    granted = {i: e for i, e in enumerate(result.grant.epochs) if e is not None}
    return give_back_calls(keys, owner, mode, granted, marked)


# -- renewals and releases -------------------------------------------------------------------------

RETRY: Final = "retry"


def renewal_verdict(
    *, renewed: int, held: int, writer_waits: bool, quorum: int, masters: int, in_time: bool
) -> wire.Renewal | str:
    """A renewal round's meaning for one handle: renewed (a majority renewed it in
    time), :data:`RETRY` (too few answered; lost once its validity ends), or why it
    is lost (fewer than a majority still hold it)."""
    if renewed >= quorum and in_time:
        return wire.Renewal.RENEWED_WRITER_WAITS if writer_waits else wire.Renewal.RENEWED
    if held < quorum:
        return f"held on {held} of {masters} masters at renewal, fewer than a majority ({quorum})"
    return RETRY


def release_error(*, released: int, pending: int, quorum: int, lost: bool) -> str | None:
    """After a release on every master: ``"lost"`` (fewer than a majority still
    held it, or it was lost before), ``"unavailable"`` (too few answered to tell),
    or None."""
    if lost or released + pending < quorum:
        return "lost"
    if released < quorum:
        return "unavailable"
    return None


H = TypeVar("H", bound="RedlockHandleState")

RenewalCalls = dict[int, list[tuple[int, ScriptCall]]]


def renewal_calls(handles: Sequence[RedlockHandleState]) -> tuple[list[float], RenewalCalls]:
    """When each handle's renewal starts (on its lock's timer), and per master the
    renew calls of every handle held there (one pipeline per master)."""
    starts = [h.lock._timer() for h in handles]
    calls: RenewalCalls = {}
    for n, h in enumerate(handles):
        for i, epoch in enumerate(h.epochs):
            if epoch is not None:
                calls.setdefault(i, []).append(
                    (n, wire.renew_call(h.keys, h.owner, epoch, h.lease_ms))
                )
    return starts, calls


def settle_renewals(
    handles: Sequence[RedlockHandleState],
    starts: Sequence[float],
    calls: RenewalCalls,
    replies: Mapping[int, Any],
) -> list[wire.Renewal | str]:
    """Per handle: the renewal (a majority renewed within its validity;
    ``valid_until`` moved on), :data:`RETRY` (too few answered), or why the handle is
    lost (too few masters still hold it). Masters answering that the holding is
    gone are dropped from the handle."""
    renewed = [0] * len(handles)
    writer_waits = [False] * len(handles)
    for i, batch in calls.items():
        answers = replies[i]
        if isinstance(answers, BaseException):
            continue
        for (n, _), answer in zip(batch, answers, strict=True):
            if isinstance(answer, BaseException):
                continue
            renewal = wire.parse_renewal(answer)
            if renewal is wire.Renewal.GONE:
                handles[n].epochs[i] = None
            else:
                renewed[n] += 1
                writer_waits[n] |= renewal is wire.Renewal.RENEWED_WRITER_WAITS
    verdicts: list[wire.Renewal | str] = []
    for n, h in enumerate(handles):
        masters = len(h.epochs)
        valid_until = starts[n] + h.lease - h.lock.drift
        verdict = renewal_verdict(
            renewed=renewed[n],
            held=h.masters_held,
            writer_waits=writer_waits[n],
            quorum=majority(masters),
            masters=masters,
            in_time=h.lock._timer() < valid_until,
        )
        if isinstance(verdict, wire.Renewal):
            h.valid_until = valid_until
        verdicts.append(verdict)
    return verdicts


def release_calls(handle: RedlockHandleState) -> dict[int, ScriptCall]:
    """The release call on every master still holding ``handle``."""
    return {
        i: wire.release_call(handle.keys, handle.owner, handle.mode, epoch)
        for i, epoch in enumerate(handle.epochs)
        if epoch is not None
    }


def settle_release(handle: RedlockHandleState, replies: Mapping[int, Any]) -> tuple[int, list[int]]:
    """(How many masters released ``handle``, the masters that did not answer: they
    keep their epoch in ``handle.epochs``.) A master answering that the holding was
    gone counts for neither."""
    released = 0
    pending = []
    for i, reply in replies.items():
        if isinstance(reply, BaseException):
            pending.append(i)
            continue
        handle.epochs[i] = None
        released += wire.parse_release(reply)
    return released, pending


def renewal_outcome(handle: RedlockHandleState, verdict: wire.Renewal | str) -> str | None:
    """After a renewal asked for by hand: ``None`` (renewed), or why the handle is
    lost; :class:`BackendUnavailable` when too few masters answered to tell and its
    validity is not over yet."""
    if isinstance(verdict, wire.Renewal):
        return None
    if verdict == RETRY and handle.validity > 0:
        raise BackendUnavailable(
            f"no majority of the masters of lock {handle.lock_name!r} answered the renewal"
        )
    return "no majority renewal within its validity" if verdict == RETRY else verdict


def release_failure(
    handle: RedlockHandleState, released: int, pending: Sequence[int]
) -> Exception | None:
    """The error a release raises, if any: lost (fewer than a majority still held it,
    or it was lost before), or unavailable (too few masters answered to tell)."""
    masters = len(handle.epochs)
    error = release_error(
        released=released, pending=len(pending), quorum=majority(masters), lost=handle.lost
    )
    if error == "lost":
        return handle._lost_at_release()
    if error == "unavailable":
        return BackendUnavailable(
            f"released lock {handle.lock_name!r} on {released} of {masters} masters; "
            f"{len(pending)} did not answer and are retried in the background"
        )
    return None


class RedlockCommon:
    """What the sync and the asyncio Redlock keep and work out alike: the checked
    settings, the masters, one round's flow with this lock's settings, the repr."""

    _masters: Any  # the driver's master set: len(), ``masters`` (each has ``address``)

    def _configure(
        self,
        settings: RedlockSettings,
        masters: Any,
        *,
        on_lost: Any,
        backoff: Callable[[], Backoff],
        timer: Callable[[], float],
    ) -> None:
        self.name, self.keys = settings.name, settings.keys
        self.lease, self.lease_ms = settings.lease, settings.lease_ms
        self.timeout = settings.timeout
        self.instance_timeout, self.clock_drift = settings.instance_timeout, settings.clock_drift
        self.drift = settings.drift
        self._mark_ms = settings.mark_ms
        self._masters = masters
        self.quorum = majority(len(masters))
        self._on_lost = on_lost
        self._backoff = backoff
        self._timer = timer

    @property
    def masters(self) -> list[str]:
        """The masters' addresses, in the order given."""
        return [m.address for m in self._masters.masters]

    def _round_flow(
        self, mode: Mode, owner: str, *, queued: bool, unanswered: list[int]
    ) -> Generator[FanOut, dict[int, Any], RoundResult]:
        """One round of this lock (a ``queued`` writer leaves its marks where refused)."""
        return round_flow(
            self.keys,
            masters=len(self._masters),
            owner=owner,
            mode=mode,
            lease=self.lease,
            lease_ms=self.lease_ms,
            mark_ms=self._mark_ms if queued else 0,
            drift=self.drift,
            timer=self._timer,
            describe=self._describe,
            unanswered=unanswered,
        )

    def _tidy_later(self, unanswered: list[int], owner: str, mode: Mode) -> None:
        """Masters that may have run a call of a round whose reply never came (also a
        round cut short): the watchdog tidies them once the round no longer counts on
        them."""
        if unanswered:
            tidier = self._tidier()
            for i in sorted(set(unanswered)):
                tidier.tidy(self._masters.masters[i], self.keys, owner, mode, self.lease)

    def _tidier(self) -> Any:
        raise NotImplementedError

    def _withdraw_step(self, owner: str) -> FanOut:
        return FanOut(withdraw_calls(self.keys, owner, len(self._masters)))

    def _describe(self, index: int) -> str:
        return repr(self._masters.masters[index])

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} key={self.keys.lock!r} lease={self.lease}s "
            f"on {len(self._masters)} masters, quorum {self.quorum}>"
        )


# -- handles --------------------------------------------------------------------------------------


class RedlockHandleState(HandleState):
    """What a Redlock handle keeps (the fields of ``LockHandle``, plus these).

    ``token``: for write holds, the fencing token (see :mod:`cacheguard.locks.redlock.rwlock`
    for when it increases). ``epochs``: per master, the epoch of the holding there,
    or ``None`` where it is not held. ``valid_until``: the moment (on the lock's
    timer) until which a majority is known to hold it; renewals move it on.
    """

    __slots__ = ("_granted", "epochs", "valid_until")

    def _dropped(self) -> None:
        # Collected unreleased: its epochs no longer keep tidy-ups off its masters.
        process_holdings().remove(self)

    def __init__(
        self, lock: Any, mode: Mode, owner: str, grant: Grant, on_lost: Any, addresses: list[str]
    ) -> None:
        super().__init__(mode, owner, grant.token, on_lost)
        self.lock = lock
        self.epochs = grant.epochs
        self.valid_until = grant.valid_until
        # (master address, epoch) as granted: this process's record of the holding.
        self._granted = [(addresses[i], e) for i, e in enumerate(grant.epochs) if e is not None]

    # Used by the watchdogs.
    @property
    def client(self) -> Any:
        return self.lock._masters

    @property
    def granted(self) -> list[tuple[str, int]]:
        """(master address, epoch) of each master that granted this holding."""
        return self._granted

    @property
    def keys(self) -> ResourceKeys:
        keys: ResourceKeys = self.lock.keys
        return keys

    @property
    def lease(self) -> float:
        lease: float = self.lock.lease
        return lease

    @property
    def lease_ms(self) -> int:
        lease_ms: int = self.lock.lease_ms
        return lease_ms

    @property
    def validity(self) -> float:
        """Seconds left until ``valid_until`` (0 once it passed)."""
        now: float = self.lock._timer()
        return max(0.0, self.valid_until - now)

    @property
    def masters_held(self) -> int:
        return sum(e is not None for e in self.epochs)

    def _where(self) -> str:
        return f"on {self.masters_held}/{len(self.epochs)} masters "


# -- this process's live holdings, for tidying after lost replies ----------------------------------


# -- tidy-ups -------------------------------------------------------------------------------------


@dataclass(eq=False)
class Tidy:
    """A master that did not answer an acquire call, which may have run there."""

    master: Any  # the driver's master (its ``address`` is used here)
    keys: ResourceKeys
    owner: str
    mode: Mode
    due: float
    give_up_at: float

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.master.address, self.keys.lock, self.owner, self.mode)


def tidy_plan(
    tidies: Sequence[Tidy], epochs: Sequence[Any], address: str, holdings: Holdings
) -> tuple[list[Tidy], list[tuple[Tidy, ScriptCall]]]:
    """From each owner's epoch on one master (``HGET g:<owner>``, or the error it
    raised): the tidy-ups already done, and the releases still to run (a holding
    there that no live handle of this process counts on, by ``holdings``)."""
    done: list[Tidy] = []
    releases: list[tuple[Tidy, ScriptCall]] = []
    for t, raw in zip(tidies, epochs, strict=True):
        if isinstance(raw, BaseException):
            continue
        if raw is None:
            done.append(t)  # nothing of this owner's there
        elif holdings.acquiring(t.keys.lock, t.owner):
            continue  # its round may be counting on that holding: look again later
        elif holdings.counts_on(t.keys.lock, t.owner, address, int(raw)):
            # A live handle holds that epoch there: an extra hold, if one landed,
            # cannot be told apart; it ends with the owner's lease on that master.
            done.append(t)
        else:
            releases.append((t, wire.release_call(t.keys, t.owner, t.mode, int(raw))))
    return done, releases


def tidies_released(
    releases: Sequence[tuple[Tidy, ScriptCall]], answers: Sequence[Any]
) -> list[Tidy]:
    return [
        t for (t, _), a in zip(releases, answers, strict=True) if not isinstance(a, BaseException)
    ]


# -- the watchdogs' bookkeeping -------------------------------------------------------------------


class RedlockBook(LeaseBook[H], Generic[H]):
    """What the sync and the asyncio Redlock watchdog decide alike: renewals that need
    a majority within the validity, releases finished on every master, and tidy-ups
    of masters that did not answer an acquire call (retried every 0.5 s, for at most
    one lease). Guarded by ``_guard`` (a condition on the sync side)."""

    _tidies: dict[tuple[str, str, str, str], Tidy]

    def _add_tidy(
        self, master: Any, keys: ResourceKeys, owner: str, mode: Mode, lease: float
    ) -> None:
        now = self._timer()
        tidy = Tidy(master, keys, owner, mode, now, now + lease)
        self._tidies.setdefault(tidy.key, tidy)

    def pending_tidies(self) -> int:
        with self._guard:
            return len(self._tidies)

    def _due_tidies(self, now: float) -> list[Tidy]:
        return [t for t in self._tidies.values() if t.due <= now]

    def _next_tidy(self) -> float:
        return min((t.due for t in self._tidies.values()), default=float("inf"))

    def _settle_renewals(
        self, entries: Sequence[LeaseEntry[H]], verdicts: Sequence[wire.Renewal | str], now: float
    ) -> None:
        for entry, verdict in zip(entries, verdicts, strict=True):
            if isinstance(verdict, wire.Renewal):
                self._settle(entry, int(verdict), now)
            elif verdict == RETRY:
                self._after_error([entry])
            else:
                self._lose(entry, verdict)

    def _settle_release(self, entry: LeaseEntry[H], pending: Sequence[int]) -> None:
        if pending:
            self._after_error([entry])
        else:
            self._forget(entry)

    def _after_error(self, entries: Sequence[LeaseEntry[H]]) -> None:
        now = self._timer()
        for entry in entries:
            handle = entry.handle
            if entry.releasing:
                if now - entry.last_renewed >= handle.lease:
                    self._forget(entry)  # expired by now anyway: nothing left to release
                    continue
            elif handle.validity <= 0:
                self._lose(entry, "no majority renewed it within its validity")
                continue
            entry.due = now + min(RETRY_AFTER_ERROR, handle.lease / 3)

    def _tidies_done(self, tidies: Sequence[Tidy], done: Iterable[Tidy]) -> None:
        finished = {id(t) for t in done}
        now = self._timer()
        with self._guard:
            for t in tidies:
                if id(t) in finished or now >= t.give_up_at:
                    self._tidies.pop(t.key, None)
                else:
                    t.due = now + RETRY_AFTER_ERROR


def group_by_master(tidies: Sequence[Tidy]) -> list[list[Tidy]]:
    by_master: dict[str, list[Tidy]] = {}
    for t in tidies:
        by_master.setdefault(t.master.address, []).append(t)
    return list(by_master.values())
