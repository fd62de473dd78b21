"""Session-wide Redis Cluster and Sentinel deployments (``cacheguard_testing.deployments``).

A test module that uses the fixtures declares::

    pytest_plugins = ["tests.deployment_fixtures"]

(Importing the fixtures by name trips ruff's F811 at every use, and pytest
supports ``pytest_plugins`` only in the rootdir's conftest, which this repo does
not have, or in test modules.) Once one module has loaded the plugin its fixtures
are visible to every module collected after it: declare it anyway, so a module
does not depend on the collection order.

Without ``redis-server`` on the PATH the fixtures skip, or fail when
``CACHEGUARD_REQUIRE_REDIS`` is set.

The deployments are shared by every test of the session: a test that kills a
node must bring it back and wait until the deployment is healthy, or better,
start a private deployment of its own.
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import Iterator

import pytest
import redis
from cacheguard_testing.deployments import OwnedRedisCluster, OwnedSentinelSet

from cacheguard.testing import require_real_redis

__all__ = ["cluster_namespace", "redis_cluster", "redis_server_binary", "sentinel_set"]


@pytest.fixture(scope="session")
def redis_server_binary() -> str:
    """redis-server's path; skips the test without it (fails under CACHEGUARD_REQUIRE_REDIS).
    Tests that start a private deployment ask for it."""
    binary = shutil.which("redis-server")
    if binary is None:
        if require_real_redis():
            pytest.fail("redis-server is not on the PATH (CACHEGUARD_REQUIRE_REDIS is set)")
        pytest.skip("these tests start their own redis-server, which is not installed")
    return binary


@pytest.fixture(scope="session")
def redis_cluster(redis_server_binary: str) -> Iterator[OwnedRedisCluster]:
    """A 3-master, 3-replica Redis Cluster for the whole session."""
    cluster = OwnedRedisCluster()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def sentinel_set(redis_server_binary: str) -> Iterator[OwnedSentinelSet]:
    """A master, one replica and three sentinels for the whole session."""
    sentinels = OwnedSentinelSet()
    try:
        yield sentinels
    finally:
        sentinels.close()


@pytest.fixture
def cluster_namespace(redis_cluster: OwnedRedisCluster) -> Iterator[str]:
    """A namespace no other test uses. Afterwards its own keys are deleted from the
    shared cluster (nothing else is flushed); a master that is down is skipped."""
    namespace = f"c{uuid.uuid4().hex[:12]}"
    yield namespace
    for master in redis_cluster.masters():
        with (
            contextlib.suppress(redis.RedisError),
            redis.Redis.from_url(master.url, socket_timeout=2) as client,
        ):
            keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
            for key in keys:  # one by one: a node's keys may span several slots
                client.delete(key)
