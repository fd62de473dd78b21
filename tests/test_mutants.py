"""The mutation check's list stays in step with the code and the docs.

tools/mutants.py runs the mutants (CI does, after the suite); these checks are
the cheap part: every patch still applies exactly once, every named test exists,
and docs/testing.md lists every mutant.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutants", ROOT / "tools" / "mutants.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


TOOL = load_tool()


def test_at_least_fifteen_distinct_mutants() -> None:
    ids = [m.id for m in TOOL.MUTANTS]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 15


@pytest.mark.parametrize("mutant", TOOL.MUTANTS, ids=lambda m: m.id)
def test_mutant_applies_once(mutant: Any) -> None:
    """Each patch applies exactly once inside its anchor (MutantError's report says what
    changed); a file that moved costs a warning, as does a mutant naming no anchor."""
    site = TOOL.locate(mutant, ROOT)
    if site.moved_from:
        warnings.warn(TOOL.moved_warning(mutant, site).removeprefix("warning: "), stacklevel=1)
    if not mutant.within and site.file.endswith(".py"):  # anchors name Python defs
        text = (ROOT / site.file).read_text(encoding="utf-8")
        anchor = TOOL.suggested_anchor(text, mutant.find)
        warnings.warn(
            f"mutant {mutant.id} names no anchor" + (f': add within="{anchor}"' if anchor else ""),
            stacklevel=1,
        )
    assert mutant.find != mutant.replace


@functools.cache  # one parse per test file, not one per mutant naming it
def _test_names(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return frozenset(
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name.startswith("test_")
    )


@pytest.mark.parametrize("mutant", TOOL.MUTANTS, ids=lambda m: m.id)
def test_named_tests_exist(mutant: object) -> None:
    assert mutant.tests  # type: ignore[attr-defined]
    for node_id in mutant.tests:  # type: ignore[attr-defined]
        file, _, name = node_id.partition("::")
        assert (ROOT / file).is_file(), node_id
        assert name.split("[", 1)[0] in _test_names(ROOT / file), node_id


def test_docs_list_every_mutant() -> None:
    docs = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    missing = [m.id for m in TOOL.MUTANTS if f"`{m.id}`" not in docs]
    assert not missing


def test_the_hypothesis_plugin_is_loaded_only_for_tests_that_use_it() -> None:
    """A mutant's pytest start leaves hypothesis's plugin out unless one of its test
    files uses hypothesis (its @given tests then run with the plugin, as in the suite)."""
    with_it = TOOL.pytest_command(["tests/test_keys.py::test_x", "tests/test_cache.py::test_y"])
    without = TOOL.pytest_command(["tests/test_cache.py::test_y"])
    assert "no:hypothesispytest" not in with_it
    assert "no:hypothesispytest" in without
    assert "no:hypothesispytest" not in TOOL.pytest_command(["tests/no_such_file.py::test_z"])


def test_a_mutants_tests_keep_bytecode_caches(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """PYTHONDONTWRITEBYTECODE in the caller's environment does not reach a mutant's
    pytest: its scratch tree keeps the caches from one mutant to the next."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    seen: dict[str, str] = {}
    real_popen = subprocess.Popen

    def popen(command: list[str], **kwargs: Any) -> subprocess.Popen[str]:
        seen.update(kwargs["env"])
        return real_popen([sys.executable, "-c", ""], **kwargs)

    monkeypatch.setattr(TOOL.subprocess, "Popen", popen)
    TOOL.run_tests(tmp_path, ["tests/test_cache.py::test_y"])
    assert seen, "the tests were not run"
    assert "PYTHONDONTWRITEBYTECODE" not in seen
    assert seen["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path)


# -- what a mutant's tests start goes with them --------------------------------------------

# A test that starts a process it never stops (as a fixture a mutant broke would leave
# a server), writes its pid and its own, then passes or hangs.
LEAKY_TEST = """\
import os, subprocess, sys, threading

def test_leaks():
    child = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"])
    with open("pids.tmp", "w") as out:
        out.write(f"{os.getpid()} {child.pid}")
    os.rename("pids.tmp", "pids")
    if os.environ.get("HANG"):
        threading.Event().wait()
"""


def _alive(pid: int) -> bool:
    """Running (a zombie left for a reaper that may never come counts as gone)."""
    if not Path("/proc/self/stat").exists():  # not Linux: no zombie to tell apart
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _gone(pids: list[int], within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def leaky_tree(tmp_path: Path) -> Iterator[Path]:
    """A tree holding LEAKY_TEST; what it started is killed afterwards whatever the
    outcome (a failing check must not leave its processes to the next tests)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "test_leaky.py").write_text(LEAKY_TEST)
    yield tree
    if (tree / "pids").exists():
        for pid in (int(pid) for pid in (tree / "pids").read_text().split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _pids(tree: Path, within: float = 30.0) -> list[int]:
    deadline = time.monotonic() + within
    while not (tree / "pids").exists():
        assert time.monotonic() < deadline, "the test never started its child"
        time.sleep(0.05)
    return [int(pid) for pid in (tree / "pids").read_text().split()]


@pytest.mark.slow
def test_a_mutants_run_leaves_nothing_running(leaky_tree: Path) -> None:
    """A process the tests started and left running is killed when they end."""
    tree = leaky_tree
    done = TOOL.run_tests(tree, ["test_leaky.py"])
    assert done.returncode == 0, done.stdout + done.stderr
    _, child = _pids(tree)
    assert _gone([child]), "the process the tests left running still runs"


@pytest.mark.slow
@pytest.mark.timeout(30)  # without the kill at the time-out, the run would never end
def test_a_hung_mutants_run_is_killed_with_all_it_started(
    leaky_tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HANG", "1")
    monkeypatch.setattr(TOOL, "RUN_TIMEOUT", 5.0)
    tree = leaky_tree
    done = TOOL.run_tests(tree, ["test_leaky.py"])
    assert done.returncode == 124
    assert "did not end within 5 s" in done.stderr
    assert _gone(_pids(tree, within=0))


# Runs a hung mutant's tests in a worker thread, as the check's jobs do, with the
# check's stop signals.
STOPPED_CHECK = """\
import importlib.util, sys, threading
from pathlib import Path

spec = importlib.util.spec_from_file_location("mutants", sys.argv[1])
tool = importlib.util.module_from_spec(spec)
sys.modules["mutants"] = tool
spec.loader.exec_module(tool)
with tool.stop_signals():
    job = threading.Thread(target=tool.run_tests, args=(Path(sys.argv[2]), ["test_leaky.py"]))
    job.start()
    job.join()
"""


@pytest.mark.slow
def test_a_stopped_check_kills_its_runs_and_what_they_started(
    leaky_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM (CI's cleanup, or a Ctrl-C) ends the check at once and takes every run
    under way with it, servers its tests started included: the runs are sessions of
    their own, which the terminal's signals do not reach."""
    monkeypatch.setenv("HANG", "1")
    tree = leaky_tree
    (tmp_path / "check.py").write_text(STOPPED_CHECK)
    check = subprocess.Popen(
        [sys.executable, str(tmp_path / "check.py"), str(ROOT / "tools" / "mutants.py"), str(tree)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        pids = _pids(tree)
        check.send_signal(signal.SIGTERM)
        check.wait(20)
    finally:
        check.kill()
        output = check.communicate()[0]
    assert check.returncode == 128 + signal.SIGTERM, output
    assert _gone(pids), "a run, or what it started, outlived the stopped check"


def test_jobs_check_mutants_at_the_same_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--jobs 2``: two mutants are checked at once (each waits here for the other)."""
    import threading

    both_running = threading.Barrier(2, timeout=10)

    def check_one(mutant: object, tree: Path) -> tuple[str, str]:
        both_running.wait()  # serially, the first would wait alone and break the barrier
        return "killed", "fake"

    monkeypatch.setattr(TOOL, "scratch_copy", lambda destination: destination)
    monkeypatch.setattr(TOOL, "check_imports_from", lambda tree: None)
    monkeypatch.setattr(TOOL, "check_one", check_one)
    first, second = TOOL.MUTANTS[0].id, TOOL.MUTANTS[1].id
    assert TOOL.main(["--only", first, second, "--jobs", "2"]) == 0


def test_no_mutant_is_checked_after_a_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop during the first mutant's run: the others are not checked (a stop
    signal's handler sets the flag, as here, and kills the run, which raises Stopped)."""
    checked: list[str] = []

    def check_one(mutant: Any, tree: Path) -> tuple[str, str]:
        checked.append(mutant.id)
        TOOL._STOPPING.set()
        raise TOOL.Stopped("stopped")

    monkeypatch.setattr(TOOL, "scratch_copy", lambda destination: destination)
    monkeypatch.setattr(TOOL, "check_imports_from", lambda tree: None)
    monkeypatch.setattr(TOOL, "check_one", check_one)
    try:
        TOOL.check([m.id for m in TOOL.MUTANTS[:3]], jobs=1)
    finally:
        TOOL._STOPPING.clear()
    assert checked == [TOOL.MUTANTS[0].id]


# -- anchors: a mutant applies inside its definition, found again when it moved -------------
# (on small trees of their own, never the real package)

LOCKS = """\
class Lock:
    def acquire(self) -> bool:
        if self.held:
            return False
        self.held = True
        return True

    def release(self) -> None:
        self.held = False
"""

SCRIPTS = '''\
_BODY = """
-- KEYS[1]: the counter; ARGV: none
redis.call('INCR', KEYS[1])
"""


def run_body() -> str:
    return "redis.call('INCR', KEYS[1])"
'''


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def fake(file: str, find: str, replace: str = "", within: str = "") -> Any:
    return TOOL.Mutant(
        "fake-mutant", "a fake guarantee", file, find, replace, ("tests/x.py::test_x",), within
    )


def test_a_patch_applies_once_inside_its_anchor_only(tmp_path: Path) -> None:
    tree = make_tree(tmp_path, {"cacheguard/locks.py": LOCKS})
    # twice in the file: without an anchor this find text does not apply
    with pytest.raises(TOOL.MutantError, match=r"occurs twice in cacheguard/locks.py"):
        TOOL.locate(fake("cacheguard/locks.py", "        self.held = "), tree)
    mutant = fake(
        "cacheguard/locks.py", "        self.held = ", "        self.was = ", "Lock.release"
    )
    path, original = TOOL.apply(mutant, tree)
    assert original == LOCKS
    assert path.read_text(encoding="utf-8") == LOCKS.replace(
        "        self.held = False", "        self.was = False"
    )


def test_a_lua_scripts_constant_is_an_anchor(tmp_path: Path) -> None:
    tree = make_tree(tmp_path, {"cacheguard/scripts.py": SCRIPTS})
    mutant = fake("cacheguard/scripts.py", "redis.call('INCR', KEYS[1])\n", "", "_BODY")
    site = TOOL.locate(mutant, tree)
    assert (site.where, site.first, site.last) == ("cacheguard/scripts.py::_BODY", 1, 4)
    path, _ = TOOL.apply(mutant, tree)
    assert path.read_text(encoding="utf-8").count("redis.call('INCR', KEYS[1])") == 1
    assert "return \"redis.call('INCR', KEYS[1])\"" in path.read_text(encoding="utf-8")


def test_a_moved_file_is_found_by_its_anchor(tmp_path: Path) -> None:
    tree = make_tree(tmp_path, {"cacheguard/locking/lock.py": "import os\n\n\n" + LOCKS})
    mutant = fake("cacheguard/locks.py", "        self.held = False\n", "", "Lock.release")
    site = TOOL.locate(mutant, tree)
    assert site.file == "cacheguard/locking/lock.py"
    assert site.moved_from == "cacheguard/locks.py"
    assert (site.first, site.last) == (11, 12)
    path, _ = TOOL.apply(mutant, tree)
    assert path == tree / "cacheguard/locking/lock.py"
    assert "self.held = False" not in path.read_text(encoding="utf-8")
    assert 'update its file= to "cacheguard/locking/lock.py"' in TOOL.moved_warning(mutant, site)


def test_a_function_moved_to_another_module_is_found_by_its_anchor(tmp_path: Path) -> None:
    tree = make_tree(
        tmp_path,
        {
            "cacheguard/flows.py": "def other_flow() -> int:\n    return 1\n",
            "cacheguard/flows/acquire.py": "def acquire_flow() -> int:\n    return 2\n",
        },
    )
    mutant = fake("cacheguard/flows.py", "    return 2\n", "    return 3\n", "acquire_flow")
    site = TOOL.locate(mutant, tree)
    assert (site.file, site.moved_from) == ("cacheguard/flows/acquire.py", "cacheguard/flows.py")
    # a shim left behind under the old name: the code is where the find text is
    shim = (
        "from cacheguard.flows import acquire as _acquire\n\n\n"
        "def acquire_flow() -> int:\n    return _acquire.acquire_flow()\n"
    )
    (tree / "cacheguard/flows.py").write_text(shim, encoding="utf-8")
    site = TOOL.locate(mutant, tree)
    assert site.file == "cacheguard/flows/acquire.py"
    assert "still defines it" in site.note
    # a same-named definition that the old module does not import is not where its
    # code went (a twin, say): an error, never a patch there
    alone = "def acquire_flow() -> int:\n    return 4\n"
    (tree / "cacheguard/flows.py").write_text(alone, encoding="utf-8")
    with pytest.raises(TOOL.MutantError, match="find text is not in `acquire_flow`"):
        TOOL.locate(mutant, tree)


def test_an_anchor_defined_in_two_modules_is_ambiguous(tmp_path: Path) -> None:
    tree = make_tree(tmp_path, {"cacheguard/sync/lock.py": LOCKS, "cacheguard/aio/lock.py": LOCKS})
    mutant = fake("cacheguard/locks.py", "        self.held = False\n", "", "Lock.release")
    with pytest.raises(TOOL.MutantError) as error:
        TOOL.locate(mutant, tree)
    report = str(error.value)
    assert report.startswith("fake-mutant: its anchor `Lock.release` is ambiguous")
    assert "cacheguard/locks.py does not exist" in report
    assert "cacheguard/aio/lock.py lines 8-9: the find text occurs once" in report
    assert "cacheguard/sync/lock.py lines 8-9: the find text occurs once" in report
    assert "set file= to the module meant" in report
    # where the find text tells the twins apart, it chooses
    asyncio_twin = LOCKS.replace("self.held = False", "self.held = await self._gone()")
    (tree / "cacheguard/aio/lock.py").write_text(asyncio_twin, encoding="utf-8")
    site = TOOL.locate(mutant, tree)
    assert (site.file, site.note) == (
        "cacheguard/sync/lock.py",
        "also defined in cacheguard/aio/lock.py",
    )


def test_an_anchor_defined_twice_in_its_file_is_ambiguous(tmp_path: Path) -> None:
    twice = LOCKS + "\n    @property\n    def release(self) -> None:\n        pass\n"
    tree = make_tree(tmp_path, {"cacheguard/locks.py": twice})
    mutant = fake("cacheguard/locks.py", "        self.held = False\n", "", "Lock.release")
    with pytest.raises(
        TOOL.MutantError,
        match=r"`Lock.release` is ambiguous: cacheguard/locks.py "
        r"defines it 2 times \(lines 8, 11\)",
    ):
        TOOL.locate(mutant, tree)


def test_a_drifted_find_text_is_reported_with_the_closest_lines(tmp_path: Path) -> None:
    drifted = LOCKS.replace("        self.held = False\n", "        self.held = None\n")
    tree = make_tree(tmp_path, {"cacheguard/locks.py": drifted})
    mutant = fake("cacheguard/locks.py", "        self.held = False\n", "", "Lock.release")
    with pytest.raises(TOOL.MutantError) as error:
        TOOL.locate(mutant, tree)
    lines = str(error.value).splitlines()
    assert lines[0] == (
        "fake-mutant: its find text is not in `Lock.release` (cacheguard/locks.py, lines 8-9)"
    )
    assert lines[1].startswith("    closest lines now, line 9 (")
    assert "      -         self.held = False" in lines
    assert "      +         self.held = None" in lines
    assert lines[-1] == "    update the mutant's find (and replace) to today's code"
    # the code moved to another definition: the report says which
    moved = drifted.replace("        return True\n", "        self.held = False\n")
    (tree / "cacheguard/locks.py").write_text(moved, encoding="utf-8")
    with pytest.raises(TOOL.MutantError) as error:
        TOOL.locate(mutant, tree)
    lines = str(error.value).splitlines()
    assert '    the find text occurs once in cacheguard/locks.py, within="Lock.acquire"' in lines
    assert lines[-1].endswith(", or its anchor to where the find text is now")


def test_a_find_text_twice_inside_its_anchor_is_reported_with_both_places(tmp_path: Path) -> None:
    tree = make_tree(tmp_path, {"cacheguard/locks.py": LOCKS})
    mutant = fake("cacheguard/locks.py", "        self.held", "", "Lock")
    with pytest.raises(TOOL.MutantError) as error:
        TOOL.locate(mutant, tree)
    assert str(error.value).splitlines()[0] == (
        "fake-mutant: its find text occurs twice in `Lock` (cacheguard/locks.py, lines 1-9): "
        "at lines 5 (in `Lock.acquire`), 9 (in `Lock.release`)"
    )


def test_a_missing_anchor_is_reported_with_names_like_it_and_the_find_text(
    tmp_path: Path,
) -> None:
    renamed = LOCKS.replace("class Lock:", "class Mutex:")
    tree = make_tree(tmp_path, {"cacheguard/locks.py": renamed})
    mutant = fake("cacheguard/locks.py", "        self.held = False\n", "", "Lock.release")
    with pytest.raises(TOOL.MutantError) as error:
        TOOL.locate(mutant, tree)
    lines = str(error.value).splitlines()
    assert lines[0] == (
        "fake-mutant: its anchor `Lock.release` is missing: cacheguard/locks.py no longer "
        "defines it, nor does any module of cacheguard/"
    )
    assert "    a definition named like it: `Mutex.release` in cacheguard/locks.py" in lines
    assert '    the find text occurs once in cacheguard/locks.py, within="Mutex.release"' in lines


def fake_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mutant: Any
) -> tuple[int, list[str]]:
    """Run ``main`` on ``mutant`` in the tree at ``tmp_path``: its tests 'fail' at once,
    and what the patched files held while they ran is returned."""
    seen: list[str] = []

    def run_tests(tree: Path, tests: Any, *extra: str) -> subprocess.CompletedProcess[str]:
        seen.extend(p.read_text(encoding="utf-8") for p in sorted(tree.rglob("*.py")))
        return subprocess.CompletedProcess([], 1, "1 failed", "")

    monkeypatch.setattr(TOOL, "ROOT", tmp_path)
    monkeypatch.setattr(TOOL, "MUTANTS", (mutant,))
    monkeypatch.setattr(TOOL, "scratch_copy", lambda destination: tmp_path)
    monkeypatch.setattr(TOOL, "check_imports_from", lambda tree: None)
    monkeypatch.setattr(TOOL, "run_tests", run_tests)
    return TOOL.main(["--only", mutant.id]), seen


def test_the_check_patches_a_moved_file_and_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_tree(tmp_path, {"cacheguard/locking/lock.py": LOCKS})
    mutant = fake("cacheguard/locks.py", "        self.held = False\n", "", "Lock.release")
    verdict, seen = fake_check(tmp_path, monkeypatch, mutant)
    assert verdict == 0
    assert seen == [LOCKS.replace("        self.held = False\n", "")]
    assert (tmp_path / "cacheguard/locking/lock.py").read_text(encoding="utf-8") == LOCKS
    out, err = capsys.readouterr()
    assert (
        "warning: mutant fake-mutant: `Lock.release` is no longer in cacheguard/locks.py; "
        'found it in cacheguard/locking/lock.py: update its file= to "cacheguard/locking/lock.py"'
    ) in err
    assert "1 of 1 mutants killed" in out
    assert "1 found their code by its anchor in another file: update their file=" in out
    assert TOOL.main(["--list"]) == 0
    out, err = capsys.readouterr()
    assert (
        "    at cacheguard/locking/lock.py::Lock.release, lines 8-9"
        "  (moved: its file= says cacheguard/locks.py)"
    ) in out.splitlines()
    assert "update its file=" in err


def test_the_check_reports_a_patch_that_no_longer_applies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    drifted = LOCKS.replace("        self.held = False\n", "        self.held = None\n")
    make_tree(tmp_path, {"cacheguard/locks.py": drifted})
    mutant = fake("cacheguard/locks.py", "        self.held = False\n", "", "Lock.release")
    verdict, seen = fake_check(tmp_path, monkeypatch, mutant)
    assert (verdict, seen) == (1, [])
    out = capsys.readouterr().out
    assert "error    fake-mutant" in out
    assert "its find text is not in `Lock.release` (cacheguard/locks.py, lines 8-9)" in out
    assert "      +         self.held = None" in out.splitlines()
    assert "0 of 1 mutants killed" in out


def test_the_anchor_of_a_snippet_is_its_innermost_unique_definition() -> None:
    text = LOCKS + "\n\ndef helper() -> None:\n    def inner() -> None:\n        x = 1\n"
    assert TOOL.suggested_anchor(text, "        self.held = False\n") == "Lock.release"
    assert TOOL.suggested_anchor(text, "        x = 1\n") == "helper.inner"
    assert TOOL.named(text, "helper.<locals>.inner")  # Python's own qualified name too
    # spanning two methods: their class; twice in the text: none
    assert TOOL.suggested_anchor(text, "        return True\n\n    def release") == "Lock"
    assert TOOL.suggested_anchor(text, "        self.held") == ""
