"""The asyncio driver of the batch read flow: the twin of
:mod:`cacheguard.cache.batch_driver`, step for step, with awaits.

A fill's script calls run to their end even if the caller is cancelled meanwhile
(see :class:`~cacheguard.cache.async_driver.Deferral`); the cancellation is then
thrown into the flow at its next step that would wait, and the flow ends the
fills it holds before it propagates.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import redis

from cacheguard.cache.async_driver import AsyncFillDriver
from cacheguard.cache.batch_driver import Batch, loads_user_code, refused_or, step_name
from cacheguard.cache.driver import NO_IO_STEPS, backend_down
from cacheguard.cache.flows.batch import (
    BatchFill,
    EndFill,
    FillStep,
    GetMany,
    LoadMany,
    ReadOne,
    TryHold,
)
from cacheguard.cache.flows.fill import Call
from cacheguard.cache.flows.read import valid_for_all
from cacheguard.cache.flows.state import GuardState, value_key
from cacheguard.cache.watermark import collecting
from cacheguard.exceptions import LockTimeout
from cacheguard.redis.clients import AsyncClient
from cacheguard.redis.errors import REDIS_DOWN, classify

__all__ = ["AsyncBatchDriver", "aget_many_raw"]


async def aget_many_raw(client: AsyncClient, keys: list[str]) -> list[Any]:
    """:func:`~cacheguard.cache.batch_driver.get_many_raw`, awaited."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.get(key)
    replies: list[Any] = await pipe.execute(raise_on_error=False)
    return refused_or(replies)


def _no_wait(step: Any) -> bool:
    """Steps that do not wait: a deferred cancellation waits for the next other one."""
    if isinstance(step, FillStep):
        return isinstance(step.step, (Call, *NO_IO_STEPS))
    return isinstance(step, EndFill)


class AsyncBatchDriver:
    """Carries out a batch flow's steps for an :class:`~cacheguard.aio.AsyncCacheGuard`
    (``run``: its driver of a single flow, ``answer``: its answer to other steps)."""

    def __init__(
        self,
        state: GuardState,
        client: AsyncClient,
        batch: Batch,
        run: Callable[[Generator[Any, Any, Any], str], Awaitable[Any]],
        answer: Callable[[Any, str], Awaitable[Any]],
    ) -> None:
        self.state, self.client, self.batch = state, client, batch
        self.run_one, self.answer_other = run, answer
        self.fills: dict[int, AsyncFillDriver] = {}
        self.cancelled = False  # during a script call that was let finish

    async def drive(self, flow: Generator[Any, Any, dict[str, Any]]) -> dict[str, Any]:
        step: Any = None
        try:
            step = next(flow)
            while True:
                if self.cancelled and not _no_wait(step):
                    self.cancelled = False  # thrown once; the flow ends what it holds
                    step = flow.throw(asyncio.CancelledError())
                    continue
                try:
                    reply = await self.answer(step)
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
            if self.cancelled:
                raise asyncio.CancelledError from None
            values: dict[str, Any] = done.value
            return values
        finally:
            flow.close()
            for fill in self.fills.values():
                fill.close()
            self.fills.clear()

    def fill_driver(self, fill: BatchFill) -> AsyncFillDriver:
        driver = self.fills.get(id(fill))
        if driver is None:
            call = fill.call
            driver = self.fills[id(fill)] = AsyncFillDriver(
                self.client,
                fill.lock,
                self.state.loads,
                call.name,
                call.load,
                valid_for_all,  # seals are the flow's
                call.template,
            )
        return driver

    async def answer(self, step: Any) -> Any:
        if isinstance(step, FillStep):
            driver = self.fill_driver(step.fill)
            try:
                return await driver.answer(step.step)
            finally:
                if driver.deferral.cancelled:
                    driver.deferral.cancelled = False
                    self.cancelled = True
        if isinstance(step, GetMany):
            namespace = self.state.namespace
            return await aget_many_raw(self.client, [value_key(namespace, n) for n in step.names])
        if isinstance(step, TryHold):
            driver = self.fill_driver(step.fill)
            try:
                await driver.lock.local.acquire_read(0)
            except LockTimeout:
                return False
            driver.local = True
            return True
        if isinstance(step, EndFill):
            if id(step.fill) in self.fills:
                self.fills.pop(id(step.fill)).close()
            return None
        if isinstance(step, LoadMany):
            return await self.load_many(step.names)
        if isinstance(step, ReadOne):
            return await self.run_one(step.flow, step.name)
        return await self.answer_other(step, step_name(step, self.batch))

    async def load_many(self, names: tuple[str, ...]) -> tuple[dict[str, Any], float, int | None]:
        batch = self.batch
        template = batch.calls[0].template
        with (
            self.state.loads.loading_many(names, template) as elapsed,
            collecting(self.state.namespace) as snapshots,
        ):
            answer = batch.load_many(batch.originals(names))
            if inspect.isawaitable(answer):
                answer = await answer
            values = batch.loaded(answer, names)
            seconds = elapsed()
        return values, seconds, min(snapshots, default=None)
