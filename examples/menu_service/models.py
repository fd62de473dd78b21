"""The demo's menu table (id, name, parent_id, sort, url) and the keys it is cached under.

The table has a name of its own, ``cacheguard_demo_menu``, so that the demo,
pointed at a database of yours, never drops or fills a table it did not create.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Menu(Base):
    __tablename__ = "cacheguard_demo_menu"
    # The cache keys a change to a Menu row affects (read by track_models).
    __cache_keys__ = ("menu:list", "menu:{id}")

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(100))
    parent_id: Mapped[int | None] = mapped_column(default=None)
    sort: Mapped[int] = mapped_column(default=0)
    url: Mapped[str] = mapped_column(sa.String(200), default="")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "parent_id": self.parent_id,
            "sort": self.sort,
            "url": self.url,
        }


EDITABLE = ("name", "parent_id", "sort", "url")
