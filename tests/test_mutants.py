"""The mutation check's list stays in step with the code and the docs.

tools/mutants.py runs the mutants (CI does, after the suite); these checks are
the cheap part: every patch still applies exactly once, every named test exists,
and docs/testing.md lists every mutant.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

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
def test_mutant_applies_once(mutant: object) -> None:
    text = (ROOT / mutant.file).read_text(encoding="utf-8")  # type: ignore[attr-defined]
    assert text.count(mutant.find) == 1  # type: ignore[attr-defined]
    assert mutant.find != mutant.replace  # type: ignore[attr-defined]


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name.startswith("test_")
    }


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
