"""The write path's flows fed scripted answers, with no Redis: what an invalidation
does when the namespace's sequence lives on a node that is down (a cluster), and
how the versions it poisoned then are healed.

The guard here is the flows' state with no driver: each test plays the driver,
answering the steps with replies written out by hand (see test_flow_scripted.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from typing import Any

import pytest
import redis

from cacheguard.cache.flows.fill import Call
from cacheguard.cache.flows.state import GuardState
from cacheguard.cache.flows.write import (
    AcquireWrite,
    Body,
    Command,
    Pipelined,
    ReleaseWrites,
    Scan,
    invalidate_flow,
    invalidate_prefix_flow,
    watermark_flow,
    write_flow,
)
from cacheguard.cache.scripts import INVALIDATE, NEXT_STAMP, RAISE_WATERMARK, READ_WATERMARK
from cacheguard.cache.settings import GuardSettings
from cacheguard.cache.wire import POISON_FLOOR
from cacheguard.exceptions import BackendUnavailable, WriteNotConfirmed

POISONED = POISON_FLOOR + 1_700_000_000_000_000  # what INVALIDATE writes: floor + server µs
DOWN = BackendUnavailable("Redis unreachable: connection refused")


class Locks:
    def rwlock(self, name: str) -> Any:
        return f"write lock of {name}"  # only handed to the driver


def guard(*, cluster: bool = True, shared: bool = False, **settings: Any) -> GuardState:
    """The flows of a guard whose keys live on node "keys" and whose sequence lives
    on node "sequence" (a cluster; ``shared``: on node "keys" too), or of a guard on
    one server."""

    def node_of(key: str) -> str:
        return "sequence" if key == "ns:wm" and not shared else "keys"

    return GuardState(
        GuardSettings(namespace="ns", breaker_failures=2, breaker_cooldown=60, **settings),
        flight_event=threading.Event,
        run_in_background=lambda *args: False,
        locks=Locks(),
        node_of=node_of if cluster else None,
    )


def play(flow: Generator[Any, Any, Any], answers: list[tuple[type, Any]]) -> tuple[Any, list[Any]]:
    """Drive ``flow``: (expected step type, reply) pairs; an exception is thrown in,
    a callable gets the step. Returns the flow's value and the steps it asked for."""
    steps: list[Any] = []
    try:
        step = next(flow)
    except StopIteration as done:
        return done.value, steps
    for expected, scripted in answers:
        steps.append(step)
        assert isinstance(step, expected), f"step {len(steps)}: {step!r}, expected {expected}"
        reply = scripted(step) if callable(scripted) else scripted
        try:
            step = flow.throw(reply) if isinstance(reply, BaseException) else flow.send(reply)
        except StopIteration as done:
            return done.value, steps
    raise AssertionError(f"the flow asked for more: {step!r}")


def scripts(step: Pipelined) -> list[Any]:
    return [call[0] for call in step.calls]


def stamps(step: Pipelined) -> list[Any]:
    """ARGV[4] (the stamp) and ARGV[5] (the poisoned version healed) of each call."""
    return [(call[2][3], call[2][4]) for call in step.calls]


def replies(*values: Any) -> Callable[[Pipelined], list[Any]]:
    def answer(step: Pipelined) -> list[Any]:
        assert len(values) == len(step.calls)
        return list(values)

    return answer


def test_a_stamp_is_taken_then_every_key_is_stamped_with_it() -> None:
    flows = guard(confirm_replicas=1)
    _, steps = play(
        invalidate_flow(flows, ["a", "b"]),
        [(Pipelined, replies(7)), (Pipelined, replies(7, 7))],
    )
    assert scripts(steps[0]) == [NEXT_STAMP]
    assert steps[0].calls[0][1] == ["ns:wm"]
    # Confirmed by replicas, like the invalidations: a number a failover loses would
    # be handed out again, below a watermark some snapshot already read.
    assert steps[0].confirm == steps[1].confirm == (1, 1.0)
    assert scripts(steps[1]) == [INVALIDATE, INVALIDATE]
    assert stamps(steps[1]) == [(7, ""), (7, "")]
    assert steps[1].calls[0][2][5] == POISON_FLOOR


@pytest.mark.parametrize(
    "failure", [DOWN, [redis.ConnectionError("refused")], [WriteNotConfirmed("0 of 1 replicas")]]
)
def test_an_unreachable_sequence_on_a_cluster_poisons_instead_of_failing(failure: Any) -> None:
    # The keys' node is up, the sequence's is not (or its number is unconfirmed): the
    # invalidation goes through, poisoning the versions; nothing is raised.
    flows = guard()
    _, steps = play(
        invalidate_flow(flows, ["a", "b"]),
        [(Pipelined, failure), (Pipelined, replies(POISONED, POISONED + 1))],
    )
    assert stamps(steps[1]) == [("", ""), ("", "")]
    assert flows.stats().backend_errors == 1
    # A poisoned version is not a number of the sequence: no lift, no heal without one.


def test_a_dead_sequence_opens_its_own_circuit_and_is_not_asked_again() -> None:
    flows = guard()
    for _ in range(2):  # breaker_failures
        play(invalidate_flow(flows, ["a"]), [(Pipelined, DOWN), (Pipelined, replies(POISONED))])
    # Its circuit is open: no call to the sequence's node, straight to the poison.
    _, steps = play(invalidate_flow(flows, ["a"]), [(Pipelined, replies(POISONED))])
    assert scripts(steps[0]) == [INVALIDATE]
    assert stamps(steps[0]) == [("", "")]
    # The keys' own circuit is closed: a write of them is not refused.
    _, steps = play(
        write_flow(flows, ["a"], None, "me"),
        [
            (AcquireWrite, None),
            (Pipelined, replies(POISONED)),
            (Body, None),
            (Pipelined, replies(POISONED + 1)),
            (ReleaseWrites, None),
        ],
    )
    assert [stamps(s) for s in steps if isinstance(s, Pipelined)] == [[("", "")], [("", "")]]


@pytest.mark.parametrize("failure", [DOWN, [WriteNotConfirmed("0 of 1 replicas")]])
def test_on_one_server_the_sequence_failing_is_the_invalidation_failing(failure: Any) -> None:
    # One node holds the keys too: poisoning would only postpone the same failure.
    flows = guard(cluster=False)
    with pytest.raises(BackendUnavailable):
        play(invalidate_flow(flows, ["a"]), [(Pipelined, failure)])


def test_a_full_redis_poisons_even_on_one_server() -> None:
    # noeviction, memory full: the sequence's INCR is refused, but the invalidation's
    # own script is not (it deletes first): poisoning goes through and is no failure.
    full = redis.OutOfMemoryError("command not allowed when used memory > 'maxmemory'")
    flows = guard(cluster=False)
    _, steps = play(
        invalidate_flow(flows, ["a"]), [(Pipelined, [full]), (Pipelined, replies(POISONED))]
    )
    assert scripts(steps[1]) == [INVALIDATE]
    assert stamps(steps[1]) == [("", "")]
    assert flows.stats().backend_errors == 0
    # A prefix stamp needs a number: refused, that is Redis down for the caller.
    with pytest.raises(BackendUnavailable):
        play(invalidate_prefix_flow(guard(cluster=False), "menu:"), [(Pipelined, [full])])


def test_versions_found_poisoned_are_healed_with_a_number_taken_afterwards() -> None:
    flows = guard()
    _, steps = play(
        invalidate_flow(flows, ["a", "b"]),
        [
            (Pipelined, replies(8)),
            (Pipelined, replies(POISONED + 1, 8)),  # "a" was poisoned: it stays so, +1
            (Pipelined, replies(9)),  # a number taken after that write
            (Pipelined, replies(9)),
        ],
    )
    assert scripts(steps[2]) == [NEXT_STAMP]
    assert scripts(steps[3]) == [INVALIDATE]
    assert steps[3].calls[0][1] == ["ns:{a}:v", "ns:{a}:ver", "ns:{a}:rw"]
    assert stamps(steps[3]) == [(9, POISONED + 1)]  # only if still the version it wrote


def test_a_heal_above_its_number_lifts_the_sequence() -> None:
    # The poison carried a real version above the number (a sequence that went back):
    # the heal took that version + 1, and the sequence is lifted to it.
    _, steps = play(
        invalidate_flow(guard(), ["a"]),
        [
            (Pipelined, replies(8)),
            (Pipelined, replies(POISONED + 1)),
            (Pipelined, replies(9)),
            (Pipelined, replies(40)),
            (Call, 40),
        ],
    )
    assert steps[4].call[0] is RAISE_WATERMARK
    assert steps[4].call[2] == [40]


def test_a_partly_failed_invalidation_still_lifts_the_sequence() -> None:
    flows = guard()
    lifted: list[Any] = []
    with pytest.raises(BackendUnavailable):
        play(
            invalidate_flow(flows, ["a", "b"]),
            [
                (Pipelined, replies(8)),
                (Pipelined, replies(12, redis.ConnectionError("b's node is down"))),
                (Call, lambda step: lifted.append(step.call) or 12),
            ],
        )
    assert [(call[0], call[2]) for call in lifted] == [(RAISE_WATERMARK, [12])]


def test_a_sequence_on_a_node_of_the_keys_is_counted_once() -> None:
    # The stamp and the keys' calls fail on the same dead node: one failure, not two
    # (the circuit would open after half its failures).
    flows = guard(shared=True)
    with pytest.raises(BackendUnavailable):
        play(
            invalidate_flow(flows, ["a"]),
            [(Pipelined, DOWN), (Pipelined, [redis.ConnectionError("refused")])],
        )
    assert flows.stats().backend_errors == 1


def test_a_failing_heal_or_lift_does_not_fail_the_invalidation_that_went_through() -> None:
    flows = guard()
    play(
        invalidate_flow(flows, ["a", "b"]),
        [
            (Pipelined, replies(8)),
            (Pipelined, replies(POISONED + 1, 12)),
            (Call, DOWN),  # the lift to 12
        ],
    )
    play(
        invalidate_flow(flows, ["a"]),
        [(Pipelined, replies(8)), (Pipelined, replies(POISONED + 1)), (Pipelined, DOWN)],
    )
    play(
        invalidate_flow(flows, ["a", "b"]),
        [
            (Pipelined, replies(8)),
            (Pipelined, replies(POISONED + 1, 12)),
            (Call, redis.ResponseError("WRONGTYPE")),  # not even an outage
        ],
    )


def test_the_lift_ignores_poisoned_versions() -> None:
    flows = guard()
    _, steps = play(
        invalidate_flow(flows, ["a", "b"]),
        [
            (Pipelined, replies(8)),
            (Pipelined, replies(POISONED + 1, 12)),
            (Call, 12),
            (Pipelined, replies(13)),
            (Pipelined, replies(13)),
        ],
    )
    lift = steps[2].call
    assert lift[0] is RAISE_WATERMARK
    assert lift[2] == [12]


def test_a_prefix_stamp_needs_a_number() -> None:
    flows = guard()
    with pytest.raises(BackendUnavailable):
        play(invalidate_prefix_flow(flows, "menu:"), [(Pipelined, DOWN)])
    _, steps = play(
        invalidate_prefix_flow(guard(), "menu:"),
        [(Pipelined, replies(5)), (Command, True), (Scan, [])],
    )
    assert steps[1].args[:3] == ("SET", "ns:{menu:}:ps", 5)


def test_the_watermark_is_read_as_a_confirmed_write() -> None:
    flows = guard(confirm_replicas=1)
    value, steps = play(watermark_flow(flows), [(Pipelined, replies(41))])
    assert value == 41
    assert scripts(steps[0]) == [READ_WATERMARK]
    assert steps[0].confirm == (1, 1.0)
    with pytest.raises(WriteNotConfirmed):
        play(watermark_flow(flows), [(Pipelined, [WriteNotConfirmed("0 of 1")])])


def test_an_unconfirmed_invalidation_fails_the_write_before_its_body() -> None:
    # The number was confirmed, the invalidation was not (a replica fell behind
    # meanwhile): the write fails before its body (no Body step), locks released.
    flows = guard(confirm_replicas=1)
    asked: list[Pipelined] = []

    def unconfirmed(step: Pipelined) -> list[Any]:
        asked.append(step)
        return [WriteNotConfirmed("0 of 1 replicas acknowledged")]

    with pytest.raises(WriteNotConfirmed):
        play(
            write_flow(flows, ["a"], None, "me"),
            [
                (AcquireWrite, None),
                (Pipelined, replies(7)),
                (Pipelined, unconfirmed),
                (ReleaseWrites, None),
            ],
        )
    assert asked[0].confirm == (1, 1.0)  # the invalidation asked for the WAIT
    assert flows.stats().backend_errors == 1
