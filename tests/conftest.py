"""Shared fixtures: a real Redis (or the documented fallback) and per-test isolation.

Which Redis: ``REDIS_URL`` if set, else a throwaway ``redis-server``, else
fakeredis's TCP server. ``CACHEGUARD_REQUIRE_REDIS=1`` (set by ``.ci/run``)
makes the fallback, or an unreachable ``REDIS_URL``, an error.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio

from cacheguard._identity import _ambient
from cacheguard.aio import async_notifier_for
from cacheguard.testing import RedisEndpoint, redis_server, require_real_redis


@pytest.fixture(autouse=True)
def no_ambient_holder() -> Iterator[None]:
    """Each test starts outside every lock holder's context: a hold an earlier test
    left behind (a lost one never released, say) must not make this test's threads
    and tasks, which copy the context, re-enter it (see cacheguard/_identity.py)."""
    token = _ambient.set(None)
    yield
    _ambient.reset(token)


@pytest.fixture(scope="session")
def redis_endpoint() -> Iterator[RedisEndpoint]:
    with redis_server() as endpoint:
        if require_real_redis():
            assert endpoint.real, "CACHEGUARD_REQUIRE_REDIS is set but Redis is fakeredis"
        yield endpoint


@pytest.fixture
def redis_url(redis_endpoint: RedisEndpoint) -> str:
    return redis_endpoint.url


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url, socket_connect_timeout=2, socket_timeout=10)
    yield c
    c.close()


@pytest.fixture
def other_client(redis_url: str) -> Iterator[redis.Redis]:
    """A second client with its own pool, hence its own pub/sub connection: what
    another process would have."""
    c = redis.Redis.from_url(redis_url, socket_connect_timeout=2, socket_timeout=10)
    yield c
    c.close()


@pytest.fixture
def namespace(client: redis.Redis) -> Iterator[str]:
    """A namespace no other test uses; its keys are deleted afterwards."""
    ns = f"t{uuid.uuid4().hex[:12]}"
    yield ns
    keys = list(client.scan_iter(match=f"{ns}:*", count=1000))
    if keys:
        client.delete(*keys)


def pytest_report_header(config: pytest.Config) -> str:
    return f"cacheguard: real Redis required = {require_real_redis()}"


@pytest.fixture
async def aclient(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """An asyncio client on the test's own event loop; the loop's notifier for it is
    closed afterwards (its listener task must not outlive the loop)."""
    c = redis.asyncio.Redis.from_url(redis_url, socket_connect_timeout=2, socket_timeout=10)
    yield c
    await async_notifier_for(c).aclose()
    await c.aclose()


def _database_urls() -> list[object]:
    urls: list[object] = [pytest.param("sqlite", id="sqlite")]
    pg = os.environ.get("DATABASE_URL", "")
    if pg.startswith("postgresql"):
        urls.append(pytest.param(pg, id="postgresql"))
    return urls


@pytest.fixture(params=_database_urls())
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The SQLAlchemy tests' database: SQLite in a temporary file, and PostgreSQL
    when ``DATABASE_URL`` points at one (CI sets it)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'menu.sqlite3'}"
    return str(request.param)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """dogpile.cache's own suites mark their threaded tests ``time_intensive``: here
    they run with the slow tests (the whole suite, in CI), not in ``-m "not slow"``."""
    for item in items:
        if item.get_closest_marker("time_intensive") is not None:
            item.add_marker(pytest.mark.slow)
