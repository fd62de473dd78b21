"""MenuRepository: reads through the cache, writes through tracked sessions."""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from cacheguard import CacheGuard, CacheLoader
from menu_service.models import EDITABLE, Menu


class MenuNotFound(LookupError):
    pass


class MenuRepository:
    """``get_list()`` is cached as ``menu:list`` and ``get(id)`` as ``menu:{id}``.

    ``update_menu_by_id`` only changes the row and commits: the session factory
    is tracked (``track_models``), so the write locks, the invalidation before
    the UPDATE and again after the COMMIT all happen in the session hooks.
    ``build_seconds`` stands for the expensive part of building the list (joins,
    permissions, rendering) that makes a stampede hurt.
    """

    def __init__(
        self,
        guard: CacheGuard,
        sessions: sessionmaker[Session],
        *,
        ttl: float = 300.0,
        build_seconds: float = 0.0,
    ) -> None:
        self.guard = guard
        self.sessions = sessions
        self.build_seconds = build_seconds
        self._list = CacheLoader(guard, key="menu:list", load=self.load_list, ttl=ttl)
        self._one = CacheLoader(guard, key="menu:{menu_id}", load=self.load_one, ttl=ttl)

    def get_list(self) -> list[dict[str, Any]]:
        return self._list.get()

    def get(self, menu_id: int) -> dict[str, Any]:
        row = self._one.get(menu_id)
        if row is None:  # cached as a miss too (negative caching)
            raise MenuNotFound(menu_id)
        return row

    def update_menu_by_id(self, menu: dict[str, Any]) -> dict[str, Any]:
        """Update the editable fields given in ``menu`` of row ``menu["id"]``."""
        with self.sessions.begin() as session:
            row = session.get(Menu, menu["id"])
            if row is None:
                raise MenuNotFound(menu["id"])
            for field in EDITABLE:
                if field in menu:
                    setattr(row, field, menu[field])
            return row.to_dict()

    # -- loaders (run once per miss, under the key's lock) --

    def load_list(self) -> list[dict[str, Any]]:
        with self.sessions() as session:
            rows = session.scalars(sa.select(Menu).order_by(Menu.sort, Menu.id)).all()
            result = [row.to_dict() for row in rows]
        if self.build_seconds:
            time.sleep(self.build_seconds)
        return result

    def load_one(self, menu_id: int) -> dict[str, Any] | None:
        with self.sessions() as session:
            row = session.get(Menu, menu_id)
            return None if row is None else row.to_dict()
