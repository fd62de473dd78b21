"""A Redis to test and demo against, wherever the code runs.

:func:`redis_server` yields a :class:`RedisEndpoint`, trying in order:

1. ``url`` (or the ``REDIS_URL`` environment variable), if given;
2. a throwaway ``redis-server`` on a free loopback port, if the binary exists;
3. fakeredis's TCP server with Lua (the ``fakeredis[lua]`` package), so a bare
   machine still runs everything.

``require_real=True`` (or ``CACHEGUARD_REQUIRE_REDIS=1``) turns step 3 into an
error, and makes an unreachable ``REDIS_URL`` an error too: CI must fail, not
quietly test against an imitation.

The ZooKeeper server and the Redis Cluster and Sentinel sets that the project's own
tests start are test rigs, not part of this package: they live in the
``cacheguard-testing`` distribution of the repository (``testing/``, package
``cacheguard_testing``). ``zookeeper_server`` and its kin are still importable from
here where that distribution is installed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import redis

from cacheguard.exceptions import BackendUnavailable
from cacheguard.redis.errors import REDIS_UNREACHABLE

__all__ = [
    "OwnedRedisServer",
    "RedisEndpoint",
    "free_port",
    "redis_server",
    "require_real_redis",
    "spawn_redis_server",
]

Kind = Literal["url", "redis-server", "fakeredis"]


@dataclass(frozen=True)
class RedisEndpoint:
    url: str
    kind: Kind

    @property
    def real(self) -> bool:
        return self.kind != "fakeredis"


def require_real_redis() -> bool:
    return os.environ.get("CACHEGUARD_REQUIRE_REDIS", "") not in ("", "0", "false", "no")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_for_ping(url: str, deadline: float) -> None:
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
            try:
                client.ping()
                return
            finally:
                client.close()
        except REDIS_UNREACHABLE as exc:
            last = exc
            time.sleep(0.02)
    raise BackendUnavailable(f"Redis at {url} did not answer PING: {last}")


class OwnedRedisServer:
    """A throwaway ``redis-server`` (no persistence) on a loopback port that its owner
    can kill and restart (the harness, fault tests, the soak). ``extra_args`` go to
    the server's command line."""

    def __init__(self, *extra_args: str, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server is not on the PATH")
        self.binary = binary
        self.port = port or free_port()
        self.extra_args = extra_args
        self.workdir = tempfile.mkdtemp(prefix="cacheguard-redis-")
        self.proc: subprocess.Popen[bytes] | None = None
        try:
            self.start()
        except BaseException:  # a failed start, or a signal meanwhile: leave nothing behind
            self.close()
            raise

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start it (again, empty: it keeps nothing) and wait until it answers."""
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.workdir, *self.extra_args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not self._answers():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.kill()
                raise BackendUnavailable(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL it (no shutdown, no goodbye to clients)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(5)
            self.proc = None

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _answers(self) -> bool:
        # A raw PING: answers "+PONG", or "-NOAUTH" when a password is required.
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(64).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False


@contextlib.contextmanager
def spawn_redis_server(
    *, port: int | None = None, extra_args: tuple[str, ...] = ()
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Run a throwaway ``redis-server`` (no persistence) on a loopback port."""
    server = OwnedRedisServer(*extra_args, port=port)
    assert server.proc is not None
    try:
        yield server.url, server.proc
    finally:
        server.close()


def _error_replies_keep_connection(handler: Any) -> Any:
    """fakeredis's TCP server closes a connection after any error reply (a NOSCRIPT,
    a WRONGTYPE); real Redis answers the error and keeps the connection. Hand the
    error back as the reply instead, so the fallback behaves like the real thing."""

    class Handler(handler):  # type: ignore[misc, valid-type, unused-ignore]
        def setup(self) -> None:
            super().setup()
            read = self.current_client.read_response

            def read_keeping_errors(*args: Any, **kwargs: Any) -> Any:
                try:
                    return read(*args, **kwargs)
                except redis.ResponseError as exc:
                    return exc

            self.current_client.read_response = read_keeping_errors

    return Handler


@contextlib.contextmanager
def _fakeredis_server() -> Iterator[str]:
    try:
        from fakeredis import TcpFakeServer  # noqa: PLC0415 - optional dependency
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise BackendUnavailable(
            "no Redis: set REDIS_URL, install redis-server, or pip install 'fakeredis[lua]'"
        ) from exc
    server = TcpFakeServer(("127.0.0.1", 0), server_type="redis")
    server.RequestHandlerClass = _error_replies_keep_connection(server.RequestHandlerClass)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="fakeredis", daemon=True)
    thread.start()
    port = server.server_address[1]
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def redis_server(
    url: str | None = None, *, require_real: bool | None = None
) -> Iterator[RedisEndpoint]:
    """Yield a reachable Redis endpoint (see the module docstring for the order)."""
    strict = require_real_redis() if require_real is None else require_real
    url = url or os.environ.get("REDIS_URL") or None
    if url:
        _wait_for_ping(url, time.monotonic() + 5)
        yield RedisEndpoint(url, "url")
        return
    if shutil.which("redis-server"):
        with spawn_redis_server() as (spawned_url, _proc):
            yield RedisEndpoint(spawned_url, "redis-server")
        return
    if strict:
        raise BackendUnavailable(
            "a real Redis is required (CACHEGUARD_REQUIRE_REDIS is set) but REDIS_URL is "
            "unset and redis-server is not on the PATH"
        )
    with _fakeredis_server() as fake_url:
        yield RedisEndpoint(fake_url, "fakeredis")


# The ZooKeeper rig moved to the cacheguard-testing distribution (testing/ in the
# repository); the names the docs showed here keep working where it is installed.
_MOVED_TO_RIGS = frozenset(
    {
        "DEBIAN_ZOOKEEPER_CLASSPATH",
        "OwnedZooKeeperServer",
        "zookeeper_installed",
        "zookeeper_server",
    }
)


def __getattr__(name: str) -> Any:
    if name not in _MOVED_TO_RIGS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from cacheguard_testing import zookeeper  # noqa: PLC0415 - a rig, only on demand
    except ImportError as exc:
        raise ImportError(
            f"cacheguard.testing.{name} is a test rig of the cacheguard-testing distribution: "
            "pip install -e ./testing (from a checkout of the cacheguard repository)"
        ) from exc
    return getattr(zookeeper, name)
