"""In-process single flight: one thread per key does the work, the others wait.

Followers wait for the leader's result or exception, each up to its own
deadline, and all wake at once when it finishes. A flight's Event is made only
when a first follower joins, so a lone caller (a cache hit) allocates none.

Generations keep coalescing linearizable. Before the leader sends a Redis read
whose answer it will share, it *seals* the flight (a new generation). That answer
is valid only for followers that joined before the seal; a follower that joined
after it may have started after a write that the read did not see, so it must
read again (as a new flight: one shared round trip per wave of late joiners,
not one per thread). A value the leader loaded itself under the key's read lock
is valid for every follower (``VALID_FOR_ALL``): every writer of the guard's own
write path waits for that lock.

Writes that take no lock (``invalidate``, ``invalidate_prefix``, the entry
writes of :mod:`cacheguard.cache.entry_writes`) *close* the key's open flight
once they are done (:meth:`SingleFlight.written`): a caller from then on begins
a flight of its own, whose reads follow the write, instead of waiting for a load
that may have read the data before it. Whoever joined before the write keeps
the flight's outcome (their calls overlap the write: either answer is theirs to
get), capped at the generation of the write.

A flight also keeps when the newest of its callers' calls began
(``newest_start``, on the guard's monotonic timer): a load without the lock
that the leader shares after a timeout must have begun after that (see
:mod:`cacheguard.cache.outage.shared_loads`), or a follower could take a value read
before its call began.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable
from typing import Any, Final

__all__ = ["VALID_FOR_ALL", "Flight", "SingleFlight"]

VALID_FOR_ALL: Final = 1 << 62


class Flight:
    __slots__ = (
        "error",
        "event",
        "generation",
        "newest_follower",
        "newest_start",
        "result",
        "valid_below",
        "written_at",
    )

    def __init__(self, generation: int = 0, newest_start: float = math.inf) -> None:
        self.event: Any = None  # a threading.Event, or an asyncio.Event for tasks
        self.generation = generation
        self.newest_follower = -1  # generation the latest follower joined at
        self.newest_start = newest_start  # when the latest-begun call of leader and followers began
        self.result: Any = None
        self.error: BaseException | None = None
        self.valid_below = 0
        # The generation a write closed the flight at (see SingleFlight.written): its
        # outcome serves only those who joined below it. VALID_FOR_ALL: never closed.
        self.written_at = VALID_FOR_ALL

    def wait(self, timeout: float) -> bool:
        """``True`` once the leader finished, ``False`` at the timeout (followers only)."""
        assert self.event is not None, "only followers wait, and joining made the event"
        return bool(self.event.wait(max(timeout, 0.0)))

    async def wait_async(self, timeout: float) -> bool:
        """:meth:`wait` for tasks (a flight of an asyncio single flight)."""
        assert self.event is not None, "only followers wait, and joining made the event"
        try:
            await asyncio.wait_for(self.event.wait(), max(timeout, 0.0))
        except asyncio.TimeoutError:
            return False
        return True

    def has_followers_from(self, generation: int) -> bool:
        """Did anyone join at ``generation`` or later (after that seal)?"""
        return self.newest_follower >= generation

    def serves(self, joined_generation: int) -> bool:
        """Is the finished flight's outcome valid for a follower of that generation?"""
        return self.error is not None or joined_generation < self.valid_below


class SingleFlight:
    """Groups concurrent calls for the same key behind one leader: threads (with
    ``threading.Event``, the default) or the tasks of one loop (``asyncio.Event``)."""

    def __init__(self, event: Callable[[], Any] = threading.Event) -> None:
        self._flights: dict[str, Flight] = {}
        self._mutex = threading.Lock()
        self._event = event

    def join(self, key: str, since: float = math.inf) -> tuple[Flight, bool, int]:
        """The key's flight, whether the caller leads it (and must finish it), and
        the generation the caller joined at; ``since``: when the caller's call began
        (unknown: as late as can be)."""
        with self._mutex:
            flight = self._flights.get(key)
            if flight is None:
                # Born sealed: the leader's first read follows at once, so anyone
                # joining from now on is after it (one mutex round less per hit).
                flight = self._flights[key] = Flight(1, since)
                return flight, True, 0
            if flight.event is None:
                flight.event = self._event()
            flight.newest_follower = flight.generation
            flight.newest_start = max(flight.newest_start, since)
            return flight, False, flight.generation

    def lead(self, key: str, since: float) -> Flight | None:
        """:meth:`join` for a caller that goes on only as the leader: the new flight it
        leads, or None (and nothing joined) when the key has one already."""
        with self._mutex:
            if key in self._flights:
                return None
            flight = self._flights[key] = Flight(1, since)  # born sealed, as in join
            return flight

    def seal(self, flight: Flight) -> int:
        """Start a new generation; returns it (answers of the read about to be sent
        are valid for followers that joined below it)."""
        with self._mutex:
            flight.generation += 1
            return flight.generation

    def written(self, key: str) -> None:
        """``key`` was just written without the write path's locks (an invalidation,
        an entry write): its open flight, if any, is closed to new callers (they
        begin their own, reading after the write) and its outcome serves only the
        callers that joined it before."""
        with self._mutex:
            self._close(self._flights.pop(key, None))

    def written_under(self, prefix: str) -> None:
        """:meth:`written` for every key that starts with ``prefix``."""
        with self._mutex:
            for key in [key for key in self._flights if key.startswith(prefix)]:
                self._close(self._flights.pop(key))

    @staticmethod
    def _close(flight: Flight | None) -> None:
        if flight is not None:
            flight.generation += 1
            flight.written_at = flight.generation

    def finish(
        self,
        key: str,
        flight: Flight,
        result: Any = None,
        error: BaseException | None = None,
        valid_below: int = VALID_FOR_ALL,
    ) -> None:
        with self._mutex:
            # A write closed the flight: what it read or loaded may predate the write.
            valid_below = min(valid_below, flight.written_at)
            flight.result, flight.error, flight.valid_below = result, error, valid_below
            if self._flights.get(key) is flight:
                del self._flights[key]
            event = flight.event
        if event is not None:
            event.set()

    def __len__(self) -> int:
        return len(self._flights)
