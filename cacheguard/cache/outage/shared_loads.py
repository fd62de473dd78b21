"""Callers whose wait timed out share their unlocked loads: one in flight per key.

Under ``on_timeout="load"`` a caller whose wait for someone else's fill reaches
``wait_timeout`` loads without the lock (storing nothing). A slow database makes
every waiter time out together; loading each on its own would stampede the
database exactly when it is slowest. So in a process such callers share: per key
at most one of these loads runs at a time (a *wave*), and the others take its
outcome. A caller that holds the key's write lock never comes here: its load is
its own uncommitted view (see ``writing_here`` in :mod:`cacheguard.cache.flows.fill`).

Sharing stays linearizable, as in the single flight (see
:mod:`cacheguard.cache.singleflight`): a caller takes a load's outcome only if the
load began after the caller's call began, so a write that ended before the call
began had ended before the load read the database. Generations cannot order
these callers (they come from different flights, or from none: a follower whose
wait timed out has left its flight), so the order is read on the guard's
monotonic timer, one clock for every thread of the process: a call began at its
caller's reading when it started; a leader, whose outcome its followers take too,
asks for a load begun after the newest of their starts (``Flight.newest_start``).
The runner *seals* its wave right before it loads, stamping it under the mutex. A
caller arriving while a wave loads takes that wave only if its call began before
the stamp (strictly: an equal reading proves nothing, so a timer that stands
still makes callers share less, never wrongly). Otherwise it gathers into the
next wave, which begins once the running one ended, loaded by the first of its
members to see that end, for all of them (each arrived before it began). Everyone
who arrives while a wave only gathers joins it too.

Bounds: at most one such load per key in flight per process. A caller waits at
most for the rest of the running load, then one load of its own wave: no shorter
deadline of its own, because that would start a second load while the first still
runs, the stampede itself. What bounds the wait is the load, and the guard's
``max_load_time``: a load running that long is presumed hung (as a fill's hold
is), so it no longer counts as in flight: its callers stop waiting for it and
share a new one. No caller waits forever, even when loaders read each other's
keys in a cycle (each waiting for the other's shared load); a hung loader itself
is never interrupted.

Outcomes: the loader's value or exception is its wave's, for every member (a
failing database is not asked again by each of them). A runner that is
interrupted (a cancelled task, KeyboardInterrupt) leaves no outcome: its members
go on without it, one of them loading. A member cancelled while it waits leaves
its wave; a gathering wave all of whose members left is dropped, so nothing is
left behind for the key.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["LOAD_SHARED", "AwaitLoad", "LoadShared", "SharedLoads", "Wave", "shared_load"]


class Wave:
    """One shared unlocked load of a key, and the outcome its members take."""

    __slots__ = ("began", "error", "event", "interrupted", "members", "result")

    def __init__(self, event: Any) -> None:
        self.event: Any = event  # a threading.Event, or an asyncio.Event for tasks
        self.began = math.inf  # the seal: the timer right before the load (inf: not yet)
        self.members = 1  # callers that take its outcome (counted while it gathers)
        self.result: Any = None
        self.error: BaseException | None = None
        self.interrupted = False  # its runner stopped with no outcome to share

    def wait(self, timeout: float | None) -> bool:
        """``True`` once the wave ended, ``False`` at the timeout (None: none)."""
        return bool(self.event.wait(timeout))

    async def wait_async(self, timeout: float | None) -> bool:
        """:meth:`wait` for tasks."""
        try:
            await asyncio.wait_for(self.event.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


@dataclass(frozen=True, slots=True)
class LoadShared:
    """Step: run the loader without any lock, for every member of the caller's wave.
    Answer: the value, or its exception thrown in."""


@dataclass(frozen=True, slots=True)
class AwaitLoad:
    """Step: wait until ``wave`` ended, up to ``timeout`` s (None: no limit), when
    its load is presumed hung. Answer: ``True`` once it ended, ``False`` at the
    timeout."""

    wave: Wave
    timeout: float | None


LOAD_SHARED: Final = LoadShared()


class SharedLoads:
    """The waves of one guard, per key: the one loading and the one gathering
    behind it. Threads (``threading.Event``, the default) or the tasks of one loop
    (``asyncio.Event``); ``timer`` is the guard's, the one its calls' starts are read
    on; a load running ``hung_after`` s (the guard's ``max_load_time``) is presumed hung."""

    def __init__(
        self,
        event: Callable[[], Any] = threading.Event,
        timer: Callable[[], float] = time.monotonic,
        hung_after: float = math.inf,
    ) -> None:
        self._event = event
        self._timer = timer
        self._hung_after = hung_after
        self._mutex = threading.Lock()
        self._loading: dict[str, Wave] = {}
        self._gathering: dict[str, Wave] = {}

    def patience(self, wave: Wave) -> float | None:
        """How long to wait for ``wave`` (begun) before presuming its load hung."""
        if self._hung_after == math.inf:
            return None
        return max(wave.began + self._hung_after - self._timer(), 0.0)

    def _live(self, name: str) -> Wave | None:
        """The key's running wave, unless it is presumed hung (then forgotten: the
        next wave may begin, its callers wait no more). Under the mutex."""
        loading = self._loading.get(name)
        if loading is not None and self._timer() - loading.began >= self._hung_after:
            del self._loading[name]
            return None
        return loading

    def enter(self, name: str, since: float) -> tuple[Wave, Wave | None]:
        """For a caller whose call began at ``since``: the wave whose outcome it
        takes, and the wave to wait for first (None: the caller loads its wave now)."""
        with self._mutex:
            loading = self._live(name)
            if loading is not None and loading.began > since:
                loading.members += 1
                return loading, loading
            gathering = self._gathering.get(name)
            if gathering is None:
                gathering = self._gathering[name] = Wave(self._event())
            else:
                gathering.members += 1
            if loading is None:  # nothing ahead of it: it begins with this caller
                return self._begin(name, gathering), None
            return gathering, loading

    def claim(self, name: str, wave: Wave) -> Wave | None:
        """The load ahead of ``wave`` ended: None if the caller loads ``wave`` now,
        else the wave to wait for (``wave`` itself, begun by another member)."""
        with self._mutex:
            if wave.began < math.inf:  # another member began it
                return wave
            loading = self._live(name)
            if loading is not None:  # (cannot be: only this wave begins next) wait again
                return loading
            self._begin(name, wave)
            return None

    def _begin(self, name: str, wave: Wave) -> Wave:
        if self._gathering.get(name) is wave:
            del self._gathering[name]
        self._loading[name] = wave
        wave.began = self._timer()  # the seal: the load starts after this reading
        return wave

    def leave(self, name: str, wave: Wave) -> None:
        """A member stopped waiting (cancelled): a gathering wave left by all is dropped."""
        with self._mutex:
            wave.members -= 1
            if wave.members <= 0 and self._gathering.get(name) is wave:
                del self._gathering[name]

    def finish(
        self,
        name: str,
        wave: Wave,
        result: Any = None,
        error: BaseException | None = None,
        *,
        interrupted: bool = False,
    ) -> None:
        """The runner's load of ``wave`` ended: record its outcome, wake its members
        (and those gathered behind it)."""
        wave.result, wave.error, wave.interrupted = result, error, interrupted
        with self._mutex:
            if self._loading.get(name) is wave:
                del self._loading[name]
        wave.event.set()

    def __len__(self) -> int:
        """Keys with a wave loading or gathering (0 when nothing is left behind)."""
        with self._mutex:
            return len(self._loading.keys() | self._gathering.keys())


def shared_load(
    loads: SharedLoads, name: str, since: float, count: Callable[..., None]
) -> Generator[LoadShared | AwaitLoad, Any, Any]:
    """The value of an unlocked load of ``name`` for a caller whose call began at
    ``since``: its own, or the one it shares (counted as ``shared_timeout_loads``)."""
    wave, ahead = loads.enter(name, since)
    while ahead is not None:
        try:
            # (It may end just as the wait times out: then it ended.)
            ended = (yield AwaitLoad(ahead, loads.patience(ahead))) or ahead.event.is_set()
        except BaseException:
            loads.leave(name, wave)
            raise
        if ahead is not wave:  # the load ahead ended, or hung: ours may begin
            ahead = loads.claim(name, wave)
        elif ended and not wave.interrupted:
            count("shared_timeout_loads", name)
            if wave.error is not None:
                raise wave.error
            return wave.result
        else:  # its runner gave up, or it hung: go on without it
            loads.leave(name, wave)
            wave, ahead = loads.enter(name, since)
    try:
        value = yield LOAD_SHARED
    except Exception as exc:
        loads.finish(name, wave, error=exc)
        raise
    except BaseException:  # cancelled or interrupted: not an outcome to share
        loads.finish(name, wave, interrupted=True)
        raise
    loads.finish(name, wave, value)
    return value
