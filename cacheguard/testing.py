"""A Redis to test and demo against, wherever the code runs.

:func:`redis_server` yields a :class:`RedisEndpoint`, trying in order:

1. ``url`` (or the ``REDIS_URL`` environment variable), if given;
2. a throwaway ``redis-server`` on a free loopback port, if the binary exists;
3. fakeredis's TCP server with Lua (the ``fakeredis[lua]`` package), so a bare
   machine still runs everything.

``require_real=True`` (or ``CACHEGUARD_REQUIRE_REDIS=1``) turns step 3 into an
error, and makes an unreachable ``REDIS_URL`` an error too: CI must fail, not
quietly test against an imitation.

:func:`zookeeper_server` yields a throwaway standalone ZooKeeper (for
:class:`~cacheguard.locks.zookeeper.ZooKeeperRWLock`): the ``zookeeper`` Java
server of the distribution package (Debian's ``zookeeper``; another install by
``classpath=`` or ``ZOOKEEPER_CLASSPATH``), on a free loopback port with a
temporary data directory.
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

from cacheguard.exceptions import REDIS_UNREACHABLE, BackendUnavailable

__all__ = [
    "OwnedRedisServer",
    "OwnedZooKeeperServer",
    "RedisEndpoint",
    "free_port",
    "redis_server",
    "require_real_redis",
    "spawn_redis_server",
    "zookeeper_installed",
    "zookeeper_server",
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


# Where Debian's ``zookeeper`` package puts the server; its manifest names the jars it needs.
DEBIAN_ZOOKEEPER_CLASSPATH = "/usr/share/java/zookeeper.jar"
_ZOOKEEPER_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"


def zookeeper_installed(classpath: str | None = None) -> bool:
    """Can :class:`OwnedZooKeeperServer` start here (a JRE and the server's jars)?"""
    found = classpath or os.environ.get("ZOOKEEPER_CLASSPATH") or DEBIAN_ZOOKEEPER_CLASSPATH
    jars = any(os.path.exists(part) for part in found.split(os.pathsep))
    return jars and shutil.which("java") is not None


class OwnedZooKeeperServer:
    """A throwaway standalone ZooKeeper on a loopback port that its owner can kill and
    restart. Its data directory outlives a restart, so sessions and znodes do too (a
    client that reconnects within its session timeout keeps its session).

    ``tick_ms`` is ZooKeeper's tick: sessions expire on tick boundaries and may be as
    short as two ticks (``minSessionTimeout``) and as long as 60 s. ``classpath``:
    the server's jars (default ``$ZOOKEEPER_CLASSPATH``, else Debian's).
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        tick_ms: int = 100,
        classpath: str | None = None,
        java: str | None = None,
    ) -> None:
        self.classpath = (
            classpath or os.environ.get("ZOOKEEPER_CLASSPATH") or DEBIAN_ZOOKEEPER_CLASSPATH
        )
        if not any(os.path.exists(part) for part in self.classpath.split(os.pathsep)):
            raise FileNotFoundError(
                f"no ZooKeeper server at {self.classpath} (apt-get install zookeeper, "
                "or set ZOOKEEPER_CLASSPATH)"
            )
        found = java or shutil.which("java")
        if found is None:
            raise FileNotFoundError("java is not on the PATH (ZooKeeper needs a JRE)")
        self.java = found
        self.port = port or free_port()
        self.workdir = tempfile.mkdtemp(prefix="cacheguard-zookeeper-")
        self.config = os.path.join(self.workdir, "zoo.cfg")
        with open(self.config, "w", encoding="utf-8") as cfg:
            cfg.write(
                f"tickTime={tick_ms}\n"
                f"dataDir={os.path.join(self.workdir, 'data')}\n"
                f"clientPort={self.port}\n"
                "clientPortAddress=127.0.0.1\n"
                f"minSessionTimeout={2 * tick_ms}\n"
                "maxSessionTimeout=60000\n"
                # A process kill loses nothing written to the page cache: skip fsync.
                "forceSync=no\n"
                "admin.enableServer=false\n"
                "4lw.commands.whitelist=srvr,ruok,cons,mntr\n"
            )
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def hosts(self) -> str:
        """The connection string for ``KazooClient(hosts=...)``."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it (again, with the data it had) and wait until it serves requests."""
        with open(os.path.join(self.workdir, "server.log"), "ab") as log:
            self.proc = subprocess.Popen(
                [self.java, "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                 "-Djava.net.preferIPv4Stack=true", "-cp", self.classpath, _ZOOKEEPER_MAIN,
                 self.config],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 30  # a JVM on a busy machine: allow it time
        while not self._serving():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.kill()
                raise BackendUnavailable(
                    f"ZooKeeper on port {self.port} did not start (log in {self.workdir})"
                )
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL it: no goodbye to clients, whose sessions live on in its data."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def four_letter(self, word: str) -> str:
        """The answer to a four-letter command (``srvr``, ``cons``, ``mntr``, ``ruok``)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as conn:
            conn.sendall(word.encode())
            chunks = []
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def _serving(self) -> bool:
        # "srvr" answers "not currently serving requests" until the database is loaded.
        try:
            return "Mode: standalone" in self.four_letter("srvr")
        except OSError:
            return False


@contextlib.contextmanager
def zookeeper_server(
    *, port: int | None = None, tick_ms: int = 100, classpath: str | None = None
) -> Iterator[OwnedZooKeeperServer]:
    """Run a throwaway standalone ZooKeeper; its ``hosts`` go to ``KazooClient``."""
    server = OwnedZooKeeperServer(port=port, tick_ms=tick_ms, classpath=classpath)
    try:
        yield server
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
