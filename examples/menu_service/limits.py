"""What the HTTP server refuses before the application sees a request.

Two layers, because some bad input never reaches an ASGI application:

* :class:`GuardedH11Protocol` (uvicorn's h11 protocol, adjusted): a request
  whose bytes are not HTTP (``Content-Length: abc`` or ``-1``, a broken request
  line) gets a JSON 400 instead of uvicorn's plain-text one; a client that does
  not finish its request head within ``head_timeout`` seconds (the first request
  of a connection or a later one) is answered 408 and disconnected (uvicorn
  itself waits for ever for a slow head); a request answered before its body was
  read (a GET with a body, an unknown path) has its connection closed rather
  than the rest of its body read without limits.
* :class:`BodyLimits` (ASGI middleware): a body announced larger than
  ``max_bytes`` is refused with 413 before a byte of it is read; a chunked body
  that grows past it is cut off with 413; a body that is not complete
  ``body_timeout`` seconds after the request began (a client announcing more
  than it sends, or sending it a byte at a time) is answered 408.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import h11
from fastapi import HTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_BODY_BYTES = 64 * 1024


def json_body(detail: str) -> bytes:
    # ASCII-only: a detail may quote client input, which may hold lone surrogates.
    return json.dumps({"detail": detail}, ensure_ascii=True).encode("ascii")


class BodyLimits:
    """ASGI middleware: request bodies of at most ``max_bytes``, arriving in time."""

    def __init__(
        self, app: ASGIApp, *, max_bytes: int = MAX_BODY_BYTES, body_timeout: float = 10.0
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        announced = _content_length(scope)
        if announced is not None and announced > self.max_bytes:
            # Refused from the header: the body is never read (nor waited for).
            await _reply(send, 413, f"request body over {self.max_bytes} bytes")
            return
        await self.app(scope, self._limited(receive), send)

    def _limited(self, receive: Receive) -> Receive:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout
        received = 0
        done = False

        async def limited() -> Message:
            nonlocal received, done
            if done:  # after the body: only http.disconnect is left, no deadline
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0))
            except asyncio.TimeoutError:
                raise HTTPException(
                    408,
                    f"request body not received within {self.body_timeout:g} s",
                    headers={"Connection": "close"},
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(
                        413,
                        f"request body over {self.max_bytes} bytes",
                        headers={"Connection": "close"},
                    )
                done = not message.get("more_body", False)
            else:
                done = True
            return message

        return limited


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            # h11 has checked it: digits only (a bad one never reaches the app).
            return int(value)
    return None


async def _reply(send: Send, status: int, detail: str) -> None:
    body = json_body(detail)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with JSON 400s and a deadline for the request head.

    ``head_timeout`` is a class attribute: uvicorn builds the protocol itself
    (see :func:`guarded_protocol` for a subclass with another value)."""

    head_timeout = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            # Answered before its body was read (a GET with a body, a 404, a 413): reading
            # the rest would take no limit or deadline into account. Close instead.
            self.transport.close()
        super().on_response_complete()
        self._arm_head_timer()  # the next request on this connection gets a deadline too

    def send_400_response(self, msg: str) -> None:
        self._send_json(400, "Bad Request", f"invalid HTTP request: {msg}")

    # -- the request head's deadline ---------------------------------------------------

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        if not self.transport.is_closing():
            self._head_timer: asyncio.TimerHandle | None = self.loop.call_later(
                self.head_timeout, self._head_overdue
            )

    def _disarm_head_timer(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return  # the head arrived: the request's own limits apply from here
        if self.conn.our_state is h11.IDLE and self._has_partial_head():
            self._send_json(408, "Request Timeout", "request head not received in time")
        else:
            self.transport.close()  # idle keep-alive connection: just close it

    def _has_partial_head(self) -> bool:
        return bool(self.conn.trailing_data[0])

    def _send_json(self, status: int, reason: str, detail: str) -> None:
        body = json_body(detail)
        head = (
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        ).encode("ascii")
        # Written raw: h11 is in an error state (400) or has no request to answer (408).
        self.transport.write(head + body)
        self.transport.close()


def guarded_protocol(head_timeout: float) -> type[GuardedH11Protocol]:
    """A :class:`GuardedH11Protocol` with ``head_timeout`` seconds for request heads."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"head_timeout": head_timeout})
