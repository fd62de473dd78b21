"""The house: old import paths keep working, the import stays lean, the layers hold.

The package was laid out by concept (``redis/`` plumbing, ``locks/`` by store with
the asyncio twins beside the sync ones, ``cache/`` with its ``flows/`` and
``outage/``, ``integrations/``). Code written against the paths the docs showed
before must not break, ``import cacheguard`` must not pay for the whole tree, and
no module may import one of a layer above it or take part in an import circle.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "cacheguard"

# Every (module, name) the docs, README and examples showed before the move, and
# where each now lives: the old path must give the very same object.
OLD_PATHS = [
    ("cacheguard", "CacheGuard", "cacheguard.cache.guard"),
    ("cacheguard", "CacheLoader", "cacheguard.cache.loader"),
    ("cacheguard", "cached_with_lock", "cacheguard.cache.decorator"),
    ("cacheguard", "MISSING", "cacheguard.cache.guard"),
    ("cacheguard", "RedisRWLock", "cacheguard.locks.redis.rwlock"),
    ("cacheguard", "LockFactory", "cacheguard.locks.two_tier"),
    ("cacheguard", "LockLostError", "cacheguard.exceptions"),
    ("cacheguard", "GuardClosed", "cacheguard.exceptions"),
    ("cacheguard", "CacheGuardError", "cacheguard.exceptions"),
    ("cacheguard", "Notifier", "cacheguard.redis.notifier"),
    ("cacheguard", "Watchdog", "cacheguard.locks.redis.watchdog"),
    ("cacheguard", "WeakRegistry", "cacheguard.locks.registry"),
    ("cacheguard", "Backoff", "cacheguard.backoff"),
    ("cacheguard.aio", "AsyncCacheGuard", "cacheguard.cache.async_guard"),
    ("cacheguard.aio", "AsyncCacheLoader", "cacheguard.cache.async_loader"),
    ("cacheguard.aio", "async_notifier_for", "cacheguard.redis.async_notifier"),
    ("cacheguard.aio", "AsyncRedisRWLock", "cacheguard.locks.redis.async_rwlock"),
    ("cacheguard.aio", "AsyncRedlockRWLock", "cacheguard.locks.redlock.async_rwlock"),
    ("cacheguard.aio.postgres", "AsyncPostgresRWLock", "cacheguard.locks.postgres.async_rwlock"),
    (
        "cacheguard.aio.postgres",
        "close_idle_async_connections",
        "cacheguard.locks.postgres.async_rwlock",
    ),
    ("cacheguard.locks", "RedlockRWLock", "cacheguard.locks.redlock.rwlock"),
    ("cacheguard.locks", "Holder", "cacheguard._identity"),
    ("cacheguard.locks.notifier", "notifier_for", "cacheguard.redis.notifier"),
    ("cacheguard.locks.postgres", "PostgresRWLock", "cacheguard.locks.postgres.rwlock"),
    ("cacheguard.locks.postgres", "close_idle_connections", "cacheguard.locks.postgres.rwlock"),
    ("cacheguard.locks.postgres", "key_parts", "cacheguard.locks.postgres.rwlock"),
    ("cacheguard.locks.zookeeper", "ZooKeeperRWLock", "cacheguard.locks.zookeeper.rwlock"),
    ("cacheguard.locks.redlock", "RedlockRWLock", "cacheguard.locks.redlock.rwlock"),
    ("cacheguard.cache.write_locks", "StoreWriteLock", "cacheguard.cache.write_locks"),
    ("cacheguard.cache.scripts", "TIMED_GET", "cacheguard.cache.scripts"),
    ("cacheguard.cache.invalidation", "RECENT_PREFIXES", "cacheguard.cache.invalidation"),
    ("cacheguard.cache.invalidation", "Prefixes", "cacheguard.cache.invalidation"),
    ("cacheguard.cache.watermark", "note_snapshot", "cacheguard.cache.watermark"),
    ("cacheguard.sqlalchemy", "track_models", "cacheguard.integrations.sqlalchemy.tracker"),
    ("cacheguard.sqlalchemy", "sqlite_engine", "cacheguard.integrations.sqlalchemy.sqlite"),
    ("cacheguard.sqlalchemy", "sqlite_async_engine", "cacheguard.integrations.sqlalchemy.sqlite"),
    ("cacheguard.sqlalchemy", "outbox_table", "cacheguard.integrations.sqlalchemy.outbox"),
    ("cacheguard.sqlalchemy", "OutboxReplayer", "cacheguard.integrations.sqlalchemy.outbox"),
    ("cacheguard.sqlalchemy", "outbox_depth", "cacheguard.integrations.sqlalchemy.outbox"),
    ("cacheguard.clients", "parse_url", "cacheguard.redis.clients"),
    ("cacheguard.clients", "sync_client_from_url", "cacheguard.redis.clients"),
    ("cacheguard.testing", "RedisEndpoint", "cacheguard.testing"),
    ("cacheguard.testing", "redis_server", "cacheguard.testing"),
    ("cacheguard.testing", "spawn_redis_server", "cacheguard.testing"),
    ("cacheguard.testing", "OwnedRedisServer", "cacheguard.testing"),
    ("cacheguard.testing", "free_port", "cacheguard.testing"),
    ("cacheguard.testing", "zookeeper_server", "cacheguard_testing.zookeeper"),
    ("cacheguard.integrations.prometheus", "CacheMetrics", "cacheguard.integrations.prometheus"),
    ("cacheguard.integrations.dogpile", "CacheGuardBackend", "cacheguard.integrations.dogpile"),
]


@pytest.mark.parametrize(("old", "name", "home"), OLD_PATHS, ids=str)
def test_an_old_import_path_gives_the_same_object(old: str, name: str, home: str) -> None:
    assert getattr(importlib.import_module(old), name) is getattr(
        importlib.import_module(home), name
    )


_IMPORT = re.compile(r"^\s*from (cacheguard[\w.]*) import \(?([\w ,\n]+?)\)?$", re.M)


def _documented_imports() -> list[tuple[str, str, str]]:
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for module, names in _IMPORT.findall(page.read_text()):
            for name in re.split(r"[,\s]+", names.strip()):
                if name:
                    found.append((page.name, module, name.split(" as ")[0]))
    return found


def test_every_import_the_docs_show_resolves() -> None:
    documented = _documented_imports()
    assert len(documented) > 40  # the pages were read
    broken = [
        f"{page}: from {module} import {name}"
        for page, module, name in documented
        if not hasattr(importlib.import_module(module), name)
    ]
    assert broken == []


def _loaded_after(code: str) -> list[str]:
    """The modules of cacheguard (and the stdlib's asyncio, redis-py) loaded by ``code``
    in a fresh interpreter."""
    probe = (
        f"{code}\nimport json, sys\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('cacheguard', 'cacheguard_testing', 'asyncio', 'redis', 'sqlalchemy', 'kazoo', "
        "'opentelemetry', 'prometheus_client', 'django'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


def test_import_cacheguard_is_lean() -> None:
    loaded = _loaded_after("import cacheguard")
    ours = [m for m in loaded if m.startswith("cacheguard")]
    assert len(ours) <= 25, ours
    # Not even redis-py (which itself imports asyncio): the exceptions need nothing.
    # Nor an integration's library: those load with their integration, on demand.
    assert not [
        m
        for m in loaded
        if m.split(".")[0] in ("asyncio", "redis", "opentelemetry", "prometheus_client", "django")
    ], loaded


_NOT_FOR_THE_SYNC_GUARD = re.compile(
    r"cacheguard\.(aio|testing|integrations|sqlalchemy)\b"
    r"|cacheguard\.locks\.(redlock|postgres|zookeeper)\b"
    r"|\.async_|cacheguard_testing"
)


def test_the_sync_guard_loads_no_asyncio_twin_store_or_integration() -> None:
    # A guard made and a function decorated (no Redis is asked: nothing is called).
    loaded = _loaded_after(
        "import redis\n"
        "from cacheguard import CacheGuard, CacheLoader, cached_with_lock\n"
        "guard = CacheGuard(redis.Redis(port=1), namespace='layout')\n"
        "cached_with_lock(guard, key='k', ttl=1)(lambda: 1)\n"
        "CacheLoader(guard, key='k:{i}', load=lambda i: i, ttl=1)"
    )
    assert "cacheguard.cache.guard" in loaded
    assert [m for m in loaded if _NOT_FOR_THE_SYNC_GUARD.search(m)] == []


def test_the_django_face_loads_django_on_first_use() -> None:
    # Naming the face (as a settings module may) loads neither Django nor the backend.
    loaded = _loaded_after("import cacheguard.integrations.django")
    assert "cacheguard.integrations.django" in loaded
    assert [m for m in loaded if m.split(".")[0] == "django" or "django." in m] == [], loaded


@pytest.mark.slow
def test_the_asyncio_face_loads_on_first_use() -> None:
    assert "cacheguard.cache.async_guard" not in _loaded_after("import cacheguard.aio")
    loaded = _loaded_after("from cacheguard.aio import AsyncCacheGuard")
    assert "cacheguard.cache.async_guard" in loaded
    assert [m for m in loaded if re.search(r"redlock|postgres|zookeeper|integrations", m)] == []


def test_public_all_is_the_public_api() -> None:
    import cacheguard

    internals = {"LockFactory", "WeakRegistry", "Notifier", "Watchdog", "Backoff"}
    assert internals.isdisjoint(cacheguard.__all__)
    for name in cacheguard.__all__:
        assert getattr(cacheguard, name) is not None
    assert set(cacheguard.__all__) <= set(dir(cacheguard))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = cacheguard.Nope  # type: ignore[attr-defined]


# -- the layers and the circles: read from the code's own imports --------------------------

# A module may import its own layer and the layers below it, never one above.
LAYERS = [
    ("basics", r"cacheguard\.(exceptions|checks|steps|backoff|_identity|_lazy|_loop)$"),
    ("codecs", r"cacheguard\.codecs(\..*)?$"),
    ("redis", r"cacheguard\.redis(\..*)?$"),
    ("locks", r"cacheguard\.locks(\..*)?$"),
    ("cache", r"cacheguard\.cache(\..*)?$"),
    ("top", r"cacheguard(\.(testing|integrations(\..*)?|aio(\..*)?|sqlalchemy|clients))?$"),
]
# The package faces and the old paths only hand names on.
FACES = {"cacheguard", "cacheguard.locks", "cacheguard.locks.notifier"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_at_import_time(path: Path, *, for_type_checkers: bool = False) -> set[str]:
    """The cacheguard modules ``path`` imports when it is imported: not inside a
    function (those run later, on demand), and not under ``if TYPE_CHECKING:``
    unless ``for_type_checkers`` (a type checker reads those too)."""
    found: set[str] = set()

    def is_module(dotted: str) -> bool:
        base = PACKAGE.parent / dotted.replace(".", "/")
        return base.is_dir() or base.with_suffix(".py").exists()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.body if for_type_checkers else node.orelse)
                continue
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cacheguard"):
                # `from package import submodule` needs the submodule, not the package's
                # face (which Python runs first for any of its modules anyway).
                module = node.module or ""
                for alias in node.names:
                    dotted = f"{module}.{alias.name}"
                    found.add(dotted if is_module(dotted) else module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("cacheguard"))
            for field in ("body", "orelse", "finalbody", "handlers"):
                visit([n for n in getattr(node, field, []) if isinstance(n, ast.stmt)])
            for handler in getattr(node, "handlers", []):
                visit(handler.body)

    visit(ast.parse(path.read_text()).body)
    return found


def _graph(*, for_type_checkers: bool = False) -> dict[str, set[str]]:
    return {
        _module_name(path): _imports_at_import_time(path, for_type_checkers=for_type_checkers)
        for path in PACKAGE.rglob("*.py")
    }


def _layer(module: str) -> int:
    for index, (_, pattern) in enumerate(LAYERS):
        if re.fullmatch(pattern, module):
            return index
    raise AssertionError(f"{module} is on no layer of tests/test_layout.py")


@pytest.mark.slow
def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = [
        f"{module} ({LAYERS[_layer(module)][0]}) imports {target} ({LAYERS[_layer(target)][0]})"
        for module, targets in _graph(for_type_checkers=True).items()
        if module not in FACES
        for target in targets
        if _layer(target) > _layer(module)
    ]
    assert upward == []


@pytest.mark.slow
def test_no_import_circles() -> None:
    """None at import time, and none for a type checker either (an import under
    ``if TYPE_CHECKING:`` is still two modules that know each other): every strongly
    connected group of modules (Tarjan's algorithm, which a depth-first walk that
    skips finished modules is not: it misses circles through them) is one module."""
    graph = _graph(for_type_checkers=True)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = [stack.pop()]
            while group[-1] != module:
                group.append(stack.pop())
            groups.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    # A package's __init__ importing its own submodule is how packages work, not a circle.
    real = [g for g in groups if len(g) > 1 and not all(m.startswith(g[0]) for m in g)]
    assert real == []
