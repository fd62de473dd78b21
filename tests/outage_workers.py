"""Child-process bodies for the outage tests (tests/faults/test_outage_modes.py): module
level, so the spawn start method can import them.

Each child builds one guard (sync: its workers are threads; asyncio: tasks on
the child's own loop) and reads a few hot keys through a Redis outage the
parent causes. The "database" is a shared-memory array of versions, one per
key, that no Redis outage touches; a loader returns the key's version and logs
``(key, started, ended, version)`` with ``time.monotonic()`` stamps (one clock
for every process of the machine), so the parent counts loads per process, per
key and per window, and classifies every read it is given.

The parent steers the children through shared objects: ``stop`` ends the run;
``target`` is a version the children report (``("fresh", index)`` on
``reports``) once they read it or a newer one for every key with their
breaker closed (Redis is theirs again).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from cacheguard import CacheGuard, CacheGuardError
from cacheguard.aio import AsyncCacheGuard


@dataclass(frozen=True)
class Spec:
    """What one child does."""

    kind: str  # "sync" (threads) or "async" (tasks)
    url: str
    settings: dict[str, Any]  # the guard's from_url keywords
    keys: tuple[str, ...]
    gutter: str | None = None
    workers: int = 8
    ttl: float = 60.0
    load_seconds: float = 0.02
    pause: float = 0.005  # between two reads of one worker
    record_reads: bool = False
    # A writer whose guard.write Redis refused commits anyway (writes keep flowing,
    # as with an outbox; their invalidations are then lost unless Redis lost its
    # data too).
    commit_anyway: bool = False


@dataclass
class Shared:
    """The parent's handles (multiprocessing objects of one context)."""

    db: Any  # Array("q"): a version per key
    target: Any  # Value("q")
    stop: Any  # Event
    reports: Any  # Queue


@dataclass
class Log:
    """What one child saw; returned to the parent."""

    loads: list[tuple[str, float, float, int]] = field(default_factory=list)
    reads: list[tuple[str, float, int]] = field(default_factory=list)  # (key, began, version)
    read_count: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    # Reads older than a version this process had read once its breaker was closed.
    regressions: int = 0
    stats: dict[str, float] = field(default_factory=dict)


def build_guard(spec: Spec) -> CacheGuard | AsyncCacheGuard:
    cls = CacheGuard if spec.kind == "sync" else AsyncCacheGuard
    extra: dict[str, Any] = {"gutter": spec.gutter} if spec.gutter else {}
    return cls.from_url(spec.url, **spec.settings, **extra)


def breaker_closed(guard: CacheGuard | AsyncCacheGuard) -> bool:
    """Is Redis this guard's again (every breaker it has closed)?"""
    breakers = guard._state.breakers
    return breakers.shared.state == "closed" and all(
        breaker.state == "closed" for breaker in breakers._by_node.values()
    )


class Reader:
    """The bookkeeping of one child's readers, shared by its threads or tasks."""

    def __init__(self, index: int, spec: Spec, shared: Shared, guard: Any) -> None:
        self.index, self.spec, self.shared, self.guard = index, spec, shared, guard
        self.log = Log()
        self.newest: dict[str, int] = {}  # the newest version read per key
        self.settled: dict[str, int] = {}  # ... read with the breaker closed
        self.reported = 0  # the last target reported
        self.mutex = threading.Lock()

    def version(self, key: str) -> int:
        db = self.shared.db
        with db.get_lock():
            return int(db[self.spec.keys.index(key)])

    def loaded(self, key: str, began: float, version: int) -> None:
        with self.mutex:
            self.log.loads.append((key, began, time.monotonic(), version))

    def read_done(self, key: str, began: float, version: int) -> None:
        closed = breaker_closed(self.guard)
        with self.mutex:
            log = self.log
            log.read_count += 1
            if self.spec.record_reads:
                log.reads.append((key, began, version))
            if version < self.settled.get(key, -1):
                log.regressions += 1
            self.newest[key] = max(self.newest.get(key, -1), version)
            if closed:
                self.settled[key] = max(self.settled.get(key, -1), version)
            target = int(self.shared.target.value)
            if (
                closed
                and target > self.reported
                and all(self.settled.get(k, -1) >= target for k in self.spec.keys)
            ):
                self.reported = target
                self.shared.reports.put(("fresh", self.index, target))

    def failed(self, exc: BaseException) -> None:
        with self.mutex:
            self.log.errors[type(exc).__name__] += 1


def read_through_outage(index: int, spec: Spec, shared: Shared) -> Log:
    """Read ``spec.keys`` in ``spec.workers`` workers until ``shared.stop``; reports
    ``("warm", index)`` once every key was read, and ``("fresh", ...)`` as above."""
    if spec.kind == "sync":
        return _read_sync(index, spec, shared)
    return asyncio.run(_read_async(index, spec, shared))


def _read_sync(index: int, spec: Spec, shared: Shared) -> Log:
    guard = build_guard(spec)
    assert isinstance(guard, CacheGuard)
    reader = Reader(index, spec, shared, guard)

    def loader(key: str) -> Any:
        def load() -> int:
            began = time.monotonic()
            version = reader.version(key)
            time.sleep(spec.load_seconds)
            reader.loaded(key, began, version)
            return version

        return load

    loaders = {key: loader(key) for key in spec.keys}
    for key in spec.keys:  # warm: each key read once, from Redis
        guard.get_or_load(key, loaders[key], ttl=spec.ttl)
    shared.reports.put(("warm", index))

    def work(seed: int) -> None:
        order = list(spec.keys)
        random.Random(seed).shuffle(order)
        while not shared.stop.is_set():
            for key in order:
                began = time.monotonic()
                try:
                    version = guard.get_or_load(key, loaders[key], ttl=spec.ttl)
                except CacheGuardError as exc:
                    reader.failed(exc)
                else:
                    reader.read_done(key, began, version)
                time.sleep(spec.pause)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(spec.workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    reader.log.stats = guard.stats().as_dict()
    guard.close()
    return reader.log


async def _read_async(index: int, spec: Spec, shared: Shared) -> Log:
    guard = build_guard(spec)
    assert isinstance(guard, AsyncCacheGuard)
    reader = Reader(index, spec, shared, guard)

    def loader(key: str) -> Any:
        async def load() -> int:
            began = time.monotonic()
            version = reader.version(key)
            await asyncio.sleep(spec.load_seconds)
            reader.loaded(key, began, version)
            return version

        return load

    loaders = {key: loader(key) for key in spec.keys}
    for key in spec.keys:
        await guard.get_or_load(key, loaders[key], ttl=spec.ttl)
    shared.reports.put(("warm", index))

    async def work(seed: int) -> None:
        order = list(spec.keys)
        random.Random(seed).shuffle(order)
        while not shared.stop.is_set():
            for key in order:
                began = time.monotonic()
                try:
                    version = await guard.get_or_load(key, loaders[key], ttl=spec.ttl)
                except CacheGuardError as exc:
                    reader.failed(exc)
                else:
                    reader.read_done(key, began, version)
                await asyncio.sleep(spec.pause)

    await asyncio.gather(*(work(i) for i in range(spec.workers)))
    reader.log.stats = guard.stats().as_dict()
    await guard.aclose()
    return reader.log


# -- a writer ---------------------------------------------------------------------------------


def write_through_outage(index: int, spec: Spec, shared: Shared) -> dict[str, Any]:
    """``guard.write`` around a commit of a random key's next version until ``stop``;
    returns the commits ``(key, version, committed at)`` (a body that ran is a
    commit, even if the write's closing invalidation then failed; with
    ``spec.commit_anyway`` so is a write refused before its body) and the writes
    refused, by error."""
    if spec.kind == "sync":
        return _write_sync(index, spec, shared)
    return asyncio.run(_write_async(index, spec, shared))


def _commit(spec: Spec, shared: Shared, key: str, commits: list[Any]) -> None:
    db = shared.db
    with db.get_lock():
        slot = spec.keys.index(key)
        db[slot] += 1
        commits.append((key, int(db[slot]), time.monotonic()))


def _write_sync(index: int, spec: Spec, shared: Shared) -> dict[str, Any]:
    guard = build_guard(spec)
    assert isinstance(guard, CacheGuard)
    rng = random.Random(index)
    commits: list[Any] = []
    refused: Counter[str] = Counter()
    shared.reports.put(("warm", index))
    while not shared.stop.is_set():
        key = rng.choice(spec.keys)
        done = len(commits)
        try:
            with guard.write(key):
                _commit(spec, shared, key, commits)
        except CacheGuardError as exc:
            refused[type(exc).__name__] += 1
            if spec.commit_anyway and len(commits) == done:
                _commit(spec, shared, key, commits)
        time.sleep(spec.pause)
    guard.close()
    return {"commits": commits, "refused": refused}


async def _write_async(index: int, spec: Spec, shared: Shared) -> dict[str, Any]:
    guard = build_guard(spec)
    assert isinstance(guard, AsyncCacheGuard)
    rng = random.Random(index)
    commits: list[Any] = []
    refused: Counter[str] = Counter()
    shared.reports.put(("warm", index))
    while not shared.stop.is_set():
        key = rng.choice(spec.keys)
        done = len(commits)
        try:
            async with guard.write(key):
                _commit(spec, shared, key, commits)
        except CacheGuardError as exc:
            refused[type(exc).__name__] += 1
            if spec.commit_anyway and len(commits) == done:
                _commit(spec, shared, key, commits)
        await asyncio.sleep(spec.pause)
    await guard.aclose()
    return {"commits": commits, "refused": refused}


# -- refills after an outage ------------------------------------------------------------------


def refill_after_outage(
    index: int, spec: Spec, shared: Shared, halt: Any, probed: Any, refill_ttl: float
) -> dict[str, Any]:
    """Read through an outage (reads with ``spec.ttl``, short: the keys expire or are
    lost meanwhile) until ``halt``, then report ``("halted", index)``: the parent
    ends the outage only then, so no key is filled before the barrier. Then probe
    until this guard's breaker is closed, meet the other children at the ``probed``
    barrier, and only then read every key again (``refill_ttl``) in every worker at
    once. Returns the loads that began after the barrier."""
    if spec.kind == "sync":
        return _refill_sync(index, spec, shared, halt, probed, refill_ttl)
    return asyncio.run(_refill_async(index, spec, shared, halt, probed, refill_ttl))


def _refill_sync(
    index: int, spec: Spec, shared: Shared, halt: Any, probed: Any, refill_ttl: float
) -> dict[str, Any]:
    guard = build_guard(spec)
    assert isinstance(guard, CacheGuard)
    reader = Reader(index, spec, shared, guard)
    after: list[tuple[str, float]] = []
    barrier_passed = threading.Event()

    def loader(key: str) -> Any:
        def load() -> int:
            began = time.monotonic()
            version = reader.version(key)
            time.sleep(spec.load_seconds)
            reader.loaded(key, began, version)
            if barrier_passed.is_set():
                with reader.mutex:
                    after.append((key, began))
            return version

        return load

    loaders = {key: loader(key) for key in spec.keys}
    for key in spec.keys:
        guard.get_or_load(key, loaders[key], ttl=spec.ttl)
    shared.reports.put(("warm", index))

    def through_outage(seed: int) -> None:
        order = list(spec.keys)
        random.Random(seed).shuffle(order)
        while not halt.is_set():
            for key in order:
                try:
                    guard.get_or_load(key, loaders[key], ttl=spec.ttl)
                except CacheGuardError as exc:
                    reader.failed(exc)
                time.sleep(spec.pause)

    threads = [threading.Thread(target=through_outage, args=(i,)) for i in range(spec.workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    shared.reports.put(("halted", index))
    # Half-open: one call probes and the others bypass Redis (they may load). This
    # phase is over for this process once a probe closed its breaker.
    deadline = time.monotonic() + 30
    while not breaker_closed(guard):
        assert time.monotonic() < deadline, "the breaker never closed"
        guard.peek("probe")
        time.sleep(0.02)
    shared.reports.put(("probed", index))
    probed.wait(60)
    barrier_passed.set()

    def refill(seed: int) -> None:
        order = list(spec.keys)
        random.Random(seed).shuffle(order)
        for key in order:
            guard.get_or_load(key, loaders[key], ttl=refill_ttl)

    threads = [threading.Thread(target=refill, args=(i,)) for i in range(spec.workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = guard.stats().as_dict()
    guard.close()
    return {"after": after, "stats": stats, "errors": reader.log.errors}


async def _refill_async(
    index: int, spec: Spec, shared: Shared, halt: Any, probed: Any, refill_ttl: float
) -> dict[str, Any]:
    guard = build_guard(spec)
    assert isinstance(guard, AsyncCacheGuard)
    reader = Reader(index, spec, shared, guard)
    after: list[tuple[str, float]] = []
    barrier_passed = False

    def loader(key: str) -> Any:
        async def load() -> int:
            began = time.monotonic()
            version = reader.version(key)
            await asyncio.sleep(spec.load_seconds)
            reader.loaded(key, began, version)
            if barrier_passed:
                after.append((key, began))
            return version

        return load

    loaders = {key: loader(key) for key in spec.keys}
    for key in spec.keys:
        await guard.get_or_load(key, loaders[key], ttl=spec.ttl)
    shared.reports.put(("warm", index))

    async def through_outage(seed: int) -> None:
        order = list(spec.keys)
        random.Random(seed).shuffle(order)
        while not halt.is_set():
            for key in order:
                try:
                    await guard.get_or_load(key, loaders[key], ttl=spec.ttl)
                except CacheGuardError as exc:
                    reader.failed(exc)
                await asyncio.sleep(spec.pause)

    await asyncio.gather(*(through_outage(i) for i in range(spec.workers)))
    shared.reports.put(("halted", index))
    deadline = time.monotonic() + 30
    while not breaker_closed(guard):
        assert time.monotonic() < deadline, "the breaker never closed"
        await guard.peek("probe")
        await asyncio.sleep(0.02)
    shared.reports.put(("probed", index))
    await asyncio.to_thread(probed.wait, 60)
    barrier_passed = True

    async def refill(seed: int) -> None:
        order = list(spec.keys)
        random.Random(seed).shuffle(order)
        for key in order:
            await guard.get_or_load(key, loaders[key], ttl=refill_ttl)

    await asyncio.gather(*(refill(i) for i in range(spec.workers)))
    stats = guard.stats().as_dict()
    await guard.aclose()
    return {"after": after, "stats": stats, "errors": reader.log.errors}
