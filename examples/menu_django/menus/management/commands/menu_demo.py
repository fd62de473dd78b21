"""``menu_demo``: the stampede and stale-read demo (see menus/demo.py)."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...demo import MODES, PARTS, Settings, run


def _at_least(low: float, kind: type = int) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low:g}, got {text}")
        return value

    return parse


class Command(BaseCommand):  # type: ignore[misc]  # django ships no type hints
    help = (
        "Read the menu list through Django's Redis backend and through cacheguard: a "
        "stampede on an absent key, and a slow reader racing a write (stale reads)."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        defaults = Settings()
        parser.add_argument(
            "--processes", type=_at_least(1), default=defaults.processes,
            help=f"stampede: processes (default {defaults.processes})",
        )  # fmt: skip
        parser.add_argument(
            "--threads", type=_at_least(1), default=defaults.threads,
            help=f"stampede: threads per process (default {defaults.threads})",
        )  # fmt: skip
        parser.add_argument(
            "--build-ms", type=_at_least(0, float), default=defaults.build_ms,
            help="stampede: time to build the list after its query, ms "
            f"(default {defaults.build_ms:g})",
        )  # fmt: skip
        parser.add_argument(
            "--slow-build", type=_at_least(0.1, float), default=defaults.slow_build_s,
            help="stale read: the slow reader's build, seconds at most; it ends as soon as "
            f"the write commits (default {defaults.slow_build_s:g})",
        )  # fmt: skip
        parser.add_argument(
            "--menus", type=_at_least(1), default=defaults.menus,
            help=f"rows to seed (default {defaults.menus})",
        )  # fmt: skip
        parser.add_argument(
            "--reads-after", type=_at_least(1), default=defaults.reads_after,
            help=f"stale read: reads after the commit (default {defaults.reads_after})",
        )  # fmt: skip
        parser.add_argument("--only", choices=PARTS, help="run one of the two scenes")
        parser.add_argument("--mode", choices=MODES, help="run one of the two caches")
        parser.add_argument("--json", action="store_true", help="print a JSON summary only")

    def handle(self, *args: Any, **options: Any) -> None:
        settings = Settings(
            processes=options["processes"],
            threads=options["threads"],
            build_ms=options["build_ms"],
            slow_build_s=options["slow_build"],
            menus=options["menus"],
            reads_after=options["reads_after"],
            parts=(options["only"],) if options["only"] else PARTS,
            modes=(options["mode"],) if options["mode"] else MODES,
        )
        try:
            run(settings, self.stdout, as_json=options["json"])
        except RuntimeError as exc:
            raise CommandError(str(exc)) from exc
