"""The shared unlocked loads of timed-out callers, played by hand with no Redis and
no clock (as tests/test_flow_scripted.py plays the fill flow): each caller's flow
is a generator, resumed as its driver would resume it."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Generator
from typing import Any

import pytest

from cacheguard.cache.outage.shared_loads import (
    AwaitLoad,
    LoadShared,
    SharedLoads,
    Wave,
    shared_load,
)

Flow = Generator[Any, Any, Any]


class Clock:
    """The guard's monotonic timer, moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Callers:
    """One guard's shared loads, its timer, and the events its callers counted."""

    def __init__(self, hung_after: float = math.inf) -> None:
        self.clock = Clock()
        self.loads = SharedLoads(timer=self.clock, hung_after=hung_after)
        self.counts: list[str] = []

    def __call__(self, since: float, name: str = "k") -> Flow:
        """The flow of a timed-out caller whose call began at ``since``."""
        return shared_load(self.loads, name, since, lambda kind, key: self.counts.append(kind))


@pytest.fixture
def caller() -> Callers:
    return Callers()


def ends(flow: Flow, reply: Any = True) -> Any:
    """Resume ``flow`` with ``reply`` (thrown in if an exception; by default: the
    load it waits for ended) and return what it returned; fails if it asks for more."""
    try:
        step = flow.throw(reply) if isinstance(reply, BaseException) else flow.send(reply)
    except StopIteration as done:
        return done.value
    raise AssertionError(f"the flow asked for more: {step!r}")


def waits_for(step: Any) -> Wave:
    assert isinstance(step, AwaitLoad), step
    return step.wave


def test_a_lone_caller_loads_and_leaves_nothing_behind(caller: Callers) -> None:
    runner = caller(since=0.0)
    assert isinstance(next(runner), LoadShared)
    assert len(caller.loads) == 1
    assert ends(runner, "v") == "v"
    assert len(caller.loads) == 0
    assert caller.counts == []  # it loaded: nothing shared


def test_callers_that_began_before_the_load_take_it_later_ones_share_the_next(
    caller: Callers,
) -> None:
    caller.clock.now = 1.0
    runner = caller(since=0.0)
    assert isinstance(next(runner), LoadShared)  # sealed at 1.0, then loads
    early = caller(since=0.5)  # its call began before the load: may take it
    running = waits_for(next(early))
    tie = caller(since=1.0)  # an equal reading proves nothing: not that load
    assert waits_for(next(tie)) is running
    late = caller(since=2.0)  # began after the load: a write may lie between
    assert waits_for(next(late)) is running
    caller.clock.now = 3.0
    assert ends(runner, "old") == "old"
    assert ends(early) == "old"
    assert isinstance(tie.send(True), LoadShared)  # the first to see the end loads
    assert waits_for(late.send(True)).began == 3.0  # the other one takes that load
    latest = caller(since=2.5)  # arrives while it runs, began before it: takes it
    assert waits_for(next(latest)).began == 3.0
    assert ends(tie, "new") == "new"
    assert ends(late) == "new"
    assert ends(latest) == "new"
    assert caller.counts == ["shared_timeout_loads"] * 3
    assert len(caller.loads) == 0


def test_a_loaders_error_is_its_waves_not_the_next_ones(caller: Callers) -> None:
    caller.clock.now = 1.0
    runner = caller(since=0.0)
    next(runner)
    member = caller(since=0.5)
    next(member)
    late = caller(since=2.0)
    next(late)
    error = ZeroDivisionError("database down")
    with pytest.raises(ZeroDivisionError):
        ends(runner, error)
    with pytest.raises(ZeroDivisionError) as raised:
        ends(member)
    assert raised.value is error
    assert isinstance(late.send(True), LoadShared)  # began after that load: loads again
    assert ends(late, "back") == "back"
    assert len(caller.loads) == 0


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, asyncio.CancelledError, GeneratorExit])
def test_members_of_an_interrupted_runner_go_on_without_it(
    caller: Callers, interruption: type[BaseException]
) -> None:
    caller.clock.now = 1.0
    runner = caller(since=0.0)
    next(runner)
    first, second = caller(since=0.5), caller(since=0.6)
    next(first)
    next(second)
    if interruption is GeneratorExit:
        runner.close()  # its driver stopped mid-load
    else:
        with pytest.raises(interruption):
            ends(runner, interruption())
    caller.clock.now = 2.0
    assert isinstance(first.send(True), LoadShared)  # one of them loads
    assert waits_for(second.send(True)).began == 2.0  # the other takes it
    assert ends(first, "v") == "v"
    assert ends(second) == "v"
    assert len(caller.loads) == 0


def test_a_member_cancelled_while_it_waits_leaves_nothing_behind(caller: Callers) -> None:
    caller.clock.now = 1.0
    runner = caller(since=0.0)
    next(runner)
    late = caller(since=2.0)  # gathers behind the running load
    next(late)
    member = caller(since=0.5)  # takes the running load
    next(member)
    for flow in (late, member):
        with pytest.raises(asyncio.CancelledError):
            ends(flow, asyncio.CancelledError())
    assert ends(runner, "v") == "v"
    assert len(caller.loads) == 0  # the wave gathered behind, left by all, was dropped


def test_a_gathered_wave_is_loaded_by_whoever_comes_first_after_the_end(caller: Callers) -> None:
    caller.clock.now = 1.0
    runner = caller(since=0.0)
    next(runner)
    late = caller(since=2.0)
    next(late)
    assert ends(runner, "old") == "old"
    # The load ended; before its gathered member resumes, a new caller comes: the
    # wave has not begun, so it joins it and loads it at once (nothing runs ahead).
    caller.clock.now = 3.0
    newcomer = caller(since=2.5)
    assert isinstance(next(newcomer), LoadShared)
    assert waits_for(late.send(True)).began == 3.0
    assert ends(newcomer, "new") == "new"
    assert ends(late) == "new"
    assert len(caller.loads) == 0


def test_a_load_running_past_max_load_time_is_presumed_hung() -> None:
    """No caller waits forever (loaders reading each other's keys in a cycle would
    wait for each other's loads): a load running ``max_load_time`` no longer counts
    as in flight, and its callers share a new one."""
    caller = Callers(hung_after=10.0)
    caller.clock.now = 1.0
    hung = caller(since=0.0)
    next(hung)
    member, late = caller(since=0.5), caller(since=2.0)
    assert next(member).timeout == 10.0
    caller.clock.now = 4.0
    assert next(late).timeout == 7.0  # until the load is 10 s old
    caller.clock.now = 11.0
    assert isinstance(member.send(False), LoadShared)  # waited it out: loads anew
    assert waits_for(late.send(False)).began == 11.0  # and the other takes that
    newcomer = caller(since=10.5)
    assert waits_for(next(newcomer)).began == 11.0  # not the hung one: the new one
    assert ends(member, "fresh") == "fresh"
    assert ends(late) == "fresh"
    assert ends(newcomer) == "fresh"
    assert ends(hung, "at last") == "at last"  # its own caller still gets it
    assert len(caller.loads) == 0


def test_keys_do_not_share(caller: Callers) -> None:
    one, other = caller(0.0, "a"), caller(0.0, "b")
    assert isinstance(next(one), LoadShared)
    assert isinstance(next(other), LoadShared)
    assert ends(one, 1) == 1
    assert ends(other, 2) == 2
