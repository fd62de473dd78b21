"""Small helpers shared by tests and their child processes."""

from __future__ import annotations

import time
from collections.abc import Callable

import redis


def wait_until(predicate: Callable[[], object], timeout: float = 5.0) -> bool:
    """Poll ``predicate`` (test-side only) until it is true or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


def client_for(url: str) -> redis.Redis:
    """The client a test child process uses."""
    return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=10)
