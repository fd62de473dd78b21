"""Helpers shared by the benchmarks: percentiles, interleaved timing, Markdown output."""

from __future__ import annotations

import asyncio
import datetime as dt
import multiprocessing as mp
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

import cacheguard
from cacheguard.testing import RedisEndpoint, redis_server, spawn_redis_server


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def interleaved_us(bodies: dict[str, Callable[[], None]], cycles: int) -> dict[str, float]:
    """Median µs per cycle of each body, batches interleaved so noise hits all alike."""

    def batched(body: Callable[[], None]) -> Callable[[int], None]:
        def run(n: int) -> None:
            for _ in range(n):
                body()

        return run

    return interleaved_batches_us({label: batched(b) for label, b in bodies.items()}, cycles)


def interleaved_batches_us(
    batches: dict[str, Callable[[int], None]], cycles: int, batch: int = 100
) -> dict[str, float]:
    """Like :func:`interleaved_us` for bodies that run ``n`` cycles per call (an
    asyncio loop entered once per batch, say)."""
    samples: dict[str, list[float]] = {label: [] for label in batches}
    for round_no in range(max(cycles // batch, 1)):
        labels = list(batches)
        rotation = round_no % len(labels)
        for label in labels[rotation:] + labels[:rotation]:
            start = time.perf_counter()
            batches[label](batch)
            samples[label].append((time.perf_counter() - start) / batch * 1e6)
    return {label: statistics.median(values) for label, values in samples.items()}


@dataclass(frozen=True)
class Paired:
    """One body's figures from :func:`paired_batches`: medians over batches of µs per
    call, wall-clock and this thread's CPU, and the medians of each batch's
    difference from the same round's batch of the first body (the base)."""

    wall: float
    cpu: float
    wall_over: float
    cpu_over: float


def paired_batches(
    batches: dict[str, Callable[[int], None]], rounds: int, batch: int = 300
) -> dict[str, Paired]:
    """Run every body ``batch`` calls at a time, ``rounds`` times, in a rotating order
    (each round runs each body once, back to back), and compare each with the first
    body round by round: the machine's speed, which drifts by more than the
    differences measured, moves the batches of one round alike. The CPU time is
    this thread's alone: the wait for the server's reply is not in it."""
    labels = list(batches)
    wall: dict[str, list[float]] = {label: [] for label in labels}
    cpu: dict[str, list[float]] = {label: [] for label in labels}
    for round_no in range(rounds):
        rotation = round_no % len(labels)
        for label in labels[rotation:] + labels[:rotation]:
            cpu_start, start = time.thread_time(), time.perf_counter()
            batches[label](batch)
            elapsed, cpu_elapsed = time.perf_counter() - start, time.thread_time() - cpu_start
            wall[label].append(elapsed / batch * 1e6)
            cpu[label].append(cpu_elapsed / batch * 1e6)

    def over(samples: dict[str, list[float]], label: str) -> float:
        pairs = zip(samples[label], samples[labels[0]], strict=True)
        return statistics.median(a - b for a, b in pairs)

    return {
        label: Paired(
            wall=statistics.median(wall[label]),
            cpu=statistics.median(cpu[label]),
            wall_over=over(wall, label),
            cpu_over=over(cpu, label),
        )
        for label in labels
    }


def write_section(path: Path, text: str, mark: str) -> None:
    """Replace the block between ``<!-- mark:begin -->`` and ``<!-- mark:end -->``."""
    begin, end = f"<!-- {mark}:begin -->", f"<!-- {mark}:end -->"
    content = path.read_text() if path.exists() else ""
    block = f"{begin}\n{text}\n{end}"
    if begin in content and end in content:
        head, rest = content.split(begin, 1)
        tail = rest.split(end, 1)[1]
        content = head + block + tail
    else:
        content = content.rstrip() + "\n\n" + block + "\n"
    path.write_text(content)


def run_report(
    url: str | None, write: Path | None, mark: str, report: Callable[[RedisEndpoint], str]
) -> int:
    """Run ``report`` on ``url``, else on a throwaway redis-server (so command counts
    are not mixed with other traffic), else on the test fallback; print and write it."""
    if url:
        with redis_server(url) as endpoint:
            text = report(endpoint)
    else:
        try:
            with spawn_redis_server() as (spawned_url, _proc):
                text = report(RedisEndpoint(spawned_url, "redis-server"))
        except FileNotFoundError:
            with redis_server() as endpoint:
                text = report(endpoint)
    print(text)
    if write:
        write_section(write, text, mark)
        print(f"\nwritten to {write}")
    return 0


def run_line(redis_version: str, endpoint_kind: str) -> str:
    """When, where and with what versions a run was made."""
    return (
        f"Run {dt.datetime.now().strftime('%Y-%m-%d %H:%M')} on {platform.node() or 'host'} "
        f"({os.cpu_count()} cores, {platform.system()} {platform.release()}), Python "
        f"{platform.python_version()}, redis-py {redis.__version__}, cacheguard "
        f"{cacheguard.__version__}, Redis {redis_version} ({endpoint_kind}, loopback)."
    )


def command_calls(admin: redis.Redis) -> dict[str, int]:
    """Calls per command name so far (INFO commandstats)."""
    try:
        return {k[8:]: int(v["calls"]) for k, v in admin.info("commandstats").items()}
    except redis.ResponseError:  # fakeredis has no INFO
        return {}


def total_commands(admin: redis.Redis) -> int:
    """Commands the server processed so far, calls inside Lua included; -1 without INFO."""
    try:
        return int(admin.info("stats")["total_commands_processed"])
    except redis.ResponseError:  # fakeredis has no INFO
        return -1


def _floor_worker(threads: int, at: float, out: Any) -> None:
    event = threading.Event()
    woke: list[float] = []
    mutex = threading.Lock()

    def wait() -> None:
        event.wait()
        now = time.time()
        with mutex:
            woke.append(now)

    pool = [threading.Thread(target=wait) for _ in range(threads)]
    for t in pool:
        t.start()
    time.sleep(max(at - time.time() - 0.002, 0))
    while time.time() < at:
        pass
    event.set()
    for t in pool:
        t.join()
    out.put([(w - at) * 1000 for w in woke])


def wake_floor(processes: int, callers: int, *, tasks: bool = False) -> dict[str, float]:
    """The machine's floor for waiter lag: P x T threads (or asyncio tasks) parked on
    an Event that is set at a known instant, no Redis at all."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    at = time.time() + 2.0
    worker = _async_floor_worker if tasks else _floor_worker
    procs = [ctx.Process(target=worker, args=(callers, at, out)) for _ in range(processes)]
    for p in procs:
        p.start()
    lags = sorted(x for _ in procs for x in out.get(timeout=60))
    for p in procs:
        p.join(10)
    return {"lag_p50": statistics.median(lags), "lag_max": max(lags)}


def _async_floor_worker(tasks: int, at: float, out: Any) -> None:
    async def main() -> list[float]:
        event = asyncio.Event()
        woke: list[float] = []

        async def wait() -> None:
            await event.wait()
            woke.append(time.time())

        waiting = [asyncio.ensure_future(wait()) for _ in range(tasks)]
        await asyncio.sleep(max(at - time.time() - 0.002, 0))
        while time.time() < at:
            pass
        event.set()
        await asyncio.gather(*waiting)
        return [(w - at) * 1000 for w in woke]

    out.put(asyncio.run(main()))
