"""Jittered, capped exponential backoff: the safety net behind pub/sub wake-ups.

Waiters normally wake on a release notification. The backoff only decides how
long a waiter sleeps if that notification is lost (a dropped pub/sub
connection, a holder that died without releasing), so it starts small and is
capped: a lost message costs at most ``cap`` seconds, never a hang.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["Backoff"]


@dataclass
class Backoff:
    """Full-jitter exponential backoff: delay n is uniform in [base*2^n/2, base*2^n], capped."""

    initial: float = 0.05
    cap: float = 1.0
    # None: the random module's shared generator (seeding one per wait costs ~10 µs).
    rng: random.Random | None = field(default=None, repr=False)
    _attempt: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.cap <= 0:
            raise ValueError("backoff initial and cap must be > 0")
        if self.initial > self.cap:
            raise ValueError("backoff initial must not exceed cap")

    def next_delay(self) -> float:
        ceiling = min(self.cap, self.initial * 2.0 ** min(self._attempt, 32))
        self._attempt += 1
        # Half-jitter: never collapse to ~0 (a busy loop), still de-synchronise waiters.
        draw = self.rng.random() if self.rng is not None else random.random()
        return ceiling / 2 + draw * ceiling / 2
