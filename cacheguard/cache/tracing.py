"""The seam tracing plugs into: a guard's calls begin and end, loaders run, callers wait.

A guard's events (:mod:`cacheguard.cache.stats`) say what happened, but not when a
call began or ended, nor when a loader started, and a caller that waits for the
leader of its own process counts nothing. A :class:`CallTracer` set on the guard's
state (:meth:`~cacheguard.cache.flows.state.GuardState.set_tracer`) is told those:
both drivers begin and end a trace around each public read and invalidation,
:class:`~cacheguard.cache.loading.Loads` around each loader run, and the read flow
reports a follower's wait. Unset (None, the default) it costs each call one
attribute check. :mod:`cacheguard.integrations.opentelemetry` is the tracer the
package ships; nothing here imports it.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["CallTrace", "CallTracer"]


class CallTrace(Protocol):
    """One traced call or loader run, from its begin to its :meth:`end`."""

    def failed(self, error: BaseException) -> None:
        """It raises ``error`` (called once, before :meth:`end`)."""

    def end(self) -> None:
        """It is over; called once, however it ended."""


class CallTracer(Protocol):
    """What a guard tells a tracer; every method is called in the calling thread (or
    task), inside the call it concerns, and must be quick."""

    def begin(self, operation: str, template: str | None) -> CallTrace:
        """A public call (``"get_or_load"``, ``"get_or_load_many"``, ``"refresh"``,
        ``"peek"``, ``"invalidate"``, ``"invalidate_prefix"``) begins; ``template`` is
        its key's, when it gave one."""
        ...

    def load(self, name: str, template: str | None) -> CallTrace:
        """The loader of ``name`` is about to run (in a fill, a bypass, or a timed-out
        caller's load): its trace is ended when the loader returns or raises."""
        ...

    def waited(self, name: str, seconds: float) -> None:
        """This caller waited ``seconds`` for the leader of ``name`` in its own process
        (the single flight) to finish: an event hook never hears of it."""
