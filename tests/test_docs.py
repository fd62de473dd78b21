"""Docs that cannot rot: every ```python block of the docs runs, and the site builds.

One test per Markdown page (README.md, DEVELOPERS.md, docs/*.md, the examples'
READMEs) runs the page's ```python blocks in order, in one shared namespace (so a
later block uses what an earlier one defined), as a script would: ``__name__`` is
``"__main__"``. The conventions (docs/testing.md and DEVELOPERS.md state them):

- Every fence names its language: ```python runs; ```bash for shell, ```text for
  output and diagrams, anything else as it is. An untagged fence fails the page,
  since it could hide Python that never runs; so does any other tag that names
  Python (```Python, ```py, ```python3, ```pycon, ...): only ```python runs.
- ``<!-- setup -->`` on the line before a fence marks a set-up block: one that
  exists only to define what later blocks use. It runs like any other, and its
  first line is a ``# Set-up`` comment, so readers of the rendered page see it too.
- ``<!-- signature -->`` before a ```python fence marks a call signature
  (``RedisRWLock(client, name, *, lease=30.0, ...)``, ``LockFactory.rwlock(name) ->
  TwoTierRWLock``): it is not run but compared with the real signature (parameter
  names, kinds and defaults, return annotation).
- Blocks with a top-level ``await`` run as in ``python -m asyncio``: on one event
  loop for the whole page. A page that leaves a task running on it fails: blocks
  close what they start (``await guard.aclose()``, ``await engine.dispose()``). So
  does a task on it that ended with an exception nobody retrieved (never awaited).
- The test sets ``REDIS_URL`` (the test Redis, as for the rest of the suite) and
  ``CACHE_NAMESPACE`` (a namespace no other test uses, its keys deleted afterwards);
  blocks read both with ``os.environ.get(..., <default>)``, so they also run as
  written on a reader's machine. A page that reads ``REDIS_CLUSTER_URL`` or
  ``REDIS_SENTINEL_URL`` gets the session's throwaway cluster or Sentinel set
  (``tests/deployment_fixtures.py``).

Why a collector of our own: mktestdocs runs blocks in a shared namespace but has no
top-level ``await``, no set-up marker and reports no block number; pytest-examples
runs each block on its own (or with hand-threaded globals) and is built around
formatting and ``print`` checks. What we need is small: fences, two markers, one
namespace, one event loop, and errors that name the page, the block and the line.

The site tests build the docs site (``mkdocs build --strict``, never ``--quiet``: with
mkdocs 1.6 that also hides the warnings ``--strict`` counts), so the README's test
command also catches a broken link, anchor or docstring in the API reference.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import gc
import importlib
import inspect
import os
import re
import shlex
import shutil
import subprocess
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from cacheguard_testing.zookeeper import zookeeper_installed

from cacheguard.aio import default_async_watchdog
from cacheguard.locks.redis.watchdog import default_watchdog
from cacheguard.testing import require_real_redis

pytest_plugins = ["tests.deployment_fixtures"]

ROOT = Path(__file__).resolve().parent.parent


def doc_pages() -> list[Path]:
    """The pages whose blocks run: the repository's Markdown docs."""
    pages = [ROOT / "README.md", ROOT / "DEVELOPERS.md"]
    pages += sorted((ROOT / "docs").glob("*.md"))
    pages += sorted((ROOT / "examples").glob("*/README.md"))
    return [page for page in pages if page.is_file()]


# -- reading the fences ------------------------------------------------------------------------

PYTHON = "python"  # the one tag that runs
# Any other tag that names Python is refused: its block would never run.
_NAMES_PYTHON = re.compile(r"py|.*python", re.IGNORECASE)
MARKERS = frozenset({"setup", "signature"})
_OPENING = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<name>[a-z-]+)\s*-->\s*$")
SETUP_COMMENT = "# Set-up"


class DocFormatError(Exception):
    """A page breaks the fence conventions (so a block could escape the check)."""


class BlockFailed(Exception):
    """A block raised: the message names the page, the block and the line."""


@dataclass(frozen=True)
class Block:
    page: Path
    number: int  # 1-based, among the page's python blocks (0 for other languages)
    line: int  # line of the block's first code line in the page (1-based)
    language: str
    code: str
    marker: str | None

    @property
    def python(self) -> bool:
        return self.language == PYTHON

    @property
    def setup(self) -> bool:
        return self.marker == "setup"

    def where(self) -> str:
        kind = ", set-up" if self.setup else ""
        return f"{display(self.page)}: python block {self.number} (line {self.line}{kind})"


def display(page: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(page.relative_to(ROOT))
    return page.name


def read_blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order; fails on a fence that breaks the rules."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    index = 0
    marker: str | None = None
    while index < len(lines):
        line = lines[index]
        found = _MARKER.match(line)
        if found and found.group("name") in MARKERS:
            marker = found.group("name")
            index += 1
            continue
        opening = _OPENING.match(line)
        if opening is None:
            if line.strip():
                marker = None  # a marker belongs to the fence right after it
            index += 1
            continue
        fence, indent = opening.group("fence"), len(opening.group("indent"))
        language = opening.group("info").strip().split(" ", 1)[0].strip("{}.")
        start = index + 1
        end = start
        while end < len(lines) and not _closes(lines[end], fence):
            end += 1
        where = f"{display(page)}: line {index + 1}"
        if end == len(lines):
            raise DocFormatError(f"{where}: the fence is never closed")
        if not language:
            raise DocFormatError(
                f"{where}: a fence without a language; tag it (```python runs, ```bash for "
                "shell, ```text for output and diagrams)"
            )
        if language != PYTHON and _NAMES_PYTHON.match(language):
            raise DocFormatError(
                f"{where}: a ```{language} block never runs; only ```python blocks run "
                "(an interactive session too: its code in ```python, its output in ```text)"
            )
        code = "\n".join(_dedent(text, indent) for text in lines[start:end]) + "\n"
        number = sum(b.python for b in blocks) + 1 if language == PYTHON else 0
        block = Block(page, number, start + 1, language, code, marker)
        _check_marker(block, where)
        blocks.append(block)
        marker = None
        index = end + 1
    return blocks


def _closes(line: str, fence: str) -> bool:
    stripped = line.strip()
    return stripped.startswith(fence) and set(stripped) == {fence[0]}


def _dedent(text: str, indent: int) -> str:
    return text[min(indent, len(text) - len(text.lstrip())) :]


def _check_marker(block: Block, where: str) -> None:
    if block.marker is not None and not block.python:
        raise DocFormatError(f"{where}: <!-- {block.marker} --> marks a {block.language} block")
    first = block.code.lstrip("\n").split("\n", 1)[0]
    if block.setup and not first.startswith(SETUP_COMMENT):
        raise DocFormatError(
            f"{where}: a set-up block starts with a {SETUP_COMMENT!r} comment, "
            "so that readers of the rendered page see it"
        )
    if block.python and first.startswith(SETUP_COMMENT) and not block.setup:
        raise DocFormatError(f"{where}: a {SETUP_COMMENT!r} block needs <!-- setup --> above it")


# -- running the blocks ------------------------------------------------------------------------


@dataclass
class PageRun:
    blocks_run: int = 0
    signatures_checked: int = 0


def run_page(page: Path, extra_globals: dict[str, Any] | None = None) -> PageRun:
    """Run the ```python blocks of ``page`` in order in one namespace; check its
    signature blocks. Raises :class:`BlockFailed` naming the block that failed, or
    saying what the blocks left behind (a lock held, a task running)."""
    blocks = [block for block in read_blocks(page) if block.python]
    namespace: dict[str, Any] = {"__name__": "__main__", **(extra_globals or {})}
    run = PageRun()
    loop: asyncio.AbstractEventLoop | None = None
    tasks: list[asyncio.Task[Any]] = []  # every task created on the page's loop
    held_before = len(default_watchdog())
    try:
        for block in blocks:
            if block.marker == "signature":
                check_signatures(block)
                run.signatures_checked += 1
                continue
            code = _compile(block)
            try:
                if code.co_flags & inspect.CO_COROUTINE:
                    if loop is None:
                        loop = _new_loop(tasks)
                    loop.run_until_complete(eval(code, namespace))
                else:
                    exec(code, namespace)
            except (Exception, SystemExit) as exc:
                raise BlockFailed(_failure(block, exc)) from exc
            run.blocks_run += 1
        if len(default_watchdog()) > held_before:
            raise BlockFailed(f"{display(page)}: the blocks left a lock held (still watched)")
        if loop is not None:
            _nothing_left_on(page, loop, tasks)
    finally:
        namespace.clear()  # what the blocks made goes now, not at the next collection
        if loop is not None:
            _close_loop(loop)
        tasks.clear()
        gc.collect()
    return run


def _compile(block: Block) -> Any:
    # Padded so that tracebacks give the page's own line numbers.
    source = "\n" * (block.line - 1) + block.code
    try:
        return compile(
            source,
            str(block.page),
            "exec",
            flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
            dont_inherit=True,
        )
    except SyntaxError as exc:
        raise BlockFailed(f"{block.where()}: {exc.msg} at line {exc.lineno}") from exc


def _failure(block: Block, exc: BaseException) -> str:
    lines = [
        frame.lineno
        for frame in traceback.extract_tb(exc.__traceback__)
        if frame.filename == str(block.page) and frame.lineno is not None
    ]
    at = ""
    if lines:
        text = block.page.read_text(encoding="utf-8").splitlines()[lines[-1] - 1].strip()
        at = f" at line {lines[-1]}: {text}"
    return f"{block.where()} raised {type(exc).__name__}: {exc}{at}"


def _new_loop(tasks: list[asyncio.Task[Any]]) -> asyncio.AbstractEventLoop:
    """The page's event loop; every task created on it is appended to ``tasks``, so
    that one that failed unobserved is found even if the page kept no reference to
    it (asyncio only logs such an error when the task is collected, if ever)."""
    loop = asyncio.new_event_loop()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **options: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **options)
        tasks.append(task)
        return task

    loop.set_task_factory(factory)
    return loop


def _nothing_left_on(
    page: Path, loop: asyncio.AbstractEventLoop, tasks: list[asyncio.Task[Any]]
) -> None:
    """No lock held by a task, no task left running but the idle lease watchdog
    (one per loop, documented: it ends by itself at its next wake-up; stopped here),
    and no task that ended with an exception nobody retrieved."""

    async def settle() -> int:
        watchdog = default_async_watchdog()
        if len(watchdog):
            return len(watchdog)
        watchdog.close()
        current = asyncio.current_task()
        stopping = [t for t in asyncio.all_tasks() if t is not current and _is_watchdog(t)]
        await asyncio.gather(*stopping, return_exceptions=True)
        return 0

    if loop.run_until_complete(settle()):
        raise BlockFailed(f"{display(page)}: the blocks left a lock held by a task")
    left = [task for task in asyncio.all_tasks(loop) if not task.done()]
    if left:
        names = ", ".join(sorted(f"{task.get_name()} ({task.get_coro()})" for task in left))
        raise BlockFailed(
            f"{display(page)}: the blocks left {len(left)} task(s) running on the page's "
            f"event loop: {names}; close what they start (await guard.aclose(), ...)"
        )
    # _log_traceback is asyncio's own "exception not retrieved yet" flag (what it logs
    # "Task exception was never retrieved" by): awaiting the task, or its result() or
    # exception(), clears it; a cancelled task never sets it.
    unretrieved = [task for task in tasks if task.done() and task._log_traceback]
    if unretrieved:
        names = ", ".join(
            sorted(f"{task.get_name()} ({task.exception()!r})" for task in unretrieved)
        )
        raise BlockFailed(
            f"{display(page)}: {len(unretrieved)} task(s) on the page's event loop ended "
            f"with an exception nobody retrieved: {names}; await the tasks a block starts"
        )


def _is_watchdog(task: asyncio.Task[Any]) -> bool:
    return task.get_name() == "cacheguard-watchdog"


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    left = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in left:
        task.cancel()
    if left:
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


# -- signature blocks --------------------------------------------------------------------------


def check_signatures(block: Block) -> None:
    """Each statement of a signature block, ``Name(params)`` or ``Class.method(params) ->
    R`` (``self`` left out), must match the callable's real signature."""
    import time as time_module  # defaults such as timer=time.monotonic name it

    import cacheguard
    import cacheguard.aio
    import cacheguard.locks
    from cacheguard.backoff import Backoff  # the default of every lock's backoff=

    scope: dict[str, Any] = {"time": time_module, "Backoff": Backoff}
    for module in (cacheguard, cacheguard.aio, cacheguard.locks):
        scope.update({name: getattr(module, name) for name in module.__all__})
    for statement in _statements(block):
        shape = _SIGNATURE.fullmatch(statement)
        if shape is None:
            raise BlockFailed(f"{block.where()}: not a signature: {statement!r}")
        name, returns = shape.group("name"), shape.group("returns")
        owner, _, method = name.partition(".")
        if owner not in scope:
            raise BlockFailed(f"{block.where()}: {owner} is not in cacheguard's public API")
        real = inspect.signature(getattr(scope[owner], method) if method else scope[owner])
        actual = [
            (p.name, p.kind.name, _NO_DEFAULT if p.default is p.empty else p.default)
            for p in real.parameters.values()
            if not (method and p.name == "self")
        ]
        documented = _parameters(shape.group("params"), scope)
        if documented != actual:
            raise BlockFailed(
                f"{block.where()}: the documented signature of {name} is out of date\n"
                f"  documented: {_show(documented)}\n  real:       {_show(actual)}"
            )
        annotation = real.return_annotation
        annotation = annotation if isinstance(annotation, str) else annotation.__name__
        if returns is not None and annotation != returns.strip():
            raise BlockFailed(f"{block.where()}: {name} returns {annotation}, not {returns}")


_SIGNATURE = re.compile(
    r"(?P<name>[A-Za-z_][\w.]*)\((?P<params>.*)\)\s*(?:->(?P<returns>[^\n]+))?", re.DOTALL
)
_NO_DEFAULT = "<no default>"


def _statements(block: Block) -> Iterator[str]:
    """The block's statements: lines joined while a parenthesis is open."""
    current: list[str] = []
    for line in block.code.splitlines():
        if line.strip() or current:
            current.append(line)
        joined = "\n".join(current)
        if current and joined.count("(") == joined.count(")"):
            yield joined.strip()
            current = []
    if current:
        raise BlockFailed(f"{block.where()}: a parenthesis is never closed")


def _parameters(params: str, scope: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(name, kind, default) of a parameter list, its defaults evaluated in ``scope``."""
    tree = ast.parse(f"def _({params}): ...")
    args = tree.body[0].args  # type: ignore[attr-defined]

    def value(node: ast.expr | None) -> Any:
        return _NO_DEFAULT if node is None else eval(ast.unparse(node), dict(scope))

    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    found = [
        (a.arg, "POSITIONAL_ONLY" if a in args.posonlyargs else "POSITIONAL_OR_KEYWORD", value(d))
        for a, d in zip(positional, defaults, strict=True)
    ]
    if args.vararg is not None:
        found.append((args.vararg.arg, "VAR_POSITIONAL", _NO_DEFAULT))
    found += [
        (a.arg, "KEYWORD_ONLY", value(d))
        for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    ]
    if args.kwarg is not None:
        found.append((args.kwarg.arg, "VAR_KEYWORD", _NO_DEFAULT))
    return found


def _show(params: list[tuple[str, str, Any]]) -> str:
    return ", ".join(name if d is _NO_DEFAULT else f"{name}={d!r}" for name, _, d in params)


# -- the pages ---------------------------------------------------------------------------------

CLUSTER_URL = "REDIS_CLUSTER_URL"
SENTINEL_URL = "REDIS_SENTINEL_URL"


def _servers_the_page_needs(python: str) -> None:
    """A page whose blocks start a ZooKeeper or talk to PostgreSQL needs them: where one
    is missing, the page is skipped (a failure when real servers are required, as in CI)."""
    missing = []
    if "zookeeper_server(" in python and not zookeeper_installed():
        missing.append("ZooKeeper (apt-get install zookeeper)")
    if "postgresql+psycopg://" in python and not _postgres_answers():
        missing.append("PostgreSQL at DATABASE_URL or 127.0.0.1:5432")
    if missing:
        message = f"the page's blocks need {' and '.join(missing)}"
        if require_real_redis():
            raise AssertionError(message)
        pytest.skip(f"{message}; CI requires them")


def _postgres_answers() -> bool:
    import sqlalchemy

    url = os.environ.get("DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
    if not url.startswith("postgresql"):
        return False
    engine = sqlalchemy.create_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect():
            return True
    except Exception:
        return False
    finally:
        engine.dispose()


# The pages whose blocks take over a second (their locks' and outages' waits) run
# with the slow tests.
SLOW_PAGES = frozenset({"docs/locks.md", "docs/outage.md"})


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(page, marks=pytest.mark.slow)
        if page.relative_to(ROOT).as_posix() in SLOW_PAGES
        else page
        for page in doc_pages()
    ],
    ids=display,
)
def test_page_runs(
    page: Path,
    redis_url: str,
    namespace: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    python = "".join(block.code for block in read_blocks(page) if block.python)
    _servers_the_page_needs(python)
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("CACHE_NAMESPACE", namespace)
    cleanups = []
    if CLUSTER_URL in python:
        cluster = request.getfixturevalue("redis_cluster")
        nodes = ",".join(f"127.0.0.1:{node.port}" for node in cluster.nodes)
        monkeypatch.setenv(CLUSTER_URL, f"redis+cluster://{nodes}")
        cleanups += [master.url for master in cluster.masters()]
    if SENTINEL_URL in python:
        sentinels = request.getfixturevalue("sentinel_set")
        hosts = ",".join(f"{host}:{port}" for host, port in sentinels.sentinel_addresses)
        monkeypatch.setenv(SENTINEL_URL, f"redis+sentinel://{hosts}/{sentinels.master_name}")
        host, port = sentinels.master_address()
        cleanups.append(f"redis://{host}:{port}")
    try:
        run = run_page(page)
    finally:
        for url in cleanups:
            _delete_namespace(url, namespace)
    print(f"{display(page)}: {run.blocks_run} blocks run, {run.signatures_checked} signatures")


def _delete_namespace(url: str, namespace: str) -> None:
    with contextlib.suppress(redis.RedisError), redis.Redis.from_url(url, socket_timeout=2) as c:
        for key in list(c.scan_iter(match=f"{namespace}:*", count=1000)):
            c.delete(key)  # one by one: a cluster node's keys span several slots


# The flags of the site build. Never --quiet: with mkdocs 1.6 it also drops the
# warnings that --strict counts, and a broken link passes. The output is captured
# instead, and shown when the build fails.
BUILD_FLAGS = ("--strict",)


def build_site(
    project: Path, site: Path, flags: tuple[str, ...] = BUILD_FLAGS
) -> subprocess.CompletedProcess[str]:
    """``mkdocs build`` of ``project``'s mkdocs.yml into ``site``, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", *flags, "-d", str(site)],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


@pytest.mark.slow  # over a second: the whole suite runs it, -m 'not slow' does not
def test_the_docs_site_builds_strict(tmp_path: Path) -> None:
    """``mkdocs build --strict``: every page, link, anchor and API docstring renders."""
    site = tmp_path / "site"
    done = build_site(ROOT, site)
    assert done.returncode == 0, done.stdout + done.stderr
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    headings = set(re.findall(r'id="(cacheguard[\w.]*)"', api))
    missing = [
        f"{module}.{name}"
        for module, name in public_names()
        if not any(f"{documented}.{name}" in headings for documented in API_MODULES)
    ]
    assert not missing, f"docs/api.md leaves out {missing}"
    # tools/mkdocs_hooks.py renders the docstrings' Sphinx roles as code
    assert not re.search(r":(class|func|meth|mod|data|attr|exc|obj):", api)


def ci_build_flags() -> tuple[str, ...]:
    """The flags of .ci/run's ``mkdocs build`` (those between ``build`` and ``-d``)."""
    for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines():
        if "mkdocs" not in line or line.lstrip().startswith("#"):
            continue
        words = shlex.split(line, comments=True)
        if any(word.endswith("/mkdocs") for word in words) and "build" in words:
            flags = words[words.index("build") + 1 :]
            return tuple(flags[: flags.index("-d")] if "-d" in flags else flags)
    raise AssertionError(".ci/run no longer builds the docs site with mkdocs")


def copied_site(tmp_path: Path) -> Path:
    """The site's sources (mkdocs.yml, its hooks, docs/) copied into ``tmp_path``, the
    API page a heading only: rendering the docstrings takes most of a build's time,
    and the whole site is built by test_the_docs_site_builds_strict."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "docs", project / "docs")
    shutil.copy2(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    (project / "tools").mkdir()
    shutil.copy2(ROOT / "tools" / "mkdocs_hooks.py", project / "tools" / "mkdocs_hooks.py")
    (project / "cacheguard").symlink_to(ROOT / "cacheguard")  # mkdocstrings reads it there
    (project / "docs" / "api.md").write_text("# API reference\n", encoding="utf-8")
    return project


@pytest.mark.slow
def test_a_broken_link_or_anchor_fails_the_strict_build(tmp_path: Path) -> None:
    """The site as it is (mkdocs.yml, its hooks, docs/) copied, with one link to a
    missing page and one to a missing heading added to index.md: the build with
    this file's flags, and with .ci/run's (once if they are the same), fails and
    names both."""
    project = copied_site(tmp_path)
    index = project / "docs" / "index.md"
    broken = "\nSee [a page](no-such-page.md) and [a heading](guide.md#no-such-heading).\n"
    index.write_text(index.read_text(encoding="utf-8") + broken, encoding="utf-8")
    for n, flags in enumerate(dict.fromkeys([BUILD_FLAGS, ci_build_flags()])):
        done = build_site(project, tmp_path / f"site{n}", flags)
        output = done.stdout + done.stderr
        assert done.returncode != 0, f"mkdocs build {' '.join(flags)} passed:\n{output}"
        assert "no-such-page.md" in output, output
        assert "no-such-heading" in output, output


@pytest.mark.slow
def test_the_copied_site_without_its_breakage_builds(tmp_path: Path) -> None:
    """The copy the test above breaks builds clean before it is broken: its failure
    is the links', not the copy's (an API page reduced to a heading, say)."""
    project = copied_site(tmp_path)
    done = build_site(project, tmp_path / "site", ci_build_flags())
    assert done.returncode == 0, done.stdout + done.stderr


# The modules docs/api.md documents; a name exported by several (cacheguard re-exports
# the locks and the exceptions) is documented once, under any of them.
API_MODULES = (
    "cacheguard",
    "cacheguard.aio",
    "cacheguard.locks",
    "cacheguard.integrations.sqlalchemy",
    "cacheguard.exceptions",
    "cacheguard.integrations.prometheus",
    "cacheguard.integrations.dogpile",
)


def public_names() -> Iterator[tuple[str, str]]:
    """(module, name) for every name in the ``__all__`` of the documented modules."""
    for module_name in API_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            if not name.startswith("__"):
                yield module_name, name


# -- the collector itself ----------------------------------------------------------------------


def write_page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text, encoding="utf-8")
    return page


def test_blocks_run_in_order_in_one_namespace_set_up_blocks_included(tmp_path: Path) -> None:
    page = write_page(
        tmp_path,
        "# Page\n\n<!-- setup -->\n```python\n# Set-up: a list\nnames = ['set-up']\n```\n\n"
        "Text.\n\n```bash\nexit 1\n```\n\n```python\nnames.append('second')\n```\n\n"
        "```text\nraise SystemExit(1)\n```\n\n```python\nseen.extend(names)\n```\n",
    )
    seen: list[str] = []
    run = run_page(page, {"seen": seen})
    assert seen == ["set-up", "second"]
    assert run.blocks_run == 3


def test_a_raising_block_fails_with_the_page_the_block_and_the_line(tmp_path: Path) -> None:
    page = write_page(
        tmp_path,
        "```python\nx = 1\n```\n\n```text\noutput\n```\n\n"
        "```python\ny = 2\nassert x == 2, 'x is one'\n```\n",
    )
    with pytest.raises(BlockFailed) as failed:
        run_page(page)
    message = str(failed.value)
    assert "page.md: python block 2 (line 10)" in message
    assert "AssertionError: x is one at line 11: assert x == 2" in message


def test_a_set_up_block_that_raises_fails_the_page(tmp_path: Path) -> None:
    page = write_page(
        tmp_path, "<!-- setup -->\n```python\n# Set-up\nraise RuntimeError('no')\n```\n"
    )
    with pytest.raises(BlockFailed, match=r"python block 1 \(line 3, set-up\) raised RuntimeError"):
        run_page(page)


def test_top_level_await_blocks_share_one_event_loop(tmp_path: Path) -> None:
    page = write_page(
        tmp_path,
        "```python\nimport asyncio\nawait asyncio.sleep(0)\nfirst = asyncio.get_running_loop()\n"
        "```\n\n```python\nawait asyncio.sleep(0)\nloops.append(first)\n"
        "loops.append(asyncio.get_running_loop())\n```\n",
    )
    loops: list[object] = []
    assert run_page(page, {"loops": loops}).blocks_run == 2
    assert len(loops) == 2
    assert loops[0] is loops[1]


def test_a_task_left_running_fails_the_page(tmp_path: Path) -> None:
    page = write_page(
        tmp_path,
        "```python\nimport asyncio\nforever = asyncio.Event()\n"
        "task = asyncio.create_task(forever.wait(), name='left-behind')\nawait asyncio.sleep(0)\n"
        "```\n",
    )
    with pytest.raises(BlockFailed, match=r"left 1 task.*left-behind"):
        run_page(page)


@pytest.mark.slow
@pytest.mark.parametrize("kept", [True, False], ids=["kept", "dropped"])
def test_a_task_that_failed_unobserved_fails_the_page(tmp_path: Path, kept: bool) -> None:
    """The task raised, the page waited for it to end but never looked at its result,
    whether or not it kept a reference to the task."""
    start = "asyncio.create_task(fail(), name='forgotten')"
    wait = (
        f"task = {start}\nawait asyncio.wait([task])\n"
        if kept
        else f"await asyncio.wait([{start}])\n"
    )
    page = write_page(
        tmp_path,
        "```python\nimport asyncio\n\nasync def fail():\n    raise ValueError('nobody looked')\n\n"
        f"{wait}```\n",
    )
    with pytest.raises(BlockFailed, match=r"1 task.* nobody retrieved: forgotten \(ValueError"):
        run_page(page)


def test_a_task_whose_exception_was_handled_passes(tmp_path: Path) -> None:
    page = write_page(
        tmp_path,
        "```python\nimport asyncio\n\nasync def fail():\n    raise ValueError('handled')\n\n"
        "task = asyncio.create_task(fail(), name='observed')\ntry:\n    await task\n"
        "except ValueError:\n    pass\n"
        "cancelled = asyncio.create_task(asyncio.Event().wait(), name='cancelled')\n"
        "await asyncio.sleep(0)\ncancelled.cancel()\nawait asyncio.wait([cancelled])\n```\n",
    )
    assert run_page(page).blocks_run == 1


@pytest.mark.slow
def test_a_lock_left_held_fails_the_page(
    tmp_path: Path, redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("CACHE_NAMESPACE", namespace)
    held: list[Any] = []
    for opening, awaited in [("", ""), ("import asyncio\nawait asyncio.sleep(0)\n", "await ")]:
        client = "redis.asyncio.Redis" if awaited else "redis.Redis"
        lock = "AsyncRedisRWLock" if awaited else "RedisRWLock"
        page = write_page(
            tmp_path,
            f"```python\n{opening}import os\nimport redis.asyncio\n"
            f"from cacheguard.aio import AsyncRedisRWLock\nfrom cacheguard import RedisRWLock\n"
            f"client = {client}.from_url(os.environ['REDIS_URL'])\n"
            f"lock = {lock}(client, '{lock}', namespace=os.environ['CACHE_NAMESPACE'])\n"
            f"held.append((client, {awaited}lock.acquire_write()))\n```\n",
        )
        with pytest.raises(BlockFailed, match="left a lock held"):
            run_page(page, {"held": held})
    client, handle = held[0]
    handle.release()  # the sync one; the asyncio one's keys go with the namespace
    client.close()


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("```\nprint('never run')\n```\n", "a fence without a language"),
        ("```python\nx = 1\n", "never closed"),
        ("<!-- setup -->\n```python\nx = 1\n```\n", "starts with a '# Set-up' comment"),
        ("```python\n# Set-up: x\nx = 1\n```\n", "needs <!-- setup -->"),
        ("<!-- setup -->\n```bash\necho\n```\n", "marks a bash block"),
        ("```Python\nraise SystemExit(1)\n```\n", "a ```Python block never runs"),
        ("```py\nraise SystemExit(1)\n```\n", "a ```py block never runs"),
        ("~~~python3\nraise SystemExit(1)\n~~~\n", "a ```python3 block never runs"),
        ("```pycon\n>>> raise SystemExit(1)\n```\n", "a ```pycon block never runs"),
        ("```{.PYTHON}\nraise SystemExit(1)\n```\n", "a ```PYTHON block never runs"),
        ("```ipython\nraise SystemExit(1)\n```\n", "a ```ipython block never runs"),
    ],
)
def test_fences_that_could_hide_a_block_fail_the_page(
    tmp_path: Path, text: str, complaint: str
) -> None:
    with pytest.raises(DocFormatError, match=re.escape(complaint)):
        run_page(write_page(tmp_path, text))


@pytest.mark.slow
def test_signature_blocks_are_compared_with_the_real_signature(tmp_path: Path) -> None:
    good = (
        "<!-- signature -->\n```python\n"
        'LockFactory(client=None, *, namespace="cg", lease=30.0, timeout=30.0,\n'
        "            watchdog=True, on_lost=None, store=None, timer=time.monotonic,\n"
        "            cohort_limit=16)\n"
        "LockFactory.rwlock(name) -> TwoTierRWLock\n```\n"
    )
    assert run_page(write_page(tmp_path, good)).signatures_checked == 1
    for stale, complaint in [
        (good.replace("lease=30.0", "lease=10.0"), "out of date"),
        (good.replace("timeout=30.0,", ""), "out of date"),
        (good.replace("*, ", ""), "out of date"),
        (good.replace("-> TwoTierRWLock", "-> LocalRWLock"), "returns TwoTierRWLock"),
    ]:
        with pytest.raises(BlockFailed, match=complaint):
            run_page(write_page(tmp_path, stale))


def test_every_page_has_its_test() -> None:
    names = {display(page) for page in doc_pages()}
    assert {"README.md", "docs/guide.md", "examples/menu_service/README.md"} <= names
