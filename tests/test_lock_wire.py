"""The lock scripts' wire format and the acquire flow's give-up rule, without Redis."""

from __future__ import annotations

import re
from typing import Any

import pytest

from cacheguard.backoff import Backoff
from cacheguard.exceptions import LockTimeout
from cacheguard.locks.protocol import TRY, WITHDRAW, Attempt, Withdraw, acquire_flow
from cacheguard.locks.redis import wire
from cacheguard.locks.redis.lua import (
    ACQUIRE,
    ACQUIRE_CONTRACT,
    RELEASE,
    RELEASE_CONTRACT,
    RENEW,
    RENEW_CONTRACT,
    WITHDRAW_CONTRACT,
)
from cacheguard.locks.redis.lua import WITHDRAW as WITHDRAW_SCRIPT
from cacheguard.redis.keys import ResourceKeys
from cacheguard.steps import Subscribe, Wait

KEYS = ResourceKeys("ns", "menu:{x}")
LOCK, FENCE, CHANNEL = "ns:{menu:%7Bx%7D}:rw", "ns:{menu:%7Bx%7D}:fence", "ns:{menu:%7Bx%7D}:rel"


def test_acquire_call_follows_its_contract() -> None:
    assert wire.acquire_call(KEYS, "me", "write", lease_ms=30_000, mark_ms=3_000) == (
        ACQUIRE,
        [LOCK, FENCE],
        ["me", "write", 30_000, 3_000, CHANNEL],
    )
    assert wire.acquire_call(KEYS, "me", "read", lease_ms=5, mark_ms=0)[2] == [
        "me",
        "read",
        5,
        0,
        CHANNEL,
    ]


def test_release_renew_and_withdraw_calls_follow_their_contracts() -> None:
    assert wire.release_call(KEYS, "me", "read", 17) == (
        RELEASE,
        [LOCK],
        ["me", "read", 17, CHANNEL],
    )
    assert wire.renew_call(KEYS, "me", 17, 9_000) == (RENEW, [LOCK], ["me", 17, 9_000])
    assert wire.withdraw_call(KEYS, "me") == (WITHDRAW_SCRIPT, [LOCK], ["me", CHANNEL])


@pytest.mark.parametrize(
    ("contract", "call"),
    [
        (ACQUIRE_CONTRACT, wire.acquire_call(KEYS, "o", "read", lease_ms=1, mark_ms=0)),
        (RELEASE_CONTRACT, wire.release_call(KEYS, "o", "read", 1)),
        (RENEW_CONTRACT, wire.renew_call(KEYS, "o", 1, 1)),
        (WITHDRAW_CONTRACT, wire.withdraw_call(KEYS, "o")),
    ],
    ids=["acquire", "release", "renew", "withdraw"],
)
def test_every_builder_passes_as_many_keys_and_args_as_its_contract_states(
    contract: str, call: Any
) -> None:
    script, keys, args = call
    assert script.source.startswith(contract)
    assert len(keys) == len(re.findall(r"^-- KEYS\[\d\]", contract, flags=re.MULTILINE))
    assert len(args) == len(re.findall(r"^-- ARGV\[\d\]", contract, flags=re.MULTILINE))


def test_undo_of_an_attempt() -> None:
    granted = Attempt(granted=True, epoch=7)
    busy = Attempt(granted=False, retry_in=0.5)
    assert wire.undo_attempt_call(KEYS, "me", "write", granted, queued=True) == (
        wire.release_call(KEYS, "me", "write", 7)
    )
    assert wire.undo_attempt_call(KEYS, "me", "read", granted, queued=False) == (
        wire.release_call(KEYS, "me", "read", 7)
    )
    assert wire.undo_attempt_call(KEYS, "me", "write", busy, queued=True) == (
        wire.withdraw_call(KEYS, "me")
    )
    assert wire.undo_attempt_call(KEYS, "me", "write", busy, queued=False) is None
    assert wire.undo_attempt_call(KEYS, "me", "read", busy, queued=True) is None
    upgrade = Attempt(granted=False, upgrade=True)
    assert wire.undo_attempt_call(KEYS, "me", "write", upgrade, queued=True) is None


@pytest.mark.parametrize(
    ("reply", "attempt"),
    [
        ([1, b"42"], Attempt(granted=True, epoch=42)),
        ([1, b"1700000000123456"], Attempt(granted=True, epoch=1_700_000_000_123_456)),
        ([1, 3], Attempt(granted=True, epoch=3)),
        ([0, 1500], Attempt(granted=False, retry_in=1.5)),
        ([0, 0], Attempt(granted=False)),
        ([0, -5], Attempt(granted=False)),  # a lease that just ended: retry at once
        ([-1, 0], Attempt(granted=False, upgrade=True)),
    ],
)
def test_parse_attempt(reply: list[Any], attempt: Attempt) -> None:
    assert wire.parse_attempt(reply) == attempt


@pytest.mark.parametrize("reply", [[], [1], [2, 0], [1, b"x"], [0, 1, 2]])
def test_parse_attempt_refuses_what_no_script_answers(reply: list[Any]) -> None:
    with pytest.raises(ValueError, match="acquire reply"):
        wire.parse_attempt(reply)


def test_parse_renewal_and_release() -> None:
    assert wire.parse_renewal(0) is wire.Renewal.GONE
    assert wire.parse_renewal(1) is wire.Renewal.RENEWED
    assert wire.parse_renewal(2) is wire.Renewal.RENEWED_WRITER_WAITS
    assert wire.parse_release(1) is True
    assert wire.parse_release(0) is False
    for bad in (3, -1, None, b"x"):
        with pytest.raises(ValueError, match="renew reply"):
            wire.parse_renewal(bad)
    for bad in (2, None, True, b"1"):
        with pytest.raises(ValueError, match="release reply"):
            wire.parse_release(bad)


# -- the acquire flow: a writer that gives up while waiting withdraws -------------------


def _flow(mode: str, clock: list[float]) -> Any:
    return acquire_flow(
        Attempt(granted=False, retry_in=10.0),
        name="res",
        mode=mode,  # type: ignore[arg-type]
        owner="me",
        start=0.0,
        timeout=5.0,
        timer=lambda: clock[0],
        backoff=Backoff,
    )


@pytest.mark.parametrize("at", ["subscribe", "wait"])
def test_a_writer_cancelled_while_waiting_withdraws_then_the_cancel_goes_on(at: str) -> None:
    class Cancelled(BaseException):
        pass

    flow = _flow("write", [0.0])
    step = next(flow)
    assert isinstance(step, Subscribe)
    if at == "wait":
        assert flow.send(True) is TRY
        assert isinstance(flow.send(Attempt(granted=False, retry_in=1.0)), Wait)
    assert isinstance(flow.throw(Cancelled()), Withdraw)
    with pytest.raises(Cancelled):
        flow.send(1)


def test_a_reader_cancelled_while_waiting_just_ends() -> None:
    class Cancelled(BaseException):
        pass

    flow = _flow("read", [0.0])
    next(flow)
    with pytest.raises(Cancelled):
        flow.throw(Cancelled())


def test_a_closed_flow_yields_nothing_more() -> None:
    flow = _flow("write", [0.0])
    next(flow)
    flow.close()  # a driver closing a waiting writer's flow: no RuntimeError


def test_a_writer_at_its_deadline_withdraws_then_times_out() -> None:
    clock = [0.0]
    flow = _flow("write", clock)
    next(flow)
    assert flow.send(True) is TRY
    clock[0] = 6.0
    assert flow.send(Attempt(granted=False, retry_in=1.0)) is WITHDRAW
    with pytest.raises(LockTimeout):
        flow.send(1)
