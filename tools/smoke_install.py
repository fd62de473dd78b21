"""The distribution as a user gets it: run by .ci/run with the Python of a fresh venv
into which only the built wheel was installed, from a directory outside the source
tree, so that nothing of the repository is on the path.

    python tools/smoke_install.py --sdist dist/cacheguard_redis-0.1.0.tar.gz

Checks that the installed package is the wheel's (its name, version, types marker
and dogpile.cache entry point; no test rigs), that ``import cacheguard`` stays lean,
that both guards load once and then hit against the Redis at ``REDIS_URL``, and that
the sdist holds what builds the wheel and nothing of the tests. Exits non-zero with
the first failed check.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import os
import pathlib
import subprocess
import sys
import tarfile
import uuid

import cacheguard
from cacheguard import CacheGuard
from cacheguard.aio import AsyncCacheGuard

DISTRIBUTION = "cacheguard-redis"


def check(condition: bool, what: str) -> None:
    if not condition:
        sys.exit(f"smoke: FAILED: {what}")
    print(f"smoke: ok: {what}")


def installed(source_tree: pathlib.Path) -> None:
    package = pathlib.Path(cacheguard.__file__).resolve().parent
    check("site-packages" in package.parts, f"cacheguard is imported from the venv ({package})")
    check(source_tree not in package.parents, "not from the source tree")
    check(
        importlib.metadata.version(DISTRIBUTION) == cacheguard.__version__,
        f"{DISTRIBUTION} {cacheguard.__version__} is installed under its own name",
    )
    check((package / "py.typed").is_file(), "the package ships its types marker (py.typed)")
    check(importlib.util.find_spec("cacheguard_testing") is None, "no test rigs are installed")
    check(importlib.util.find_spec("tests") is None, "no tests package is installed")
    points = importlib.metadata.entry_points(group="dogpile.cache")
    check(
        any(p.name == "cacheguard" and p.dist and p.dist.name == DISTRIBUTION for p in points),
        "the dogpile.cache backend 'cacheguard' is registered",
    )
    lean = subprocess.run(
        [sys.executable, "-c", "import sys, cacheguard; print('redis' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    check(lean.stdout.strip() == "False", "import cacheguard loads no redis-py")


def guards(url: str) -> None:
    namespace = f"smoke-{uuid.uuid4().hex[:8]}"
    loads: list[str] = []

    def load() -> list[int]:
        loads.append("sync")
        return [1, 2, 3]

    with CacheGuard.from_url(url, namespace=namespace) as guard:
        first = guard.get_or_load("menu:list", load, ttl=60)
        again = guard.get_or_load("menu:list", load, ttl=60)
        guard.invalidate("menu:list")
    check(first == again == [1, 2, 3] and loads == ["sync"], "the sync guard loads once, then hits")

    async def run() -> list[int]:
        async def aload() -> list[int]:
            loads.append("async")
            return [4, 5]

        async with AsyncCacheGuard.from_url(url, namespace=namespace) as guard:
            await guard.get_or_load("dish:1", aload, ttl=60)
            value: list[int] = await guard.get_or_load("dish:1", aload, ttl=60)
            await guard.invalidate("dish:1")
            return value

    value = asyncio.run(run())
    check(value == [4, 5] and loads == ["sync", "async"], "the asyncio guard loads once, then hits")


def sdist(path: pathlib.Path) -> None:
    with tarfile.open(path) as archive:
        names = [name.split("/", 1)[1] for name in archive.getnames() if "/" in name]
        info = archive.extractfile(next(n for n in archive.getnames() if n.endswith("/PKG-INFO")))
        assert info is not None
        metadata = info.read().decode()
    check(f"Name: {DISTRIBUTION}\n" in metadata, f"the sdist's metadata names {DISTRIBUTION}")
    for needed in ("pyproject.toml", "README.md", "cacheguard/__init__.py", "cacheguard/py.typed"):
        check(needed in names, f"the sdist holds {needed}")
    check(not any(name.startswith("tests/") for name in names), "the sdist holds no tests")
    check(not any("cacheguard_testing" in name for name in names), "the sdist holds no test rigs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist", type=pathlib.Path, required=True)
    args = parser.parse_args()
    source_tree = pathlib.Path(__file__).resolve().parent.parent
    installed(source_tree)
    guards(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    sdist(args.sdist)
    print("smoke: the wheel and the sdist are good")


if __name__ == "__main__":
    main()
