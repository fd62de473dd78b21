"""The launcher: Redis and a database for the example, then Django's command line.

Without ``REDIS_URL`` a throwaway ``redis-server`` is started (or fakeredis's, as
``cacheguard.testing.redis_server`` does for the tests and examples/menu_service);
without ``DATABASE_URL`` the database is a SQLite file in a temporary folder. Both
go away when the command ends (on SIGTERM and Ctrl-C too). Each run gets a key
prefix of its own in Redis (``MENU_DJANGO_NAMESPACE``, unless set), whose keys are
deleted at the end.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path

import redis
from django.core.exceptions import ImproperlyConfigured
from django.core.management import execute_from_command_line

from cacheguard.testing import redis_server

COMMANDS = {"demo": "menu_demo"}  # the launcher's short names for the app's commands


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv) or ["help"]
    args[0] = COMMANDS.get(args[0], args[0])
    own_namespace = "MENU_DJANGO_NAMESPACE" not in os.environ
    # SIGTERM ends the command as Ctrl-C does (runserver exits on it): through the
    # blocks below, so the throwaway Redis and folder go too.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    with redis_server() as endpoint, tempfile.TemporaryDirectory(prefix="menu-django-") as tmp:
        os.environ["REDIS_URL"] = endpoint.url
        os.environ["DJANGO_SETTINGS_MODULE"] = "menu_django.settings"
        os.environ.setdefault("MENU_DJANGO_SQLITE", str(Path(tmp) / "menu.sqlite3"))
        if own_namespace:
            os.environ["MENU_DJANGO_NAMESPACE"] = f"menu-django-{uuid.uuid4().hex[:8]}"
        if args[0] in ("menu_demo", "runserver"):
            print(f"Redis: {endpoint.kind} ({endpoint.url})", file=sys.stderr, flush=True)
        try:
            execute_from_command_line(["menu_django", *args])
        except ImproperlyConfigured as exc:  # a DATABASE_URL it cannot use, say
            print(f"menu_django: {exc}", file=sys.stderr)
            return 1
        finally:
            _close_caches()  # before the throwaway Redis stops under their connections
            if own_namespace:
                _forget_keys(endpoint.url, os.environ["MENU_DJANGO_NAMESPACE"])
    return 0


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _forget_keys(url: str, namespace: str) -> None:
    """Delete the run's keys: its namespace is in each of their names."""
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"*{namespace}*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
    finally:
        client.close()


def _close_caches() -> None:
    """Close the caches' connections (the cacheguard backend's guard and its pub/sub
    listener too), if the command configured Django at all."""
    from django.conf import settings
    from django.core.cache import caches

    try:
        aliases = list(settings.CACHES)
    except ImproperlyConfigured:  # the settings never loaded: no cache was made
        return
    for alias in aliases:
        cache = caches[alias]
        shutdown = getattr(cache, "shutdown", None)  # cacheguard's backend: its guard
        if callable(shutdown):
            shutdown()
        else:
            cache.close()
