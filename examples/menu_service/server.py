"""``serve``: the API of :mod:`menu_service.api` on uvicorn, stopped gracefully.

While serving, SIGTERM and SIGINT (Ctrl-C) stop accepting connections, let
requests in flight finish and run the application's shutdown (guards and
engines closed); uvicorn then re-raises the signal it caught. Around the whole
command, :func:`stop_signals_raise` turns either signal into :class:`Stopped`,
before serving (starting Redis, seeding) as after, so it unwinds the caller's
``with`` blocks, which remove the throwaway Redis and the temporary directory.
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import uvicorn

from .api import ServiceConfig, create_app
from .limits import guarded_protocol


class Stopped(Exception):
    """SIGTERM or SIGINT arrived (see :func:`stop_signals_raise`)."""


def listen(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: a free one, read back from the socket)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def run(
    config: ServiceConfig,
    sock: socket.socket,
    *,
    head_timeout: float = 10.0,
    on_ready: Callable[[], None] | None = None,
    access_log: bool = False,
) -> None:
    """Serve ``config``'s application on ``sock`` until SIGTERM or SIGINT."""
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config),
            http=guarded_protocol(head_timeout),
            lifespan="on",
            ws="none",  # no WebSocket routes: an Upgrade request is a plain request
            access_log=access_log,
            log_level="info" if access_log else "warning",
            timeout_keep_alive=5,
            timeout_graceful_shutdown=30,  # then cancel what is still running
        )
    )
    if on_ready is not None:
        _call_when_started(server, on_ready)
    server.run(sockets=[sock])  # a signal re-raised at its end: Stopped, if raised
    if not server.started:
        raise RuntimeError("the service did not start (see the log above)")


@contextmanager
def stop_signals_raise() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT raise :class:`Stopped` (uvicorn takes them
    over while it serves, and re-raises them here once it has shut down)."""

    def stopped(signum: int, frame: FrameType | None) -> None:
        for sig in handled:  # once: a second Ctrl-C must not cut the clean-up short
            signal.signal(sig, signal.SIG_IGN)
        raise Stopped(signum)

    handled = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.signal(sig, stopped) for sig in handled}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _call_when_started(server: uvicorn.Server, on_ready: Callable[[], None]) -> None:
    startup = server.startup

    async def startup_then_tell(sockets: list[socket.socket] | None = None) -> None:
        await startup(sockets=sockets)
        if server.started:
            on_ready()

    server.startup = startup_then_tell  # type: ignore[method-assign]
