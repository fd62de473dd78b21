"""The ``cacheguard`` dogpile.cache backend (cacheguard/integrations/dogpile.py).

dogpile.cache's own generic suites (backend, mutex, JSON serializer) run against
the backend on the real Redis, each test in a namespace of its own. Then what
the backend adds: the entry point, its arguments, the mutex's contract (not
reentrant, released from any thread, excluding processes, a dead holder's lease,
a fair share between processes), a stampede of real processes woken by the
lock's release message, and the deployments its URLs name.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from cacheguard_testing.deployments import OwnedRedisCluster, OwnedSentinelSet
from dogpile.cache import make_region
from dogpile.cache.api import NO_VALUE, CacheMutex
from dogpile.cache.exception import ValidationError
from dogpile.cache.region import CacheRegion
from dogpile.testing import fixtures as dogpile_suites

from cacheguard import (
    BackendUnavailable,
    CacheGuard,
    CacheGuardError,
    LockNotHeldError,
    LockTimeout,
)
from cacheguard.backoff import Backoff
from cacheguard.exceptions import LockUpgradeError
from cacheguard.integrations.dogpile import (
    BackendArgumentError,
    CacheGuardBackend,
    CacheGuardMutex,
)
from cacheguard.locks import Holder, LockFactory, RedisRWLock
from cacheguard.locks.redis.lua import FENCE_TTL_MS
from cacheguard.redis.keys import ResourceKeys, watermark_key
from tests.helpers import client_for, subscribers, wait_until
from tests.procs import CTX, result_within, run_processes, start_process_reporting

pytest_plugins = ["tests.deployment_fixtures"]

# Retry timers and leases a minute long: within a test's deadline only a release
# message can wake a waiter in another process.
NO_TIMER_WAKE_UP = functools.partial(Backoff, initial=60.0, cap=60.0)
DEFAULT_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


# -- dogpile.cache's own suites -----------------------------------------------------------------


@pytest.mark.filterwarnings(  # test_argument_dictionary_unmodified passes made-up names
    "ignore:the cacheguard dogpile backend ignores unknown arguments:UserWarning"
)
class _OnCacheguard:
    """The suites' fixture, pointed at the ``cacheguard`` backend by name (the entry
    point), in a fresh namespace per test. ``setup_class`` builds one backend from the
    class's arguments before any fixture runs: it connects to nothing."""

    backend = "cacheguard"
    config_args: dict[str, Any] = {"arguments": {"url": DEFAULT_URL}}  # noqa: RUF012

    @pytest.fixture(autouse=True)
    def _own_namespace(self, redis_url: str, namespace: str) -> None:
        self.config_args = {"arguments": {"url": redis_url, "namespace": namespace}}


class TestDogpileBackendSuite(_OnCacheguard, dogpile_suites._GenericBackendTestSuite):
    pass


class TestDogpileMutexSuite(_OnCacheguard, dogpile_suites._GenericMutexTestSuite):
    pass


class TestDogpileJsonSerializerSuite(
    _OnCacheguard,
    dogpile_suites._GenericSerializerTestSuite,
    dogpile_suites._GenericBackendTestSuite,
):
    pass


# -- helpers -------------------------------------------------------------------------------------


@pytest.fixture
def make_backend(redis_url: str, namespace: str) -> Iterator[Any]:
    made: list[CacheGuardBackend] = []

    def make(**arguments: Any) -> CacheGuardBackend:
        arguments.setdefault("url", redis_url)
        arguments.setdefault("namespace", namespace)
        backend = CacheGuardBackend(arguments)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


def region_on(url: str, namespace: str, **arguments: Any) -> CacheRegion:
    """A region on the ``cacheguard`` backend, found by name."""
    return make_region().configure(
        "cacheguard",
        expiration_time=600,
        arguments={"url": url, "namespace": namespace, **arguments},
    )


def lock_hash(client: redis.Redis, namespace: str, key: str) -> dict[bytes, bytes]:
    return client.hgetall(ResourceKeys(namespace, key).lock)


def waiting_marks(client: redis.Redis, namespace: str, key: str) -> int:
    """Writers queued in Redis for ``key``'s lock (one ``q:<owner>`` field each)."""
    return sum(field.startswith(b"q:") for field in lock_hash(client, namespace, key))


# -- found by name ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_region_finds_the_backend_by_name_without_importing_cacheguard(
    redis_url: str, namespace: str
) -> None:
    script = """
import os, sys
from dogpile.cache import make_region
assert not any(m == "cacheguard" or m.startswith("cacheguard.") for m in sys.modules)
region = make_region().configure(
    "cacheguard",
    expiration_time=60,
    arguments={"url": os.environ["REDIS_URL"], "namespace": os.environ["NS"]},
)
assert region.get_or_create("k", lambda: {"made": "here"}) == {"made": "here"}
print(type(region.backend).__module__, type(region.backend).__name__)
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "REDIS_URL": redis_url, "NS": namespace},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["cacheguard.integrations.dogpile", "CacheGuardBackend"]
    region = region_on(redis_url, namespace)
    assert region.get("k") == {"made": "here"}  # stored under the guard's key layout
    client = region.backend.guard.client
    assert client.exists(ResourceKeys(namespace, "k").value)


# -- arguments ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"lease": -1}, "lease must be a finite number > 0"),
        ({"lock_timeout": "soon"}, "lease must be a number of seconds"),
        ({"lease": 5, "lock_timeout": 6}, "disagree"),
        ({"redis_expiration_time": -5}, "redis_expiration_time must be"),
        ({"wait_timeout": 0}, "wait_timeout must be a finite number > 0"),
        ({"distributed_lock": "yes"}, "'distributed_lock' must be True or False"),
        ({"namespace": "a{b}"}, "namespace must not contain braces"),
        ({"namespace": ""}, "namespace must not be empty"),
        ({"url": "redis+nothing://h:1"}, "unsupported Redis URL"),
        ({"url": "redis://h:1", "ssl": True}, "rediss://"),
        ({"sentinels": [["h", 26379]]}, "redis\\+sentinel://"),
        ({"startup_nodes": []}, "redis\\+cluster://"),
        ({"connection_pool": "pool"}, "redis.ConnectionPool"),
        ({"client": "not a client"}, "redis.Redis or redis.cluster.RedisCluster"),
        ({"guard": "not a guard"}, "cacheguard.CacheGuard"),
    ],
)
def test_bad_arguments_raise_a_clear_error(
    redis_url: str, arguments: dict[str, Any], message: str
) -> None:
    arguments = {"url": redis_url, **arguments} if "client" not in arguments else arguments
    with pytest.raises(BackendArgumentError, match=message) as raised:
        make_region().configure("cacheguard", arguments=arguments)
    # One error for cacheguard's callers, dogpile's and plain Python's.
    assert isinstance(raised.value, CacheGuardError)
    assert isinstance(raised.value, ValidationError)
    assert isinstance(raised.value, ValueError)


def test_a_guard_given_brings_its_client_namespace_and_lease(
    client: redis.Redis, namespace: str
) -> None:
    guard = CacheGuard(client, namespace=namespace, lease=7)
    region = make_region().configure("cacheguard", arguments={"guard": guard})
    region.set("k", "v")
    assert client.exists(guard.keys("k").value)
    assert region.backend.guard is guard
    for clash in ({"namespace": "other"}, {"lease": 8}, {"url": "redis://h"}, {"client": client}):
        with pytest.raises(BackendArgumentError, match="would contradict"):
            CacheGuardBackend({"guard": guard, **clash})
    same = CacheGuardBackend({"guard": guard, "namespace": namespace, "lease": 7})
    assert same.guard is guard
    same.close()
    assert region.get("k") == "v"  # close() leaves a guard it was given alone


def test_dogpile_redis_arguments_carry_over_unchanged(redis_url: str, namespace: str) -> None:
    """A dogpile.cache.redis arguments dict, host/port/db form and lock tuning
    included, configures this backend with no warning."""
    parts = urlsplit(redis_url)
    arguments = {
        "host": parts.hostname,
        "port": parts.port,
        "db": int(parts.path.strip("/") or 0),
        "redis_expiration_time": 60 * 60 * 2,
        "distributed_lock": True,
        "thread_local_lock": False,
        "lock_timeout": 10,
        "lock_sleep": 0.1,
        "lock_prefix": "_lk",
        "lock_blocking": True,
        "lock_blocking_timeout": 30,
        "socket_timeout": 5,
        "socket_connect_timeout": 2,
        "socket_keepalive": True,
        "connection_kwargs": {"health_check_interval": 30},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        region = make_region().configure(
            "cacheguard", expiration_time=60, arguments={**arguments, "namespace": namespace}
        )
    backend = region.backend
    assert backend.guard.settings.lease == 10
    assert backend.wait_timeout == 30
    assert region.get_or_create("k", lambda: "made") == "made"
    ttl_ms = backend.guard.client.pttl(ResourceKeys(namespace, "k").value)
    assert 0 < ttl_ms <= 2 * 3600 * 1000


def test_a_region_configured_from_a_config_file(redis_url: str, namespace: str) -> None:
    """configure_from_config: every value a string, as an ini file gives them."""
    config = {
        "cache.menu.backend": "cacheguard",
        "cache.menu.expiration_time": "300",
        "cache.menu.arguments.url": redis_url,
        "cache.menu.arguments.namespace": namespace,
        "cache.menu.arguments.lease": "5",
        "cache.menu.arguments.redis_expiration_time": "600",
        "cache.menu.arguments.distributed_lock": "true",
    }
    region = make_region().configure_from_config(config, "cache.menu.")
    backend = region.backend
    assert (backend.guard.settings.lease, backend.redis_expiration_time) == (5, 600)
    assert region.get_or_create("k", lambda: "made") == "made"
    backend.close()


def host_form(redis_url: str, **arguments: Any) -> dict[str, Any]:
    """dogpile.cache.redis's host/port/db arguments for ``redis_url``, then ``arguments``."""
    parts = urlsplit(redis_url)
    where = {"host": parts.hostname, "port": parts.port, "db": int(parts.path.strip("/") or 0)}
    return {**where, **arguments}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"port": "abc"}, "'port' must be a whole number, not 'abc'"),
        ({"port": 0}, "'port' must be from 1 to 65535, not 0"),
        ({"port": 65536}, "'port' must be from 1 to 65535"),
        ({"port": True}, "'port' must be a whole number"),
        ({"db": -1}, "'db' must be at least 0, not -1"),
        ({"db": "x"}, "'db' must be a whole number, not 'x'"),
        ({"db": 1.5}, "'db' must be a whole number"),
        ({"host": ""}, "'host' must be a non-empty str"),
        ({"password": 1234}, "'password' must be a str"),
        ({"socket_keepalive": "yes"}, "'socket_keepalive' must be True or False"),
        ({"socket_keepalive": True, "socket_keepalive_options": 1}, "a dict of socket options"),
        ({"connection_kwargs": {"bogus": 1}}, "redis-py does not take: 'bogus'; it takes .*retry"),
        ({"connection_kwargs": ["x"]}, "'connection_kwargs' must be a dict"),
        ({"connection_kwargs": {"protocol": "x"}}, "refuses the connection arguments"),
    ],
)
@pytest.mark.parametrize("form", ["host", "url"])
def test_connection_arguments_fail_configure_not_the_first_call(
    redis_url: str, namespace: str, form: str, arguments: dict[str, Any], message: str
) -> None:
    """Each of these configured fine and then failed the first cache call with a raw
    ValueError, ResponseError or TypeError: now ``configure`` refuses it, in the host
    form and next to a ``url`` alike (which overrides host, port and db)."""
    given = host_form(redis_url, **arguments)
    if form == "url":
        given["url"] = redis_url
    with pytest.raises(BackendArgumentError, match=message):
        make_region().configure("cacheguard", arguments={**given, "namespace": namespace})


def test_connection_arguments_that_redis_py_accepts_still_work(
    redis_url: str, namespace: str
) -> None:
    """Digits in a str are a number, as redis-py reads them; a connection argument
    refused only by the connection class a URL picks fails ``configure`` too."""
    parts = urlsplit(redis_url)
    region = make_region().configure(
        "cacheguard",
        arguments={
            "host": parts.hostname,
            "port": str(parts.port),
            "db": parts.path.strip("/") or "0",
            "namespace": namespace,
            "connection_kwargs": {"health_check_interval": 30, "client_name": "cg-test"},
        },
    )
    assert region.get_or_create("k", lambda: "made") == "made"
    region.backend.close()
    with pytest.raises(BackendArgumentError, match=r"refuses the connection arguments.*ssl"):
        # A TLS argument, with a redis:// URL: its connections are plain ones.
        CacheGuardBackend(
            {"url": redis_url, "namespace": namespace, "connection_kwargs": {"ssl_certfile": "x"}}
        )


def test_unknown_arguments_are_ignored_with_a_warning(redis_url: str, namespace: str) -> None:
    with pytest.warns(UserWarning, match="redis_expiration"):
        backend = CacheGuardBackend(
            {"url": redis_url, "namespace": namespace, "redis_expiration": 5}
        )
    backend.close()


def test_redis_expiration_time_is_the_values_ttl_in_redis(
    make_backend: Any, client: redis.Redis, namespace: str
) -> None:
    expiring = make_backend(redis_expiration_time=30)
    expiring.set_serialized("a", b"1")
    expiring.set_serialized_multi({"b": b"2", "c": b"3"})
    for key in "abc":
        assert 0 < client.pttl(ResourceKeys(namespace, key).value) <= 30_000
    lasting = make_backend()  # no redis_expiration_time: dogpile.cache.redis's default
    lasting.set_serialized("d", b"4")
    assert client.pttl(ResourceKeys(namespace, "d").value) == -1
    assert make_backend(redis_expiration_time=0).redis_expiration_time is None


def test_keys_and_values_are_checked(make_backend: Any) -> None:
    backend = make_backend()
    for key in (7, b"k", ""):
        with pytest.raises(BackendArgumentError, match="non-empty str keys"):
            backend.get_serialized(key)
        with pytest.raises(BackendArgumentError, match="non-empty str keys"):
            backend.get_mutex(key)
    with pytest.raises(BackendArgumentError, match="serialized values"):
        backend.set_serialized("k", "text")


def test_a_key_without_a_utf8_form_is_a_clear_error(redis_url: str, namespace: str) -> None:
    """A str with a lone surrogate cannot be sent to Redis: every call names the key
    instead of raising a raw UnicodeEncodeError."""
    region = region_on(redis_url, namespace)
    backend = region.backend
    key = "menu:\ud800"
    calls = [
        lambda: region.get(key),
        lambda: region.get_or_create(key, lambda: "made"),
        lambda: region.set(key, "v"),
        lambda: region.delete(key),
        lambda: region.get_multi(["ok", key]),
        lambda: region.delete_multi(["ok", key]),
        lambda: backend.get_mutex(key),
    ]
    for call in calls:
        with pytest.raises(BackendArgumentError, match=re.escape(repr(key))):
            call()
    assert region.get_or_create("menu:caf\u00e9", lambda: "made") == "made"  # valid text
    backend.close()


def test_multi_operations_and_a_foreign_key_type(
    make_backend: Any, client: redis.Redis, namespace: str
) -> None:
    backend = make_backend()
    backend.set_serialized_multi({"a": b"1", "b": b"2"})
    client.rpush(ResourceKeys(namespace, "list").value, "x")  # another type at our name
    assert backend.get_serialized_multi(["a", "missing", "b", "list"]) == [
        b"1",
        NO_VALUE,
        b"2",
        NO_VALUE,
    ]
    assert backend.get_serialized("list") is NO_VALUE
    backend.delete_multi(["a", "b", "list"])
    assert backend.get_serialized_multi(["a", "b"]) == [NO_VALUE, NO_VALUE]
    backend.delete_multi([])
    assert backend.get_serialized_multi([]) == []


def test_redis_down_is_backend_unavailable(namespace: str) -> None:
    backend = CacheGuardBackend(
        {"url": "redis://127.0.0.1:1/0", "namespace": namespace, "socket_connect_timeout": 0.2}
    )
    for call in (
        lambda: backend.get_serialized("k"),
        lambda: backend.set_serialized("k", b"v"),
        lambda: backend.delete("k"),
        lambda: backend.get_mutex("k").acquire(False),
    ):
        with pytest.raises(BackendUnavailable):
            call()
    mutex = backend.get_mutex("k")
    assert not mutex._gate.holder  # a failed acquire leaves the gate free


def test_without_distributed_lock_dogpile_locks_in_process(make_backend: Any) -> None:
    assert make_backend(distributed_lock=False).get_mutex("k") is None


# -- what the keys leave in Redis ----------------------------------------------------------------


def ttls(client: redis.Redis, namespace: str) -> dict[bytes, int]:
    """Every key of ``namespace`` with its TTL in ms (-1: it never expires)."""
    return {key: client.pttl(key) for key in client.scan_iter(match=f"{namespace}:*", count=1000)}


def test_creations_leave_no_key_that_never_expires(
    redis_url: str, namespace: str, client: redis.Redis
) -> None:
    """Keys created through a region, one of them by eight threads at once (the hold
    passed on between them), then deleted: the fencing counters their locks drew from
    expire with redis_expiration_time (dogpile.cache.redis leaves nothing behind
    either). The counter of a key the guard's write path locked (``guard.write``)
    expires a day after its last token (the lock layer's FENCE_TTL_MS); what the
    design keeps for ever is the namespace's invalidation sequence alone."""
    region = region_on(redis_url, namespace, redis_expiration_time=120, lease=5)
    keys = [f"k{i}" for i in range(5)]
    for key in keys:
        assert region.get_or_create(key, lambda key=key: f"made {key}") == f"made {key}"
    with ThreadPoolExecutor(8) as pool:
        made = pool.map(lambda _: region.get_or_create("busy", lambda: "made"), range(8))
        assert set(made) == {"made"}
    keys.append("busy")
    with region.backend.guard.write("written"):  # the guard's write path, on a key of its own
        pass
    forever = {watermark_key(namespace).encode()}
    left = ttls(client, namespace)
    assert 120_000 < left[ResourceKeys(namespace, "written").fence.encode()] <= FENCE_TTL_MS
    for key in keys:
        assert 0 < left[ResourceKeys(namespace, key).fence.encode()] <= 120_000
        assert 0 < left[ResourceKeys(namespace, key).value.encode()] <= 120_000
    assert {name for name, ttl in left.items() if ttl == -1} == forever
    region.delete_multi(keys)
    left = ttls(client, namespace)
    assert not any(ResourceKeys(namespace, key).value.encode() in left for key in keys)
    assert {name for name, ttl in left.items() if ttl == -1} == forever
    region.backend.close()


@pytest.mark.slow
def test_without_redis_expiration_time_a_counter_lives_a_lease_past_its_release(
    make_backend: Any, client: redis.Redis, namespace: str
) -> None:
    """No redis_expiration_time: values never expire (dogpile.cache.redis's default),
    the key's counter does, a lease after the hold's release. The key is locked as
    before once its counter is gone, and its next counter expires too."""
    backend = make_backend(lease=1)
    fence = ResourceKeys(namespace, "k").fence
    mutex = backend.get_mutex("k")
    assert mutex.acquire()
    # While held: the lock layer's counter, with the lock layer's lifetime.
    assert 1000 < client.pttl(fence) <= FENCE_TTL_MS
    backend.set_serialized("k", b"v")
    mutex.release()
    assert 0 < client.pttl(fence) <= 1000
    assert client.pttl(ResourceKeys(namespace, "k").value) == -1
    assert wait_until(lambda: not client.exists(fence), 10)
    assert mutex.acquire()
    try:
        assert not make_backend().get_mutex("k").acquire(False)  # excluded as before
    finally:
        mutex.release()
    assert 0 < client.pttl(fence) <= 1000


def test_delete_gives_a_dead_holders_counter_its_lifetime(
    make_backend: Any, client: redis.Redis, namespace: str
) -> None:
    """A holder that died before its release left the key's counter with the lock
    layer's day-long lifetime (and a lock hash that ends with its lease): ``delete``
    and ``delete_multi`` give the counters the backend's own, shorter one."""
    for key in ("a", "b", "c"):
        # What a holder killed mid-creation leaves: no watchdog, never released.
        RedisRWLock(client, key, namespace=namespace, lease=60, watchdog=False).acquire_write()
        assert 30_000 < client.pttl(ResourceKeys(namespace, key).fence) <= FENCE_TTL_MS
        assert 0 < client.pttl(ResourceKeys(namespace, key).lock) <= 60_000
    backend = make_backend(redis_expiration_time=30)
    backend.set_serialized_multi({"a": b"1", "b": b"2", "c": b"3"})
    backend.delete("a")
    backend.delete_multi(["b", "c"])
    left = ttls(client, namespace)
    assert left, "the counters and lock hashes are still there, expiring"
    assert all(ttl > 0 for ttl in left.values()), left
    for key in ("a", "b", "c"):
        assert 0 < left[ResourceKeys(namespace, key).fence.encode()] <= 30_000
        assert backend.get_serialized(key) is NO_VALUE


def test_a_hold_lost_before_its_release_is_logged_and_the_key_freed(
    make_backend: Any, client: redis.Redis, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The key's lock vanished from Redis while held: the release says so in the
    log, raises nothing, frees the key here and still gives the counter its expiry."""
    backend = make_backend()
    mutex = backend.get_mutex("k")
    assert mutex.acquire()
    client.delete(ResourceKeys(namespace, "k").lock)
    with caplog.at_level(logging.WARNING, logger="cacheguard.dogpile"):
        mutex.release()
    assert "dogpile lock lost before its release" in caplog.text
    assert 0 < client.pttl(ResourceKeys(namespace, "k").fence) <= 30_000
    again = make_backend().get_mutex("k")
    assert again.acquire(False)
    again.release()


# -- the mutex ------------------------------------------------------------------------------------


def test_mutex_is_not_reentrant_in_one_thread(make_backend: Any) -> None:
    backend = make_backend()
    mutex = backend.get_mutex("k")
    assert isinstance(mutex, CacheMutex)
    assert mutex.acquire()
    try:
        assert not mutex.acquire(False)  # the same mutex, the same thread
        assert not backend.get_mutex("k").acquire(False)  # another mutex of the key
        other = make_backend()  # another backend (its own guard and client)
        assert not other.get_mutex("k").acquire(False)
        assert mutex.locked()
        assert other.get_mutex("k").locked()  # seen in Redis
    finally:
        mutex.release()
    assert not mutex.locked()
    again = backend.get_mutex("k")
    assert again.acquire(False)
    again.release()


def test_release_by_a_mutex_that_does_not_hold_it_is_refused(make_backend: Any) -> None:
    backend = make_backend()
    with pytest.raises(LockNotHeldError):
        backend.get_mutex("k").release()
    held = backend.get_mutex("k")
    assert held.acquire()
    with pytest.raises(LockNotHeldError):
        backend.get_mutex("k").release()
    held.release()


def test_the_async_creation_runner_releases_from_its_own_thread(
    redis_url: str, namespace: str, client: redis.Redis
) -> None:
    """dogpile hands the held mutex to the runner, whose thread releases it."""
    go = threading.Event()
    runners: list[threading.Thread] = []
    released_by: list[int] = []

    def runner(region: CacheRegion, key: str, creator: Any, mutex: CacheMutex) -> None:
        def run() -> None:
            try:
                region.set(key, creator())
            finally:
                mutex.release()
                released_by.append(threading.get_ident())

        runners.append(threading.Thread(target=run))
        runners[-1].start()

    region = make_region(async_creation_runner=runner).configure(
        "cacheguard",
        expiration_time=600,
        arguments={"url": redis_url, "namespace": namespace},
    )
    region.set("k", "old")
    region.invalidate(hard=False)  # the stored value now counts as expired

    def create() -> str:
        assert go.wait(30)
        return "new"

    assert region.get_or_create("k", create) == "old"  # served while the runner works
    assert region.key_is_locked("k")
    assert not region.backend.get_mutex("k").acquire(False)  # held: not re-entered here
    assert lock_hash(client, namespace, "k").get(b"mode") == b"write"
    go.set()
    runners[0].join(30)
    assert released_by == [runners[0].ident]
    assert not region.key_is_locked("k")
    assert b"mode" not in lock_hash(client, namespace, "k")
    assert region.get("k") == "new"
    mutex = region.backend.get_mutex("k")
    assert mutex.acquire(False)
    mutex.release()


@pytest.mark.slow
def test_a_blocking_acquire_gives_up_at_wait_timeout(make_backend: Any) -> None:
    holder = make_backend().get_mutex("k")
    assert holder.acquire()
    try:
        here = make_backend(wait_timeout=0.3)  # waits in Redis, behind another guard
        with pytest.raises(LockTimeout):
            here.get_mutex("k").acquire()
        same = CacheGuardMutex(holder._gate, 0.3)  # waits at this process's gate
        with pytest.raises(LockTimeout):
            same.acquire()
    finally:
        holder.release()
    assert make_backend(wait_timeout=0.3).get_mutex("k").acquire(False)


def test_a_guard_write_and_a_creator_exclude_each_other(
    client: redis.Redis, other_client: redis.Redis, namespace: str
) -> None:
    """The mutex is the write side of the key's lock: a guard's write on the key (here
    another guard, as another process would have) waits for a creation under way,
    then deletes what it created."""
    region = make_region().configure(
        "cacheguard", arguments={"guard": CacheGuard(client, namespace=namespace)}
    )
    writer = CacheGuard(other_client, namespace=namespace)
    creating, finish = threading.Event(), threading.Event()
    order: list[str] = []

    def create() -> str:
        creating.set()
        assert finish.wait(30)
        order.append("created")
        return "value"

    creator = threading.Thread(target=lambda: region.get_or_create("k", create))
    creator.start()
    assert creating.wait(10)

    def write() -> None:
        with writer.write("k"):
            order.append("written")

    writing = threading.Thread(target=write)
    writing.start()
    assert wait_until(lambda: waiting_marks(client, namespace, "k") == 1, 10)  # it queued
    finish.set()
    creator.join(30)
    writing.join(30)
    assert order == ["created", "written"]
    assert region.get("k") is NO_VALUE  # the write invalidated the created value


@pytest.mark.slow
def test_a_live_holders_lease_is_renewed_and_a_dead_ones_ends(
    redis_url: str, namespace: str, client: redis.Redis, make_backend: Any
) -> None:
    """A process holds the key with a 1 s lease: the watchdog keeps it past that
    lease; once the process is killed, the lock frees itself when the lease ends."""
    held = CTX.Event()
    holder = CTX.Process(
        target=hold_until_killed, args=(redis_url, namespace, "k", 1.0, held), daemon=True
    )
    holder.start()
    try:
        assert held.wait(30)
        owner, first_end = lease_end(client, namespace, "k")
        # Past the first lease, by Redis's clock: still held, under a renewed lease.
        assert wait_until(lambda: server_ms(client) > first_end + 500, 10)
        assert lease_end(client, namespace, "k")[0] == owner
        assert not make_backend().get_mutex("k").acquire(False)
    finally:
        holder.kill()
        holder.join(10)
    waiter = make_backend(wait_timeout=20).get_mutex("k")
    assert waiter.acquire()  # once the dead holder's lease ended
    waiter.release()


def hold_until_killed(url: str, namespace: str, key: str, lease: float, held: Any) -> None:
    backend = CacheGuardBackend({"url": url, "namespace": namespace, "lease": lease})
    mutex = backend.get_mutex(key)
    assert mutex.acquire()
    held.set()
    threading.Event().wait(120)  # until killed


def lease_end(client: redis.Redis, namespace: str, key: str) -> tuple[bytes, int]:
    """The owner holding ``key``'s lock for writing, and its lease end (server ms)."""
    fields = lock_hash(client, namespace, key)
    (owner,) = [f[2:] for f in fields if f.startswith(b"w:")]
    return owner, int(fields[b"e:" + owner])


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


@pytest.mark.slow
def test_a_busy_process_still_lets_another_process_in(
    redis_url: str, namespace: str, make_backend: Any, client: redis.Redis
) -> None:
    """Four threads here take and release the key without pause; a process that asks
    meanwhile still gets it: the hold passed on between this process's threads goes
    back to Redis after one round of them."""
    backend = make_backend()
    stop = threading.Event()
    rounds: list[int] = []
    flag = f"{namespace}:other-got-it"

    def busy() -> None:
        count = 0
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            mutex = backend.get_mutex("k")
            mutex.acquire()
            try:
                count += 1
                time.sleep(0.002)  # the work under the lock
                if client.exists(flag):
                    stop.set()
            finally:
                mutex.release()
        rounds.append(count)

    threads = [threading.Thread(target=busy) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        assert wait_until(lambda: backend.get_mutex("k").locked(), 10)
        child, result = start_process_reporting(
            acquire_once_and_flag, redis_url, namespace, "k", flag, 20.0
        )
        assert result_within(result, 40, "the other process never got the key") == 1
        child.join(10)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert len(rounds) == 4


def acquire_once_and_flag(url: str, namespace: str, key: str, flag: str, wait: float) -> int:
    backend = CacheGuardBackend({"url": url, "namespace": namespace, "wait_timeout": wait})
    mutex = backend.get_mutex(key)
    mutex.acquire()  # LockTimeout if the busy process never lets go
    try:
        backend.guard.client.set(flag, 1)
    finally:
        mutex.release()
    return 1


# -- a waiter's first read -----------------------------------------------------------------------


def counted_gets(backend: CacheGuardBackend) -> list[str]:
    """The value keys the backend's client GETs from now on."""
    client = backend._client
    original = client.get
    names: list[str] = []

    def get(name: str) -> Any:
        names.append(name)
        return original(name)

    client.get = get  # type: ignore[method-assign]
    return names


def queue_waiters(mutex_of: Any, count: int, inside: Any) -> list[threading.Thread]:
    """``count`` threads each waiting for the key's mutex (returned once they all wait
    at the process's gate), then running ``inside()`` under it."""
    gate = mutex_of()._gate

    def waiter() -> None:
        mutex = mutex_of()
        assert mutex.acquire()
        try:
            inside()
        finally:
            mutex.release()

    threads = [threading.Thread(target=waiter) for _ in range(count)]
    for t in threads:
        t.start()
    assert wait_until(lambda: gate.waiting == count, 10)
    return threads


def test_waiters_read_what_was_created_while_they_waited_without_a_round_trip(
    redis_url: str, namespace: str
) -> None:
    """dogpile's waiters each take the mutex in turn and read the value under it: a
    stampede of 8 threads costs one GET per caller before the mutex, and none after
    it but the creator's own."""
    region = region_on(redis_url, namespace)
    gets = counted_gets(region.backend)
    creating = threading.Event()
    finish = threading.Event()
    calls = 8

    def create() -> str:
        creating.set()
        assert finish.wait(30)
        return "menu"

    with ThreadPoolExecutor(calls) as pool:
        creator = pool.submit(region.get_or_create, "k", create)
        assert creating.wait(30)
        waiters = [pool.submit(region.get_or_create, "k", create) for _ in range(calls - 1)]
        gate = region.backend._gates.peek("k")
        assert wait_until(lambda: gate.waiting == calls - 1, 10)
        finish.set()
        assert creator.result(30) == "menu"
        assert [w.result(30) for w in waiters] == ["menu"] * (calls - 1)
    # Each caller's read before the mutex (all misses), and the creator's under it.
    assert len(gets) == calls + 1


def test_a_waiters_first_read_never_answers_with_what_was_seen_before_it_waited(
    make_backend: Any,
) -> None:
    """The holder read the value before a second thread began to wait; another process
    changed it meanwhile: the waiter's read goes to Redis and sees the change."""
    backend = make_backend()
    elsewhere = make_backend()  # another process's backend: no gate shared
    backend.set_serialized("k", b"old")
    holder = backend.get_mutex("k")
    assert holder.acquire()
    assert backend.get_serialized("k") == b"old"  # seen under the hold, before the wait
    read: list[Any] = []
    threads = queue_waiters(
        lambda: backend.get_mutex("k"), 1, lambda: read.append(backend.get_serialized("k"))
    )
    elsewhere.set_serialized("k", b"new")  # an unlocked write, as region.set makes
    gets = counted_gets(backend)
    holder.release()
    threads[0].join(30)
    assert read == [b"new"]
    assert len(gets) == 1


def test_a_waiters_first_read_is_from_redis_once_the_hold_was_let_go(
    make_backend: Any, client: redis.Redis, namespace: str
) -> None:
    """What was seen under a hold that has since gone back to Redis (here: lost) tells
    nothing: another process may have created the value since."""
    backend = make_backend()
    elsewhere = make_backend()
    holder = backend.get_mutex("k")
    assert holder.acquire()
    read: list[Any] = []
    threads = queue_waiters(
        lambda: backend.get_mutex("k"), 1, lambda: read.append(backend.get_serialized("k"))
    )
    backend.set_serialized("k", b"mine")  # seen under this hold, after the wait began
    hold = holder._gate.hold
    client.delete(ResourceKeys(namespace, "k").lock)  # the hold is lost...
    assert not hold.renew()  # ...and known lost: it is let go, not passed on
    other = elsewhere.get_mutex("k")
    assert other.acquire()  # another process creates meanwhile
    elsewhere.set_serialized("k", b"theirs")
    gets = counted_gets(backend)
    holder.release()
    other.release()
    threads[0].join(30)
    assert read == [b"theirs"]
    assert len(gets) == 1


def test_a_waiter_that_wrote_the_key_reads_it_back_from_redis(make_backend: Any) -> None:
    """Only a waiter's first call on the key may be answered from its wait: after its
    own write, a read seen by some other thread (stamped later) must not be served."""
    backend = make_backend()
    holder = backend.get_mutex("k")
    assert holder.acquire()
    read: list[Any] = []
    gate = holder._gate

    def inside() -> None:
        backend.delete("k")
        gate.saw(b"raced", time.monotonic(), gate.hold)  # another thread's late reply
        read.append(backend.get_serialized("k"))

    threads = queue_waiters(lambda: backend.get_mutex("k"), 1, inside)
    backend.set_serialized("k", b"created")
    holder.release()
    threads[0].join(30)
    assert read == [NO_VALUE]


def test_a_hold_whose_lease_may_have_run_out_is_not_passed_on(make_backend: Any) -> None:
    """No renewal confirmed the hold for most of a lease (renewals failing, a frozen
    process): the holder lets it go in Redis instead of passing it on; the waiter
    takes a fresh one."""
    backend = make_backend()
    holder = backend.get_mutex("k")
    assert holder.acquire()
    first = holder._gate.hold
    got: list[Any] = []
    threads = queue_waiters(
        lambda: backend.get_mutex("k"), 1, lambda: got.append(holder._gate.hold)
    )
    first.confirmed_at -= first.lease  # as if nothing had confirmed it for a lease
    holder.release()
    threads[0].join(30)
    assert got[0] is not first
    assert got[0].token > first.token
    assert first.released


# -- a stampede of processes ---------------------------------------------------------------------

PROCESSES, THREADS = 3, 8


@pytest.mark.slow
def test_a_stampede_of_processes_creates_once_and_wakes_waiters_by_release(
    redis_url: str, namespace: str, client: redis.Redis
) -> None:
    """3 processes x 8 threads miss one key at once through a region on the backend:
    one creator call, every caller gets its value. While it runs, each other process
    has exactly one thread queued in Redis (the rest wait at their process's gate),
    and those waiters' retry timers and the holder's lease are a minute long: the
    results can only arrive within the deadline through the release message."""
    go = CTX.Event()
    results: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.extend(
                run_processes(
                    stampede_process,
                    [(redis_url, namespace, THREADS, go)] * PROCESSES,
                    timeout=25,  # the minute-long timers cannot fire within it
                )
            )
        except BaseException as exc:
            errors.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    channel = ResourceKeys(namespace, "menu").released_channel
    try:
        assert wait_until(lambda: client.get(f"{namespace}:creations") == b"1", 60)
        assert wait_until(
            lambda: client.get(f"{namespace}:asked") == b"%d" % (PROCESSES * THREADS), 60
        )
        # One thread per other process queued in Redis, subscribed to the key's channel.
        assert wait_until(lambda: waiting_marks(client, namespace, "menu") == PROCESSES - 1, 30)
        assert wait_until(lambda: subscribers(client, channel) == PROCESSES - 1, 30)
    finally:
        go.set()
        runner.join(60)
    assert not errors, errors
    values = [value for process in results for value in process]
    assert len(values) == PROCESSES * THREADS
    assert len({(v["made_by"], v["n"]) for v in values}) == 1  # everyone got the one value
    assert client.get(f"{namespace}:creations") == b"1"


def stampede_process(url: str, namespace: str, threads: int, go: Any) -> list[Any]:
    region = region_on(url, namespace, lease=60)
    # The key's lock as the backend will use it (kept referenced, so the gate gets this
    # very one), its distributed part swapped for one whose retry timer and waiting
    # writer's mark last minutes: no timer can wake this process within the deadline.
    lock = region.backend.guard.rwlock("menu")
    lock.remote = RedisRWLock(
        lock.remote.client,
        "menu",
        namespace=namespace,
        lease=60,
        timeout=120,
        backoff=NO_TIMER_WAKE_UP,
    )
    client = client_for(url)
    start = threading.Barrier(threads)
    got: list[Any] = []

    def create() -> dict[str, Any]:
        n = client.incr(f"{namespace}:creations")
        assert go.wait(60), "the test never let the creator finish"
        return {"made_by": os.getpid(), "n": n}

    def caller() -> None:
        start.wait(30)
        client.incr(f"{namespace}:asked")
        got.append(region.get_or_create("menu", create))

    pool = [threading.Thread(target=caller) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(60)
    del lock
    return got


# -- the two-tier lock's holder ids (added for this backend) -------------------------------------


def test_a_write_hold_for_a_holder_id_is_released_from_another_thread(
    client: redis.Redis, namespace: str
) -> None:
    factory = LockFactory(client, namespace=namespace, lease=5, timeout=5)
    lock = factory.rwlock("k")
    h1 = Holder()
    handle = lock.acquire_write(5, holder=h1)
    assert not lock.local.is_write_held_by_me()  # the hold is not this thread's
    with pytest.raises(LockTimeout):  # so this thread does not re-enter it
        lock.acquire_write(0.2)
    assert lock.try_acquire_write() is None
    assert lock.try_acquire_write(holder=h1) is handle  # the holder id re-enters
    lock.release_write(holder=h1)
    released = threading.Thread(target=lambda: lock.release_write(holder=h1))
    released.start()
    released.join(10)
    assert lock.local.is_free()
    assert b"mode" not in client.hgetall(lock.remote.keys.lock)


def test_try_acquire_write_leaves_no_waiting_mark(
    client: redis.Redis, other_client: redis.Redis, namespace: str
) -> None:
    here = LockFactory(client, namespace=namespace).rwlock("k")
    elsewhere = LockFactory(other_client, namespace=namespace).rwlock("k")
    h2 = Holder()
    with elsewhere.write(5):
        assert here.try_acquire_write(holder=h2) is None
        assert waiting_marks(client, namespace, "k") == 0
        assert here.local.is_free()
    handle = here.try_acquire_write(holder=h2)
    assert handle is not None
    here.release_write(holder=h2)


def test_a_reading_thread_asking_for_a_holder_ids_write_is_refused(
    client: redis.Redis, namespace: str
) -> None:
    lock = LockFactory(client, namespace=namespace).rwlock("k")
    h3 = Holder()
    with lock.read(5):
        with pytest.raises(LockUpgradeError):
            lock.acquire_write(5, holder=h3)  # it would wait for this very thread
        with pytest.raises(LockUpgradeError):
            lock.try_acquire_write(holder=h3)


# -- the deployments its URLs name ---------------------------------------------------------------


def names_per_master(cluster: OwnedRedisCluster, namespace: str) -> list[str]:
    found: dict[int, str] = {}
    for i in range(1000):
        port = cluster.master_for_key(ResourceKeys(namespace, f"k{i}").value).port
        found.setdefault(port, f"k{i}")
    assert len(found) == len(cluster.masters())
    return list(found.values())


@pytest.mark.slow
def test_a_region_on_a_cluster_url(
    redis_cluster: OwnedRedisCluster, cluster_namespace: str
) -> None:
    nodes = ",".join(f"{node.host}:{node.port}" for node in redis_cluster.masters())
    region = region_on(f"redis+cluster://{nodes}", cluster_namespace, redis_expiration_time=60)
    names = names_per_master(redis_cluster, cluster_namespace)
    region.set_multi({name: f"v{name}" for name in names})  # one pipeline per node
    assert region.get_multi(names) == [f"v{name}" for name in names]
    region.delete_multi(names)
    assert region.get_multi(names) == [NO_VALUE] * len(names)
    for name in names:
        assert region.get_or_create(name, lambda name=name: f"made {name}") == f"made {name}"
        mutex = region.backend.get_mutex(name)
        assert mutex.acquire()
        other = region_on(f"redis+cluster://{nodes}", cluster_namespace).backend
        assert not other.get_mutex(name).acquire(False)
        mutex.release()
        theirs = other.get_mutex(name)
        assert theirs.acquire(False)
        theirs.release()
        other.close()
    region.backend.close()


def test_a_region_on_a_sentinel_url(sentinel_set: OwnedSentinelSet, namespace: str) -> None:
    hosts = ",".join(f"{h}:{p}" for h, p in sentinel_set.sentinel_addresses)
    url = f"redis+sentinel://{hosts}/{sentinel_set.master_name}"
    region = region_on(url, namespace)
    try:
        assert region.get_or_create("k", lambda: "made") == "made"
        assert region.get_multi(["k", "none"]) == ["made", NO_VALUE]
        mutex = region.backend.get_mutex("k")
        assert mutex.acquire()
        other = region_on(url, namespace).backend
        assert not other.get_mutex("k").acquire(False)
        mutex.release()
        other.close()
        region.delete("k")
    finally:
        region.backend.close()
