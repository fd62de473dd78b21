"""``DATABASES["default"]`` from a database URL, in Django's form or SQLAlchemy's."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_POSTGRES_SCHEMES = ("postgres", "postgresql", "postgresql+psycopg", "postgresql+psycopg2")
_SQLITE_SCHEMES = ("sqlite", "sqlite+pysqlite")


def database_from_url(url: str) -> dict[str, Any]:
    """``DATABASES["default"]`` from a database URL, Django's or SQLAlchemy's form."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in _SQLITE_SCHEMES:
        # sqlite:///relative/path or sqlite:////absolute/path, as SQLAlchemy reads them.
        path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
        if not path or path == ":memory:":
            raise ImproperlyConfigured(
                "the demo's processes share the database: give SQLite a file, not memory"
            )
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": path, "OPTIONS": {"timeout": 30}}
    if scheme in _POSTGRES_SCHEMES:
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parts.path.lstrip("/")),
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            "OPTIONS": dict(parse_qsl(parts.query)),  # sslmode=require and the like
        }
    raise ImproperlyConfigured(
        f"DATABASE_URL: {scheme or url!r} is not a database this example knows; "
        "use postgresql://user@host:5432/name (or postgresql+psycopg://...) or sqlite:///path"
    )
