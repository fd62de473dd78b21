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

from .database import database_from_url


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
