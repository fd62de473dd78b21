"""The sync driver of the fill flow: carries out its steps with blocking calls.

It decides nothing: every step of :func:`cacheguard.cache.flows.fill.fill_flow` maps
to one call here, I/O errors are thrown back into the flow (Redis being down as
:class:`BackendUnavailable`), and whatever it holds (the local read lock, the
subscription) is released when the flow ends, however it ends. The asyncio
driver (:mod:`cacheguard.cache.async_driver`) is the same with awaits.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Final

import redis

from cacheguard.cache.flows.fill import (
    Adopt,
    Call,
    Disown,
    Drain,
    HoldLocal,
    Load,
    LoadUnlocked,
    Lookup,
    Outcome,
    ReadStamps,
    ReleaseLater,
    Seal,
    Step,
)
from cacheguard.cache.flows.read import Gutter, LoadNow, Replay, RunFill
from cacheguard.cache.flows.state import Lock
from cacheguard.cache.loading import Loads
from cacheguard.cache.outage.shared_loads import AwaitLoad, LoadShared
from cacheguard.cache.singleflight import VALID_FOR_ALL
from cacheguard.cache.watermark import collecting
from cacheguard.redis.clients import SyncClient
from cacheguard.redis.errors import REDIS_DOWN, backend_down, classify
from cacheguard.redis.notifier import notifier_for
from cacheguard.steps import Subscribe, Wait

__all__ = [
    "NO_IO_STEPS",
    "FillDriverState",
    "backend_down",
    "drive_fill",
    "get_raw",
    "is_loader",
    "lookup_failed",
]


def get_raw(client: SyncClient, key: str) -> Any:
    """GET ``key``: bytes, None, or the error a non-string key gave (someone else's
    key: the flow treats it as corrupt). Redis being down raises."""
    try:
        return client.get(key)
    except REDIS_DOWN:
        raise
    except redis.ResponseError as exc:
        return exc


def lookup_failed(name: str, exc: BaseException) -> tuple[Any, BaseException | None]:
    """A hit path's GET of ``name`` raised ``exc``: ``(reply, None)`` for what the
    drivers send into the flow as the GET's answer (the error a key of another type
    gave: not ours), else ``(None, error)`` as they throw it in (Redis being down
    as :class:`BackendUnavailable`)."""
    if isinstance(exc, REDIS_DOWN):
        return None, backend_down(name, exc)
    if isinstance(exc, redis.ResponseError):
        refusal = classify(exc)
        if isinstance(refusal, REDIS_DOWN):  # LOADING, MASTERDOWN...: Redis refusing
            return None, backend_down(name, refusal)
        return exc, None
    return None, exc


def is_loader(step: object) -> bool:
    """Does ``step`` run the caller's loader (directly, or in a fill or guard whose
    driver classified its own Redis errors already; or the outbox replays, whose
    errors are the database's or a guard's)? Its errors then pass as they are: a
    loader's own ``OSError`` is not Redis being down."""
    return isinstance(step, (Load, LoadUnlocked, LoadNow, LoadShared, RunFill, Gutter, Replay))


# Steps answered without I/O, alike in both drivers (FillDriverState.answer_now).
NO_IO_STEPS: Final = (Seal, Drain, Adopt, Disown, ReleaseLater)


class FillDriverState:
    """What a driver holds while it runs one fill flow (the local read lock, the
    subscription, the fill's read hold), and its answers to the steps that need
    no I/O. The sync driver below and the asyncio one (:mod:`cacheguard.cache.async_driver`)
    extend it with their I/O."""

    __slots__ = (
        "client",
        "handle",
        "last_renewed",
        "load",
        "loads",
        "local",
        "lock",
        "name",
        "seal",
        "sealed",
        "subscription",
        "template",
    )

    def __init__(
        self,
        client: Any,
        lock: Any,
        loads: Loads,
        name: str,
        load: Callable[[], Any],
        seal: Callable[[], int],
        template: str | None = None,
    ) -> None:
        self.client, self.lock, self.loads, self.name = client, lock, loads, name
        self.load, self.seal, self.template = load, seal, template
        self.sealed = VALID_FOR_ALL
        self.subscription: Any = None  # opened by the Subscribe step
        self.handle: Any = None  # the fill's read hold, from Adopt
        self.last_renewed: float | None = None
        self.local = False  # the local read lock is held

    def answer_now(self, step: Step) -> None:
        """Carry out one of :data:`NO_IO_STEPS`."""
        if isinstance(step, Seal):
            self.sealed = self.seal()
        elif isinstance(step, Drain):
            self.subscription.drain()
        elif isinstance(step, Adopt):
            owner = self.lock.owner
            self.handle = self.lock.remote.adopt(
                "read", owner, step.epoch, renew_for=step.renew_for
            )
        elif isinstance(step, Disown):
            self.last_renewed = self.lock.remote.disown(self.handle)
        elif isinstance(step, ReleaseLater):
            self.lock.remote.release_in_background(self.handle, self.last_renewed)

    def close(self) -> None:
        if self.subscription is not None:
            self.subscription.close()
        if self.local:
            self.lock.local.release_read()


class FillDriver(FillDriverState):
    __slots__ = ()

    def answer(self, step: Step) -> Any:
        if isinstance(step, NO_IO_STEPS):
            return self.answer_now(step)
        if isinstance(step, Call):
            script, keys, args = step.call
            return script(self.client, keys, args)
        if isinstance(step, Lookup):
            return get_raw(self.client, self.lock.remote.keys.value)
        if isinstance(step, Subscribe):
            channel = self.lock.remote.keys.released_channel
            self.subscription = notifier_for(self.client).subscription(channel)
            return self.subscription.open(step.timeout)
        if isinstance(step, Wait):
            return self.subscription.wait(step.seconds)
        if isinstance(step, HoldLocal):
            self.lock.local.acquire_read(step.timeout)
            self.local = True
            return None
        if isinstance(step, Load):
            with collecting(self.lock.remote.keys.namespace) as snapshots:
                value, seconds = self.loads.run(self.name, self.load, self.template)
            return value, seconds, min(snapshots, default=None)
        if isinstance(step, (LoadUnlocked, LoadShared)):
            return self.loads.run(self.name, self.load, self.template)[0]
        if isinstance(step, AwaitLoad):
            return step.wave.wait(step.timeout)
        if isinstance(step, ReadStamps):
            pipe = self.client.pipeline(transaction=False)
            for key in step.keys:
                pipe.get(key)
            return pipe.execute()
        raise TypeError(f"not a fill step: {step!r}")


def drive_fill(
    flow: Generator[Step, Any, Outcome],
    *,
    client: SyncClient,
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
    fill = FillDriver(client, lock, loads, name, load, seal, template)
    try:
        step = next(flow)
        while True:
            try:
                reply = fill.answer(step)
            except REDIS_DOWN as exc:
                step = flow.throw(exc if is_loader(step) else backend_down(name, exc))
            except BaseException as exc:
                step = flow.throw(exc)
            else:
                step = flow.send(reply)
    except StopIteration as done:
        outcome: Outcome = done.value
        return outcome, 0 if outcome.private else fill.sealed
    finally:
        flow.close()
        fill.close()
