"""A TCP proxy between a client and Redis that a test can make misbehave.

Modes (switch at any time with :meth:`TcpProxy.set_mode`):

* ``"pass"``: forward both ways;
* ``"delay"``: forward, each chunk held back ``delay`` seconds first;
* ``"blackhole"``: accept connections and read, never forward nor answer;

and :meth:`TcpProxy.drop_all` closes every open connection at once (a network
reset), :meth:`TcpProxy.drop_subscribers` only those a client subscribed on (its
pub/sub connection dies, its command connections live); new connections are
accepted as usual.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from typing import Literal

Mode = Literal["pass", "delay", "blackhole"]


class TcpProxy:
    def __init__(self, upstream_port: int, *, host: str = "127.0.0.1") -> None:
        self.upstream = (host, upstream_port)
        self.mode: Mode = "pass"
        self.delay = 0.0
        self._listener = socket.create_server((host, 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: set[socket.socket] = set()
        self._subscribers: set[socket.socket] = set()  # client sides that sent SUBSCRIBE
        self._mutex = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def set_mode(self, mode: Mode, delay: float = 0.0) -> None:
        self.mode, self.delay = mode, delay

    def drop_all(self) -> None:
        with self._mutex:
            sockets, self._sockets = list(self._sockets), set()
        self._close(sockets)

    @staticmethod
    def _close(sockets: list[socket.socket]) -> None:
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def drop_subscribers(self) -> int:
        """Close the subscribed connections; returns how many there were."""
        with self._mutex:
            sockets, self._subscribers = list(self._subscribers), set()
        self._close(sockets)
        return len(sockets)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self._listener.close()
        self.drop_all()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=2)
            except OSError:
                client.close()
                continue
            with self._mutex:
                self._sockets |= {client, server}
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        peers = {client: server, server: client}
        try:
            while not self._closed:
                try:
                    ready, _, _ = select.select(list(peers), [], [], 0.1)
                except (OSError, ValueError):
                    return
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if self.mode == "blackhole":
                        continue  # swallowed: the sender waits for an answer forever
                    if sock is client and b"SUBSCRIBE" in data.upper():
                        with self._mutex:
                            self._subscribers.add(client)
                    if self.mode == "delay" and self.delay > 0:
                        time.sleep(self.delay)
                    peers[sock].sendall(data)
        except OSError:
            return
        finally:
            for s in (client, server):
                with contextlib.suppress(OSError):
                    s.close()
            with self._mutex:
                self._sockets -= {client, server}
                self._subscribers.discard(client)
