"""The sync driver of the batch read flow (:mod:`cacheguard.cache.flows.batch`), and
what both drivers share: the batch's calls and the checks of ``load_many``'s answer.

It decides nothing: each key's fill steps go to a fill driver of that key
(:class:`~cacheguard.cache.driver.FillDriver`), a read of one name to the guard's
own driver, and whatever a fill driver holds is released when its fill ends, or
when the batch ends, however it ends. The asyncio twin is
:mod:`cacheguard.cache.async_batch_driver`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator, Iterable, Mapping
from typing import Any

import redis

from cacheguard.cache.driver import FillDriver, backend_down, is_loader
from cacheguard.cache.entry import Missing
from cacheguard.cache.flows.batch import (
    BatchFill,
    EndFill,
    FillStep,
    GetMany,
    LoadMany,
    ReadOne,
    TryHold,
)
from cacheguard.cache.flows.read import Read, read_call, valid_for_all
from cacheguard.cache.flows.state import GuardState, value_key
from cacheguard.cache.typed import Fits
from cacheguard.cache.watermark import collecting
from cacheguard.checks import Seconds
from cacheguard.codecs import ValueType
from cacheguard.exceptions import IncompleteLoad, LockTimeout
from cacheguard.redis.clients import SyncClient
from cacheguard.redis.errors import REDIS_DOWN, classify

__all__ = ["Batch", "BatchDriver", "get_many_raw"]


class Batch:
    """One ``get_or_load_many`` call: its distinct names (the caller's, in order),
    their checked names, and the reads the flow runs. ``load_one(name)`` makes the
    loader of a name read alone (``load_many`` called for it only, its value dumped
    when typed). With ``values`` (the values' type, see :mod:`cacheguard.cache.typed`)
    stored data that does not fit it is a miss, what ``load_many`` returns is stored
    as ``values.dump`` makes it, and :meth:`result` converts every value."""

    __slots__ = ("calls", "checked", "fits", "load_many", "names", "original", "values")

    def __init__(
        self,
        state: GuardState,
        names: Iterable[str],
        load_many: Callable[[list[str]], Any],
        load_one: Callable[[str], Callable[[], Any]],
        ttl: Seconds,
        none_ttl: Seconds | Missing | None,
        template: str | None,
        values: ValueType | None = None,
    ) -> None:
        if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
            raise TypeError(
                f"names must be an iterable of key names (a list, a tuple...), "
                f"not {type(names).__name__}"
            )
        if not callable(load_many):
            raise TypeError(f"load_many must be callable, not {type(load_many).__name__}")
        self.names = list(dict.fromkeys(names))  # duplicates collapse, first place kept
        self.checked = state.key_names(self.names)
        self.original = dict(zip(self.checked, self.names, strict=True))
        self.load_many = load_many
        self.values = values
        self.fits: dict[str, Fits | None] = {}
        self.calls: list[Read] = []
        for checked, name in zip(self.checked, self.names, strict=True):
            if checked not in self.fits:
                fits = self.fits[checked] = None if values is None else Fits(values)
                call = read_call(state, checked, load_one(name), ttl, none_ttl, template, fits)
                self.calls.append(call)

    def result(self, values: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The flow's values (by checked name) by the caller's names, in their order,
        typed; and the caller's names whose data does not fit the type (shared by an
        untyped read of this process: the caller loads them again)."""
        result: dict[str, Any] = {}
        unfit: list[str] = []
        for name, checked in zip(self.names, self.checked, strict=True):
            data = values[checked]
            fits = self.fits[checked]
            if fits is None:
                result[name] = data
                continue
            try:
                result[name] = fits.load(data)
            except ValueError:
                result[name] = None
                unfit.append(name)
        return result, unfit

    def originals(self, names: tuple[str, ...]) -> list[str]:
        return [self.original[name] for name in names]

    def loaded(self, answer: Any, names: tuple[str, ...]) -> dict[str, Any]:
        """``load_many``'s answer for ``names`` (checked ones), by checked name: the
        names it returned (extra ones ignored)."""
        mapping = checked_mapping(answer)
        values = {}
        for name in names:
            original = self.original[name]
            if original in mapping:
                value = mapping[original]
                values[name] = value if self.values is None else self.values.dump(value)
        return values


def checked_mapping(answer: Any) -> Mapping[str, Any]:
    """What ``load_many`` returned, if a mapping; else a clear :class:`TypeError`."""
    if isinstance(answer, Mapping):
        return answer
    if inspect.isawaitable(answer):
        if inspect.iscoroutine(answer):
            answer.close()
        raise TypeError(
            "load_many returned an awaitable: a CacheGuard calls plain functions; "
            "use cacheguard.aio.AsyncCacheGuard for an async load_many"
        )
    raise TypeError(f"load_many must return a mapping name -> value, not {type(answer).__name__}")


def value_of(answer: Any, name: str) -> Any:
    """The value of ``name`` in ``load_many``'s answer for it alone."""
    mapping = checked_mapping(answer)
    if name not in mapping:
        raise IncompleteLoad((name,))
    return mapping[name]


def get_many_raw(client: SyncClient, keys: list[str]) -> list[Any]:
    """GET each of ``keys`` in one pipeline (a cluster client's pipeline goes to each
    node once): bytes, None, or the error a key of another type gave. Redis being
    down, or refusing, raises."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.get(key)
    replies: list[Any] = pipe.execute(raise_on_error=False)
    return refused_or(replies)


def refused_or(replies: list[Any]) -> list[Any]:
    """``replies``, unless one is Redis refusing (LOADING, a failover...): raised."""
    for reply in replies:
        if isinstance(reply, Exception):
            refusal = classify(reply)
            if isinstance(refusal, REDIS_DOWN):
                raise refusal
    return replies


def step_name(step: Any, batch: Batch) -> str:
    """The name a step's Redis error is reported for."""
    if isinstance(step, (FillStep, TryHold, EndFill)):
        return step.fill.name
    if isinstance(step, (GetMany, LoadMany)):
        return step.names[0]
    if isinstance(step, ReadOne):
        return step.name
    return batch.calls[0].name


def loads_user_code(step: Any) -> bool:
    """Does ``step`` run the caller's code (or a driver that classified its own
    Redis errors)? Its errors pass as they are."""
    if isinstance(step, FillStep):
        return is_loader(step.step)
    return isinstance(step, (LoadMany, ReadOne)) or is_loader(step)


class BatchDriver:
    """Carries out a batch flow's steps with blocking calls for a :class:`CacheGuard`
    (``run``: its driver of a single flow, ``answer``: its answer to other steps)."""

    def __init__(
        self,
        state: GuardState,
        client: SyncClient,
        batch: Batch,
        run: Callable[[Generator[Any, Any, Any], str], Any],
        answer: Callable[[Any, str], Any],
    ) -> None:
        self.state, self.client, self.batch = state, client, batch
        self.run_one, self.answer_other = run, answer
        self.fills: dict[int, FillDriver] = {}

    def drive(self, flow: Generator[Any, Any, dict[str, Any]]) -> dict[str, Any]:
        step: Any = None
        try:
            step = next(flow)
            while True:
                try:
                    reply = self.answer(step)
                except REDIS_DOWN as exc:
                    if loads_user_code(step):
                        step = flow.throw(exc)
                    else:
                        step = flow.throw(backend_down(step_name(step, self.batch), exc))
                except redis.ResponseError as exc:
                    refusal = classify(exc)
                    if not loads_user_code(step) and isinstance(refusal, REDIS_DOWN):
                        step = flow.throw(backend_down(step_name(step, self.batch), refusal))
                    else:
                        step = flow.throw(exc)
                except BaseException as exc:
                    step = flow.throw(exc)
                else:
                    step = flow.send(reply)
        except StopIteration as done:
            values: dict[str, Any] = done.value
            return values
        finally:
            flow.close()
            for fill in self.fills.values():
                fill.close()
            self.fills.clear()

    def fill_driver(self, fill: BatchFill) -> FillDriver:
        driver = self.fills.get(id(fill))
        if driver is None:
            call = fill.call
            driver = self.fills[id(fill)] = FillDriver(
                self.client,
                fill.lock,
                self.state.loads,
                call.name,
                call.load,
                valid_for_all,  # seals are the flow's
                call.template,
            )
        return driver

    def answer(self, step: Any) -> Any:
        if isinstance(step, FillStep):
            return self.fill_driver(step.fill).answer(step.step)
        if isinstance(step, GetMany):
            namespace = self.state.namespace
            return get_many_raw(self.client, [value_key(namespace, n) for n in step.names])
        if isinstance(step, TryHold):
            driver = self.fill_driver(step.fill)
            try:
                driver.lock.local.acquire_read(0)
            except LockTimeout:
                return False
            driver.local = True
            return True
        if isinstance(step, EndFill):
            if id(step.fill) in self.fills:
                self.fills.pop(id(step.fill)).close()
            return None
        if isinstance(step, LoadMany):
            return self.load_many(step.names)
        if isinstance(step, ReadOne):
            return self.run_one(step.flow, step.name)
        return self.answer_other(step, step_name(step, self.batch))

    def load_many(self, names: tuple[str, ...]) -> tuple[dict[str, Any], float, int | None]:
        batch = self.batch
        template = batch.calls[0].template
        with (
            self.state.loads.loading_many(names, template) as elapsed,
            collecting(self.state.namespace) as snapshots,
        ):
            values = batch.loaded(batch.load_many(batch.originals(names)), names)
            seconds = elapsed()
        return values, seconds, min(snapshots, default=None)
