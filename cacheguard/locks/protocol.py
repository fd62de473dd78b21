"""The acquire algorithm of the distributed lock, with no I/O in it.

:func:`acquire_flow` is a generator that *asks* for I/O by yielding a step and
gets the answer sent back in, the way httpx drives its auth flows. A sync
driver (:mod:`cacheguard.locks.redis.rwlock`) answers with blocking calls; an
asyncio driver can answer the same steps with awaits, so both share one
algorithm and one set of tests.

The algorithm:

1. try once (one script call); an uncontended lock costs nothing more. The
   driver makes this first call itself and starts the flow only if it failed,
   so the uncontended path builds no generator;
2. otherwise subscribe to the lock's release channel, then try again: a
   release that happened between the first try and the subscription would
   otherwise be missed;
3. sleep until a release notification or a timer, whichever comes first. The
   timer is the sooner of a jittered capped backoff (the safety net for a lost
   message) and the moment the blocking holder's lease ends (a dead holder is
   taken over as soon as its lease allows);
4. try again; give up with :class:`LockTimeout` at the deadline (a writer
   first withdraws the waiting mark that holds off new readers).

The loop is bounded by the deadline, never recursive.

Drivers throw I/O errors into the flow (they end it). An exception thrown in
while the flow waits (a cancelled asyncio task) means the caller gives up: a
writer withdraws its mark first, as at the deadline. A driver whose caller gave
up in the middle of a :class:`TryAcquire` round trip takes back what that call
did itself (``wire.undo_attempt_call``), after it completed. The scripts' KEYS,
ARGV and replies are in :mod:`cacheguard.locks.redis.wire`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Final, Literal

from cacheguard.backoff import Backoff
from cacheguard.exceptions import LockTimeout, LockUpgradeError
from cacheguard.steps import Subscribe, Wait

__all__ = [
    "Attempt",
    "Mode",
    "Step",
    "TryAcquire",
    "Withdraw",
    "acquire_flow",
]

Mode = Literal["read", "write"]

# A margin after a blocking lease's end before retrying, so the retry lands
# after the server considers it ended, not just before.
LEASE_END_MARGIN: Final = 0.002
SUBSCRIBE_WAIT_CAP: Final = 1.0


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one acquire script answered."""

    granted: bool
    epoch: int = 0
    retry_in: float = 0.0  # seconds until the soonest blocking lease ends
    upgrade: bool = False


class TryAcquire:
    """Step: run the acquire script once; answer with an :class:`Attempt`."""

    __slots__ = ()


class Withdraw:
    """Step: a writer gives up; remove its waiting mark; answer ``None``."""

    __slots__ = ()


Step = TryAcquire | Subscribe | Wait | Withdraw
TRY: Final = TryAcquire()
WITHDRAW: Final = Withdraw()


def acquire_flow(
    first: Attempt,
    *,
    name: str,
    mode: Mode,
    owner: str,
    start: float,
    timeout: float,
    timer: Callable[[], float],
    backoff: Callable[[], Backoff],
) -> Generator[Step, Any, int]:
    """Yield I/O steps until the lock is granted; return its epoch (fencing token).

    ``first`` is the answer to the first try, made at ``start`` by the driver.
    """
    deadline = start + timeout
    if first.granted:
        return first.epoch
    if first.upgrade:
        raise LockUpgradeError(name=name, owner=owner)

    delays = backoff()
    # Wait for the confirmation at most about one backoff cap: with the pub/sub
    # connection down it never comes, and the timers must take over.
    confirm_within = max(min(deadline - timer(), SUBSCRIBE_WAIT_CAP), 0.0)
    yield from _waiting(Subscribe(timeout=confirm_within), mode)
    while True:
        attempt: Attempt = yield TRY
        if attempt.granted:
            return attempt.epoch
        if attempt.upgrade:  # only possible if the owner changed state meanwhile
            raise LockUpgradeError(name=name, owner=owner)
        remaining = deadline - timer()
        if remaining <= 0:
            if mode == "write":
                # Our waiting mark holds off readers; do not make them wait it out.
                yield WITHDRAW
            raise LockTimeout(name=name, mode=mode, waited=timer() - start, owner=owner)
        delay = delays.next_delay()
        if attempt.retry_in > 0:
            delay = min(delay, attempt.retry_in + LEASE_END_MARGIN)
        yield from _waiting(Wait(min(delay, remaining)), mode)  # messages only wake us


def _waiting(step: Subscribe | Wait, mode: Mode) -> Generator[Step, Any, Any]:
    """Yield a waiting step; if the caller gives up meanwhile (an exception thrown in,
    such as a task's cancellation), a writer withdraws its waiting mark first."""
    try:
        return (yield step)
    except GeneratorExit:  # the driver closed the flow: it may not yield any more
        raise
    except BaseException:
        if mode == "write":
            # Our mark holds off readers; do not make them wait it out.
            yield WITHDRAW
        raise
