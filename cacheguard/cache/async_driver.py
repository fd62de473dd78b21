"""The asyncio driver of the fill flow: carries out its steps with awaits.

The twin of :mod:`cacheguard.cache.driver`, step for step: it decides nothing,
throws I/O errors back into the flow (Redis being down as
:class:`BackendUnavailable`), and releases what it holds (the task's local read
lock, the subscription) when the flow ends, however it ends, cancellation
included. A fill's read hold is renewed by the loop's watchdog task while the
loader runs; a cancelled filler still ends its fill (the end script runs
shielded), so no fill is left stranded for its lease.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import redis
import redis.asyncio

from cacheguard.cache.driver import NO_IO_STEPS, FillDriverState, backend_down, is_loader
from cacheguard.cache.flows.fill import (
    Call,
    HoldLocal,
    Load,
    LoadUnlocked,
    Lookup,
    Outcome,
    ReadStamps,
    Step,
)
from cacheguard.cache.flows.state import Lock
from cacheguard.cache.loading import Loads
from cacheguard.cache.outage.shared_loads import AwaitLoad, LoadShared
from cacheguard.cache.watermark import collecting
from cacheguard.redis.async_notifier import async_notifier_for
from cacheguard.redis.clients import AsyncClient
from cacheguard.redis.errors import REDIS_DOWN
from cacheguard.steps import Subscribe, Wait

__all__ = ["Deferral", "aget_raw", "arun_load", "drive_fill_async"]


async def aget_raw(client: AsyncClient, key: str) -> Any:
    """GET ``key``: bytes, None, or the error a non-string key gave. Redis being
    down raises."""
    try:
        return await client.get(key)
    except REDIS_DOWN:
        raise
    except redis.ResponseError as exc:
        return exc


async def arun_load(
    loads: Loads, name: str, load: Callable[[], Any], template: str | None = None
) -> tuple[Any, float]:
    """``load()`` counted and timed; an async loader is awaited, a sync one called."""
    with loads.loading(name, template) as elapsed:
        value = load()
        if inspect.isawaitable(value):
            value = await value
        return value, elapsed()


class Deferral:
    """Calls run to their end even if the caller is cancelled meanwhile (once or
    more); the cancellation is remembered for the caller to raise once it is done."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    async def through(self, call: Awaitable[Any]) -> Any:
        task = asyncio.ensure_future(call)
        while True:
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                if task.cancelled():  # the call itself (the loop is shutting down)
                    raise
                self.cancelled = True


class AsyncFillDriver(FillDriverState):
    __slots__ = ("deferral",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.deferral = Deferral()  # cancelled during a script call, which was let finish

    async def answer(self, step: Step) -> Any:
        if isinstance(step, NO_IO_STEPS):
            return self.answer_now(step)
        if isinstance(step, Call):
            # Run to its end even if cancelled (again): a begin that made us the filler,
            # or an end, must be seen through, or the fill would stay stranded until its
            # lease ends. The cancellation is thrown in at the next step that waits.
            script, keys, args = step.call
            return await self.deferral.through(script.acall(self.client, keys, args))
        if isinstance(step, Lookup):
            return await aget_raw(self.client, self.lock.remote.keys.value)
        if isinstance(step, Subscribe):
            channel = self.lock.remote.keys.released_channel
            self.subscription = async_notifier_for(self.client).subscription(channel)
            return await self.subscription.open(step.timeout)
        if isinstance(step, Wait):
            return await self.subscription.wait(step.seconds)
        if isinstance(step, HoldLocal):
            await self.lock.local.acquire_read(step.timeout)
            self.local = True
            return None
        if isinstance(step, Load):
            with collecting(self.lock.remote.keys.namespace) as snapshots:
                value, seconds = await arun_load(self.loads, self.name, self.load, self.template)
            return value, seconds, min(snapshots, default=None)
        if isinstance(step, (LoadUnlocked, LoadShared)):
            return (await arun_load(self.loads, self.name, self.load, self.template))[0]
        if isinstance(step, AwaitLoad):
            return await step.wave.wait_async(step.timeout)
        if isinstance(step, ReadStamps):
            pipe = self.client.pipeline(transaction=False)
            for key in step.keys:
                pipe.get(key)
            return await pipe.execute()
        raise TypeError(f"not a fill step: {step!r}")


# Steps that do not wait: a cancellation deferred by a script call is thrown into
# the flow at the first step that would (the flow then ends its fill, if any).
_NO_WAIT = (Call, *NO_IO_STEPS)


async def drive_fill_async(
    flow: Generator[Step, Any, Outcome],
    *,
    client: AsyncClient,
    lock: Lock,
    loads: Loads,
    name: str,
    load: Callable[[], Any],
    seal: Callable[[], int],
    template: str | None = None,
) -> tuple[Outcome, int]:
    """Run ``flow`` to its end; its outcome and the flight generation below which
    followers may share it (the last seal; 0 for a private outcome). ``template``
    labels the load's events."""
    fill = AsyncFillDriver(client, lock, loads, name, load, seal, template)
    try:
        step = next(flow)
        while True:
            if fill.deferral.cancelled and not isinstance(step, _NO_WAIT):
                step = flow.throw(asyncio.CancelledError())
                continue
            try:
                reply = await fill.answer(step)
            except REDIS_DOWN as exc:
                step = flow.throw(exc if is_loader(step) else backend_down(name, exc))
            except BaseException as exc:
                step = flow.throw(exc)
            else:
                step = flow.send(reply)
    except StopIteration as done:
        if fill.deferral.cancelled:
            raise asyncio.CancelledError from None
        outcome: Outcome = done.value
        return outcome, 0 if outcome.private else fill.sealed
    finally:
        flow.close()
        fill.close()
