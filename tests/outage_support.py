"""What the outage tests share (tests/test_outage_settings.py,
tests/faults/test_outage_modes.py): outages of a throwaway Redis server (killed,
paused, black-holed), a clock the test moves forward, a counting loader, and
looks into a gutter server. Their fixtures are in ``tests/outage_fixtures.py``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from cacheguard.redis.keys import ResourceKeys
from cacheguard.testing import OwnedRedisServer
from tests.faults.proxy import TcpProxy
from tests.guard_drivers import Guard

__all__ = [
    "FAST_FAIL",
    "NAMESPACE",
    "OUTAGES",
    "WINDOW",
    "Clock",
    "Counted",
    "Make",
    "Outage",
    "gutter_commands",
    "many",
    "read",
    "reset_stats",
    "value_key",
]

NAMESPACE = "outage"
WINDOW = 30.0  # outage_ttl / stale_if_error of most tests: crossed only by a jump
# Timeouts short enough that a dead server costs little; a breaker whose cooldown
# only a jump of the clock ends.
FAST_FAIL: dict[str, Any] = {
    "connect_timeout": 0.5,
    "socket_timeout": 0.5,
    "breaker_failures": 2,
    "breaker_cooldown": 5.0,
    "ttl_jitter": 0,
    "namespace": NAMESPACE,
}


class Clock:
    """``time.monotonic`` plus whatever the test added: real waits still pass, and a
    window ends when the test says so."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


class Counted:
    """A loader returning ``<name>-<n>`` for its n-th call, or raising while ``failing``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0
        self.failing = False
        self._mutex = threading.Lock()

    def __call__(self) -> str:
        with self._mutex:
            if self.failing:
                raise LookupError(f"the database cannot load {self.name}")
            self.calls += 1
            return f"{self.name}-{self.calls}"


Make = Callable[..., Guard]


async def read(guard: Guard, load: Any, name: str | None = None, **kwargs: Any) -> Any:
    kwargs.setdefault("ttl", 600)
    return await guard.get_or_load(name or load.name, load, **kwargs)


async def many(guard: Guard, load: Any, count: int = 8) -> list[Any]:
    return list(await asyncio.gather(*(read(guard, load) for _ in range(count))))


def value_key(name: str, namespace: str = NAMESPACE) -> str:
    return ResourceKeys(namespace, name).value


def gutter_commands(server: OwnedRedisServer) -> dict[str, int]:
    """The commands ``server`` ran since its stats were last reset, but the test's own
    (a connection's HELLO and CLIENT, INFO, CONFIG)."""
    with redis.Redis(port=server.port) as direct:
        stats = direct.info("commandstats")
    return {
        name: int(value["calls"])
        for name, value in stats.items()
        if not name.startswith(
            ("cmdstat_info", "cmdstat_config", "cmdstat_hello", "cmdstat_client")
        )
    }


def reset_stats(server: OwnedRedisServer) -> None:
    with redis.Redis(port=server.port) as direct:
        direct.config_resetstat()


# The outages: connection refused, a partition (data kept, replies never come), an
# address that accepts connections and swallows everything.
OUTAGES = ("killed", "stopped", "blackholed")


class Outage:
    """One kind of outage of ``server``, begun and ended by the test; clients go
    through :attr:`url` (a black-holing proxy's, for ``"blackholed"``)."""

    def __init__(self, how: str, server: OwnedRedisServer) -> None:
        assert how in OUTAGES, how
        self.how = how
        self.server = server
        self.proxy = TcpProxy(server.port) if how == "blackholed" else None
        self.down = False

    @property
    def url(self) -> str:
        return self.proxy.url if self.proxy is not None else self.server.url

    def begin(self) -> None:
        self.down = True
        if self.how == "killed":
            self.server.kill()
        elif self.how == "stopped":
            assert self.server.proc is not None
            os.kill(self.server.proc.pid, signal.SIGSTOP)
        else:
            assert self.proxy is not None
            self.proxy.set_mode("blackhole")

    def end(self) -> None:
        """Redis is back: restarted empty (killed), or with its data (the others)."""
        if not self.down:
            return
        self.down = False
        if self.how == "killed":
            self.server.start()
        elif self.how == "stopped":
            assert self.server.proc is not None
            os.kill(self.server.proc.pid, signal.SIGCONT)
        else:
            assert self.proxy is not None
            self.proxy.set_mode("pass")

    def close(self) -> None:
        if self.how == "stopped":
            self.end()  # a stopped server still dies of SIGKILL, but leave none paused
        if self.proxy is not None:
            self.proxy.close()
