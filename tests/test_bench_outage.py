"""bench/outage.py, small: ``--quick --scenario today`` runs end to end against a
throwaway redis-server and PostgreSQL and prints its tables in the documented shape
(timings and counts are printed by the benchmark, never asserted here); a scenario
whose setting the installed cacheguard lacks is refused with a message naming it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import outage
from bench.outage import Scenario, max_in_window, missing_feature
from cacheguard.testing import require_real_redis

ROOT = Path(__file__).resolve().parent.parent
# About 10 s here (three spawned processes, a 5 s timeline); pytest's own timeout is
# raised above the subprocess's so that the latter, with its output, reports a stall.
RUN_TIMEOUT = 120
COUNT = r"\d[\d,]*"


def _postgres_or_skip() -> str:
    url = os.environ.get("DATABASE_URL", "")
    missing = []
    if not url.startswith("postgresql"):
        missing.append("DATABASE_URL (PostgreSQL)")
    if shutil.which("redis-server") is None:
        missing.append("redis-server")
    if missing:
        reason = f"bench/outage.py needs {' and '.join(missing)}"
        if require_real_redis():
            pytest.fail(f"{reason} (CACHEGUARD_REQUIRE_REDIS is set: CI must run this test)")
        pytest.skip(reason)
    return url


def _rows(output: str, header: str) -> list[list[str]]:
    section = output.split(header, 1)[1].split("\n\n", 1)[0]
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith("|---")
    ]


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_quick_today_prints_one_row_per_scenario_and_phase(tmp_path: Path) -> None:
    db_url = _postgres_or_skip()
    report = tmp_path / "bench.md"
    report.write_text("# Benchmarks\n")
    run = subprocess.run(
        [sys.executable, "-m", "bench.outage", "--quick", "--scenario", "today",
         "--database-url", db_url, "--write", str(report)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout

    rows = _rows(out, "| scenario | DB loads in outage |")
    assert [row[0] for row in rows] == ["today (defaults)"], rows
    (row,) = rows
    assert len(row) == 10, row
    loads, per_process, across, reads, errors = row[1:6]
    for cell in (loads, per_process, across, reads, errors):
        assert re.fullmatch(COUNT, cell), row
    assert re.fullmatch(rf"{COUNT} \(\d+\.\d\d\)", row[6]), row  # stale reads (max s)
    stale_after = re.fullmatch(rf"({COUNT}) \(({COUNT})\)", row[7])
    assert stale_after is not None, row
    assert stale_after.group(2) == "0", row  # none older than today's bound (0 s) allows
    assert re.fullmatch(r"\d+ / \d+", row[8]), row  # writes ok / attempted
    assert row[9] == "-", row  # no outbox today

    phases = _rows(out, "| scenario | phase |")
    assert [(p[0], p[1]) for p in phases] == [
        ("today (defaults)", "before"),
        ("today (defaults)", "during"),
        ("today (defaults)", "after"),
    ], phases
    for phase in phases:
        assert len(phase) == 10, phase
        assert float(phase[2]) > 0, phase  # the phase's seconds
        assert re.fullmatch(r"\d+ / \d+", phase[8]), phase  # writes ok / attempted

    written = report.read_text()
    assert "<!-- bench/outage.py:begin -->" in written
    assert "| today (defaults) |" in written


def test_a_setting_the_guard_lacks_is_named() -> None:
    lacking = Scenario("future", "future", (("no_such_setting_cacheguard", 1.0),))
    message = missing_feature(lacking)
    assert message is not None
    assert message.startswith("scenario future needs the no_such_setting_cacheguard setting")
    assert missing_feature(Scenario("today", "today")) is None


def test_a_missing_setting_fails_the_run_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    future = Scenario("today", "today", (("no_such_setting_cacheguard", 1.0),))
    monkeypatch.setitem(outage.SCENARIOS, "today", future)
    assert outage.main(["--scenario", "today"]) == 2
    printed = capsys.readouterr()
    assert "scenario today needs the no_such_setting_cacheguard setting" in printed.err
    assert printed.out == ""


def test_loads_in_a_window() -> None:
    assert max_in_window([], 1.0) == 0
    assert max_in_window([0.0, 1.0, 2.0], 1.0) == 1  # a window is half-open
    assert max_in_window([0.0, 0.5, 0.99, 1.5], 1.0) == 3
    assert max_in_window([3.0, 0.1, 0.2], 5.0) == 3
