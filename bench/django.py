"""Django cache backends side by side: cacheguard's against Django's own Redis backend
and django-redis (its default client and its ``HerdClient``), in one run.

    python bench/django.py [--url redis://...] [--processes 8] [--threads 4] [--rounds 5]
                           [--load-ms 50] [--hit-rounds 60] [--backends ...] [--quick]
                           [--write docs/benchmarks.md]

Without ``--url`` it starts its own throwaway ``redis-server`` (or falls back as the
tests do). Every backend has a key prefix of its own (``KEY_PREFIX``, a token of the
run), and every key the run made is deleted at its end.

Stampede: P processes x T threads call ``cache.get_or_set(key, load, 60)`` on one
absent key at once. ``load`` sleeps ``--load-ms`` (the database query) and counts
itself in shared memory. The callers are started by an event once every thread of
every process is parked on it (no sleep), and each process's threads are woken by
one thread of theirs that waits for the event (a process's wake-up is the same for
every backend). Reported per backend: loads per round, callers served, errors, and
the time from the event to each caller's return (p50 and max: the max is when the
last caller was served). The backends' rounds are interleaved, who goes first
rotating. django-redis's ``HerdClient`` answers a different case than an absent key
(an entry past its herd time: one caller is told to refresh it while the others get
the old value), so it also runs on such an entry, planted as HerdClient stores it
with its herd time a second ago; its row counts the callers served the old value.

Hit: one warm key holding 20 menu rows (dicts), one thread: ``cache.get(key)`` and a
``get_or_set`` hit of each backend, beside a plain redis-py ``GET`` + ``pickle.loads``
of the same payload (what every backend here must at least do). Batches of 300
calls, every row's batch once per round in a rotating order, ``--hit-rounds``
rounds; µs per call is the median batch, the cost over the first row the median of
the rounds' paired differences (see ``bench/_common.py``). Each of Django's backends
is used as Django hands it out (``caches[alias]``: one instance per thread).

``--quick`` is a small run for the tests (2 processes x 2 threads, one round, a few
hit rounds): its figures mean nothing, its load counts do.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pickle
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import Any

import redis

# Run as a script, this file's folder comes first on the path, where its own name
# would shadow the django package: the repository root goes there instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from bench._common import (  # noqa: E402 (after the path is set)
    Paired,
    paired_batches,
    run_line,
    run_report,
    write_section,
)
from cacheguard.testing import RedisEndpoint  # noqa: E402

CTX = mp.get_context("spawn")
MARK = "bench/django.py"
HEADING = "## Django backends"

# label -> (BACKEND, OPTIONS)
BACKENDS: dict[str, tuple[str, dict[str, Any]]] = {
    "cacheguard": ("cacheguard.integrations.django.CacheGuardCache", {}),
    "Django RedisCache": ("django.core.cache.backends.redis.RedisCache", {}),
    "django-redis": (
        "django_redis.cache.RedisCache",
        {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
    ),
    "django-redis HerdClient": (
        "django_redis.cache.RedisCache",
        {"CLIENT_CLASS": "django_redis.client.HerdClient"},
    ),
}
HERD = "django-redis HerdClient"
HERD_STALE = "django-redis HerdClient, entry past its herd time"
TIMEOUT = 60  # the get_or_set timeout, seconds
ROUND_DEADLINE = 120.0  # a stampede round that takes longer than this failed


def menu_rows() -> list[dict[str, Any]]:
    return [
        {"id": i, "name": f"menu {i}", "price": 100 + i, "owner": f"owner {i % 3}", "sort": i}
        for i in range(20)
    ]


def alias_of(label: str) -> str:
    return label.lower().replace(" ", "-")


def caches_setting(url: str, token: str, labels: Sequence[str]) -> dict[str, Any]:
    """``CACHES``: one alias per backend, each under a key prefix of its own."""
    return {
        alias_of(label): {
            "BACKEND": BACKENDS[label][0],
            "LOCATION": url,
            "KEY_PREFIX": f"{token}-{alias_of(label)}",
            "TIMEOUT": TIMEOUT,
            "OPTIONS": _options(label, token),
        }
        for label in labels
    }


def _options(label: str, token: str) -> dict[str, Any]:
    options = dict(BACKENDS[label][1])
    if label == "cacheguard":  # every key it writes (versions, the sequence too) under the token
        options["namespace"] = f"{token}-cacheguard"
    return options


def configure_django(url: str, token: str, labels: Sequence[str]) -> None:
    import django
    from django.conf import settings

    settings.configure(
        CACHES=caches_setting(url, token, labels),
        USE_TZ=True,
        SECRET_KEY=f"bench-django-{token}",  # the cacheguard backend signs its pickles with it
    )
    django.setup()


def cache_for(label: str) -> Any:
    from django.core.cache import caches

    return caches[alias_of(label)]


# -- the stampede ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One stampede: every caller of every process calls ``get_or_set`` on ``key``."""

    label: str  # the row
    backend: str  # the backend's label
    key: str


def _warm(label: str, token: str) -> None:
    """Connections (and a cacheguard process's pub/sub connection, scripts) warm, as in
    a running service."""
    cache = cache_for(label)
    cache.get_or_set(f"warm-{os.getpid()}-{threading.get_ident()}", lambda: 1, TIMEOUT)
    cache.get("warm")
    guard = getattr(cache, "guard", None)
    if guard is not None:
        from cacheguard.redis.notifier import notifier_for

        with notifier_for(guard.client).subscription(f"{token}:warm") as subscription:
            subscription.open(5)


def worker(
    url: str,
    token: str,
    labels: Sequence[str],
    steps: Sequence[Step],
    threads: int,
    load_s: float,
    loads: Any,
    started: Any,
    ready: Any,
    go: Sequence[Any],
    out: Any,
) -> None:
    """A process of callers: ``threads`` threads, each calling once per step."""
    configure_django(url, token, labels)
    parked = threading.Barrier(threads + 1)
    finished = threading.Barrier(threads + 1)
    local_go = [threading.Event() for _ in steps]
    records: list[list[tuple[float, str]]] = [[] for _ in steps]
    mutex = threading.Lock()

    def load() -> dict[str, Any]:
        time.sleep(load_s)
        with loads.get_lock():
            loads.value += 1
        return {"rev": "new", "rows": menu_rows()}

    def call(step: Step) -> tuple[float, str]:
        try:
            value = cache_for(step.backend).get_or_set(step.key, load, TIMEOUT)
        except Exception as exc:  # counted and shown, never silent
            return time.time(), f"error: {type(exc).__name__}: {exc}"
        returned = time.time()
        if isinstance(value, dict) and value.get("rev") in ("new", "old"):
            return returned, str(value["rev"])
        return returned, f"error: unexpected value {value!r:.60}"

    def caller() -> None:
        for label in labels:  # this thread's cache instances, warm
            _warm(label, token)
        parked.wait()
        for index, step in enumerate(steps):
            parked.wait()
            local_go[index].wait()
            outcome = call(step)
            with mutex:
                records[index].append(outcome)
            finished.wait()

    pool = [threading.Thread(target=caller, daemon=True) for _ in range(threads)]
    for thread in pool:
        thread.start()
    parked.wait()  # every thread warm
    started.put(os.getpid())
    for index in range(len(steps)):
        parked.wait()  # every thread about to wait for this step's event
        ready.put(index)
        if not go[index].wait(ROUND_DEADLINE):
            return
        local_go[index].set()
        finished.wait()
        out.put((index, records[index]))
    for thread in pool:
        thread.join(10)


@dataclass
class RoundResult:
    loads: int
    served: int
    old: int  # callers served the old value (the HerdClient's stale entry)
    errors: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)


def plant_herd_entry(key: str) -> None:
    """An entry as HerdClient stores it, its herd time one second ago and its Redis TTL
    a minute ahead (HerdClient's would be ``CACHE_HERD_TIMEOUT``, 60 s, less that
    second): the state of a hot key just past its time."""
    from django_redis.client import DefaultClient
    from django_redis.client.herd import Marker

    client = cache_for(HERD).client
    packed = (Marker(), {"rev": "old", "rows": menu_rows()}, int(time.time()) - 1)
    DefaultClient.set(client, key, packed, timeout=TIMEOUT)


def stampedes(args: argparse.Namespace, url: str, token: str) -> dict[str, list[RoundResult]]:
    labels = args.backends
    steps: list[Step] = []
    for rnd in range(args.rounds):
        order = [*labels, *([HERD_STALE] if HERD in labels else [])]
        shift = rnd % len(order)
        for row in order[shift:] + order[:shift]:
            backend = HERD if row == HERD_STALE else row
            steps.append(Step(row, backend, f"stampede-{rnd}-{alias_of(row)}"))
    loads = CTX.Value("q", 0)
    started, ready, out = CTX.Queue(), CTX.Queue(), CTX.Queue()
    go = [CTX.Event() for _ in steps]
    job = (url, token, labels, steps, args.threads, args.load_ms / 1000, loads)
    procs = [
        CTX.Process(target=worker, args=(*job, started, ready, go, out), daemon=True)
        for _ in range(args.processes)
    ]
    results: dict[str, list[RoundResult]] = {}
    try:
        for proc in procs:
            proc.start()
        for _ in procs:
            _from(started, procs)
        for index, step in enumerate(steps):
            print(f"stampede {index + 1}/{len(steps)}: {step.label}", file=sys.stderr)
            if step.label == HERD_STALE:
                plant_herd_entry(step.key)
            for _ in procs:
                _from(ready, procs)
            before = loads.value
            began = time.time()
            go[index].set()
            outcomes = [outcome for _ in procs for outcome in _from(out, procs)[1]]
            result = RoundResult(
                loads=loads.value - before,
                served=sum(1 for _, what in outcomes if what in ("new", "old")),
                old=sum(1 for _, what in outcomes if what == "old"),
                errors=[what for _, what in outcomes if what.startswith("error")],
                latencies_ms=[(returned - began) * 1000 for returned, _ in outcomes],
            )
            results.setdefault(step.label, []).append(result)
    finally:
        for event in go:
            event.set()  # a worker still waiting ends
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    return results


def _from(queue: Any, procs: list[Any]) -> Any:
    """The next item of ``queue``; a worker that died (its error is on stderr) or a
    round past its deadline ends the run at once."""
    deadline = time.monotonic() + ROUND_DEADLINE
    while time.monotonic() < deadline:
        try:
            return queue.get(timeout=0.5)
        except Empty:
            dead = [proc.exitcode for proc in procs if proc.exitcode is not None]
            if dead:
                raise RuntimeError(f"a worker exited ({dead[0]}): see its error above") from None
    raise RuntimeError(f"no answer from the workers within {ROUND_DEADLINE:g} s")


# -- the hit path ---------------------------------------------------------------------------------


def hit_path(url: str, labels: Sequence[str], rounds: int, batch: int) -> dict[str, Paired]:
    """µs per hit of each backend's ``get`` and ``get_or_set``, beside a plain GET + loads."""
    raw_key = f"{HIT_TOKEN}:raw"
    client = redis.Redis.from_url(url)
    client.set(raw_key, pickle.dumps(menu_rows(), pickle.HIGHEST_PROTOCOL))
    bodies: dict[str, Callable[[int], None]] = {}

    def plain(n: int) -> None:
        get, loads = client.get, pickle.loads
        for _ in range(n):
            loads(get(raw_key))  # type: ignore[arg-type]

    bodies["redis-py: GET + pickle.loads"] = plain
    rows = menu_rows()
    for label in labels:
        cache = cache_for(label)
        cache.set("hit", rows, TIMEOUT)
        assert cache.get("hit") == rows, f"{label}: the warm key does not read back"

        def get(n: int, cache: Any = cache) -> None:
            for _ in range(n):
                cache.get("hit")

        def get_or_set(n: int, cache: Any = cache) -> None:
            for _ in range(n):
                cache.get_or_set("hit", _never, TIMEOUT)

        bodies[f"{label}: get"] = get
        bodies[f"{label}: get_or_set (hit)"] = get_or_set
    try:
        for body in bodies.values():
            body(batch)  # connections, scripts: warm, as in a service
        return paired_batches(bodies, rounds, batch)
    finally:
        client.delete(raw_key)
        client.close()


HIT_TOKEN = "bench-django-hit"


def _never() -> Any:
    raise AssertionError("a hit must not call the default")


# -- the report -----------------------------------------------------------------------------------


def _cleanup(url: str, token: str) -> int:
    admin = redis.Redis.from_url(url)
    try:
        keys = list(admin.scan_iter(match=f"*{token}*", count=1000))
        for start in range(0, len(keys), 500):
            admin.delete(*keys[start : start + 500])
        return len(keys)
    finally:
        admin.close()


def _backends_line(labels: Sequence[str]) -> str:
    import django
    import django_redis

    versions = [f"Django {django.get_version()}", f"django-redis {django_redis.__version__}"]
    described = []
    for label in labels:
        backend, options = BACKENDS[label]
        client = options.get("CLIENT_CLASS", "")
        described.append(
            f"{label}: `{backend}`"
            + (f" (`CLIENT_CLASS` {client.rsplit('.', 1)[1]})" if client else "")
        )
    configured = ", ".join(described)
    return f"{', '.join(versions)}. Backends: {configured}."


def stampede_table(args: argparse.Namespace, results: dict[str, list[RoundResult]]) -> list[str]:
    callers = args.processes * args.threads
    lines = [
        "| backend | loads per round | loads (median) | callers served | errors "
        "| served the old value, per round | served p50 ms | all served (max) ms |",
        "|---|---|---:|---:|---:|---|---:|---:|",
    ]
    for label, rounds in results.items():
        latencies = [statistics.median(r.latencies_ms) for r in rounds]
        worst = [max(r.latencies_ms) for r in rounds]
        old = ", ".join(str(r.old) for r in rounds) if label == HERD_STALE else "-"
        lines.append(
            f"| {label} | {', '.join(str(r.loads) for r in rounds)} "
            f"| {statistics.median(r.loads for r in rounds):.0f} "
            f"| {min(r.served for r in rounds)} of {callers} "
            f"| {sum(len(r.errors) for r in rounds)} | {old} "
            f"| {statistics.median(latencies):.1f} | {statistics.median(worst):.1f} |"
        )
    return lines


def hit_table(hits: dict[str, Paired]) -> list[str]:
    base_label, base = next(iter(hits.items()))
    lines = [
        f"| operation | µs / call | µs over {base_label} | vs it | client CPU µs / call |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, p in hits.items():
        lines.append(
            f"| {label} | {p.wall:.1f} | {p.wall_over:+.1f} | {p.wall / base.wall:.2f}x "
            f"| {p.cpu:.1f} |"
        )
    return lines


def report(endpoint: RedisEndpoint, args: argparse.Namespace) -> str:
    token = f"bdj-{uuid.uuid4().hex[:8]}"
    configure_django(endpoint.url, token, args.backends)
    try:
        results = stampedes(args, endpoint.url, token)
        hits = hit_path(endpoint.url, args.backends, args.hit_rounds, args.hit_batch)
    finally:
        _cleanup(endpoint.url, token)
    try:
        version = redis.Redis.from_url(endpoint.url).info("server").get("redis_version", "?")
    except redis.ResponseError:  # fakeredis has no INFO
        version = "fakeredis"
    errors = [(label, e) for label, rounds in results.items() for r in rounds for e in r.errors]
    callers = args.processes * args.threads
    lines = [
        run_line(str(version), endpoint.kind),
        "",
        _backends_line(args.backends),
        "",
        f"Command: `{' '.join(['python bench/django.py', *args.argv])}`",
        "",
        "### Stampede",
        "",
        f"{args.processes} processes x {args.threads} threads ({callers} callers) call "
        f"`cache.get_or_set(key, load, {TIMEOUT})` on one absent key at once; `load` takes "
        f"{args.load_ms} ms. Served: the time from the start signal to each caller's "
        f"return, median of {args.rounds} round(s) (loads: every round's).",
        "",
        *stampede_table(args, results),
        "",
        "### Hit",
        "",
        f"One warm key holding 20 menu rows (dicts), one thread; {args.hit_rounds} rounds "
        f"of {args.hit_batch}-call batches, rotating; over the first row: the median of "
        "each round's paired difference.",
        "",
        *hit_table(hits),
    ]
    for label, error in errors[:10]:
        lines.append(f"\nerror in {label}: {error}")
    return "\n".join(lines)


def write_report(path: Path, text: str) -> None:
    """Replace the section between the marks; a file without them gets the heading too."""
    content = path.read_text() if path.exists() else ""
    if f"<!-- {MARK}:begin -->" not in content:
        content = content.rstrip() + f"\n\n{HEADING}\n"
        path.write_text(content)
    write_section(path, text, MARK)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="Redis URL (default: a throwaway redis-server)")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--threads", type=int, default=4, help="callers per process")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--load-ms", type=int, default=50, help="the default callable's time")
    parser.add_argument("--hit-rounds", type=int, default=60, help="hit: rounds of batches")
    parser.add_argument("--hit-batch", type=int, default=300, help="hit: calls per batch")
    parser.add_argument(
        "--backends",
        nargs="+",
        choices=list(BACKENDS),
        default=list(BACKENDS),
        metavar="BACKEND",
        help=f"the backends to run (default: all: {', '.join(repr(b) for b in BACKENDS)})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a small run for the tests: by default 2 processes x 2 threads, 1 round, "
        "5 hit rounds of 50 calls",
    )
    parser.add_argument("--write", type=Path, help="also write the tables into this Markdown file")
    given = sys.argv[1:] if argv is None else list(argv)
    if parser.parse_known_args(given)[0].quick:  # smaller defaults; options given still win
        parser.set_defaults(processes=2, threads=2, rounds=1, hit_rounds=5, hit_batch=50)
    args = parser.parse_args(given)
    args.argv = given
    if min(args.processes, args.threads, args.rounds, args.hit_rounds, args.hit_batch) < 1:
        parser.error("processes, threads, rounds, hit-rounds and hit-batch must be >= 1")
    if args.load_ms < 0:
        parser.error("load-ms must be >= 0")
    return run_report(args.url, None, MARK, lambda endpoint: _report_and_write(endpoint, args))


def _report_and_write(endpoint: RedisEndpoint, args: argparse.Namespace) -> str:
    text = report(endpoint, args)
    if args.write:
        write_report(args.write, text)
        print(f"\nwritten to {args.write}", file=sys.stderr)
    return text


if __name__ == "__main__":
    sys.exit(main())
