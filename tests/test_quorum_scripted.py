"""Redlock's decisions fed scripted answers, with no Redis and a hand-moved clock.

Each test plays the driver of :func:`cacheguard.locks.redlock.quorum.round_flow`: it
answers every fan-out with per-master replies written out by hand (the acquire
script's ``[status, value]``, an error, a lost connection) and checks the calls
the flow asked for and what it decided. The sync and asyncio Redlock drive this
same code, so what holds here holds for both.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
import redis

from cacheguard.exceptions import BackendUnavailable
from cacheguard.locks.protocol import Attempt, Mode
from cacheguard.locks.redis import wire
from cacheguard.locks.redis.lua import ACQUIRE, RELEASE, WITHDRAW
from cacheguard.locks.redlock import quorum
from cacheguard.locks.redlock.holdings import process_holdings
from cacheguard.locks.redlock.lua import RAISE_FENCE
from cacheguard.locks.redlock.quorum import FanOut, Grant, RoundResult, Tidy
from cacheguard.redis.keys import ResourceKeys

KEYS = ResourceKeys("t", "menu:7")
LEASE = 10.0
DRIFT = 0.1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def start_round(
    mode: Mode,
    *,
    masters: int = 5,
    queued: bool = True,
    clock: Clock | None = None,
    unanswered: list[int] | None = None,
) -> tuple[Generator[FanOut, dict[int, Any], RoundResult], FanOut]:
    flow = quorum.round_flow(
        KEYS,
        masters=masters,
        owner="me",
        mode=mode,
        lease=LEASE,
        lease_ms=int(LEASE * 1000),
        mark_ms=3000 if queued else 0,
        drift=DRIFT,
        timer=clock or Clock(),
        describe=lambda i: f"master {i}",
        unanswered=[] if unanswered is None else unanswered,
    )
    return flow, next(flow)


def finish(flow: Generator[FanOut, dict[int, Any], RoundResult], replies: dict[int, Any]) -> Any:
    """Send ``replies``; the next fan-out, or the round's result."""
    try:
        return flow.send(replies)
    except StopIteration as done:
        return done.value


def scripts(step: FanOut) -> dict[int, Any]:
    return {i: call[0] for i, call in step.calls.items()}


GRANT = [1, 7]  # granted at epoch 7
BUSY = [0, 250]  # busy for 250 ms more
UPGRADE = [-1, 0]
LOST = redis.ConnectionError("no reply")  # the call may have run there
REFUSED = redis.ResponseError("NOSCRIPT")  # an error reply: it did not run


def test_the_first_fan_out_asks_every_master_to_acquire() -> None:
    _, step = start_round("read")
    assert scripts(step) == dict.fromkeys(range(5), ACQUIRE)
    _, keys, args = step.calls[0]
    assert keys == [KEYS.lock, KEYS.fence]
    assert args == ["me", "read", 10000, 3000, KEYS.released_channel]


def test_a_try_leaves_no_mark() -> None:
    _, step = start_round("write", queued=False)
    assert step.calls[0][2][3] == 0


def test_a_read_majority_is_a_grant_with_no_more_calls() -> None:
    unanswered: list[int] = []
    flow, _ = start_round("read", unanswered=unanswered)
    result = finish(flow, {0: GRANT, 1: GRANT, 2: [1, 9], 3: BUSY, 4: LOST})
    assert isinstance(result, RoundResult)
    assert result.grant is not None
    assert result.grant.epochs == [7, 7, 9, None, None]
    assert result.grant.valid_until == pytest.approx(100.0 + LEASE - DRIFT)
    assert result.attempt.granted
    assert result.attempt.epoch == 9
    assert unanswered == [4]  # tidied later: its call may have run


def test_a_writer_writes_its_token_back_and_withdraws_its_marks_before_the_grant() -> None:
    flow, _ = start_round("write")
    step = finish(flow, {0: [1, 3], 1: [1, 8], 2: [1, 5], 3: BUSY, 4: BUSY})
    assert isinstance(step, FanOut)
    assert scripts(step) == {
        0: RAISE_FENCE,
        1: RAISE_FENCE,
        2: RAISE_FENCE,
        3: WITHDRAW,
        4: WITHDRAW,
    }
    assert step.calls[0][1:] == ([KEYS.fence], [8])  # the largest epoch is the token
    result = finish(flow, {0: "8", 1: "8", 2: "8", 3: 1, 4: 1})
    assert result.grant is not None
    assert result.grant.token == 8


def test_a_token_written_back_on_too_few_masters_is_no_grant() -> None:
    flow, _ = start_round("write")
    finish(flow, {0: GRANT, 1: GRANT, 2: GRANT, 3: BUSY, 4: BUSY})
    undo = finish(flow, {0: "7", 1: LOST, 2: LOST, 3: 1, 4: 1})
    assert isinstance(undo, FanOut)
    # Given back: the three grants released, the marks withdrawn.
    assert scripts(undo) == {0: RELEASE, 1: RELEASE, 2: RELEASE, 3: WITHDRAW, 4: WITHDRAW}
    result = finish(flow, dict.fromkeys(range(5), 1))
    assert result.grant is None
    assert result.split


def test_a_majority_that_came_too_late_is_given_back() -> None:
    clock = Clock()
    flow, _ = start_round("read", clock=clock)
    clock.now += LEASE - DRIFT  # the round took the whole validity
    undo = finish(flow, {0: GRANT, 1: GRANT, 2: GRANT, 3: BUSY, 4: BUSY})
    assert isinstance(undo, FanOut)
    assert scripts(undo) == {0: RELEASE, 1: RELEASE, 2: RELEASE}
    assert undo.calls[0][2] == ["me", "read", 7, KEYS.released_channel]
    result = finish(flow, {0: 1, 1: 1, 2: 1})
    assert result.grant is None
    assert result.undone == {0, 1, 2}  # their announcements are our own undoing


def test_a_split_vote_gives_back_and_says_so() -> None:
    flow, _ = start_round("write")
    undo = finish(flow, {0: GRANT, 1: GRANT, 2: BUSY, 3: [0, 900], 4: [0, 40]})
    assert isinstance(undo, FanOut)
    assert scripts(undo) == {0: RELEASE, 1: RELEASE, 2: WITHDRAW, 3: WITHDRAW, 4: WITHDRAW}
    result = finish(flow, dict.fromkeys(range(5), 1))
    assert result.split
    assert result.grant is None
    assert result.error is None
    # One more refusing master must grant: the soonest of their blocking leases.
    assert result.attempt.retry_in == pytest.approx(0.04)


def test_a_refused_writer_keeps_its_marks_when_nobody_granted() -> None:
    flow, _ = start_round("write")
    result = finish(flow, dict.fromkeys(range(5), BUSY))
    assert isinstance(result, RoundResult)  # no give-back fan-out: the marks queue it
    assert result.grant is None
    assert not result.split
    assert result.undone == set()


def test_too_few_masters_answering_is_backend_unavailable_after_the_give_back() -> None:
    unanswered: list[int] = []
    flow, _ = start_round("write", unanswered=unanswered)
    undo = finish(flow, {0: GRANT, 1: BUSY, 2: LOST, 3: LOST, 4: REFUSED})
    assert isinstance(undo, FanOut)
    assert scripts(undo) == {0: RELEASE, 1: WITHDRAW}
    result = finish(flow, {0: LOST, 1: 1})
    assert isinstance(result.error, BackendUnavailable)
    assert "master 2" in str(result.error)
    assert "master 4" in str(result.error)
    # The unanswered acquire calls and the unanswered release are tidied later; an
    # error reply means the script did not run there.
    assert sorted(unanswered) == [0, 2, 3]


def test_a_round_cut_short_still_names_the_masters_that_did_not_answer() -> None:
    unanswered: list[int] = []
    flow, _ = start_round("write", unanswered=unanswered)
    finish(flow, {0: LOST, 1: GRANT, 2: GRANT, 3: GRANT, 4: BUSY})  # the token write-back
    with pytest.raises(KeyboardInterrupt):
        flow.throw(KeyboardInterrupt())
    assert unanswered == [0]  # the driver tidies it in its finally


def test_an_upgrade_refused_by_a_majority_is_an_upgrade() -> None:
    flow, _ = start_round("write")
    result = finish(flow, {0: UPGRADE, 1: UPGRADE, 2: UPGRADE, 3: BUSY, 4: BUSY})
    undo = result
    assert isinstance(undo, FanOut)
    assert scripts(undo) == {3: WITHDRAW, 4: WITHDRAW}
    result = finish(flow, {3: 1, 4: 1})
    assert result.attempt.upgrade
    assert result.error is None


def test_a_caller_that_gave_up_gets_its_grant_released_not_withdrawn() -> None:
    granted = RoundResult(Attempt(granted=True, epoch=7), Grant([7, 7, 7, None, None], 7, 0.0))
    calls = quorum.abandoned_round_calls(granted, KEYS, "me", "write", masters=5, queued=True)
    assert {i: c[0] for i, c in calls.items()} == {
        0: RELEASE,
        1: RELEASE,
        2: RELEASE,
        3: WITHDRAW,
        4: WITHDRAW,
    }
    refused = RoundResult(Attempt(granted=False))
    calls = quorum.abandoned_round_calls(refused, KEYS, "me", "write", masters=5, queued=True)
    assert {i: c[0] for i, c in calls.items()} == dict.fromkeys(range(5), WITHDRAW)
    assert quorum.abandoned_round_calls(refused, KEYS, "me", "read", masters=5, queued=True) == {}


# -- renewals, releases, tidy-ups ---------------------------------------------------------------


class FakeLock:
    name = "menu:7"
    keys = KEYS
    lease = LEASE
    lease_ms = int(LEASE * 1000)
    drift = DRIFT

    def __init__(self, clock: Clock) -> None:
        self._timer = clock


class Handle(quorum.RedlockHandleState):
    __slots__ = ()

    def _start_on_lost(self) -> None:
        pass


def handle_on(epochs: list[int | None], clock: Clock, mode: Mode = "write") -> Handle:
    addresses = [f"m{i}" for i in range(len(epochs))]
    return Handle(FakeLock(clock), mode, "me", Grant(epochs, 7, clock() + 1), None, addresses)


def test_a_renewal_needs_a_majority_within_the_validity() -> None:
    clock = Clock()
    handle = handle_on([7, 7, 7, 7, None], clock)
    starts, calls = quorum.renewal_calls([handle])
    assert sorted(calls) == [0, 1, 2, 3]
    replies: dict[int, Any] = {0: [1], 1: [2], 2: [0], 3: [LOST]}
    assert quorum.settle_renewals([handle], starts, calls, replies) == [quorum.RETRY]
    assert handle.epochs == [7, 7, None, 7, None]  # master 2 said the holding is gone
    replies = {0: [1], 1: [2], 3: [1]}
    starts, calls = quorum.renewal_calls([handle])
    verdict = quorum.settle_renewals([handle], starts, calls, replies)
    assert verdict == [wire.Renewal.RENEWED_WRITER_WAITS]
    assert handle.valid_until == pytest.approx(clock() + LEASE - DRIFT)


def test_a_handle_left_on_a_minority_is_lost() -> None:
    clock = Clock()
    handle = handle_on([7, 7, 7, None, None], clock)
    starts, calls = quorum.renewal_calls([handle])
    verdicts = quorum.settle_renewals([handle], starts, calls, {0: [1], 1: [0], 2: [0]})
    assert verdicts == ["held on 1 of 5 masters at renewal, fewer than a majority (3)"]


def test_release_reaches_every_holding_master_and_reports_what_it_found() -> None:
    clock = Clock()
    handle = handle_on([7, None, 7, 7, 7], clock)
    assert sorted(quorum.release_calls(handle)) == [0, 2, 3, 4]
    released, pending = quorum.settle_release(handle, {0: 1, 2: 1, 3: 0, 4: LOST})
    assert (released, pending) == (2, [4])
    assert handle.epochs == [None, None, None, None, 7]  # master 4 is retried later
    failure = quorum.release_failure(handle, released, pending)
    assert isinstance(failure, BackendUnavailable)
    handle_lost = handle_on([7, 7, 7, None, None], clock)
    released, pending = quorum.settle_release(handle_lost, {0: 1, 1: 0, 2: 0})
    assert "was lost before release" in str(quorum.release_failure(handle_lost, released, pending))
    handle_ok = handle_on([7, 7, 7, None, None], clock)
    released, pending = quorum.settle_release(handle_ok, {0: 1, 1: 1, 2: 1})
    assert quorum.release_failure(handle_ok, released, pending) is None


def test_a_tidy_up_releases_only_what_no_live_handle_counts_on() -> None:
    clock = Clock()

    class Master:
        address = "m0"

    tidies = [Tidy(Master(), ResourceKeys("t", n), "me", "write", 0.0, 1.0) for n in "abcd"]
    live = handle_on([5], clock)
    live.lock.keys = ResourceKeys("t", "c")
    live._granted = [("m0", 5)]
    process_holdings().add(live)
    try:
        done, releases = quorum.tidy_plan(tidies, [None, "4", "5", LOST], "m0", process_holdings())
    finally:
        process_holdings().remove(live)
    assert [t.keys.name for t in done] == ["a", "c"]  # nothing there; a live handle's
    assert [(t.keys.name, call[2][2]) for t, call in releases] == [("b", 4)]
