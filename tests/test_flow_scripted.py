"""The read-through algorithm fed scripted answers, with no Redis and no clock.

As h11 tests its protocol: each test plays the driver, answering the steps the
flow yields with replies written out by hand, and checks the steps it asked for
(the script calls down to their KEYS and ARGV) and what it decided.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pytest

from cacheguard.cache import wire
from cacheguard.cache.codec import MsgpackCodec
from cacheguard.cache.entry import MISSING, Entry, pack_entry, unpack_entry
from cacheguard.cache.flows.fill import (
    Adopt,
    Call,
    Disown,
    Drain,
    FillJob,
    HoldLocal,
    Load,
    LoadUnlocked,
    Lookup,
    Outcome,
    ReadStamps,
    ReleaseLater,
    Seal,
    fill_flow,
    timed_out_flow,
)
from cacheguard.cache.flows.read import FRESH, MISS, REFRESH, STALE, judge
from cacheguard.cache.outage.shared_loads import AwaitLoad, LoadShared, SharedLoads, shared_load
from cacheguard.cache.scripts import FILL_BEGIN, FILL_END
from cacheguard.cache.settings import GuardSettings
from cacheguard.cache.singleflight import SingleFlight
from cacheguard.exceptions import BackendUnavailable, FillFailed, LockTimeout
from cacheguard.redis.keys import ResourceKeys
from cacheguard.steps import Subscribe, Wait

CODEC = MsgpackCodec()
NOW = 1_000_000.0  # the wall clock every test sees


class Clock:
    """A monotonic timer the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def entry_bytes(value: Any, *, version: int = 0, created: float = NOW, ttl: float = 60) -> bytes:
    return pack_entry(CODEC, value, created=created, ttl=ttl, version=version, load_duration=0.01)


def decode(raw: Any) -> Entry | None:
    try:
        return unpack_entry(CODEC, raw) if isinstance(raw, bytes) else None
    except ValueError:
        return None


class Job:
    """A FillJob with recorded counts and backend failures."""

    def __init__(self, *, timer: Clock | None = None, **settings: Any) -> None:
        settings.setdefault("ttl_jitter", 0)
        self.counts: list[str] = []
        self.failures: list[BaseException] = []
        self.timer = timer or Clock()
        self.settings = GuardSettings(namespace="ns", **settings)
        self.stamp_keys: tuple[str, ...] = ()
        self.floor = 0
        self.writing_here = False
        self.shared_loads = SharedLoads(timer=self.timer)
        self.replay_pending = False

    def make(self) -> FillJob:
        return FillJob(
            name="k",
            keys=ResourceKeys("ns", "k"),
            owner="me",
            settings=self.settings,
            ttl=60.0,
            none_ttl=MISSING,
            writing_here=self.writing_here,
            stamps=lambda: (self.stamp_keys, self.floor),
            timer=self.timer,
            clock=lambda: NOW,
            rng=lambda: 0.5,
            count=lambda kind, key, seconds=0.0, error=None: self.counts.append(kind),
            decode=decode,
            decode_quiet=decode,
            backend_failed=lambda name, exc: self.failures.append(exc),
            shared_loads=self.shared_loads,
            replay_pending=lambda: self.replay_pending,
        )


Answer = Callable[[Any], Any]


def play(
    flow: Generator[Any, Any, Outcome], answers: list[tuple[type, Any]]
) -> tuple[Outcome, list[Any]]:
    """Drive ``flow`` with ``answers``: (expected step type, reply) pairs, a reply
    that is an exception is thrown in, a callable reply gets the step."""
    steps: list[Any] = []
    step = next(flow)
    for expected, scripted in answers:
        steps.append(step)
        assert isinstance(step, expected), f"step {len(steps)}: {step!r}, expected {expected}"
        reply = scripted(step) if callable(scripted) else scripted
        try:
            step = flow.throw(reply) if isinstance(reply, BaseException) else flow.send(reply)
        except StopIteration as done:
            return done.value, steps
    raise AssertionError(f"the flow asked for more: {step!r}")


def begin_fill(version: str = "3") -> list[Any]:
    return [1, version.encode(), b"17", 5000, 123456]


def busy(wait_ms: int = 100, since_us: int = 200, version: str = "3") -> list[Any]:
    return [2, wait_ms, b"fill", str(since_us).encode(), version.encode()]


START = [(HoldLocal, None), (Seal, None)]


def test_a_value_that_appeared_meanwhile_is_served_from_the_begin() -> None:
    job = Job()
    outcome, steps = play(
        fill_flow(job.make(), refresh=False, background=False, stale=None, budget=5),
        [*START, (Call, [0, entry_bytes("there")])],
    )
    assert outcome.value == "there"
    assert outcome.source == "l2"
    script, keys, args = steps[2].call
    assert script is FILL_BEGIN
    assert keys == ["ns:{k}:v", "ns:{k}:rw", "ns:{k}:ver"]
    assert args == ["me", 30000, "0", 7 * 24 * 3600 * 1000]


def test_the_filler_adopts_its_hold_loads_and_ends_with_a_versioned_store() -> None:
    job = Job(max_load_time=12.0)
    outcome, steps = play(
        fill_flow(job.make(), refresh=False, background=False, stale=None, budget=5),
        [
            *START,
            (Call, begin_fill("3")),
            (Adopt, None),
            (Load, ("menu", 0.25, 41)),
            (Seal, None),
            (Disown, None),
            (Call, 1),
        ],
    )
    assert outcome == Outcome("menu", "loaded")
    assert steps[3] == Adopt(17, 12.0)
    script, keys, args = steps[7].call
    assert script is FILL_END
    assert keys == ["ns:{k}:v", "ns:{k}:rw", "ns:{k}:ver"]
    owner, epoch, seen, begun_ms, ver_ttl, data, px, channel, limit, failed, snap, since = args
    assert (owner, epoch, seen, begun_ms, since) == ("me", "17", "3", 5000, 123456)
    assert (channel, limit, failed, snap) == ("ns:{k}:rel", 64 * 1024, "0", 41)
    assert px == 60000
    assert ver_ttl == 7 * 24 * 3600 * 1000
    stored = unpack_entry(CODEC, data)
    assert (stored.value, stored.version, stored.ttl) == ("menu", 3, 60.0)
    assert job.counts == []


def test_a_failing_load_still_ends_the_fill_then_raises() -> None:
    job = Job()
    with pytest.raises(ZeroDivisionError):
        play(
            fill_flow(job.make(), refresh=False, background=False, stale=None, budget=5),
            [
                *START,
                (Call, begin_fill()),
                (Adopt, None),
                (Load, ZeroDivisionError("db")),
                (Seal, None),
                (Disown, None),
                (Call, lambda step: step.call[2][9] == "1" and step.call[2][5] == b"" and 0),
            ],
        )


def test_a_lost_end_reply_keeps_the_value_and_releases_in_the_background() -> None:
    job = Job()
    outcome, _ = play(
        fill_flow(job.make(), refresh=False, background=False, stale=None, budget=5),
        [
            *START,
            (Call, begin_fill()),
            (Adopt, None),
            (Load, ("v", 0.1, None)),
            (Seal, None),
            (Disown, None),
            (Call, BackendUnavailable("reply lost")),
            (ReleaseLater, None),
        ],
    )
    assert outcome.value == "v"
    assert [type(e) for e in job.failures] == [BackendUnavailable]
    assert job.counts == []  # no answer is not a rejected store


def test_a_newer_prefix_stamp_refuses_the_store() -> None:
    job = Job()
    job.stamp_keys = ("ns:{prefix}:ps:a", "ns:{prefix}:ps:b")
    outcome, steps = play(
        fill_flow(job.make(), refresh=False, background=False, stale=None, budget=5),
        [
            *START,
            (Call, begin_fill()),
            (Adopt, None),
            (Load, ("v", 0.1, 40)),
            (ReadStamps, [b"12", b"41"]),
            (Seal, None),
            (Disown, None),
            (Call, 0),
        ],
    )
    assert steps[5] == ReadStamps(job.stamp_keys)
    assert steps[8].call[2][10] == -1  # the snapshot sent: refuse
    assert outcome.value == "v"
    assert job.counts == ["stores_rejected"]


def test_a_waiter_takes_the_announced_entry_of_the_fill_it_saw() -> None:
    job = Job()
    announced = b"V" + b"250:" + entry_bytes("peer", version=3)
    outcome, steps = play(
        fill_flow(job.make(), refresh=False, background=False, stale=None, budget=5),
        [
            *START,
            (Call, busy(wait_ms=0, since_us=200, version="3")),
            (Subscribe, True),
            (Lookup, None),
            (Wait, [announced]),
        ],
    )
    assert outcome.source == "peer"
    assert outcome.value == "peer"
    assert steps[3] == Subscribe(1.0)
    assert isinstance(steps[5], Wait)
    assert 0.25 <= steps[5].seconds <= 0.5  # the backoff's first step: the safety net only
    assert job.counts == ["lock_waits"]


@pytest.mark.parametrize(
    ("began_us", "version"), [(199, 3), (250, 2)], ids=["older fill", "older version"]
)
def test_a_late_announcement_from_before_the_begin_is_ignored(began_us: int, version: int) -> None:
    job = Job()
    stale = b"V" + str(began_us).encode() + b":" + entry_bytes("old", version=version)
    outcome, _steps = play(
        fill_flow(job.make(), refresh=False, background=False, stale=None, budget=5),
        [
            *START,
            (Call, busy(wait_ms=0, since_us=200, version="3")),
            (Subscribe, True),
            (Lookup, None),
            (Wait, [stale]),
            (Seal, None),
            (Drain, None),
            (Call, [0, entry_bytes("new", version=3)]),
        ],
    )
    assert outcome.value == "new"


def test_a_busy_lease_shortens_the_wait_to_its_end() -> None:
    job = Job()
    _, steps = play(
        fill_flow(job.make(), refresh=False, background=False, stale=None, budget=5),
        [
            *START,
            (Call, busy(wait_ms=30)),
            (Subscribe, True),
            (Lookup, None),
            (Wait, []),
            (Seal, None),
            (Drain, None),
            (Call, [0, entry_bytes("v")]),
        ],
    )
    assert steps[5] == Wait(0.032)


def test_repeated_aborts_end_in_fill_failed() -> None:
    job = Job(max_fill_retries=1)
    waiting = [(Seal, None), (Drain, None), (Call, busy()), (Wait, [b"A"])]
    with pytest.raises(FillFailed):
        play(
            fill_flow(job.make(), refresh=False, background=False, stale=None, budget=5),
            [*START, (Call, busy()), (Subscribe, True), (Lookup, None), (Wait, [b"A"]), *waiting],
        )


@pytest.mark.parametrize("policy", ["raise", "stale", "load"])
def test_the_timeout_policy_decides_at_the_deadline(policy: str) -> None:
    timer = Clock()
    job = Job(timer=timer, on_timeout=policy)
    old = decode(entry_bytes("old", created=NOW - 120))

    def late(reply: Any) -> Callable[[Any], Any]:
        def answer(step: Any) -> Any:
            timer.now = 10.0  # past the 5 s budget
            return reply

        return answer

    flow = fill_flow(job.make(), refresh=False, background=False, stale=old, budget=5)
    script = [*START, (Call, busy()), (Subscribe, True), (Lookup, late(None))]
    if policy == "raise":
        with pytest.raises(LockTimeout):
            play(flow, script)
    elif policy == "stale":
        outcome, _ = play(flow, script)
        assert outcome == Outcome("old", "stale")
    else:
        outcome, _steps = play(flow, [*script, (Seal, None), (LoadShared, "fresh")])
        assert outcome == Outcome("fresh", "unlocked")
    assert job.counts[0] == "wait_timeouts"


def test_a_local_writer_past_the_budget_applies_the_policy() -> None:
    job = Job(on_timeout="load")
    outcome, _ = play(
        fill_flow(job.make(), refresh=False, background=False, stale=None, budget=5),
        [
            (HoldLocal, LockTimeout(name="k", mode="read", waited=5)),
            (Seal, None),
            (LoadShared, 1),
        ],
    )
    assert outcome == Outcome(1, "unlocked")


def test_the_writer_itself_loads_privately_and_stores_nothing() -> None:
    job = Job()
    job.writing_here = True
    outcome, steps = play(
        fill_flow(job.make(), refresh=False, background=False, stale=None, budget=5),
        [(LoadUnlocked, "uncommitted")],
    )
    assert outcome.private
    assert outcome.value == "uncommitted"
    assert len(steps) == 1


def unlocked_load_running(job: Job, began: float) -> Generator[Any, Any, Any]:
    """Another timed-out caller's unlocked load of the key, begun at ``began``."""
    assert isinstance(job.timer, Clock)
    job.timer.now = began
    other = shared_load(job.shared_loads, "k", 0.0, lambda *_: None)
    assert isinstance(next(other), LoadShared)
    return other


def test_the_writers_private_load_never_joins_a_shared_one() -> None:
    job = Job()
    other = unlocked_load_running(job, began=1.0)
    job.writing_here = True
    outcome, _ = play(
        fill_flow(job.make(), refresh=False, background=False, stale=None, budget=5),
        [(LoadUnlocked, "uncommitted")],
    )
    assert outcome == Outcome("uncommitted", "unlocked", private=True)
    assert len(job.shared_loads) == 1  # the other load alone: ours was never offered
    other.close()


def test_a_timed_out_leader_takes_only_a_load_begun_after_its_seal() -> None:
    """The leader's outcome serves the followers that joined before its seal: their
    calls may have begun after a load already running, so it must not take that one."""
    job = Job(on_timeout="load")
    other = unlocked_load_running(job, began=1.0)

    def past_the_budget(step: Any) -> Any:
        job.timer.now = 10.0
        return None

    def running_load_ends(step: AwaitLoad) -> bool:
        assert step.wave.began == 1.0  # it waits for the running load to end...
        with pytest.raises(StopIteration):
            other.send("old")
        job.timer.now = 12.0
        return True

    outcome, _ = play(
        fill_flow(job.make(), refresh=False, background=False, stale=None, budget=5),
        [
            *START,
            (Call, busy()),
            (Subscribe, True),
            (Lookup, past_the_budget),
            (Seal, None),
            (AwaitLoad, running_load_ends),
            (LoadShared, "fresh"),  # ...then loads anew, for those who gathered
        ],
    )
    assert outcome == Outcome("fresh", "unlocked")
    assert job.counts == ["wait_timeouts", "lock_waits"]


@pytest.mark.parametrize(("follower_began", "takes_it"), [(0.5, True), (2.0, False)])
def test_a_timed_out_leader_takes_a_running_load_begun_after_every_call_it_serves(
    follower_began: float, takes_it: bool
) -> None:
    """The leader's outcome serves its followers: it may take a load already running
    only if that load began after the newest of their calls (and its own) began."""
    job = Job(on_timeout="load")
    other = unlocked_load_running(job, began=1.0)
    flights = SingleFlight()
    flight, _, _ = flights.join("k", 0.2)  # the leader's call began at 0.2
    flights.join("k", follower_began)

    def past_the_budget(step: Any) -> Any:
        job.timer.now = 10.0
        return None

    def running_load_ends(step: AwaitLoad) -> bool:
        assert step.wave.began == 1.0
        with pytest.raises(StopIteration):
            other.send("running")
        return True

    flow = fill_flow(
        job.make(),
        refresh=False,
        background=False,
        stale=None,
        budget=5,
        since=lambda: flight.newest_start,
    )
    script = [
        *START,
        (Call, busy()),
        (Subscribe, True),
        (Lookup, past_the_budget),
        (Seal, None),
        (AwaitLoad, running_load_ends),
    ]
    if takes_it:
        assert play(flow, script)[0] == Outcome("running", "unlocked")
    else:
        assert play(flow, [*script, (LoadShared, "next")])[0] == Outcome("next", "unlocked")


def test_a_timed_out_follower_takes_a_load_begun_after_its_call() -> None:
    job = Job(on_timeout="load")
    other = unlocked_load_running(job, began=1.0)
    job.timer.now = 10.0

    def running_load_ends(step: AwaitLoad) -> bool:
        assert step.wave.began == 1.0
        with pytest.raises(StopIteration):
            other.send("loaded after the call began")
        return True

    outcome, _ = play(
        timed_out_flow(job.make(), None, waited=5.0, since=lambda: 0.5),
        [(Seal, None), (AwaitLoad, running_load_ends)],
    )
    assert outcome == Outcome("loaded after the call began", "unlocked")
    assert job.counts == ["wait_timeouts", "shared_timeout_loads"]
    assert len(job.shared_loads) == 0


def test_a_background_refresh_gives_up_when_someone_else_fills() -> None:
    job = Job()
    outcome, _ = play(
        fill_flow(job.make(), refresh=True, background=True, stale=None, budget=5),
        [*START, (Call, lambda step: step.call[2][2] == "1" and busy())],
    )
    assert outcome.source == "skipped"


def test_corrupt_bytes_are_overwritten_by_a_forced_fill() -> None:
    job = Job()
    _, steps = play(
        fill_flow(job.make(), refresh=False, background=False, stale=None, budget=5),
        [*START, (Call, [0, b"garbage"]), (Seal, None), (Call, [0, entry_bytes("x")])],
    )
    assert steps[2].call[2][2] == "0"
    assert steps[4].call[2][2] == "1"  # the second begin fills even over a value


# -- the hit path's choice -------------------------------------------------------------


def _entry(*, left: float, load: float = 0.1) -> Entry:
    return Entry("v", created=NOW - 10, ttl=10 + left, version=0, load_duration=load)


def test_judge() -> None:
    settings = GuardSettings()
    never = lambda: 0.999999  # noqa: E731
    always = lambda: 1e-300  # noqa: E731
    assert judge(_entry(left=30), NOW, settings, always) == FRESH  # far from expiry: no draw
    assert judge(_entry(left=0.05), NOW, settings, always) == REFRESH
    assert judge(_entry(left=0.05), NOW, settings, never) == FRESH
    assert judge(_entry(left=-1), NOW, settings, always) == MISS
    assert judge(_entry(left=-1), NOW, GuardSettings(stale_ttl=5), always) == STALE
    off = GuardSettings(early_refresh_beta=0)
    assert judge(_entry(left=0.05), NOW, off, always) == FRESH


# -- the wire --------------------------------------------------------------------------


def test_parse_fill_begin_every_shape() -> None:
    live, expired = entry_bytes("v"), entry_bytes("v", created=NOW - 120)
    assert wire.parse_fill_begin([0, live], decode, NOW).kind == "hit"
    assert wire.parse_fill_begin([0, expired], decode, NOW).kind == "expired"
    assert wire.parse_fill_begin([0, b"junk"], decode, NOW).kind == "corrupt"
    fill = wire.parse_fill_begin(begin_fill("9"), decode, NOW)
    assert (fill.kind, fill.version, fill.epoch, fill.begun_ms, fill.since_us) == (
        "fill",
        "9",
        "17",
        5000,
        123456,
    )
    writer = wire.parse_fill_begin([2, -5, b"write", b"77", b"4"], decode, NOW)
    assert (writer.kind, writer.wait, writer.since_us, writer.version) == ("busy", 0.0, 77, "4")


def test_parse_message_every_shape() -> None:
    value = wire.parse_message(b"V12:" + entry_bytes("v"), decode)
    assert (value.kind, value.fill_began_us) == ("value", 12)
    assert value.entry is not None
    assert value.entry.value == "v"
    assert wire.parse_message(b"V12:junk", decode).kind == "stored"  # read it instead
    assert wire.parse_message(b"Vx:" + entry_bytes("v"), decode).kind == "stored"
    assert wire.parse_message(b"S", decode).kind == "stored"
    assert wire.parse_message(b"A", decode).kind == "aborted"
    assert wire.parse_message(b"N", decode).kind == "not_stored"
    assert wire.parse_message(b"1", decode).kind == "released"


def test_invalidate_calls_and_the_lift() -> None:
    from cacheguard.cache.invalidation import Invalidation

    invalidation = Invalidation("ns", 1000)
    (call,) = invalidation.calls(["a:b"], 7)
    assert call[1] == ["ns:{a:b}:v", "ns:{a:b}:ver", "ns:{a:b}:rw"]
    assert call[2] == [1000, "ns:l1", "a:b", 7, "", wire.POISON_FLOOR]
    assert invalidation.lift([7, 7], 7) is None
    lifted = invalidation.lift([7, 9], 7)
    assert lifted is not None
    assert lifted[1:] == (["ns:wm"], [9])
    assert invalidation.name_of("ns:{a:b}:v") == "a:b"
    assert invalidation.name_of("ns:{a:b}:ver") is None


def test_the_stale_policy_serves_nothing_stored_while_replays_are_pending() -> None:
    """Outbox replays pending: what Redis holds may be replaced, so a timed-out
    caller under on_timeout="stale" does not read it; it loads as under "load"."""
    job = Job(on_timeout="stale")
    job.replay_pending = True
    outcome, steps = play(
        timed_out_flow(job.make(), None, waited=5.0, since=lambda: 0.5),
        [(Seal, None), (LoadShared, "loaded")],
    )
    assert outcome == Outcome("loaded", "unlocked")
    assert not any(isinstance(step, Lookup) for step in steps)
