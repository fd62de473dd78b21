"""Command line: ``demo`` (the stampede, unprotected vs cacheguard) and ``serve``."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import demo
from .infra import (
    DatabaseNotEmpty,
    async_database_url,
    backends,
    check_database,
    make_engine,
    seed,
)
from .models import Menu


def _positive(kind: Callable[[str], float], upper: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not 0 < value <= upper:
            raise argparse.ArgumentTypeError(f"must be > 0 and <= {upper:g}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _non_negative(kind: Callable[[str], float], upper: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not 0 <= value <= upper:
            raise argparse.ArgumentTypeError(f"must be >= 0 and <= {upper:g}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


class CannotServe(Exception):
    """serve cannot start: the address is taken, the database is unusable."""


class _WithDefaults(argparse.HelpFormatter):
    """Every option's help ends with its default, unless it has none worth saying."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        silent = action.default is None or action.default is False  # flags, "both"
        if not silent and action.default != argparse.SUPPRESS and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="menu_service",
        description="A menu service cached with cacheguard: its stampede demo and its HTTP API.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{demo,serve}")
    d = commands.add_parser(
        "demo",
        help="run the stampede unprotected, then with cacheguard",
        description="Run the stampede twice, unprotected then with cacheguard, and print "
        "DB queries, stale reads and latency for both.",
        formatter_class=_WithDefaults,
    )
    defaults = demo.Settings()
    d.add_argument(
        "--processes",
        type=_positive(int, 64),
        default=defaults.processes,
        help="reader processes",
    )
    d.add_argument(
        "--threads",
        type=_positive(int, 256),
        default=defaults.threads,
        help="reader threads per process",
    )
    d.add_argument(
        "--seconds", type=_positive(float, 600), default=defaults.seconds, help="length of each run"
    )
    d.add_argument(
        "--write-every",
        type=_positive(float, 60),
        default=defaults.write_every,
        help="seconds between writes to menu 1",
    )
    d.add_argument(
        "--build-ms",
        type=_positive(float, 10_000),
        default=defaults.build_ms,
        help="time to build the list after the query (the expensive part)",
    )
    d.add_argument(
        "--menus", type=_positive(int, 100_000), default=defaults.menus, help="rows to seed"
    )
    d.add_argument(
        "--chart", type=Path, default=defaults.chart, help="PNG to write (needs matplotlib)"
    )
    d.add_argument("--no-chart", action="store_true", help="print the table only")
    d.add_argument("--only", choices=demo.MODES, help="run one of the two runs (default: both)")
    s = commands.add_parser(
        "serve",
        help="serve the menus over HTTP (JSON)",
        description="Serve the menus over HTTP (JSON) through cacheguard; Redis and the "
        "database as for the demo (REDIS_URL, DATABASE_URL, else throwaway ones).",
        formatter_class=_WithDefaults,
    )
    s.add_argument("--host", default="127.0.0.1", help="address to listen on")
    s.add_argument(
        "--port",
        type=_non_negative(int, 65535),
        default=8000,
        help="port to listen on (0: any free port, shown when serving)",
    )
    s.add_argument(
        "--menus", type=_positive(int, 100_000), default=defaults.menus, help="rows to seed"
    )
    s.add_argument(
        "--build-ms",
        type=_non_negative(float, 10_000),
        default=0.0,
        help="extra time to build the list after the query (to watch a stampede)",
    )
    s.add_argument(
        "--body-timeout",
        type=_positive(float, 600),
        default=10.0,
        help="seconds a request body may take to arrive (else 408)",
    )
    s.add_argument(
        "--head-timeout",
        type=_positive(float, 600),
        default=10.0,
        help="seconds a request head may take to arrive (else 408)",
    )
    s.add_argument(
        "--namespace", default="menu-service", help="the guards' namespace (key prefix) in Redis"
    )
    s.add_argument("--access-log", action="store_true", help="log every request")
    for command in (d, s):
        command.add_argument(
            "--reset",
            action="store_true",
            help=f"use a DATABASE_URL database that already holds tables: drop and refill "
            f"the demo's own table ({Menu.__tablename__}) there, and touch no other "
            "(default: refuse such a database)",
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except (DatabaseNotEmpty, CannotServe) as refused:
        print(f"menu_service {args.command}: {refused}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        settings = demo.Settings(
            processes=args.processes,
            threads=args.threads,
            seconds=args.seconds,
            write_every=args.write_every,
            build_ms=args.build_ms,
            menus=args.menus,
            chart=None if args.no_chart else args.chart,
            modes=(args.only,) if args.only else demo.MODES,
            reset=args.reset,
        )
        demo.run(settings)
        return 0
    return serve(args)


def serve(args: argparse.Namespace) -> int:
    """Seed, then serve until SIGTERM/SIGINT; the throwaway Redis and temporary
    directory (if any) are removed on the way out of ``backends()``, whenever the
    signal comes (while starting, too)."""
    try:  # the service extra: FastAPI, uvicorn
        from .api import ServiceConfig  # noqa: PLC0415
        from .server import Stopped, listen, run, stop_signals_raise  # noqa: PLC0415
    except ImportError as exc:
        print(
            f"menu_service serve needs the service extra ({exc.name} is missing): "
            "pip install -e '.[service]'",
            file=sys.stderr,
        )
        return 1
    with stop_signals_raise(), contextlib.suppress(Stopped):
        _serve(args, ServiceConfig, listen, run)
    print("stopped", flush=True)
    return 0


def _serve(args: argparse.Namespace, config_type: Any, listen: Any, run: Any) -> None:
    try:
        sock = listen(args.host, args.port)
    except OSError as exc:
        raise CannotServe(f"cannot listen on {args.host}:{args.port}: {exc}") from None
    with sock, backends() as found:
        check_database(found, reset=args.reset)
        try:
            async_database_url(found.database_url)  # the async endpoints need a driver too
            engine = make_engine(found.database_url)
            try:
                seed(engine, args.menus)
            finally:
                engine.dispose()
        except Exception as exc:  # a wrong or unreachable DATABASE_URL: say so, briefly
            raise CannotServe(f"cannot use the database {found.database_url!r}: {exc}") from None
        config = config_type(
            redis_url=found.redis_url,
            database_url=found.database_url,
            namespace=args.namespace,
            build_seconds=args.build_ms / 1000.0,
            body_timeout=args.body_timeout,
        )
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host

        def ready() -> None:
            print(
                f"serving on http://{shown}:{port}/menus  (Redis: {found.redis_kind} "
                f"{found.redis_url}; Ctrl-C or SIGTERM stops)",
                flush=True,
            )

        run(
            config,
            sock,
            head_timeout=args.head_timeout,
            on_ready=ready,
            access_log=args.access_log,
        )


if __name__ == "__main__":
    sys.exit(main())
