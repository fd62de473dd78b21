"""The HTTP API on FastAPI: both cacheguard drivers behind validated endpoints.

* ``GET /menus``, ``GET /menus/{id}``: ``async def`` endpoints reading through an
  :class:`~cacheguard.aio.AsyncCacheGuard` with an async SQLAlchemy session;
* ``PUT /menus/{id}``: a plain ``def`` (FastAPI runs it in its thread pool) on the
  sync :class:`~menu_service.repository.MenuRepository`, whose tracked sessions
  lock, invalidate, commit and invalidate again;
* ``GET /stats``: the asyncio guard's counters, the PUTs' outcomes and the
  database queries;
* ``GET /metrics``: Prometheus text format (cacheguard's counters and histograms).

Every error is JSON: ``{"detail": ...}`` (422 for a body or path that fails
validation, 404 for an unknown menu or path, 405 for a wrong method, 413/408
from :mod:`menu_service.limits`, 503 while Redis or the database is unavailable).
"""

from __future__ import annotations

import logging
import threading
import unicodedata
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import sessionmaker
from starlette.convertors import Convertor, register_url_convertor

from cacheguard import CacheGuard, CacheGuardError
from cacheguard.aio import AsyncCacheGuard
from cacheguard.integrations.prometheus import CacheMetrics
from cacheguard.integrations.sqlalchemy import track_models

from .infra import QueryLog, make_async_engine, make_engine
from .limits import MAX_BODY_BYTES, BodyLimits
from .models import EDITABLE, Menu
from .repository import (
    AsyncMenuRepository,
    InvalidParent,
    MenuNotFound,
    MenuRepository,
)

log = logging.getLogger("menu_service")

# The columns' types: INTEGER is 32-bit in PostgreSQL; SQLite enforces no length, so
# the String(n) limits are enforced here.
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
NAME_LENGTH = 100
URL_LENGTH = 200

MenuId = Annotated[int, Path(ge=1, le=INT32_MAX, description="a menu's id")]


class _SignedInt(Convertor[int]):
    """Starlette's ``int`` matches digits only, so ``/menus/-1`` matched no route (a
    404): with the sign, an id below 1 reaches ``MenuId``'s check and is a 422 like
    ``/menus/0``. Anything else that is not digits stays an unknown path."""

    regex = "-?[0-9]+"

    def convert(self, value: str) -> int:
        return int(value)

    def to_string(self, value: int) -> str:
        return str(int(value))


register_url_convertor("signed_int", _SignedInt())
# Cc control, Zl/Zp line and paragraph separators, Cn unassigned and non-characters,
# Co private use, Cs surrogates.
_REFUSED_CATEGORIES = frozenset({"Cc", "Zl", "Zp", "Cn", "Co", "Cs"})


class MenuUpdate(BaseModel):
    """A PUT body: any of the editable fields, nothing else, each of its exact type."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str | None = Field(None, min_length=1, max_length=NAME_LENGTH)
    parent_id: int | None = Field(None, ge=1, le=INT32_MAX)  # null: a top-level menu
    sort: int | None = Field(None, ge=INT32_MIN, le=INT32_MAX)
    url: str | None = Field(None, max_length=URL_LENGTH)

    @field_validator("name", "sort", "url", mode="before")
    @classmethod
    def not_null(cls, value: Any) -> Any:
        # Optional to leave out, but the columns are NOT NULL: null is no value here.
        if value is None:
            raise ValueError("must not be null")
        return value

    @field_validator("name", "url")
    @classmethod
    def storable_text(cls, value: str) -> str:
        # Control characters (NUL among them: PostgreSQL refuses it), line and
        # paragraph separators, unassigned code points and non-characters (U+FFFF)
        # have no place in a menu name or URL. (Lone surrogates, "\ud800", never get
        # here: the JSON parser refuses them as invalid Unicode.)
        for char in value:
            if unicodedata.category(char) in _REFUSED_CATEGORIES:
                raise ValueError(
                    f"must not contain {unicodedata.category(char)} characters ({char!r})"
                )
        return value

    @field_validator("name")
    @classmethod
    def not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    @model_validator(mode="after")
    def something_to_change(self) -> MenuUpdate:
        if not self.model_fields_set:
            raise ValueError(f"give at least one of {', '.join(EDITABLE)}")
        return self

    def changes(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


@dataclass
class ServiceConfig:
    redis_url: str
    database_url: str
    namespace: str = "menu-service"
    build_seconds: float = 0.0  # the expensive part of building the list (see the demo)
    body_timeout: float = 10.0
    max_body_bytes: int = MAX_BODY_BYTES
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)


class WriteCounts:
    """What the PUTs that reached the write path came to. The sync guard's own
    ``stats()`` count its reads (hits, loads, waits); a PUT reads nothing through it
    (it locks, invalidates and commits), so those stay zero however many PUTs ran."""

    OUTCOMES = ("updates", "not_found", "invalid_parent", "failed")

    def __init__(self) -> None:
        self._mutex = threading.Lock()  # PUTs run on FastAPI's thread pool
        self._counts = dict.fromkeys(self.OUTCOMES, 0)

    def count(self, outcome: str) -> None:
        with self._mutex:
            self._counts[outcome] += 1

    def as_dict(self) -> dict[str, int]:
        with self._mutex:
            return dict(self._counts)


@dataclass
class _Running:
    """What the lifespan opened (and closes): both guards, both engines."""

    reads: AsyncMenuRepository
    writes: MenuRepository
    queries: QueryLog
    metrics: CacheMetrics
    write_counts: WriteCounts = field(default_factory=WriteCounts)


def create_app(config: ServiceConfig) -> FastAPI:
    """The service's ASGI application (wrapped in the body limits)."""
    running: list[_Running] = []

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(config.database_url)
        async_engine = make_async_engine(config.database_url)
        queries = QueryLog(engine)
        queries.watch(async_engine.sync_engine)
        sync_guard = CacheGuard.from_url(config.redis_url, namespace=config.namespace)
        async_guard = AsyncCacheGuard.from_url(config.redis_url, namespace=config.namespace)
        metrics = CacheMetrics(registry=config.registry)
        metrics.instrument(sync_guard)
        metrics.instrument(async_guard)
        # The table was just seeded afresh: entries a previous run left in this
        # namespace (a REDIS_URL outlives the service) describe rows that are gone.
        sync_guard.invalidate_prefix("menu:")
        sessions = sessionmaker(engine, expire_on_commit=False)
        async_sessions = async_sessionmaker(async_engine, expire_on_commit=False)
        trackers = [
            track_models(sync_guard, sessions, [Menu]),
            track_models(async_guard, async_sessions, [Menu]),
        ]
        running.append(
            _Running(
                reads=AsyncMenuRepository(
                    async_guard, async_sessions, build_seconds=config.build_seconds
                ),
                writes=MenuRepository(sync_guard, sessions, build_seconds=config.build_seconds),
                queries=queries,
                metrics=metrics,
            )
        )
        try:
            yield
        finally:
            running.clear()
            metrics.close()  # unregisters: the registry may serve a restarted app
            for tracker in trackers:
                tracker.remove()
            await async_guard.aclose()
            sync_guard.close()
            await async_engine.dispose()
            engine.dispose()

    def state() -> _Running:
        if not running:
            raise HTTPException(503, "the service is starting or stopping")
        return running[0]

    app = FastAPI(
        title="menu service",
        description="Menus read through cacheguard, written through tracked sessions.",
        lifespan=lifespan,
        redirect_slashes=False,  # /menus/ is a 404 like any unknown path, not a redirect
    )

    @app.get("/menus")
    async def list_menus() -> list[dict[str, Any]]:
        """Every menu, ordered by ``sort`` (cached as ``menu:list``)."""
        return await state().reads.get_list()

    @app.get("/menus/{menu_id:signed_int}")
    async def get_menu(menu_id: MenuId) -> dict[str, Any]:
        """One menu (cached as ``menu:{id}``, misses too)."""
        try:
            return await state().reads.get(menu_id)
        except MenuNotFound:
            raise HTTPException(404, f"no menu {menu_id}") from None

    @app.put("/menus/{menu_id:signed_int}")
    def update_menu(menu_id: MenuId, update: MenuUpdate) -> dict[str, Any]:
        """Change any of name, parent_id, sort, url (the sync write path)."""
        now = state()
        try:
            menu = now.writes.update_menu_by_id({"id": menu_id, **update.changes()})
        except MenuNotFound:
            now.write_counts.count("not_found")
            raise HTTPException(404, f"no menu {menu_id}") from None
        except InvalidParent as exc:
            now.write_counts.count("invalid_parent")
            raise HTTPException(422, str(exc)) from None
        except Exception:  # answered 503 or 500 by the handlers below
            now.write_counts.count("failed")
            raise
        now.write_counts.count("updates")
        return menu

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        """The reads' counters (the asyncio guard's), the PUTs' outcomes with the
        write path's Redis errors (the sync guard's ``backend_errors``), the DB queries."""
        now = state()
        return {
            "reads": now.reads.guard.stats().as_dict(),
            "writes": {
                **now.write_counts.as_dict(),
                "backend_errors": now.writes.guard.stats().backend_errors,
            },
            "db_queries": now.queries.count,
        }

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus text format."""
        body, content_type = state().metrics.exposition()
        return Response(body, media_type=content_type)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        # Without the inputs FastAPI would echo: a 64 KiB name need not come back.
        errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)

    @app.exception_handler(CacheGuardError)
    async def cache_unavailable(request: Request, exc: CacheGuardError) -> Response:
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        return JSONResponse({"detail": f"cache unavailable: {exc}"}, status_code=503)

    @app.exception_handler(SQLAlchemyError)
    async def database_unavailable(request: Request, exc: SQLAlchemyError) -> Response:
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        return JSONResponse({"detail": "database unavailable"}, status_code=503)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("%s %s failed", request.method, request.url.path)
        return JSONResponse({"detail": "internal error"}, status_code=500)

    app.add_middleware(
        BodyLimits,
        max_bytes=config.max_body_bytes,
        body_timeout=config.body_timeout,
    )
    return app
