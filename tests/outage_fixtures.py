"""The outage tests' fixtures (helpers in ``tests/outage_support.py``). A test module
that uses them declares::

    pytest_plugins = ["tests.deployment_fixtures", "tests.outage_fixtures"]
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from cacheguard import CacheGuard
from cacheguard.aio import AsyncCacheGuard
from cacheguard.testing import OwnedRedisServer
from tests.guard_drivers import KINDS, Guard
from tests.outage_support import FAST_FAIL, Clock, Make

__all__ = ["clock", "gutter", "make", "primary"]


@pytest.fixture
def primary(redis_server_binary: str) -> Iterator[OwnedRedisServer]:
    server = OwnedRedisServer()
    yield server
    server.close()


@pytest.fixture
def gutter(redis_server_binary: str) -> Iterator[OwnedRedisServer]:
    server = OwnedRedisServer()
    yield server
    server.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=KINDS)
async def make(request: pytest.FixtureRequest, clock: Clock) -> AsyncIterator[Make]:
    """Guards of the parametrised kind on ``url`` (``FAST_FAIL`` under the settings
    given), on the test's clock; all closed at the end."""
    made: list[Guard] = []

    def build(url: str, **settings: Any) -> Guard:
        options = {**FAST_FAIL, **settings}
        kind = request.param
        cls = CacheGuard if kind == "sync" else AsyncCacheGuard
        made.append(Guard(kind, cls.from_url(url, timer=clock, **options)))
        return made[-1]

    yield build
    for guard in made:
        await guard.close()
