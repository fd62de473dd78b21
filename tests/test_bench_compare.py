"""bench/compare.py end to end, small: every adapter runs every workload against the
real server, the report and charts are written, and cacheguard's guarantees hold
(one load per cold key, no stale read, a crashed holder taken over). Timings are
printed by the benchmark, never asserted here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from cacheguard.testing import RedisEndpoint

ROOT = Path(__file__).resolve().parent.parent
LABELS = (
    "cacheguard",
    "naive cache-aside",
    "redis-py Lock",
    "python-redis-lock",
    "dogpile.cache",
    "cashews",
)


def _table(output: str, heading: str) -> dict[str, list[str]]:
    section = output.split(f"### {heading}", 1)[1].split("###", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| system"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.slow
def test_compare_runs_every_system_and_workload(
    redis_endpoint: RedisEndpoint, tmp_path: Path
) -> None:
    if not redis_endpoint.real:
        pytest.skip("the comparison measures a real server (CI requires one)")
    report, charts = tmp_path / "bench.md", tmp_path / "img"
    report.write_text("# Benchmarks\n")
    run = subprocess.run(
        [
            sys.executable,
            "bench/compare.py",
            "--url",
            redis_endpoint.url,
            "--processes",
            "2",
            "--threads",
            "3",
            "--rounds",
            "1",
            "--keys",
            "30",
            "--churn-seconds",
            "1.5",
            "--write-every-ms",
            "150",
            "--crash-wait",
            "4",
            "--lease",
            "1",
            "--cycles",
            "200",
            "--write",
            str(report),
            "--charts",
            str(charts),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert "round failed" not in run.stderr, run.stderr[-3000:]

    stampede = _table(out, "Cold stampede")
    many = _table(out, "Many keys")
    hit = _table(out, "Hot hit path")
    churn = _table(out, "Churn")
    crash = _table(out, "Holder crash")
    for table in (stampede, many, hit, churn, crash):
        assert set(LABELS) <= set(table), table
    assert stampede["cacheguard"][0] == "1"
    assert many["cacheguard"][0] == "30"
    assert "cacheguard, L1 on" in hit
    writes, stale = int(churn["cacheguard"][0]), int(churn["cacheguard"][3])
    assert writes >= 3
    assert stale == 0
    assert crash["cacheguard"][0] == "3 of 3"
    assert crash["dogpile.cache (no lock_timeout)"][0].startswith("0 of 3 none")
    # the command count is a number and excludes nothing it should not
    assert re.fullmatch(r"\d+", stampede["cacheguard"][6].replace(",", ""))

    written = report.read_text()
    assert "<!-- bench/compare.py:begin -->" in written
    assert "### Holder crash" in written
    for workload in ("stampede", "many", "hit", "churn", "crash"):
        assert (charts / f"compare_{workload}.png").stat().st_size > 1000
