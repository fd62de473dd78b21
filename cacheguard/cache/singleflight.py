"""In-process single flight: one thread per key does the work, the others wait.

Followers wait for the leader's result or exception, each up to its own
deadline. A flight is a pre-acquired lock that the leader releases once; each
follower re-releases it after waking, so all wake in a chain. That costs far
less than an Event on the hot path, where a flight is made for every lookup.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["Flight", "SingleFlight"]


class Flight:
    __slots__ = ("_done", "error", "result")

    def __init__(self) -> None:
        self._done = threading.Lock()
        self._done.acquire()
        self.result: Any = None
        self.error: BaseException | None = None

    def wait(self, timeout: float) -> bool:
        """``True`` once the leader finished, ``False`` at the timeout."""
        if self._done.acquire(timeout=max(timeout, 0.0)):
            self._done.release()  # wake the next follower
            return True
        return False


class SingleFlight:
    """Groups concurrent calls for the same key behind one leader."""

    def __init__(self) -> None:
        self._flights: dict[str, Flight] = {}
        self._mutex = threading.Lock()

    def join(self, key: str) -> tuple[Flight, bool]:
        """The key's flight, and whether the caller leads it (and must finish it)."""
        with self._mutex:
            flight = self._flights.get(key)
            if flight is not None:
                return flight, False
            flight = self._flights[key] = Flight()
            return flight, True

    def finish(
        self, key: str, flight: Flight, result: Any = None, error: BaseException | None = None
    ) -> None:
        flight.result, flight.error = result, error
        with self._mutex:
            if self._flights.get(key) is flight:
                del self._flights[key]
        flight._done.release()

    def __len__(self) -> int:
        return len(self._flights)
