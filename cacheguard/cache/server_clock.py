"""Redis's clock as this process sees it: every entry's age is judged by it.

An entry records when it was loaded, and a reader decides by its age whether to
serve it, refresh it early or load it again. Judged by each process's own wall
clock, a host whose clock runs ten minutes fast would find every entry ten
minutes older than it is and reload it, and one ten minutes slow would serve
entries past their end. So ages are judged by the Redis server's clock: a
process samples it (fill_begin returns it; a read asks for it in the same round
trip as its GET when the last sample is older than :data:`RESAMPLE`) and carries
it forward on its own monotonic timer, which no wall-clock step or skew moves.
Entries are stamped with that clock too. The host's wall clock counts only until
the first sample (a read takes one before it judges anything).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

__all__ = ["RESAMPLE", "ServerClock"]

# Seconds of the process's timer after which its next read samples the server's
# clock again (drift between the two clocks is parts per million).
RESAMPLE: Final = 60.0


class ServerClock:
    """The server's wall clock in seconds: the last sample plus the time since, on
    ``timer`` (monotonic). ``clock`` (the host's) stands in until the first sample."""

    __slots__ = ("_timer", "offset", "resample_at")

    def __init__(self, timer: Callable[[], float], clock: Callable[[], float]) -> None:
        self._timer = timer
        self.offset = clock() - timer()  # server time = timer + offset
        self.resample_at = -math.inf  # the first read samples

    def now(self) -> float:
        return self._timer() + self.offset

    def due(self) -> bool:
        """Should the next read sample the server's clock?"""
        return self._timer() >= self.resample_at

    def sample(self, server: float, at: float) -> None:
        """The server's clock read ``server`` seconds at ``at`` on the timer (the
        middle of the round trip that read it)."""
        self.offset = server - at
        self.resample_at = at + RESAMPLE
