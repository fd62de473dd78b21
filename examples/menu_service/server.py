"""``serve``: the repository behind a small HTTP JSON API.

GET /menus, GET /menus/{id}, PUT /menus/{id} (JSON body with any of name,
parent_id, sort, url), GET /stats (the guard's counters and the DB queries).
"""

from __future__ import annotations

import json
import re
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from menu_service.infra import QueryLog
from menu_service.models import EDITABLE
from menu_service.repository import MenuNotFound, MenuRepository

_MENU = re.compile(r"^/menus/(\d+)$")
_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "parent_id": (int, type(None)),
    "sort": (int,),
    "url": (str,),
}


class BadRequest(ValueError):
    pass


def parse_update(menu_id: int, body: bytes) -> dict[str, Any]:
    """The update a PUT body asks for, checked field by field."""
    try:
        data = json.loads(body or b"null")
    except ValueError as exc:
        raise BadRequest(f"body is not JSON: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise BadRequest(f"body must be a JSON object with any of {', '.join(EDITABLE)}")
    unknown = sorted(set(data) - set(EDITABLE))
    if unknown:
        raise BadRequest(f"unknown fields {unknown}; editable: {', '.join(EDITABLE)}")
    for name, value in data.items():
        allowed = _TYPES[name]
        if isinstance(value, bool) or not isinstance(value, allowed):
            raise BadRequest(f"{name} must be {' or '.join(t.__name__ for t in allowed)}")
    if isinstance(data.get("name"), str) and not data["name"].strip():
        raise BadRequest("name must not be empty")
    return {"id": menu_id, **data}


def make_server(
    repository: MenuRepository, queries: QueryLog, host: str, port: int
) -> ThreadingHTTPServer:
    guard = repository.guard

    class Handler(BaseHTTPRequestHandler):
        server_version = "menu-service"

        def do_GET(self) -> None:
            if self.path == "/menus":
                return self._reply(HTTPStatus.OK, repository.get_list())
            if self.path == "/stats":
                stats = {**guard.stats().as_dict(), "db_queries": queries.count}
                return self._reply(HTTPStatus.OK, stats)
            match = _MENU.match(self.path)
            if match:
                try:
                    return self._reply(HTTPStatus.OK, repository.get(int(match[1])))
                except MenuNotFound:
                    return self._error(HTTPStatus.NOT_FOUND, f"no menu {match[1]}")
            return self._error(HTTPStatus.NOT_FOUND, f"no route GET {self.path}")

        def do_PUT(self) -> None:
            match = _MENU.match(self.path)
            if not match:
                return self._error(HTTPStatus.NOT_FOUND, f"no route PUT {self.path}")
            length = int(self.headers.get("Content-Length") or 0)
            try:
                update = parse_update(int(match[1]), self.rfile.read(length))
                return self._reply(HTTPStatus.OK, repository.update_menu_by_id(update))
            except BadRequest as exc:
                return self._error(HTTPStatus.BAD_REQUEST, str(exc))
            except MenuNotFound:
                return self._error(HTTPStatus.NOT_FOUND, f"no menu {match[1]}")

        def _reply(self, status: HTTPStatus, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: HTTPStatus, message: str) -> None:
            self._reply(status, {"error": message})

        def log_message(self, format: str, *args: Any) -> None:  # quiet by default
            pass

    return ThreadingHTTPServer((host, port), Handler)
