"""bench/compare.py end to end, small: every adapter runs every workload against the
real server, the report and charts are written, and cacheguard's guarantees hold
(one load per cold key, no stale read, a crashed holder taken over). Timings are
printed by the benchmark, never asserted here."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from cacheguard.testing import RedisEndpoint, require_real_redis

ROOT = Path(__file__).resolve().parent.parent
LABELS = (
    "cacheguard",
    "cacheguard (asyncio)",
    "naive cache-aside",
    "redis-py Lock",
    "python-redis-lock",
    "dogpile.cache",
    "cashews",
)


# The libraries the comparison runs (the ``bench`` extra) and draws with (``plot``).
# Without one, a benchmark child dies on its import and the run would stall.
BENCH_MODULES = ("dogpile.cache", "cashews", "redis_lock", "matplotlib")
# The run takes about a minute here; the subprocess gets three, and pytest's own
# timeout (120 s globally, see pyproject.toml) is raised above it so that the
# subprocess timeout, with its output, is what reports a stall.
RUN_TIMEOUT = 180


def _missing(modules: Sequence[str]) -> list[str]:
    missing = []
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # its parent package is missing
            found = False
        if not found:
            missing.append(module)
    return missing


def require_bench_extra(modules: Sequence[str] = BENCH_MODULES) -> None:
    """Skip without the bench extra's modules, except where CI runs (it installs them,
    and sets CACHEGUARD_REQUIRE_REDIS): there a missing one fails the test."""
    missing = _missing(modules)
    if not missing:
        return
    reason = f"bench/compare.py needs {', '.join(missing)}: pip install -e '.[bench,plot]'"
    if require_real_redis():
        pytest.fail(f"{reason} (CACHEGUARD_REQUIRE_REDIS is set: CI must run this test)")
    pytest.skip(reason)


def test_missing_bench_modules_skip_or_fail_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    absent = ("dogpile.cache", "no_such_module_cacheguard_test")
    monkeypatch.setenv("CACHEGUARD_REQUIRE_REDIS", "0")
    with pytest.raises(pytest.skip.Exception, match="no_such_module_cacheguard_test"):
        require_bench_extra(absent)
    monkeypatch.setenv("CACHEGUARD_REQUIRE_REDIS", "1")
    with pytest.raises(pytest.fail.Exception, match="CI must run"):
        require_bench_extra(absent)
    assert _missing(("no_such_parent_cacheguard.child",)) == ["no_such_parent_cacheguard.child"]


def _table(output: str, heading: str) -> dict[str, list[str]]:
    section = output.split(f"### {heading}", 1)[1].split("###", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| system"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_compare_runs_every_system_and_workload(
    redis_endpoint: RedisEndpoint, tmp_path: Path
) -> None:
    if not redis_endpoint.real:
        pytest.skip("the comparison measures a real server (CI requires one)")
    require_bench_extra()
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
        timeout=RUN_TIMEOUT,
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
    for ours in ("cacheguard", "cacheguard (asyncio)"):
        assert stampede[ours][0] == "1"
        assert many[ours][0] == "30"
        writes, stale = int(churn[ours][0]), int(churn[ours][3])
        assert writes >= 3
        assert stale == 0
        assert crash[ours][0] == "3 of 3"
    assert "cacheguard, L1 on" in hit
    assert crash["dogpile.cache (no lock_timeout)"][0].startswith("0 of 3 none")
    # the command count is a number and excludes nothing it should not
    assert re.fullmatch(r"\d+", stampede["cacheguard"][6].replace(",", ""))

    written = report.read_text()
    assert "<!-- bench/compare.py:begin -->" in written
    assert "### Holder crash" in written
    for workload in ("stampede", "many", "hit", "churn", "crash"):
        assert (charts / f"compare_{workload}.png").stat().st_size > 1000
