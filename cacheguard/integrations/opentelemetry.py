"""OpenTelemetry traces of cacheguard's guards (extra ``opentelemetry``).

::

    from cacheguard.integrations.opentelemetry import instrument

    tracing = instrument(guard)  # a CacheGuard or an AsyncCacheGuard
    ...
    tracing.uninstrument()

Each public call of the guard (``get_or_load``, ``refresh``, ``peek``,
``invalidate``, ``invalidate_prefix``; the loaders and ``@cached_with_lock`` go
through them) is one span, ``cacheguard.<call>``, made current while it runs: a
span the caller has current is its parent, and the spans its loader makes (a
database query) are its descendants. Its attributes (the :data:`ATTRIBUTES`):

- ``cacheguard.namespace``: the guard's;
- ``cacheguard.key.template``: the key's template, when the call knew it (as the
  events' ``template``, see :mod:`cacheguard.cache.stats`). Never the key name: a
  trace backend indexes attributes, and names are unbounded;
- ``cacheguard.outcome`` (``get_or_load``, ``refresh``): :data:`HIT`, :data:`LOAD`,
  :data:`WAIT`, :data:`STALE` or :data:`BYPASS`; ``cacheguard.hit.tier`` (``l1``,
  ``l2``) on a hit.

Inside it, child spans: ``cacheguard.load`` around each loader run (current while
it runs) and ``cacheguard.wait`` for each wait on another caller, with
``cacheguard.wait.on``: ``lock`` (the key's lock: a filler elsewhere, or a
writer) or ``leader`` (the caller of this process loading the key). Every other
event of the call (a miss, a Redis error, a wait timeout, a store rejected ...) is
a span event named ``cacheguard.<kind>`` after its counter (:class:`~cacheguard.Stats`),
with ``cacheguard.seconds`` when it lasted, and ``exception.type`` and
``exception.message`` when it carries an error (Redis's, say).
A call or load that raises records the exception (an ``exception`` event) and ends
with status ERROR and the ``error.type`` attribute, as OpenTelemetry's semantic
conventions ask. The spans are ``INTERNAL`` and carry no ``db.*`` attributes: a
call is cacheguard's work (a GET, maybe a lock, a load, a store), not the one
database operation those attributes describe; OpenTelemetry has no conventions
for caches yet.

The events come through an event hook (:meth:`~cacheguard.CacheGuard.add_event_hook`),
the begin and end of calls and loads through the guard's tracer seam
(:mod:`cacheguard.cache.tracing`): a guard never instrumented pays one attribute
check per call. Background refreshes run apart from any call and are not traced.
"""

from __future__ import annotations

import time
import weakref
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider

from cacheguard import __version__
from cacheguard.cache.flows.state import GuardState
from cacheguard.cache.stats import CacheEvent

if TYPE_CHECKING:
    from cacheguard.cache.async_guard import AsyncCacheGuard
    from cacheguard.cache.guard import CacheGuard

__all__ = [
    "ATTRIBUTES",
    "BYPASS",
    "HIT",
    "LOAD",
    "SCOPE",
    "STALE",
    "WAIT",
    "GuardTracing",
    "instrument",
]

SCOPE: Final = "cacheguard"
"""The instrumentation scope (the tracer's name)."""

HIT: Final = "hit"
"""Outcome: served from the cache (L1 or Redis)."""
WAIT: Final = "wait"
"""Outcome: another caller loaded it (this process's leader, or a filler elsewhere)."""
STALE: Final = "stale"
"""Outcome: an expired value served (``stale_ttl``, ``on_timeout="stale"``,
``outage_ttl``, ``stale_if_error``)."""
LOAD: Final = "load"
"""Outcome: this call's loader ran (its value, or its error)."""
BYPASS: Final = "bypass"
"""Outcome: Redis failed or its circuit was open: loaded without the cache (or
through the gutter)."""

ATTRIBUTES: Final = (
    "cacheguard.namespace",
    "cacheguard.key.template",
    "cacheguard.outcome",
    "cacheguard.hit.tier",
    "cacheguard.wait.on",
)
"""The span attributes cacheguard sets (besides OpenTelemetry's ``error.type``)."""

# What an event says of its call's outcome, and its rank: the highest rank seen wins.
# A wait that ends in this call's own load was a load; a failed load answered by
# the last value seen (stale_if_error) served a stale value.
_OUTCOMES: Final = {
    "l1_hits": (HIT, 0),
    "l2_hits": (HIT, 0),
    "lock_waits": (WAIT, 1),
    "shared_timeout_loads": (WAIT, 1),
    "stale_served": (STALE, 2),
    "outage_reuses": (STALE, 2),
    "loads": (LOAD, 3),
    "load_errors": (LOAD, 3),
    "bypasses": (BYPASS, 4),
    "gutter_reads": (BYPASS, 4),
    "stale_on_error": (STALE, 5),
}
_LEADER_WAIT: Final = (WAIT, 1)
_TIERS: Final = {"l1_hits": "l1", "l2_hits": "l2"}
# Events the span shows otherwise (an attribute, a child span): not repeated as events.
_SHOWN: Final = frozenset({"l1_hits", "l2_hits", "loads", "lock_waits"})
# The calls whose span says how the value came.
_READS: Final = frozenset({"get_or_load", "get_or_load_many", "refresh"})

# The traced call this thread or task is in (None outside one). A loader's own calls
# of a guard set theirs over it, and put it back when they end.
_CALL: ContextVar[_Call | None] = ContextVar("cacheguard_otel_call", default=None)


def instrument(
    guard: CacheGuard | AsyncCacheGuard, tracer_provider: TracerProvider | None = None
) -> GuardTracing:
    """Trace ``guard``'s calls from now on, with a tracer of ``tracer_provider`` (by
    default the global one, even if set later); returns the handle that stops it
    (:meth:`GuardTracing.uninstrument`). A guard is traced by one instrumentation
    at a time: instrumenting it again raises :class:`ValueError`."""
    state = getattr(guard, "_state", None)
    if not isinstance(state, GuardState):
        raise TypeError(
            f"guard must be a CacheGuard or an AsyncCacheGuard, not {type(guard).__name__}"
        )
    if tracer_provider is not None and not isinstance(tracer_provider, TracerProvider):
        raise TypeError(
            "tracer_provider must be an opentelemetry TracerProvider, "
            f"not {type(tracer_provider).__name__}"
        )
    if state.tracer is not None:
        raise ValueError("this guard is traced already: uninstrument it first")
    tracer = _Tracer(trace.get_tracer(SCOPE, __version__, tracer_provider), state.namespace)
    guard.add_event_hook(tracer)
    state.set_tracer(tracer)
    return GuardTracing(guard, tracer)


class GuardTracing:
    """What :func:`instrument` returns: :meth:`uninstrument` undoes it."""

    def __init__(self, guard: CacheGuard | AsyncCacheGuard, tracer: _Tracer) -> None:
        self._guard = weakref.ref(guard)  # the handle does not keep the guard alive
        self._tracer: _Tracer | None = tracer

    @property
    def instrumented(self) -> bool:
        """Are the guard's calls traced through this handle?"""
        return self._tracer is not None and self._guard() is not None

    def uninstrument(self) -> None:
        """Stop tracing the guard (calls under way still end their spans); again, or
        after the guard was dropped, it does nothing."""
        tracer, self._tracer = self._tracer, None
        guard = self._guard()
        if tracer is None or guard is None:
            return
        state: GuardState = guard._state
        if state.tracer is tracer:
            state.set_tracer(None)
        guard.remove_event_hook(tracer)


class _Tracer:
    """One guard's tracer (cacheguard.cache.tracing.CallTracer) and event hook. It keeps
    no reference to the guard or its state: the guard's state holds it."""

    __slots__ = ("__weakref__", "_attributes", "_namespace", "_tracer")

    def __init__(self, tracer: trace.Tracer, namespace: str) -> None:
        self._tracer = tracer
        self._namespace = namespace
        # Per template: the attributes every span of its calls starts with.
        self._attributes: dict[str | None, dict[str, Any]] = {}

    def _start(self, what: str, template: str | None) -> Span:
        attributes = self._attributes.get(template)
        if attributes is None:
            attributes = {"cacheguard.namespace": self._namespace}
            if template is not None:
                attributes["cacheguard.key.template"] = template
            self._attributes[template] = attributes
        return self._tracer.start_span(
            f"cacheguard.{what}", kind=SpanKind.INTERNAL, attributes=attributes
        )

    # -- the guard's tracer seam ----------------------------------------------------------

    def begin(self, operation: str, template: str | None) -> _Call:
        span = self._start(operation, template)
        call = _Call(self, span, operation in _READS)
        call.enter()
        return call

    def load(self, name: str, template: str | None) -> _Active | _NotTraced:
        call = _CALL.get()
        if call is None or call.tracer is not self or call.ended:
            return _NOT_TRACED  # a background refresh: part of no call
        active = _Active(self._start("load", template))
        active.enter()
        return active

    def waited(self, name: str, seconds: float) -> None:
        call = _CALL.get()
        if call is not None and call.tracer is self and not call.ended:
            call.saw(*_LEADER_WAIT)
            self._child(call, "wait", seconds, "leader")

    # -- the event hook -----------------------------------------------------------------

    def __call__(self, event: CacheEvent) -> None:
        call = _CALL.get()
        if call is None or call.tracer is not self or call.ended:
            return  # not in a call of ours (a background refresh, another guard's call)
        kind = event.kind
        outcome = _OUTCOMES.get(kind)
        if outcome is not None:
            call.saw(*outcome)
        tier = _TIERS.get(kind)
        if tier is not None:
            call.tier = tier  # set with the outcome: one attribute write less per hit
        elif kind == "lock_waits":
            self._child(call, "wait", event.seconds, "lock")
        if kind not in _SHOWN:
            attributes: dict[str, Any] = {}
            if event.seconds:
                attributes["cacheguard.seconds"] = event.seconds
            if event.error is not None:
                attributes["exception.type"] = _qualified(type(event.error))
                attributes["exception.message"] = str(event.error)
            call.span.add_event(f"cacheguard.{kind}", attributes)

    def _child(self, call: _Call, what: str, seconds: float, on: str) -> None:
        """A child span of ``call`` that just ended, ``seconds`` long."""
        end = time.time_ns()
        span = self._tracer.start_span(
            f"cacheguard.{what}",
            context=trace.set_span_in_context(call.span),
            kind=SpanKind.INTERNAL,
            attributes={"cacheguard.namespace": self._namespace, "cacheguard.wait.on": on},
            start_time=end - int(seconds * 1e9),
        )
        span.end(end_time=end)


class _Active:
    """A span made current from its begin to its end (a load)."""

    __slots__ = ("_context_token", "ended", "error", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.ended = False
        self.error = False
        self._context_token: Token[Any] | None = None

    def enter(self) -> None:
        self._context_token = otel_context.attach(trace.set_span_in_context(self.span))

    def failed(self, error: BaseException) -> None:
        self.error = True
        self.span.record_exception(error)
        self.span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        self.span.set_attribute("error.type", _qualified(type(error)))

    def end(self) -> None:
        self.ended = True
        if self._context_token is not None:
            otel_context.detach(self._context_token)
        self.span.end()


class _Call(_Active):
    """One traced call: its span, current while it runs, and the outcome seen so far."""

    __slots__ = ("_call_token", "outcome", "rank", "read", "tier", "tracer")

    def __init__(self, tracer: _Tracer, span: Span, read: bool) -> None:
        super().__init__(span)
        self.tracer = tracer
        self.read = read
        self.outcome: str | None = None
        self.rank = -1
        self.tier: str | None = None
        self._call_token: Token[_Call | None] | None = None

    def enter(self) -> None:
        super().enter()
        self._call_token = _CALL.set(self)

    def saw(self, outcome: str, rank: int) -> None:
        if rank >= self.rank:
            self.outcome, self.rank = outcome, rank

    def end(self) -> None:
        if self.read and (self.outcome is not None or not self.error):
            # No event decided a served value: the fill found the key filled meanwhile.
            outcome = self.outcome or HIT
            if outcome == HIT and self.tier is not None:
                self.span.set_attributes(
                    {"cacheguard.outcome": HIT, "cacheguard.hit.tier": self.tier}
                )
            else:
                self.span.set_attribute("cacheguard.outcome", outcome)
        if self._call_token is not None:
            _CALL.reset(self._call_token)
        super().end()


class _NotTraced:
    """The trace of a load outside any traced call: nothing to record."""

    __slots__ = ()

    def failed(self, error: BaseException) -> None:
        pass

    def end(self) -> None:
        pass


_NOT_TRACED: Final = _NotTraced()


def _qualified(cls: type) -> str:
    """``error.type`` as the semantic conventions spell it: the class's full name."""
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"
