"""Fault tests own their Redis: a redis-server the test starts, kills and restarts."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

from cacheguard.testing import free_port, redis_server_command, require_real_redis
from tests.helpers import wait_until


class OwnedRedis:
    """A redis-server on a fixed loopback port that the test can kill and restart."""

    def __init__(self, *extra_args: str) -> None:
        self.port = free_port()
        self.extra_args = extra_args
        self.workdir = tempfile.mkdtemp(prefix="cacheguard-fault-")
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None
        self.proc = subprocess.Popen(
            redis_server_command(binary, self.port, self.workdir, *self.extra_args),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        assert wait_until(self._answers, 10), "redis-server did not start"

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(5)
        self.proc = None

    def _answers(self) -> bool:
        import socket

        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                reply = s.recv(64)
                return reply.startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(5)
        shutil.rmtree(self.workdir, ignore_errors=True)


@pytest.fixture
def redis_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        if require_real_redis():
            pytest.fail("the fault tests need redis-server on the PATH (CACHEGUARD_REQUIRE_REDIS)")
        pytest.skip("the fault tests start their own redis-server, which is not installed")
    return binary


@pytest.fixture
def owned_redis(redis_binary: str) -> Iterator[OwnedRedis]:
    server = OwnedRedis()
    yield server
    server.close()
