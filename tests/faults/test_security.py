"""Security: AUTH, an ACL user confined to its namespace, TLS; codecs and key escaping."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cacheguard import MISSING, BackendUnavailable, CacheGuard, CacheGuardError, PickleCodec
from cacheguard.cache.entry import pack_entry
from cacheguard.redis.keys import ResourceKeys
from cacheguard.testing import OwnedRedisServer, free_port


@pytest.fixture
def acl_redis(redis_binary: str) -> Iterator[OwnedRedisServer]:
    server = OwnedRedisServer("--requirepass", "admin-secret")
    admin = redis.Redis(port=server.port, password="admin-secret")
    # An application user that may only touch its namespace's keys and channels.
    admin.execute_command(
        "ACL", "SETUSER", "app", "on", ">app-secret", "resetkeys", "~shop:*",
        "resetchannels", "&shop:*", "+@all", "-@admin", "-@dangerous",
    )  # fmt: skip
    admin.close()
    yield server
    server.close()


def _exercise(guard: CacheGuard) -> None:
    """Every kind of Redis work a guard does: fill, hit, lock, write, L1 broadcast."""
    assert guard.get_or_load("menu:list", lambda: ["soup"], ttl=60) == ["soup"]
    assert guard.get_or_load("menu:list", lambda: ["never"], ttl=60) == ["soup"]
    with guard.write("menu:list"):
        pass
    assert guard.get_or_load("menu:list", lambda: ["salad"], ttl=60) == ["salad"]
    with guard.rwlock("menu:7").read(timeout=2):
        pass


def test_password_in_the_url(acl_redis: OwnedRedisServer) -> None:
    url = f"redis://:admin-secret@127.0.0.1:{acl_redis.port}/0"
    _exercise(CacheGuard.from_url(url, namespace="shop", l1_maxsize=10))


def test_wrong_password_is_a_clear_error(acl_redis: OwnedRedisServer) -> None:
    url = f"redis://app:wrong@127.0.0.1:{acl_redis.port}/0"
    guard = CacheGuard.from_url(url, namespace="shop", on_backend_error="raise")
    with pytest.raises(BackendUnavailable, match="invalid username-password"):
        guard.get_or_load("menu:list", lambda: ["x"], ttl=60)
    bypassing = CacheGuard.from_url(url, namespace="shop")  # the default: serve uncached
    assert bypassing.get_or_load("menu:list", lambda: ["x"], ttl=60) == ["x"]


def test_acl_user_works_inside_its_namespace_and_is_refused_outside(
    acl_redis: OwnedRedisServer,
) -> None:
    url = f"redis://app:app-secret@127.0.0.1:{acl_redis.port}/0"
    _exercise(CacheGuard.from_url(url, namespace="shop", l1_maxsize=10))
    outside = CacheGuard.from_url(url, namespace="other", on_backend_error="raise")
    with pytest.raises(BackendUnavailable, match="no permissions"):
        outside.get_or_load("menu:list", lambda: ["x"], ttl=60)
    with pytest.raises(BackendUnavailable, match="no permissions"):
        outside.rwlock("menu:list").acquire_write(timeout=1)
    with pytest.raises(BackendUnavailable, match="no permissions"):
        outside.invalidate("menu:list")


@pytest.mark.slow
def test_tls_through_a_rediss_url(redis_binary: str, tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    tls_port = free_port()
    server = OwnedRedisServer(
        "--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
        "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no",
    )  # fmt: skip
    try:
        url = f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={cert}"
        _exercise(CacheGuard.from_url(url, namespace="shop", l1_maxsize=10))
        plain = redis.Redis(port=tls_port, socket_timeout=1, socket_connect_timeout=1)
        with pytest.raises(redis.RedisError):
            plain.ping()  # the TLS port speaks only TLS
    finally:
        server.close()


def test_pickle_needs_a_key_and_refuses_unsigned_or_tampered_bytes(
    client: redis.Redis, namespace: str
) -> None:
    with pytest.raises((ValueError, CacheGuardError)):
        PickleCodec(b"short")
    codec = PickleCodec(b"k" * 32)
    guard = CacheGuard(client, namespace=namespace, codec=codec)
    assert guard.get_or_load("k", lambda: {"a": 1}, ttl=60) == {"a": 1}
    keys = ResourceKeys(namespace, "k")
    raw = client.get(keys.value)
    assert raw is not None
    tampered = raw[:-1] + bytes([raw[-1] ^ 1])
    client.set(keys.value, tampered)
    assert guard.peek("k") is MISSING  # refused bytes are a miss, never unpickled
    assert guard.stats().corrupt_entries >= 1
    other = PickleCodec(b"x" * 32)  # signed with another key: refused too
    client.set(keys.value, pack_entry(other, {"evil": 1}, created=0, ttl=1e9, version=0,
                                      load_duration=0))  # fmt: skip
    assert guard.get_or_load("k", lambda: {"a": 2}, ttl=60) == {"a": 2}


def test_namespaces_never_see_each_other(client: redis.Redis, namespace: str) -> None:
    a = CacheGuard(client, namespace=f"{namespace}a")
    b = CacheGuard(client, namespace=f"{namespace}b")
    a.get_or_load("menu:list", lambda: "from a", ttl=60)
    assert b.get_or_load("menu:list", lambda: "from b", ttl=60) == "from b"
    assert a.peek("menu:list") == "from a"
    b.invalidate("menu:list")
    assert a.peek("menu:list") == "from a"
    for key in client.scan_iter(match=f"{namespace}[ab]:*"):
        client.delete(key)
