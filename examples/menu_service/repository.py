"""The menu repositories: reads through the cache, writes through tracked sessions.

:class:`MenuRepository` is the sync one (a ``CacheGuard`` and a ``sessionmaker``),
:class:`AsyncMenuRepository` its asyncio twin for reads (an ``AsyncCacheGuard``
and an ``async_sessionmaker``). Both use the same keys in the same namespace, so
they share entries, fills and invalidations across processes and drivers.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from cacheguard import CacheGuard, CacheLoader
from cacheguard.aio import AsyncCacheGuard, AsyncCacheLoader

from .models import EDITABLE, Menu

LIST_KEY = "menu:list"
MENU_KEY = "menu:{menu_id}"


class MenuNotFound(LookupError):
    pass


class InvalidParent(ValueError):
    """``parent_id`` names no menu, or would make a menu its own ancestor."""


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
        self._list = CacheLoader(guard, key=LIST_KEY, load=self.load_list, ttl=ttl)
        self._one = CacheLoader(guard, key=MENU_KEY, load=self.load_one, ttl=ttl)

    def get_list(self) -> list[dict[str, Any]]:
        return self._list.get()

    def get(self, menu_id: int) -> dict[str, Any]:
        row = self._one.get(menu_id)
        if row is None:  # cached as a miss too (negative caching)
            raise MenuNotFound(menu_id)
        return row

    def update_menu_by_id(self, menu: dict[str, Any]) -> dict[str, Any]:
        """Update the editable fields given in ``menu`` of row ``menu["id"]``.

        A new ``parent_id`` must name a menu that is not this one nor below it
        (:class:`InvalidParent`). Every write takes ``menu:list``'s write lock
        before it reads (the session hooks would take it only at the flush), so
        writes check parents one at a time: two concurrent updates cannot close
        a cycle that neither saw.
        """
        menu_id = menu["id"]
        with (
            self.guard.write(LIST_KEY, MENU_KEY.format(menu_id=menu_id)),
            self.sessions.begin() as session,
        ):
            row = session.get(Menu, menu_id)
            if row is None:
                raise MenuNotFound(menu_id)
            if menu.get("parent_id") is not None:
                check_parent(session, menu_id, menu["parent_id"])
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


def check_parent(session: Session, menu_id: int, parent_id: int) -> None:
    """Refuse ``parent_id`` for menu ``menu_id`` if it is missing or below the menu."""
    seen = {menu_id}
    ancestor: int | None = parent_id
    while ancestor is not None:
        if ancestor in seen:
            raise InvalidParent(f"parent_id {parent_id} would make menu {menu_id} its own ancestor")
        seen.add(ancestor)
        found = session.execute(sa.select(Menu.parent_id).where(Menu.id == ancestor)).first()
        if found is None:
            raise InvalidParent(f"parent_id {parent_id}: no menu {ancestor}")
        ancestor = found[0]


class AsyncMenuRepository:
    """The reads of :class:`MenuRepository` on asyncio: same keys, same values."""

    def __init__(
        self,
        guard: AsyncCacheGuard,
        sessions: async_sessionmaker[AsyncSession],
        *,
        ttl: float = 300.0,
        build_seconds: float = 0.0,
    ) -> None:
        self.guard = guard
        self.sessions = sessions
        self.build_seconds = build_seconds
        self._list: AsyncCacheLoader[[], list[dict[str, Any]]] = AsyncCacheLoader(
            guard, key=LIST_KEY, load=self.load_list, ttl=ttl
        )
        self._one: AsyncCacheLoader[[int], dict[str, Any] | None] = AsyncCacheLoader(
            guard, key=MENU_KEY, load=self.load_one, ttl=ttl
        )

    async def get_list(self) -> list[dict[str, Any]]:
        return await self._list.get()

    async def get(self, menu_id: int) -> dict[str, Any]:
        row = await self._one.get(menu_id)
        if row is None:
            raise MenuNotFound(menu_id)
        return row

    async def load_list(self) -> list[dict[str, Any]]:
        async with self.sessions() as session:
            rows = (await session.scalars(sa.select(Menu).order_by(Menu.sort, Menu.id))).all()
            result = [row.to_dict() for row in rows]
        if self.build_seconds:
            await asyncio.sleep(self.build_seconds)  # stands for the expensive part
        return result

    async def load_one(self, menu_id: int) -> dict[str, Any] | None:
        async with self.sessions() as session:
            row = await session.get(Menu, menu_id)
            return None if row is None else row.to_dict()
