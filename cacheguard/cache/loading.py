"""Running loaders: counted, timed, and refused when they would wait for themselves.

A loader that asks for its own key (directly, or through another loader)
would wait for its own fill until ``wait_timeout``. The names being loaded are
kept in a context variable, which is per thread for threads and per task for
asyncio tasks, so both drivers detect it the same way and fail at once with
:class:`RecursiveLoadError`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from cacheguard.cache.outage.fallback import mark_from_loader
from cacheguard.cache.stats import StatsRecorder
from cacheguard.cache.tracing import CallTracer
from cacheguard.exceptions import BackendUnavailable, CacheGuardError, RecursiveLoadError

__all__ = ["Loads"]

# (id of the Loads, name) pairs loading in this thread or task: immutable, so a
# task started by a loader sees its parent's names without sharing a set.
_LOADING: ContextVar[frozenset[tuple[int, str]]] = ContextVar(
    "cacheguard_loading", default=frozenset()
)


class Loads:
    """One guard's loader bookkeeping."""

    __slots__ = ("_stats", "_timer", "tracer")

    def __init__(self, stats: StatsRecorder, timer: Callable[[], float]) -> None:
        self._stats = stats
        self._timer = timer
        self.tracer: CallTracer | None = None  # GuardState.set_tracer's

    def refuse_recursion(self, name: str, template: str | None = None) -> None:
        """A loader asking for its own key would wait for itself: fail at once."""
        if (id(self), name) in _LOADING.get():
            error = RecursiveLoadError(key=name)
            self._stats.count("load_errors", name, 0.0, error, template)
            raise error

    @contextmanager
    def loading(self, name: str, template: str | None = None) -> Iterator[Callable[[], float]]:
        """Mark ``name`` as being loaded here; yields a function giving the seconds
        since the start. Counts the load, or its error (``template``: the key's)."""
        token = _LOADING.set(_LOADING.get() | {(id(self), name)})
        # Begun here, not from the events: the loader's own spans nest inside it.
        trace = None if self.tracer is None else self.tracer.load(name, template)
        start = self._timer()
        try:
            yield lambda: self._timer() - start
        except BaseException as exc:
            if trace is not None:
                trace.failed(exc)
            self._stats.count("load_errors", name, self._timer() - start, exc, template)
            if isinstance(exc, Exception) and (
                not isinstance(exc, CacheGuardError) or isinstance(exc, BackendUnavailable)
            ):
                # stale_if_error may answer it (cache/outage/fallback.py); the cache's own
                # refusals raised inside a loader (recursion, a closed guard) stand.
                mark_from_loader(exc)
            raise
        else:
            self._stats.count("loads", name, self._timer() - start, None, template)
        finally:
            if trace is not None:
                trace.end()
            _LOADING.reset(token)

    @contextmanager
    def loading_many(
        self, names: tuple[str, ...], template: str | None = None
    ) -> Iterator[Callable[[], float]]:
        """:meth:`loading` for one load of several names (a batch's ``load_many``):
        all marked as being loaded, a load (or a load error) counted for each."""
        token = _LOADING.set(_LOADING.get() | {(id(self), name) for name in names})
        start = self._timer()
        try:
            yield lambda: self._timer() - start
        except BaseException as exc:
            for name in names:
                self._stats.count("load_errors", name, self._timer() - start, exc, template)
            if isinstance(exc, Exception) and (
                not isinstance(exc, CacheGuardError) or isinstance(exc, BackendUnavailable)
            ):
                mark_from_loader(exc)
            raise
        else:
            seconds = self._timer() - start
            for name in names:
                self._stats.count("loads", name, seconds, None, template)
        finally:
            _LOADING.reset(token)

    def run(
        self, name: str, load: Callable[[], Any], template: str | None = None
    ) -> tuple[Any, float]:
        """``load()`` counted and timed: ``(value, seconds)`` (the sync drivers')."""
        with self.loading(name, template) as elapsed:
            value = load()
            if inspect.isawaitable(value):
                # An async def given to a sync guard: refuse it (as a failed load:
                # nothing stored, the fill ended) rather than try to encode it.
                if inspect.iscoroutine(value):
                    value.close()
                raise TypeError(
                    f"the loader of {name!r} returned an awaitable: a CacheGuard calls "
                    "plain functions; use cacheguard.aio.AsyncCacheGuard for async loaders"
                )
            return value, elapsed()
