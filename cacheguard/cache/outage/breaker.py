"""A circuit breaker, so a dead Redis costs a connect timeout once, not on every call.

closed    -> calls go to Redis; ``failures`` consecutive backend errors open it
open      -> calls skip Redis (bypass or raise at once) for ``cooldown`` seconds
half-open -> one call probes Redis; success closes the circuit, failure re-opens it;
             a probe whose outcome never comes back (its call failed in a layer that
             does not report here) expires after a cooldown, and another call probes
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal

__all__ = ["Breakers", "CircuitBreaker"]

State = Literal["closed", "open", "half-open"]


class CircuitBreaker:
    def __init__(
        self,
        *,
        failures: int = 3,
        cooldown: float = 2.0,
        timer: Callable[[], float] = time.monotonic,
        on_close: Callable[[], None] = lambda: None,
    ) -> None:
        if failures < 1 or cooldown <= 0:
            raise ValueError("breaker failures must be >= 1 and cooldown > 0")
        self.failures = failures
        self.cooldown = cooldown
        self._timer = timer
        self._on_close = on_close  # its node answered again (whichever call probed)
        self._mutex = threading.Lock()
        self._consecutive = 0
        self._opened_at: float | None = None
        self._probing = False
        self._probe_at = 0.0
        self.opened = 0  # how many times it opened, for stats

    @property
    def state(self) -> State:
        if self._opened_at is None:
            return "closed"
        if self._probing or self._timer() - self._opened_at >= self.cooldown:
            return "half-open"
        return "open"

    @property
    def closed(self) -> bool:
        """Is the circuit closed (calls go to Redis, no probe needed)?"""
        return self._opened_at is None

    def allow(self) -> bool:
        """May this call use Redis? (In half-open state, only one probe at a time.)"""
        if self._opened_at is None:
            return True
        with self._mutex:
            if self._opened_at is None:
                return True
            now = self._timer()
            if now - self._opened_at < self.cooldown:
                return False
            if self._probing and now - self._probe_at < self.cooldown:
                return False  # one probe at a time, until it reports or expires
            self._probing, self._probe_at = True, now
            return True

    def success(self) -> bool:
        """A call went through; True if that closed an open circuit (its probe)."""
        if self._opened_at is None and self._consecutive == 0:
            return False
        with self._mutex:
            closed = self._opened_at is not None
            self._consecutive = 0
            self._opened_at = None
            self._probing = False
        if closed:
            self._on_close()
        return closed

    def failure(self) -> None:
        with self._mutex:
            self._consecutive += 1
            if self._probing:  # the probe failed: stay open for another cooldown
                self._opened_at = self._timer()
                self._probing = False
            elif self._opened_at is None and self._consecutive >= self.failures:
                self._opened_at = self._timer()
                self.opened += 1


class Breakers:
    """The circuit breakers of one guard: one per Redis node its keys live on, so a
    dead shard of a cluster sends only its own keys to the loaders; one in all for
    a single server or a Sentinel master.

    ``node_of(key)`` names the node that serves a Redis key now (None: a single
    server). ``on_close`` is called when a circuit closes after it was open (any
    call's success: a read's, a write's, a lock's). A key whose node cannot be
    named (no node serves its slot yet) shares the breaker of keys on no known node.
    """

    def __init__(
        self,
        *,
        failures: int,
        cooldown: float,
        timer: Callable[[], float] = time.monotonic,
        node_of: Callable[[str], str] | None = None,
        on_close: Callable[[], None] = lambda: None,
    ) -> None:
        self._settings = (failures, cooldown, timer)
        self._on_close = on_close
        self.single = node_of is None
        self.shared = self._new()  # the only one on a single server
        self._node_of = node_of
        self._by_node: dict[str, CircuitBreaker] = {}
        self._mutex = threading.Lock()

    def _new(self) -> CircuitBreaker:
        failures, cooldown, timer = self._settings
        return CircuitBreaker(
            failures=failures, cooldown=cooldown, timer=timer, on_close=self._on_close
        )

    def of(self, key: str) -> CircuitBreaker:
        """The breaker of the node serving Redis key ``key``."""
        if self._node_of is None:
            return self.shared
        try:
            node = self._node_of(key)
        except Exception:  # no node for the slot (a failover): the shared breaker
            return self.shared
        breaker = self._by_node.get(node)
        if breaker is None:
            with self._mutex:
                breaker = self._by_node.setdefault(node, self._new())
        return breaker

    @property
    def opened(self) -> int:
        """How many times any of them opened."""
        with self._mutex:
            return self.shared.opened + sum(b.opened for b in self._by_node.values())
