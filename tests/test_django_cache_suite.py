"""Django's own cache tests against ``CacheGuardCache``.

``BaseCacheTests`` of Django's ``tests/cache/tests.py`` (the tests every built-in
backend passes) run against the backend on the real Redis, with the exclusions
Django makes for its own Redis backend (``redis_excluded_caches``: the ``cull`` and
``zero_cull`` caches, so the three culling tests skip themselves). Nothing of
Django's is copied here: the set-up downloads the sdist of the installed Django
version with pip (kept in ``~/.cache/cacheguard-tests/``, or
``$CACHEGUARD_TEST_CACHE``, and reused), takes its ``tests/cache`` package, and runs
a test class defined at run time in a subprocess with a minimal settings module
(SQLite in memory; the ``cache`` test app for the model tests), in a namespace of
its own: ``cache.clear()`` in Django's tear-downs clears that namespace only.

If the sdist cannot be had, the test fails (it never skips): CI must run it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import django
import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent
BACKEND = "cacheguard.integrations.django.CacheGuardCache"
# The tests Django itself skips for a backend without culling (the excluded caches).
DJANGO_SKIPS = {
    "test_cull": "Culling isn't implemented.",
    "test_zero_cull": "Culling isn't implemented.",
    "test_cull_delete_when_store_empty": "Culling isn't implemented.",
}
RESULT_MARK = "CACHEGUARD-DJANGO-SUITE "
DOWNLOAD_TIMEOUT = 600.0  # pip's whole run; each of its requests times out after 60 s


def sdist_cache() -> Path:
    return Path(
        os.environ.get("CACHEGUARD_TEST_CACHE") or Path.home() / ".cache" / "cacheguard-tests"
    )


def django_sdist(version: str) -> Path:
    """The sdist of Django ``version``: the one kept from an earlier run, else
    downloaded with pip (to a scratch folder, then moved into place: runs in
    parallel never see half a file). Fails the test, saying why, if pip cannot."""
    folder = sdist_cache()
    kept = folder / f"django-{version}.tar.gz"
    if kept.is_file() and tarfile.is_tarfile(kept):
        return kept
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--disable-pip-version-check",
            "--timeout",
            "60",
            "--retries",
            "3",
            "--dest",
            scratch,
            f"django=={version}",
        ]
        why = ""
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT, check=False
            )
        except subprocess.TimeoutExpired:
            why = f"pip did not finish within {DOWNLOAD_TIMEOUT:.0f} s"
        else:
            if done.returncode != 0:
                why = f"pip exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}"
        found = sorted(Path(scratch).glob("[Dd]jango-*.tar.gz"))
        if why or not found:
            pytest.fail(
                f"Django's own cache tests need the sdist of Django {version} "
                f"(`pip download --no-deps --no-binary :all: django=={version}`), which "
                f"could not be had: {why or 'pip saved no django-*.tar.gz'}. Put the file "
                f"in {folder} to run without network access.",
                pytrace=False,
            )
        os.replace(found[0], kept)
    return kept


def extract_cache_tests(sdist: Path, into: Path) -> Path:
    """Django's ``tests/cache`` package from ``sdist``, under ``into``; returns the
    folder to put on ``sys.path`` (the one holding ``cache/``)."""
    with tarfile.open(sdist) as archive:
        members = [
            member
            for member in archive.getmembers()
            if member.isfile() and member.name.split("/")[1:3] == ["tests", "cache"]
        ]
        if not members:
            pytest.fail(f"{sdist} has no tests/cache package", pytrace=False)
        top = members[0].name.split("/")[0]
        if hasattr(tarfile, "data_filter"):
            archive.extractall(into, members=members, filter="data")
        else:  # Python before 3.10.12: the members are plain files under tests/cache
            archive.extractall(into, members=members)
    return into / top / "tests"


RUNNER = """\
import json
import os
import sys
import unittest

import django
from django.conf import settings

LOCATION = os.environ["SUITE_REDIS_URL"]
BACKEND_OPTIONS = {"namespace": os.environ["SUITE_NAMESPACE"]}
settings.configure(
    DEBUG=False,
    SECRET_KEY="django-suite-" + "x" * 40,
    USE_TZ=True,
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    INSTALLED_APPS=[
        "django.contrib.contenttypes",
        "django.contrib.auth",
        "django.contrib.sessions",
        "django.contrib.messages",
        "cache",
    ],
    CACHES={
        "default": {"BACKEND": os.environ["SUITE_BACKEND"], "LOCATION": LOCATION,
                    "OPTIONS": BACKEND_OPTIONS},
    },
    MIDDLEWARE=[],
    ROOT_URLCONF=__name__,
    TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True}],
    DEFAULT_AUTO_FIELD="django.db.models.AutoField",
)
urlpatterns = []
django.setup()

from django.test import TestCase, override_settings
from django.test.runner import DiscoverRunner

from cache.tests import BaseCacheTests, caches_setting_for_tests, redis_excluded_caches


@override_settings(
    CACHES=caches_setting_for_tests(
        base={"BACKEND": os.environ["SUITE_BACKEND"], "LOCATION": LOCATION,
              "OPTIONS": BACKEND_OPTIONS},
        exclude=redis_excluded_caches,
    )
)
class CacheGuardCacheTests(BaseCacheTests, TestCase):
    pass


runner = DiscoverRunner(verbosity=2, interactive=False)
runner.setup_test_environment()
databases = runner.setup_databases()
try:
    suite = unittest.TestLoader().loadTestsFromTestCase(CacheGuardCacheTests)
    result = runner.run_suite(suite)
finally:
    runner.teardown_databases(databases)
    runner.teardown_test_environment()

def named(test):
    return test.id().rsplit(".", 1)[-1]

print(RESULT_MARK + json.dumps({
    "run": result.testsRun,
    "collected": suite.countTestCases(),
    "failures": [named(t) for t, _ in result.failures],
    "errors": [named(t) for t, _ in result.errors],
    "skipped": {named(t): why for t, why in result.skipped},
    "expected_failures": [named(t) for t, _ in result.expectedFailures],
    "unexpected_successes": [named(t) for t in result.unexpectedSuccesses],
}), flush=True)
"""


@pytest.fixture(scope="session")
def django_cache_tests(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Django's ``tests/cache`` for the installed Django, once per run."""
    sdist = django_sdist(django.__version__)
    return extract_cache_tests(sdist, tmp_path_factory.mktemp("django-sdist"))


@pytest.fixture
def suite_namespace(client: redis.Redis) -> Iterator[str]:
    namespace = f"djsuite-{uuid.uuid4().hex[:12]}"
    yield namespace
    for key in client.scan_iter(match=f"{namespace}:*", count=1000):
        client.delete(key)


@pytest.mark.slow
def test_django_base_cache_tests_pass_against_the_backend(
    django_cache_tests: Path, redis_url: str, suite_namespace: str, tmp_path: Path
) -> None:
    runner = tmp_path / "run_django_cache_suite.py"
    runner.write_text(f"RESULT_MARK = {RESULT_MARK!r}\n" + RUNNER)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT), str(django_cache_tests), os.environ.get("PYTHONPATH", "")]
        ),
        "SUITE_REDIS_URL": redis_url,
        "SUITE_NAMESPACE": suite_namespace,
        "SUITE_BACKEND": BACKEND,
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, str(runner)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    output = done.stdout + done.stderr
    marks = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
    assert marks, f"the suite did not report (exit {done.returncode}):\n{output[-6000:]}"
    result = json.loads(marks[-1][len(RESULT_MARK) :])
    print(textwrap.indent(done.stderr[-4000:], "    "))
    print(f"Django {django.__version__} BaseCacheTests: {json.dumps(result)}")
    assert result["failures"] == [], output[-8000:]
    assert result["errors"] == [], output[-8000:]
    assert result["unexpected_successes"] == []
    assert result["skipped"] == DJANGO_SKIPS  # only those Django itself makes
    # Every test of BaseCacheTests ran (54 in Django 5.2), none left out.
    assert result["run"] == result["collected"] >= 50, f"{result['run']} of Django's tests ran"
    assert done.returncode == 0, output[-4000:]
