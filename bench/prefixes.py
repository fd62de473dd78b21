"""Prefix bookkeeping: what many distinct ``invalidate_prefix`` prefixes cost a process.

    python bench/prefixes.py [--prefixes 20000] [--lookups 20000]

No Redis: the in-process part only. Side by side, the bookkeeping before issue #23
(every prefix ever invalidated kept for good in a tuple, copied on each new one;
every fill scanning all of them) and :class:`cacheguard.cache.invalidation.Prefixes`
(at most ``RECENT_PREFIXES`` recent ones, each kept while its stamp lives; a fill
looks up one prefix per distinct length). Shown: seconds to register the
prefixes, µs per fill's look-up afterwards, prefixes kept, and the ratios.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cacheguard.cache.invalidation import RECENT_PREFIXES, Prefixes


class Unbounded:
    """The bookkeeping before #23: a tuple of every prefix, scanned by each fill."""

    def __init__(self) -> None:
        self.watched: tuple[str, ...] = ()

    def remember(self, prefix: str, stamp: int) -> None:
        if prefix not in self.watched:
            self.watched = (*self.watched, prefix)

    def covering(self, name: str) -> list[str]:
        return [p for p in self.watched if name.startswith(p)]


def measure(book: Unbounded | Prefixes, prefixes: int, lookups: int) -> tuple[float, float]:
    """Seconds to register ``prefixes`` distinct prefixes; µs per look-up after."""
    start = time.perf_counter()
    for i in range(prefixes):
        book.remember(f"tenant:{i}:", i + 1)
    registered = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(lookups):
        book.covering(f"tenant:{i % prefixes}:menu:{i}")
    return registered, (time.perf_counter() - start) / lookups * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefixes", type=int, default=20_000)
    parser.add_argument("--lookups", type=int, default=20_000)
    args = parser.parse_args(argv)
    if min(args.prefixes, args.lookups) < 1:
        parser.error("prefixes and lookups must be >= 1")
    old = Unbounded()
    new = Prefixes(lifetime=7 * 24 * 3600.0, timer=time.monotonic, capacity=RECENT_PREFIXES)
    old_reg, old_look = measure(old, args.prefixes, args.lookups)
    new_reg, new_look = measure(new, args.prefixes, args.lookups)
    print(f"{args.prefixes} distinct prefixes, {args.lookups} fills' look-ups")
    print("| bookkeeping | register all (s) | µs per look-up | prefixes kept |")
    print("|---|---|---|---|")
    print(f"| unbounded tuple (before) | {old_reg:.3f} | {old_look:.2f} | {len(old.watched)} |")
    print(f"| Prefixes (bounded) | {new_reg:.3f} | {new_look:.2f} | {len(new)} |")
    print(f"| ratio before / after | {old_reg / new_reg:.0f}x | {old_look / new_look:.0f}x | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
