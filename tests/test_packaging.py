"""The distribution (issue #26): a name of our own on the package index, used by every
install line; a wheel and an sdist that hold the package and its types marker and
nothing of the tests. .ci/run also installs the wheel in a fresh venv and runs
tools/smoke_install.py against Redis."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
DISTRIBUTION = "cacheguard-redis"
# `pip install [options]` naming a distribution first, with or without extras or quotes.
INSTALL = re.compile(
    r"""pip install(?:\s+-[-\w]+)*\s+['"]?(cacheguard[\w.-]*)(\[|['"\s`]|$)""", re.M
)


def _smoke() -> ModuleType:
    spec = importlib.util.spec_from_file_location("smoke_install", ROOT / "tools/smoke_install.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_distribution_has_a_name_of_its_own() -> None:
    # (read as text: tomllib is 3.11's, the package supports 3.10)
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    names = re.findall(r'^name = "([^"]+)"$', pyproject, re.M)
    assert names == [DISTRIBUTION]  # "cacheguard" on the index is another project
    assert f'"{DISTRIBUTION}[' in pyproject  # the dev extra pulls the others in by name
    rigs = (ROOT / "testing/pyproject.toml").read_text(encoding="utf-8")
    assert f'dependencies = ["{DISTRIBUTION}",' in rigs


def test_every_install_line_names_the_distribution() -> None:
    pages = [ROOT / "README.md", ROOT / "DEVELOPERS.md", *sorted((ROOT / "docs").glob("*.md"))]
    pages += sorted((ROOT / "examples").glob("*/README.md"))
    pages += sorted((ROOT / "cacheguard").rglob("*.py"))  # docstrings and error messages
    named = {
        (page.name, match.group(1))
        for page in pages
        for match in INSTALL.finditer(page.read_text(encoding="utf-8"))
    }
    assert named, "no install line found: the pattern is wrong"
    wrong = sorted((page, name) for page, name in named if name != DISTRIBUTION)
    assert wrong == []
    assert INSTALL.search('pip install "cacheguard[dogpile]"')  # the pattern sees the old form


@pytest.mark.slow
def test_the_wheel_and_sdist_hold_the_package_and_no_tests(tmp_path: Path) -> None:
    build = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    (wheel,) = tmp_path.glob("cacheguard_redis-*.whl")  # built from the sdist
    (sdist,) = tmp_path.glob("cacheguard_redis-*.tar.gz")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        points = archive.read(entry_points).decode()
    assert "cacheguard/py.typed" in names
    assert "cacheguard/cache/flows/read.py" in names
    assert not [n for n in names if n.startswith(("tests/", "cacheguard_testing/"))]
    assert (
        "[dogpile.cache]\ncacheguard = cacheguard.integrations.dogpile:CacheGuardBackend" in points
    )
    _smoke().sdist(sdist)  # exits with the failed check
