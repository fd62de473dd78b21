"""Django settings for the tests, configured once per process.

Django's settings can be configured only once in a process, and several test
modules (the cache backend's, the ORM hooks') and their child processes need
Django: they all call :func:`configure_django`, which configures on the first
call and returns what the first call chose on every later one.

The database: PostgreSQL when ``database_url`` (default: ``DATABASE_URL``) names
one, in a schema of its own (``cg_<random>``, made here and dropped when the
process exits), so that runs beside each other (the mutation check runs the
tests in several copies at once) never share a table; SQLite in a temporary file
otherwise. Child processes pass the parent's :class:`DjangoDatabase` back in to
use the same tables; a child that passes none gets SQLite in memory. Two aliases
name the same database: ``default`` and ``repeatable`` (``REPEATABLE READ``, on
PostgreSQL: one snapshot per transaction, what the snapshot checks are about).

``CACHES`` has Django's local-memory backend as its default; tests of other
backends make theirs themselves (``override_settings`` or the class directly).
``INSTALLED_APPS`` is the tests' own app, ``tests.django_app``; its tables are made
by :func:`create_tables`.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import shutil
import tempfile
import threading
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["DjangoDatabase", "configure_django", "create_tables", "postgres_url"]

# The cache backend's tests sign pickles with a key derived from it: their child
# processes must have the same (tests/django_workers.py).
SECRET_KEY = "cacheguard-tests-" + "s" * 40

_mutex = threading.Lock()
_configured: DjangoDatabase | None = None


@dataclass(frozen=True)
class DjangoDatabase:
    """Where the tests' Django tables are: picklable, for child processes."""

    url: str  # a PostgreSQL URL (SQLAlchemy's spelling is fine) or "sqlite:///path"
    schema: str | None = None  # PostgreSQL: the schema the tables live in

    @property
    def postgres(self) -> bool:
        return self.url.startswith("postgres")


def postgres_url() -> str | None:
    """``DATABASE_URL`` if it names a PostgreSQL database."""
    url = os.environ.get("DATABASE_URL", "")
    return url if url.startswith("postgres") else None


def configure_django(
    database_url: str | None = None, *, database: DjangoDatabase | None = None
) -> DjangoDatabase:
    """Configure Django's settings and load its apps, once per process (later calls
    return the first call's database and change nothing). ``database``: a parent
    process's (the same tables, nothing made); else ``database_url``, default
    ``DATABASE_URL`` when it is PostgreSQL (a fresh schema in it), else SQLite."""
    global _configured
    with _mutex:
        if _configured is not None:
            return _configured
        import django
        from django.conf import settings

        if settings.configured:  # by someone else: their database, unknown here
            _configured = DjangoDatabase("configured elsewhere")
            return _configured
        if database is None and multiprocessing.parent_process() is not None:
            # A child process that was given no database needs none of its own.
            database = DjangoDatabase("sqlite:///:memory:")
        if database is None:
            url = database_url or postgres_url()
            if url is not None and url.startswith("postgres"):
                database = DjangoDatabase(url, _make_schema(url))
            else:
                folder = tempfile.mkdtemp(prefix="cacheguard-django-")
                atexit.register(shutil.rmtree, folder, ignore_errors=True)
                database = DjangoDatabase(f"sqlite:///{folder}/db.sqlite3")
        settings.configure(
            DEBUG=False,
            USE_TZ=True,
            TIME_ZONE="UTC",
            SECRET_KEY=SECRET_KEY,
            DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
            INSTALLED_APPS=["tests.django_app"],
            DATABASES=_databases(database),
            CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
        )
        django.setup()
        _configured = database
        return database


def create_tables() -> None:
    """Create the tables of ``tests.django_app`` that do not exist yet (no migrations)."""
    from django.apps import apps
    from django.db import connection

    existing = set(connection.introspection.table_names())
    with connection.schema_editor() as editor:
        for model in apps.get_app_config("django_app").get_models():
            if not model._meta.proxy and model._meta.db_table not in existing:
                editor.create_model(model)
                existing.add(model._meta.db_table)


def _databases(database: DjangoDatabase) -> dict[str, Any]:
    if not database.postgres:
        path = database.url.removeprefix("sqlite:///")
        sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": path}
        return {"default": sqlite, "repeatable": dict(sqlite)}
    import psycopg

    parts = urlsplit(database.url)
    base = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "OPTIONS": {"options": f"-c search_path={database.schema}"},
    }
    repeatable = {
        **base,
        "OPTIONS": {**base["OPTIONS"], "isolation_level": psycopg.IsolationLevel.REPEATABLE_READ},
    }
    return {"default": base, "repeatable": repeatable}


def _conninfo(url: str) -> str:
    """A libpq URL from SQLAlchemy's spelling (``postgresql+psycopg://``)."""
    scheme, rest = url.split("://", 1)
    return f"postgresql://{rest}" if scheme.startswith("postgres") else url


def _make_schema(url: str) -> str:
    """A schema of its own in the database at ``url``, dropped when this process exits."""
    import psycopg

    schema = f"cg_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_conninfo(url), autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    atexit.register(_drop_schema, url, schema)
    return schema


def _drop_schema(url: str, schema: str) -> None:
    try:
        from django.db import connections

        connections.close_all()
    except Exception:
        pass
    try:
        import psycopg

        with psycopg.connect(_conninfo(url), autocommit=True) as conn:
            conn.execute("SET lock_timeout = '10s'")
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    except Exception:
        pass  # a leftover schema costs some disk, nothing else
