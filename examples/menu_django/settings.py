"""Settings of the menu_django example.

Redis: ``REDIS_URL`` (``python -m examples.menu_django`` sets it to a throwaway
server when it is not set). The database: ``DATABASE_URL`` when set, in Django's
form or SQLAlchemy's (``postgresql://``, ``postgres://``, ``postgresql+psycopg://``,
``sqlite:///path``), else a SQLite file (``MENU_DJANGO_SQLITE``, which the launcher
points into a temporary folder). Two caches: ``default`` is cacheguard's backend,
``plain`` is Django's own Redis backend, kept for the demo's comparison.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
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


def _sqlite_default() -> str:
    path = os.environ.get("MENU_DJANGO_SQLITE") or str(
        Path(tempfile.gettempdir()) / "menu_django.sqlite3"
    )
    return f"sqlite:///{path}"


REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
# The prefix of every key the example makes in Redis, so that two runs on one Redis
# (the tests' SQLite and PostgreSQL runs, say) keep apart.
NAMESPACE = os.environ.get("MENU_DJANGO_NAMESPACE", "menu-django")

SECRET_KEY = "menu-django-example-not-a-secret"  # a demo's: never deploy it
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]", "testserver"]
INSTALLED_APPS = ["menu_django.menus"]
# JSON views for scripts: no sessions, no CSRF (never expose this as it is).
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "menu_django.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {"default": database_from_url(os.environ.get("DATABASE_URL") or _sqlite_default())}

CACHES = {
    # cacheguard's backend: get_or_set calls the default once across processes, and
    # track_models (menus/apps.py) ties the Menu table's writes to its keys.
    "default": {
        "BACKEND": "cacheguard.integrations.django.CacheGuardCache",
        "LOCATION": REDIS_URL,
        "TIMEOUT": 300,
        "OPTIONS": {"namespace": NAMESPACE},  # the prefix of every Redis key it writes
    },
    # Django's own Redis backend, invalidated by signals as Django projects usually
    # do: what the demo compares with.
    "plain": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": f"{NAMESPACE}-plain",
        "TIMEOUT": 300,
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
