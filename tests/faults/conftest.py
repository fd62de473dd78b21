"""Fault tests own their Redis: a redis-server the test starts, kills and restarts."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from cacheguard.testing import OwnedRedisServer, require_real_redis


@pytest.fixture
def redis_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        if require_real_redis():
            pytest.fail("the fault tests need redis-server on the PATH (CACHEGUARD_REQUIRE_REDIS)")
        pytest.skip("the fault tests start their own redis-server, which is not installed")
    return binary


@pytest.fixture
def owned_redis(redis_binary: str) -> Iterator[OwnedRedisServer]:
    server = OwnedRedisServer()
    yield server
    server.close()
