"""Helpers shared by the benchmarks: percentiles, interleaved timing, Markdown output."""

from __future__ import annotations

import datetime as dt
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import redis

import cacheguard
from cacheguard.testing import RedisEndpoint, redis_server, spawn_redis_server


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def interleaved_us(bodies: dict[str, Callable[[], None]], cycles: int) -> dict[str, float]:
    """Median µs per cycle of each body, batches interleaved so noise hits all alike."""
    batch = 100
    samples: dict[str, list[float]] = {label: [] for label in bodies}
    for round_no in range(max(cycles // batch, 1)):
        labels = list(bodies)
        rotation = round_no % len(labels)
        for label in labels[rotation:] + labels[:rotation]:
            body = bodies[label]
            start = time.perf_counter()
            for _ in range(batch):
                body()
            samples[label].append((time.perf_counter() - start) / batch * 1e6)
    return {label: statistics.median(values) for label, values in samples.items()}


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
