"""Tables and charts of bench/compare.py's results (Markdown, PNG)."""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.systems import CRASH_EXTRA, SYSTEMS

Rounds = list[dict[str, Any]]
Results = dict[str, Rounds]


def median_of(rounds: Rounds, field_name: str) -> float | None:
    values = [r[field_name] for r in rounds if r.get(field_name) is not None]
    return statistics.median(values) if values else None


def label(name: str) -> str:
    system = SYSTEMS.get(name) or CRASH_EXTRA[name]
    return str(system.label)


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def ok(rounds: Rounds) -> Rounds:
    return [r for r in rounds if "failed" not in r]


def failures(rounds: Rounds) -> str:
    failed = [r["failed"] for r in rounds if "failed" in r]
    return f" ({len(failed)} round(s) failed: {', '.join(sorted(set(failed)))})" if failed else ""


def table(
    heading: str,
    intro: str,
    columns: list[str],
    results: Results,
    row: Callable[[Rounds], list[str]],
) -> list[str]:
    """A Markdown table with one row per system: ``row`` gets the rounds that ran."""
    lines = ["", f"### {heading}", "", intro, ""]
    lines += ["| system | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for name, all_rounds in results.items():
        rounds = ok(all_rounds)
        cells = row(rounds) if rounds else ["-"] * len(columns)
        lines.append(f"| {label(name)}{failures(all_rounds)} | " + " | ".join(cells) + " |")
    return lines


def stampede_table(results: Results, floors: list[dict[str, float]], args: Any) -> list[str]:
    def row(rounds: Rounds) -> list[str]:
        commands = median_of(rounds, "commands")
        return [
            fmt(median_of(rounds, "loads"), 0),
            fmt(median_of(rounds, "lag_p50"), 2),
            fmt(median_of(rounds, "lag_max"), 2),
            fmt(median_of(rounds, "lat_p50")),
            fmt(median_of(rounds, "lat_p99")),
            fmt(median_of(rounds, "lat_max")),
            "n/a" if commands is None or commands < 0 else fmt(commands, 0),
            ", ".join(str(r["loads"]) for r in rounds),
        ]

    lines = table(
        "Cold stampede",
        f"One cold key, {args.processes * args.threads} callers at once. Waiter lag: from the "
        "end of the first load to each other caller's return. Commands: everything the "
        "stampede sent Redis, calls inside Lua included; not counted: the loaders' own "
        "counting and the handshakes of connections the pools opened during the stampede "
        "(both listed below the table).",
        [
            "loads",
            "waiter lag p50 ms",
            "waiter lag max ms",
            "latency p50 ms",
            "latency p99 ms",
            "latency max ms",
            "Redis commands",
            "loads per round",
        ],
        results,
        row,
    )
    lines.append(
        f"| floor: {args.processes * args.threads} threads woken by an Event, no Redis | "
        f"| {fmt(statistics.median(f['lag_p50'] for f in floors), 2)} "
        f"| {fmt(statistics.median(f['lag_max'] for f in floors), 2)} | | | | | |"
    )
    return lines + breakdown(results)


def breakdown(results: Results) -> list[str]:
    """Calls per command of each system's first round."""
    lines = ["", "Where the commands went (first round):", ""]
    for name, all_rounds in results.items():
        rounds = ok(all_rounds)
        if rounds and rounds[0].get("by_command"):
            calls = dict(rounds[0]["by_command"])
            calls["incrby"] = calls.get("incrby", 0) - rounds[0]["loads"]  # the loaders' own
            spent = sorted(((n, c) for n, c in calls.items() if c > 0), key=lambda x: -x[1])
            lines.append(f"- {label(name)}: " + ", ".join(f"{n.upper()} {c:,}" for n, c in spent))
    return lines


def many_table(results: Results, args: Any) -> list[str]:
    def row(rounds: Rounds) -> list[str]:
        complete = [r for r in rounds if r["complete"]]
        if not complete:
            return ["incomplete", "-", "-", "-"]
        loads = median_of(complete, "loads") or 0
        missing = len(rounds) - len(complete)
        return [
            fmt(loads, 0) + (f" ({missing} round(s) incomplete)" if missing else ""),
            fmt(loads / args.keys, 2),
            fmt(median_of(complete, "wall_s"), 2),
            fmt(median_of(complete, "commands_per_key"), 1),
        ]

    lines = table(
        "Many keys",
        f"{args.keys:,} cold keys, each of the {args.processes * args.threads} callers asks for "
        f"every one in its own shuffled order (ideal: {args.keys:,} loads). Commands counted "
        "as in the stampede.",
        ["loads", "loads / key", "wall time s", "Redis commands / key"],
        results,
        row,
    )
    return lines + breakdown(results)


def hit_table(hits: dict[str, dict[str, Any]]) -> list[str]:
    base = {False: hits["raw GET + unpackb"]["us"], True: hits["raw GET + unpackb (asyncio)"]["us"]}
    lines = [
        "",
        "### Hot hit path",
        "",
        "One warm key (a 20-row menu list), one thread, batches of 100 interleaved; each "
        "system against the raw GET + `msgpack.unpackb` of its own kind (sync or asyncio).",
        "",
        "| system | µs / get | µs over raw GET + unpackb | vs raw GET + unpackb |",
        "|---|---:|---:|---:|",
    ]
    for name, hit in hits.items():
        baseline = base[bool(hit["async"])]
        ratio = hit["us"] / baseline
        over = hit["us"] - baseline
        lines.append(f"| {name} | {hit['us']:.1f} | {over:+.1f} | {ratio:.2f}x |")
    return lines


def churn_table(results: Results, args: Any) -> list[str]:
    def row(rounds: Rounds) -> list[str]:
        reads, stale = median_of(rounds, "reads") or 0, median_of(rounds, "stale") or 0
        return [
            fmt(median_of(rounds, "writes"), 0),
            fmt(median_of(rounds, "loads_per_write"), 2),
            fmt(reads, 0),
            fmt(stale, 0),
            fmt(100 * stale / max(reads, 1), 2),
            fmt(median_of(rounds, "lat_p50"), 2),
            fmt(median_of(rounds, "lat_p99"), 1),
        ]

    return table(
        "Churn",
        f"All callers read one key for {args.churn_seconds:g} s while a writer commits a new "
        f"version every {args.write_every_ms} ms through the system's write path (cache-aside "
        "libraries: commit, then delete). Stale: a read returning a version older than one "
        "committed before the read began.",
        [
            "writes",
            "loads / write",
            "reads",
            "stale reads",
            "stale %",
            "latency p50 ms",
            "latency p99 ms",
        ],
        results,
        row,
    )


def crash_table(results: Results, args: Any) -> list[str]:
    def row(rounds: Rounds) -> list[str]:
        answered = median_of(rounds, "answered") or 0
        never = f" none within {args.crash_wait:g} s" if not answered else ""
        return [
            f"{answered:.0f} of {rounds[0]['callers']}{never}",
            fmt(median_of(rounds, "first_s"), 2),
            fmt(median_of(rounds, "median_s"), 2),
            fmt(median_of(rounds, "last_s"), 2),
        ]

    return table(
        "Holder crash",
        f"One process starts the load and is SIGKILLed in it; {max(args.processes - 1, 1)} "
        f"process(es) x {args.threads} callers wait. Seconds from the kill until callers get a "
        f"value (watched for {args.crash_wait:g} s; lease {args.lease:g} s). Negative: callers "
        "that did not wait for the load at all.",
        ["callers answered", "first s", "median s", "last s"],
        results,
        row,
    )


def charts_for(charts: dict[str, Any], args: Any) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (the plot extra): no charts", file=sys.stderr)
        return []
    folder: Path = args.charts
    folder.mkdir(parents=True, exist_ok=True)
    written: list[str] = []

    def bars(
        name: str, title: str, panels: list[tuple[str, dict[str, float | None], bool]]
    ) -> None:
        fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.6))
        for ax, (ylabel, values, log) in zip(
            axes if len(panels) > 1 else [axes], panels, strict=True
        ):
            labels = list(values)
            heights = [values[k] or 0.0 for k in labels]
            colors = ["#2a7ab0" if k.startswith("cacheguard") else "#9aa5ad" for k in labels]
            ax.bar(range(len(labels)), heights, color=colors)
            ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
            ax.set_ylabel(ylabel)
            if log and any(h > 0 for h in heights):
                ax.set_yscale("log")
        fig.suptitle(title)
        fig.tight_layout()
        path = folder / f"compare_{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(
            f"![{title}]({os.path.relpath(path, args.write.parent if args.write else '.')})"
        )

    def med(results: Results, key: str) -> dict[str, float | None]:
        return {label(n): median_of(ok(r), key) for n, r in results.items()}

    # workload -> title, panels of (y label, field of the rounds, log scale)
    plans: dict[str, tuple[str, list[tuple[str, str, bool]]]] = {
        "stampede": (
            "Cold stampede",
            [
                ("loads", "loads", True),
                ("waiter lag p50 ms", "lag_p50", True),
                ("Redis commands", "commands", True),
            ],
        ),
        "many": (
            f"{args.keys:,} cold keys",
            [("loads", "loads", False), ("wall time s", "wall_s", False)],
        ),
        "churn": (
            "Churn",
            [
                ("loads per write", "loads_per_write", True),
                ("stale reads", "stale", False),
                ("latency p99 ms", "lat_p99", True),
            ],
        ),
    }
    for workload, results in charts.items():
        if workload == "hit":
            values = {k: v["us"] for k, v in results.items()}
            bars("hit", "Hot hit path", [("µs per get", values, True)])
        elif workload == "crash":
            never = float(args.crash_wait)  # no value within the watch: a full bar
            values = {k: never if v is None else v for k, v in med(results, "median_s").items()}
            title = f"Holder crash (bar at {args.crash_wait:g} s: no value within it)"
            bars("crash", title, [("median s to a value after the kill", values, False)])
        else:
            title, panels = plans[workload]
            bars(workload, title, [(y, med(results, f), log) for y, f, log in panels])
    return ["", "Charts:", "", *written]
