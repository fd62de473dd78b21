"""Mixed read/write load on a guard while its deployment fails over, and the check
that matters: no read returns a value older than a write whose ``guard.write``
returned successfully (writes that failed are counted, never held against it).

The database is a version per key in this process (a commit increments it); the
loader reads it. Readers and writers run as threads on a sync guard, or as tasks
on an asyncio guard in a loop of their own, so one harness serves both drivers.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cacheguard import CacheGuard, CacheGuardError
from cacheguard.aio import AsyncCacheGuard
from tests.guard_drivers import guard_from_url


class Database:
    """One version per key; a commit makes the next one."""

    def __init__(self, keys: list[str]) -> None:
        self._versions = dict.fromkeys(keys, 0)
        self._mutex = threading.Lock()

    def read(self, key: str) -> int:
        with self._mutex:
            return self._versions[key]

    def commit(self, key: str) -> int:
        with self._mutex:
            self._versions[key] += 1
            return self._versions[key]


@dataclass
class Tally:
    """What one phase of the load saw."""

    reads: Counter[str] = field(default_factory=Counter)  # by key
    loads: Counter[str] = field(default_factory=Counter)
    stale: int = 0
    writes_ok: Counter[str] = field(default_factory=Counter)
    writes_failed: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # cacheguard errors, by class
    raw_errors: Counter[str] = field(default_factory=Counter)  # anything else: a defect

    def summary(self) -> str:
        return (
            f"reads {sum(self.reads.values())}, loads {sum(self.loads.values())}, "
            f"stale {self.stale}, writes ok {sum(self.writes_ok.values())}, "
            f"writes failed {self.writes_failed}, errors {dict(self.errors)}, "
            f"raw errors {dict(self.raw_errors)}"
        )


class Load:
    """``readers`` and ``writers`` callers over ``keys`` until :meth:`stop`; :meth:`phase`
    starts a new tally (the phases: before, during, after a failover)."""

    def __init__(
        self,
        make_guard: Callable[[], CacheGuard | AsyncCacheGuard],
        keys: list[str],
        *,
        readers: int = 4,
        writers: int = 2,
        write_pause: float = 0.02,
    ) -> None:
        self.keys = keys
        self.db = Database(keys)
        self._make_guard = make_guard
        self._readers, self._writers, self._write_pause = readers, writers, write_pause
        self._ok: dict[str, list[tuple[float, int]]] = defaultdict(list)  # (returned at, version)
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self.phases: dict[str, Tally] = {}
        self._tally = self.phase("before")
        self._threads: list[threading.Thread] = []

    # -- bookkeeping ------------------------------------------------------------------

    def phase(self, name: str) -> Tally:
        with self._mutex:
            self._tally = self.phases[name] = Tally()
            return self._tally

    def _newest_ok_before(self, key: str, moment: float) -> int:
        with self._mutex:
            return max((v for t, v in self._ok[key] if t < moment), default=0)

    def _read_done(self, key: str, began: float, value: int) -> None:
        stale = value < self._newest_ok_before(key, began)
        with self._mutex:
            self._tally.reads[key] += 1
            self._tally.stale += stale

    def _write_done(self, key: str, version: int) -> None:
        with self._mutex:
            self._ok[key].append((time.monotonic(), version))
            self._tally.writes_ok[key] += 1

    def _failed(self, exc: BaseException, *, writing: bool) -> None:
        with self._mutex:
            if writing:
                self._tally.writes_failed += 1
            kind = type(exc).__name__
            if isinstance(exc, CacheGuardError):
                self._tally.errors[kind] += 1
            else:
                self._tally.raw_errors[kind] += 1

    def _loader(self, key: str) -> Callable[[], int]:
        def load() -> int:
            with self._mutex:
                self._tally.loads[key] += 1
            return self.db.read(key)

        return load

    # -- running ------------------------------------------------------------------------

    def start(self) -> None:
        guard = self._make_guard()
        if isinstance(guard, CacheGuard):
            targets = [(self._sync_reader, guard, i) for i in range(self._readers)]
            targets += [(self._sync_writer, guard, i) for i in range(self._writers)]
            self._threads = [threading.Thread(target=t, args=(g, i)) for t, g, i in targets]
        else:
            self._threads = [threading.Thread(target=asyncio.run, args=(self._async_all(guard),))]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
            assert not thread.is_alive(), "a load caller did not stop"

    def _sync_reader(self, guard: CacheGuard, i: int) -> None:
        while not self._stop.is_set():
            key = self.keys[i % len(self.keys)]
            i += 1
            began = time.monotonic()
            try:
                value = guard.get_or_load(key, self._loader(key), ttl=60)
            except Exception as exc:
                self._failed(exc, writing=False)
                time.sleep(0.01)
                continue
            self._read_done(key, began, value)

    def _sync_writer(self, guard: CacheGuard, i: int) -> None:
        while not self._stop.is_set():
            key = self.keys[i % len(self.keys)]
            i += 1
            try:
                with guard.write(key):
                    version = self.db.commit(key)
            except Exception as exc:
                self._failed(exc, writing=True)
            else:
                self._write_done(key, version)
            self._stop.wait(self._write_pause)

    async def _async_all(self, guard: AsyncCacheGuard) -> None:
        try:
            await asyncio.gather(
                *(self._async_reader(guard, i) for i in range(self._readers)),
                *(self._async_writer(guard, i) for i in range(self._writers)),
            )
        finally:
            await guard.aclose()
            await guard.client.aclose()

    async def _async_reader(self, guard: AsyncCacheGuard, i: int) -> None:
        while not self._stop.is_set():
            key = self.keys[i % len(self.keys)]
            i += 1
            began = time.monotonic()
            try:
                value = await guard.get_or_load(key, self._loader(key), ttl=60)
            except Exception as exc:
                self._failed(exc, writing=False)
                await asyncio.sleep(0.01)
                continue
            self._read_done(key, began, value)
            await asyncio.sleep(0)

    async def _async_writer(self, guard: AsyncCacheGuard, i: int) -> None:
        while not self._stop.is_set():
            key = self.keys[i % len(self.keys)]
            i += 1
            try:
                async with guard.write(key):
                    version = self.db.commit(key)
            except Exception as exc:
                self._failed(exc, writing=True)
            else:
                self._write_done(key, version)
            await asyncio.sleep(self._write_pause)

    def recovered(self, timeout: float) -> bool:
        """Wait (up to ``timeout``) until a write succeeded in the current phase."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._mutex:
                if sum(self._tally.writes_ok.values()) > 0:
                    return True
            self._stop.wait(0.05)
        return False

    def settle(self, seconds: float) -> None:
        """Let the load run ``seconds`` more (the load is the thing being measured)."""
        self._stop.wait(seconds)

    def totals(self) -> Tally:
        total = Tally()
        for tally in self.phases.values():
            total.reads += tally.reads
            total.loads += tally.loads
            total.stale += tally.stale
            total.writes_ok += tally.writes_ok
            total.writes_failed += tally.writes_failed
            total.errors += tally.errors
            total.raw_errors += tally.raw_errors
        return total


def guard_maker(kind: str, url: str, **settings: Any) -> Callable[[], CacheGuard | AsyncCacheGuard]:
    """A guard of ``kind`` for a failover: short waits and timeouts, so callers move on."""
    settings = {
        "lease": 2.0,
        "wait_timeout": 2.0,
        "breaker_failures": 3,
        "breaker_cooldown": 0.5,
        "confirm_timeout": 0.5,
        **settings,
    }

    return functools.partial(guard_from_url, kind, url, socket_timeout=1.0, **settings)
