"""The demo: the menu list read through Django's own Redis backend and through
cacheguard, in two scenes.

* **stampede**: ``processes`` x ``threads`` callers, started at once by an event,
  read the list while it is absent from the cache; building it takes
  ``build_ms`` after its query. Each process counts the SELECTs its database
  connections send to the menu table.
* **stale read**: a reader in another process misses, queries the list, and is slow
  to build it; meanwhile a writer renames menu 1 (``Menu 1 #0`` becomes ``Menu 1
  #1``) and commits. The reader's build ends when the writer has committed, or
  after ``slow_build_s`` at the latest. Then the list is read ``reads_after`` times:
  a read that returns ``#0`` is stale (the write had committed before it began).

Both read the list with the same call, ``cache.get_or_set("menu:list", load, ttl)``.
With Django's own Redis backend (``caches["plain"]``, its keys deleted on commit by
signals, as projects usually do) every caller that misses queries the database,
and the slow reader stores the pre-commit list after the commit, where it stays
until its timeout. With cacheguard's backend (``caches["default"]``, ``track_models``
on the model) one caller queries while the others wait for its value, and the
writer's locks keep the old list out of the cache once the write has committed:
the writer waits for the reader's fill to end (its value was right until then),
and invalidates before and after its commit.
"""

from __future__ import annotations

import functools
import json
import multiprocessing as mp
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

MODES = ("django", "cacheguard")
PARTS = ("stampede", "stale")
CTX = mp.get_context("spawn")
DEADLINE = 120.0  # seconds: a step of the demo that takes longer than this failed
MENU_TABLE = "cacheguard_django_menu"


@dataclass(frozen=True)
class Settings:
    processes: int = 4
    threads: int = 8
    build_ms: float = 50.0
    slow_build_s: float = 1.0
    menus: int = 20
    reads_after: int = 20
    parts: Sequence[str] = PARTS
    modes: Sequence[str] = MODES


@dataclass
class StampedeResult:
    mode: str
    callers: int = 0
    served: int = 0
    db_queries: int = 0
    errors: list[str] = field(default_factory=list)
    served_p50_ms: float = 0.0
    all_served_ms: float = 0.0


@dataclass
class StaleResult:
    mode: str
    reader_got: int = -1  # the revision the slow reader returned (#0: it queried first)
    writer_waited_ms: float = 0.0  # from the write's start to its commit
    reads_after: int = 0
    stale_reads: int = 0
    db_queries_after: int = 0
    cached_after: int = -1  # the revision the last read after the commit returned
    errors: list[str] = field(default_factory=list)


def revision_of(menus: list[dict[str, Any]]) -> int:
    """The revision in menu 1's name (``Menu 1 #17`` -> 17)."""
    for menu in menus:
        if menu["id"] == 1:
            return int(str(menu["name"]).rsplit("#", 1)[1])
    raise ValueError("menu 1 is missing from the list")


# -- what both scenes share -----------------------------------------------------------------------


ALIASES = {"django": "plain", "cacheguard": "default"}  # the mode's cache in CACHES


def reader_of(mode: str) -> Callable[[], list[dict[str, Any]]]:
    """The same ``get_or_set`` call on the mode's cache."""
    from .reads import menu_list

    return functools.partial(menu_list, ALIASES[mode])


def forget_list(mode: str) -> None:
    """Make the list absent from the mode's cache (a cold key, an expired entry)."""
    from django.core.cache import caches

    caches[ALIASES[mode]].delete("menu:list")


class QueryCounter:
    """Counts the SELECTs on the menu table that this process's database connections
    send, whichever thread opens them (a wrapper installed on every connection)."""

    def __init__(self) -> None:
        from django.db import connection
        from django.db.backends.signals import connection_created

        self.count = 0
        self._mutex = threading.Lock()
        connection_created.connect(self._install, weak=False)
        if connection.connection is not None:  # this thread's, already open
            connection.execute_wrappers.append(self._wrapper)

    def _install(self, sender: Any, connection: Any, **kwargs: Any) -> None:
        connection.execute_wrappers.append(self._wrapper)

    def _wrapper(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.lstrip().upper().startswith("SELECT") and MENU_TABLE in sql:
            with self._mutex:
                self.count += 1
        return execute(sql, params, many, context)


def _setup_child() -> None:
    """A spawned process: Django set up from the environment the launcher left."""
    import django

    django.setup()


def prepare_table(menus: int) -> None:
    """(Re)create the demo's own table, and only it, and fill it: ``menus`` rows,
    menu 1 at revision 0, three owners."""
    from django.db import connection

    from .models import Menu

    with connection.schema_editor() as editor:
        if MENU_TABLE in connection.introspection.table_names():
            editor.delete_model(Menu)
        editor.create_model(Menu)
    Menu.objects.bulk_create(
        Menu(id=i, name=f"Menu {i} #0", price=500 + 25 * i, owner=f"owner-{i % 3}")
        for i in range(1, menus + 1)
    )


# -- the stampede -----------------------------------------------------------------------------


def stampede_worker(mode: str, threads: int, build_s: float, ready: Any, go: Any, out: Any) -> None:
    _setup_child()
    from django.db import connection

    from .reads import SLOWNESS

    SLOWNESS.build_seconds = build_s
    counter = QueryCounter()
    read = reader_of(mode)
    parked = threading.Barrier(threads + 1)
    local_go = threading.Event()
    outcomes: list[tuple[float, str]] = []
    mutex = threading.Lock()

    def caller() -> None:
        connection.ensure_connection()  # a request thread's connection: open already
        parked.wait()
        local_go.wait()
        try:
            menus = read()
            outcome = "ok" if revision_of(menus) == 0 else f"revision {revision_of(menus)}"
        except Exception as exc:  # counted and shown, never silent
            outcome = f"{type(exc).__name__}: {exc}"
        with mutex:
            outcomes.append((time.time(), outcome))
        connection.close()

    pool = [threading.Thread(target=caller, daemon=True) for _ in range(threads)]
    for thread in pool:
        thread.start()
    parked.wait()  # every caller connected and about to wait for the start
    before = counter.count
    ready.put(True)
    if go.wait(DEADLINE):
        local_go.set()
        for thread in pool:
            thread.join(DEADLINE)
    out.put((counter.count - before, outcomes))


def stampede(mode: str, settings: Settings) -> StampedeResult:
    forget_list(mode)
    ready, out, go = CTX.Queue(), CTX.Queue(), CTX.Event()
    procs = [
        CTX.Process(
            target=stampede_worker,
            args=(mode, settings.threads, settings.build_ms / 1000, ready, go, out),
            daemon=True,
        )
        for _ in range(settings.processes)
    ]
    result = StampedeResult(mode, callers=settings.processes * settings.threads)
    try:
        for proc in procs:
            proc.start()
        for _ in procs:
            ready.get(timeout=DEADLINE)
        began = time.time()
        go.set()
        latencies: list[float] = []
        for _ in procs:
            queries, outcomes = out.get(timeout=DEADLINE)
            result.db_queries += queries
            for returned, outcome in outcomes:
                latencies.append((returned - began) * 1000)
                if outcome == "ok":
                    result.served += 1
                else:
                    result.errors.append(outcome)
        for proc in procs:
            proc.join(DEADLINE)
    finally:
        go.set()
        for proc in procs:
            if proc.is_alive():
                proc.kill()
    if latencies:
        result.served_p50_ms = statistics.median(latencies)
        result.all_served_ms = max(latencies)
    missing = result.callers - len(latencies)
    if missing:
        result.errors.append(f"{missing} caller(s) did not answer")
    return result


# -- the stale read ---------------------------------------------------------------------------


def slow_reader(mode: str, slow_s: float, queried: Any, committed: Any, out: Any) -> None:
    _setup_child()
    from .reads import SLOWNESS

    def after_query() -> None:
        queried.set()
        committed.wait(slow_s)  # the slow build: over when the write commits, at the latest

    SLOWNESS.after_query = after_query
    try:
        out.put(("ok", revision_of(reader_of(mode)())))
    except Exception as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def stale_read(mode: str, settings: Settings, counter: QueryCounter) -> StaleResult:
    from django.db import transaction

    from .models import Menu

    result = StaleResult(mode)
    with transaction.atomic():  # menu 1 back at #0 (tracked and signalled like any write)
        Menu.objects.filter(pk=1).update(name="Menu 1 #0")
    forget_list(mode)
    queried, committed, out = CTX.Event(), CTX.Event(), CTX.Queue()
    reader = CTX.Process(
        target=slow_reader,
        args=(mode, settings.slow_build_s, queried, committed, out),
        daemon=True,
    )
    reader.start()
    try:
        if not queried.wait(DEADLINE):
            raise RuntimeError(f"{mode}: the slow reader never queried")
        began = time.perf_counter()
        with transaction.atomic():
            menu = Menu.objects.get(pk=1)
            menu.name = "Menu 1 #1"
            menu.save()
        result.writer_waited_ms = (time.perf_counter() - began) * 1000
        committed.set()
        status, got = out.get(timeout=DEADLINE)
        if status == "ok":
            result.reader_got = got
        else:
            result.errors.append(f"slow reader: {got}")
        reader.join(DEADLINE)
    finally:
        committed.set()
        if reader.is_alive():
            reader.kill()
    read = reader_of(mode)
    before = counter.count
    for _ in range(settings.reads_after):
        revision = revision_of(read())
        result.reads_after += 1
        result.stale_reads += revision < 1
        result.cached_after = revision
    result.db_queries_after = counter.count - before
    return result


# -- the whole demo ---------------------------------------------------------------------------


def run(settings: Settings, out: TextIO, *, as_json: bool = False) -> dict[str, Any]:
    from django.conf import settings as django_settings
    from django.db import connection

    counter = QueryCounter()
    prepare_table(settings.menus)
    database = connection.vendor

    def say(text: str) -> None:
        if not as_json:
            out.write(text + "\n")  # a management command's stdout adds no second newline
            out.flush()

    say(
        f"menu_django demo on {database}; Redis {django_settings.CACHES['default']['LOCATION']}; "
        f"{settings.menus} menus"
    )
    summary: dict[str, Any] = {"database": database}
    if "stampede" in settings.parts:
        say(
            f"\nstampede: {settings.processes} processes x {settings.threads} threads read the "
            f"absent menu list at once; building it takes {settings.build_ms:g} ms after "
            "its query"
        )
        runs = {mode: stampede(mode, settings) for mode in settings.modes}
        say(stampede_table(list(runs.values())))
        summary["stampede"] = {mode: asdict(r) for mode, r in runs.items()}
    if "stale" in settings.parts:
        say(
            "\nstale read: a slow reader queries the list, then a writer renames menu 1 "
            f"(#0 -> #1) and commits; then {settings.reads_after} reads of the list"
        )
        stale = {mode: stale_read(mode, settings, counter) for mode in settings.modes}
        say(stale_table(list(stale.values())))
        summary["stale"] = {mode: asdict(r) for mode, r in stale.items()}
    if as_json:
        out.write(json.dumps(summary, indent=2) + "\n")
    return summary


_LABELS = {"django": "Django RedisCache", "cacheguard": "cacheguard"}


def stampede_table(results: list[StampedeResult]) -> str:
    lines = [
        "| cache             | callers | DB queries | errors | served p50 ms | all served ms |",
        "|-------------------|---------|------------|--------|---------------|---------------|",
    ]
    for r in results:
        lines.append(
            f"| {_LABELS[r.mode]:<17} | {r.callers:>7} | {r.db_queries:>10} | "
            f"{len(r.errors):>6} | {r.served_p50_ms:>13.1f} | {r.all_served_ms:>13.1f} |"
        )
    errors = [f"  error ({r.mode}): {e}" for r in results for e in r.errors[:3]]
    return "\n".join(lines + errors)


def stale_table(results: list[StaleResult]) -> str:
    lines = [
        "| cache             | slow reader got | writer took ms | reads after | stale reads "
        "| DB queries after |",
        "|-------------------|-----------------|----------------|-------------|-------------"
        "|------------------|",
    ]
    for r in results:
        lines.append(
            f"| {_LABELS[r.mode]:<17} | {'#' + str(r.reader_got):>15} | "
            f"{r.writer_waited_ms:>14.1f} | {r.reads_after:>11} | {r.stale_reads:>11} | "
            f"{r.db_queries_after:>16} |"
        )
    errors = [f"  error ({r.mode}): {e}" for r in results for e in r.errors[:3]]
    return "\n".join(lines + errors)
