"""A throwaway ZooKeeper server for the ZooKeeper lock store's tests and benchmarks:
Debian's ``zookeeper`` package's jar, run on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

from cacheguard.exceptions import BackendUnavailable
from cacheguard.testing import free_port

__all__ = [
    "DEBIAN_ZOOKEEPER_CLASSPATH",
    "OwnedZooKeeperServer",
    "zookeeper_installed",
    "zookeeper_server",
]


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
