"""``CacheGuardCache``: a Django cache backend on cacheguard (extra ``django``).

::

    CACHES = {
        "default": {
            "BACKEND": "cacheguard.integrations.django.CacheGuardCache",
            "LOCATION": "redis://127.0.0.1:6379/0",  # or redis+cluster://, redis+sentinel://
            "OPTIONS": {"namespace": "shop", "lease": 30},
        }
    }

It behaves as Django's own backends do (Django's ``BaseCacheTests`` pass against it,
with the exclusions Django makes for its Redis backend: see ``docs/django.md``) and
adds what they lack: ``get_or_set(key, callable, timeout)`` calls the callable once
across every process, the others waiting for its value and woken by the fill's
announcement, through the guard's ``get_or_load``; ``set`` and ``delete`` win over a
load already under way; the ``a*`` methods run on cacheguard's asyncio driver.

Storage: the entries are the guard's (:mod:`cacheguard.cache.entry`) under the
guard's key layout, so ``cache.set(k, v)`` is a hit for ``get_or_set(k, ...)``
and a filled value is read by ``get``. Values are pickled, as Django's own Redis
backend does, and signed: :class:`~cacheguard.cache.codec.PickleCodec` with a key
derived from ``settings.SECRET_KEY`` (or ``OPTIONS["signing_key"]``), so bytes
that were not written with the key are refused before anything is unpickled.
The plain writes are one script each (:mod:`cacheguard.cache.entry_writes`);
``incr``/``decr`` are a compare-and-set on the entry, atomic across processes.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import inspect
import logging
import pickle
import threading
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final

import redis
import redis.connection
from django.conf import settings as django_settings
from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache, default_key_func
from django.core.exceptions import ImproperlyConfigured

from cacheguard._identity import on_fork_in_child
from cacheguard.cache.async_guard import AsyncCacheGuard
from cacheguard.cache.codec import PickleCodec
from cacheguard.cache.entry import MISSING, Entry, pack_entry, unpack_entry
from cacheguard.cache.entry_writes import (
    FOREVER,
    delete_call,
    new_entry,
    put_call,
    swap_call,
    touch_call,
)
from cacheguard.cache.guard import CacheGuard
from cacheguard.cache.settings import GuardSettings
from cacheguard.exceptions import BackendUnavailable, CacheGuardError, SerializationError
from cacheguard.redis.async_scripts import arun_pipelined
from cacheguard.redis.clients import is_cluster, parse_url
from cacheguard.redis.errors import REDIS_DOWN, classify
from cacheguard.redis.keys import ResourceKeys, check_name
from cacheguard.redis.scripts import ScriptCall, run_pipelined

__all__ = ["CacheBackendConfigError", "CacheGuardCache", "UnpicklableValue"]

log = logging.getLogger("cacheguard.django")

# The guard's settings that OPTIONS may give (GuardSettings' names; docs/guide.md).
_GUARD_OPTIONS: Final = frozenset(
    {
        "namespace",
        "lease",
        "wait_timeout",
        "on_timeout",
        "on_backend_error",
        "compress",
        "compress_min_size",
        "ttl_jitter",
        "early_refresh_beta",
        "max_value_bytes",
        "announce_value_bytes",
        "version_ttl",
        "max_key_length",
        "max_fill_retries",
        "max_load_time",
        "breaker_failures",
        "breaker_cooldown",
        "cohort_limit",
        "confirm_replicas",
        "confirm_timeout",
        "outage_ttl",
        "stale_if_error",
        "fallback_maxsize",
        "gutter_ttl",
    }
)
# The backend's own: the pickle signing key and the clients' options (from_url's).
_OWN_OPTIONS: Final = frozenset(
    {"signing_key", "connect_timeout", "socket_timeout", "max_connections"}
)
# Names that mean something elsewhere but not here: why, for the error.
_REFUSED_OPTIONS: Final = {
    "codec": "values are pickled, as Django's own Redis backend does (give 'signing_key' "
    "to sign them with a key of your own rather than one derived from SECRET_KEY)",
    "none_ttl": "get_or_set() caches a None for its timeout, as Django does",
    "stale_ttl": "Django's cache API never serves an entry past its timeout",
    "l1_maxsize": "an in-process copy would let get() miss another process's set() for "
    "up to l1_ttl; Django's cache API promises the next get() sees it",
    "l1_ttl": "there is no in-process copy (see 'l1_maxsize')",
    "MAX_ENTRIES": "Redis evicts by its maxmemory-policy; nothing culls entries here (as "
    "with Django's own Redis backend)",
    "CULL_FREQUENCY": "Redis evicts by its maxmemory-policy; nothing culls entries here",
}
# Defaults that differ from a guard's: Django's timeouts are exact (no jitter), and a
# get_or_set() callable runs in its caller's request, never early in a worker thread.
_BACKEND_DEFAULTS: Final = {"namespace": "django", "ttl_jitter": 0.0, "early_refresh_beta": 0.0}
# Tries of an incr() whose compare-and-set keeps losing to other writers.
_SWAP_TRIES: Final = 1000
_SIGNING_SALT: Final = b"cacheguard.integrations.django.CacheGuardCache"


class CacheBackendConfigError(CacheGuardError, ImproperlyConfigured):  # type: ignore[misc]
    """The ``CACHES`` entry of a :class:`CacheGuardCache` cannot be used (its
    ``LOCATION`` or an ``OPTIONS`` name or value). Also Django's
    ``ImproperlyConfigured``."""


class UnpicklableValue(SerializationError, pickle.PicklingError):
    """A value given to the backend cannot be pickled: nothing was stored. Also a
    ``pickle.PicklingError``, which Django's cache API raises for it."""


class _SignedPickle(PickleCodec):
    """The guard's :class:`PickleCodec`, whose refusals are also pickle errors."""

    def encode(self, value: Any) -> bytes:
        try:
            return super().encode(value)
        except SerializationError as exc:
            raise UnpicklableValue(str(exc)) from exc.__cause__


class CacheGuardCache(BaseCache):  # type: ignore[misc]  # Django is untyped
    """A Django cache backend on cacheguard's guards.

    ``LOCATION``: one URL, in every form that
    :meth:`~cacheguard.CacheGuard.from_url` takes (``redis://``, ``rediss://``,
    ``unix://``, ``redis+cluster://host:port,...``,
    ``redis+sentinel://host:port,.../service[/db]``). ``OPTIONS``: the guard's
    settings (``namespace``, default ``"django"``; ``lease``; ``wait_timeout`` ...;
    ``ttl_jitter`` and ``early_refresh_beta`` default to 0 here), ``signing_key``
    (str or bytes, 16 bytes or more; default: derived from ``SECRET_KEY``),
    ``connect_timeout``, ``socket_timeout`` and ``max_connections`` (the asyncio
    pool). An unknown or unusable one raises :class:`CacheBackendConfigError`.

    For other code (the ORM hooks use these):

    - :attr:`guard`: the sync :class:`~cacheguard.CacheGuard` the backend works
      through, shared by every instance of this configuration in the process
      (Django makes one instance per thread);
    - :meth:`async_guard`: the :class:`~cacheguard.aio.AsyncCacheGuard` of the
      running event loop (one per loop, closed when the loop shuts down);
    - :meth:`guard_name`: the guard's name for a Django key
      (``make_key`` + validation), e.g. for ``guard.invalidate(cache.guard_name(k))``;
    - :attr:`namespace`: the guard's namespace.

    ``close()`` does nothing, as with Django's own Redis backend (Django calls it at
    the end of every request; the connections stay pooled). :meth:`shutdown` and
    :meth:`ashutdown` close them (a later call opens them again).
    """

    def __init__(self, server: Any, params: Mapping[str, Any]) -> None:
        super().__init__(params)
        self._config = _Config.read(server, params.get("OPTIONS") or {})
        self._shared = _connections_for(self._config)
        self._max_key_length = self._config.settings.max_key_length

    # -- the guards ----------------------------------------------------------------------

    @property
    def guard(self) -> CacheGuard:
        """The sync guard (made on first use; again after :meth:`shutdown`)."""
        return self._shared.sync_guard()

    def async_guard(self) -> AsyncCacheGuard:
        """The asyncio guard of the running event loop (``RuntimeError`` outside one):
        made on the loop's first use, closed as the loop shuts down its async
        generators (``asyncio.run`` does, and so do Django's ``async_to_sync`` and
        pytest-asyncio)."""
        return self._shared.async_guard(asyncio.get_running_loop())

    @property
    def namespace(self) -> str:
        """The prefix of every Redis key this backend writes."""
        return self._config.settings.namespace

    def guard_name(self, key: Any, version: int | None = None) -> str:
        """The guard's name of Django key ``key`` (``make_key``, with Django's key
        warnings, then the guard's check: a name past ``max_key_length`` is shortened)."""
        return check_name(self.make_and_validate_key(key, version=version), self._max_key_length)

    def close(self, **kwargs: Any) -> None:
        """Nothing: Django calls it after every request, and the connections stay pooled."""

    def shutdown(self) -> None:
        """Close the sync guard's connections and forget asyncio guards whose loop is
        closed (for every instance of this configuration in the process). A later call
        opens new ones. An asyncio guard of a live loop is closed by :meth:`ashutdown`
        on that loop, or as the loop shuts down."""
        self._shared.shutdown()

    async def ashutdown(self) -> None:
        """Close the running loop's asyncio guard (a later call opens a new one)."""
        await self._shared.ashutdown(asyncio.get_running_loop())

    def get_backend_timeout(self, timeout: Any = DEFAULT_TIMEOUT) -> float | None:
        """A Django timeout in seconds: None for no expiry (``None``, or more than
        :data:`~cacheguard.cache.entry_writes.FOREVER`), 0 for none at all (0 or
        less: the key is deleted), the default for ``DEFAULT_TIMEOUT``."""
        if timeout is DEFAULT_TIMEOUT:
            timeout = self.default_timeout
        if timeout is None:
            return None
        seconds = float(timeout)
        if seconds <= 0:
            return 0.0
        return None if seconds > FOREVER else seconds

    # -- the sync API --------------------------------------------------------------------

    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        name = self.guard_name(key, version)
        guard = self.guard
        with _unavailable(f"reading {name!r}"):
            raw = _readable(lambda: guard.client.get(guard.keys(name).value))
        value = self._decoded(name, raw)
        return default if value is MISSING else value

    def get_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        names = {self.guard_name(key, version): key for key in keys}
        if not names:
            return {}
        guard = self.guard
        value_keys = [guard.keys(name).value for name in names]
        with _unavailable(f"reading {len(names)} keys"):
            if is_cluster(guard.client):  # the keys live on several nodes
                raws = guard.client.mget_nonatomic(value_keys)  # type: ignore[union-attr]
            else:
                raws = guard.client.mget(value_keys)
        return self._found(names, raws)

    def has_key(self, key: Any, version: int | None = None) -> bool:
        return self.get(key, MISSING, version) is not MISSING

    def set(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> None:
        name = self.guard_name(key, version)
        call, _ = self._write_call(name, value, self.get_backend_timeout(timeout))
        self._call(call, f"writing {name!r}")

    def add(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> bool:
        name = self.guard_name(key, version)
        lifetime = self.get_backend_timeout(timeout)
        entry = self._entry(name, value, lifetime)  # a value that cannot be pickled raises
        keys = self.guard.keys(name)
        if lifetime == 0:  # stored and gone at once, as Django's backends do: was it free?
            with _unavailable(f"reading {name!r}"):
                return not self.guard.client.exists(keys.value)
        if entry is None:
            return False
        return bool(self._call(put_call(keys, entry, lifetime, only_new=True), f"adding {name!r}"))

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        name = self.guard_name(key, version)
        lifetime = self.get_backend_timeout(timeout)
        keys = self.guard.keys(name)
        call = delete_call(keys) if lifetime == 0 else touch_call(keys, lifetime)
        return bool(self._call(call, f"touching {name!r}"))

    def delete(self, key: Any, version: int | None = None) -> bool:
        name = self.guard_name(key, version)
        return bool(self._call(delete_call(self.guard.keys(name)), f"deleting {name!r}"))

    def set_many(
        self,
        data: Mapping[Any, Any],
        timeout: Any = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> list[Any]:
        if not data:
            return []
        lifetime = self.get_backend_timeout(timeout)
        calls, failed = self._write_calls(data, lifetime, version)
        self._pipelined(calls, f"writing {len(calls)} keys")
        return failed

    def delete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        names = [self.guard_name(key, version) for key in keys]
        if names:
            calls = [delete_call(self.guard.keys(name)) for name in names]
            self._pipelined(calls, f"deleting {len(names)} keys")

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        name = self.guard_name(key, version)
        guard = self.guard
        keys = guard.keys(name)
        for _ in range(_SWAP_TRIES):
            with _unavailable(f"reading {name!r}"):
                raw = _readable(lambda: guard.client.get(keys.value))
            seen, entry = self._swap_for(key, name, raw, delta)
            if self._call(swap_call(keys, seen, entry), f"writing {name!r}"):
                return unpack_entry(self._config.settings.codec, entry).value
        raise _too_busy(name)

    def clear(self) -> None:
        """Delete every entry of this cache: the namespace's keys whose name starts with
        ``KEY_PREFIX:`` (with Django's key function and a ``KEY_PREFIX``), else every key
        of the namespace; nothing of another namespace (no FLUSHDB). Loads under way for
        them store nothing (the guard's ``invalidate_prefix``: a SCAN of the keyspace)."""
        with _unavailable("clearing the cache"):
            self.guard.invalidate_prefix(self._clear_prefix())

    def get_or_set(
        self,
        key: Any,
        default: Any,
        timeout: Any = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> Any:
        """The value of ``key``; if missing, ``default`` stored (Django's semantics,
        add then get), or with a callable ``default`` its value, loaded by one call
        across every process (the guard's ``get_or_load``: the others wait for it,
        woken by the fill's announcement). A load's None is cached as Django does."""
        if not callable(default):
            return super().get_or_set(key, default, timeout, version)
        name = self.guard_name(key, version)
        lifetime = self.get_backend_timeout(timeout)
        if lifetime == 0:  # nothing is stored: Django's get, call, add (a no-op), get
            value = self.get(key, MISSING, version)
            return default() if value is MISSING else value
        ttl = FOREVER if lifetime is None else lifetime
        try:
            return self.guard.get_or_load(name, default, ttl=ttl, none_ttl=ttl)
        except UnpicklableValue:
            raise
        except SerializationError as exc:
            raise UnpicklableValue(str(exc)) from exc

    # -- the asyncio API: the running loop's AsyncCacheGuard, no threads --------------------

    async def aget(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        name = self.guard_name(key, version)
        guard = self.async_guard()
        with _unavailable(f"reading {name!r}"):
            try:
                raw = await guard.client.get(guard.keys(name).value)
            except redis.ResponseError as exc:
                raw = _not_ours(exc)
        value = self._decoded(name, raw)
        return default if value is MISSING else value

    async def aget_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        names = {self.guard_name(key, version): key for key in keys}
        if not names:
            return {}
        guard = self.async_guard()
        value_keys = [guard.keys(name).value for name in names]
        with _unavailable(f"reading {len(names)} keys"):
            if is_cluster(guard.client):
                raws = await guard.client.mget_nonatomic(value_keys)  # type: ignore[union-attr]
            else:
                raws = await guard.client.mget(value_keys)
        return self._found(names, raws)

    async def ahas_key(self, key: Any, version: int | None = None) -> bool:
        return await self.aget(key, MISSING, version) is not MISSING

    async def aset(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> None:
        name = self.guard_name(key, version)
        call, _ = self._write_call(name, value, self.get_backend_timeout(timeout))
        await self._acall(call, f"writing {name!r}")

    async def aadd(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> bool:
        name = self.guard_name(key, version)
        lifetime = self.get_backend_timeout(timeout)
        entry = self._entry(name, value, lifetime)
        guard = self.async_guard()
        keys = guard.keys(name)
        if lifetime == 0:
            with _unavailable(f"reading {name!r}"):
                return not await guard.client.exists(keys.value)
        if entry is None:
            return False
        call = put_call(keys, entry, lifetime, only_new=True)
        return bool(await self._acall(call, f"adding {name!r}"))

    async def atouch(
        self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> bool:
        name = self.guard_name(key, version)
        lifetime = self.get_backend_timeout(timeout)
        keys = self.async_guard().keys(name)
        call = delete_call(keys) if lifetime == 0 else touch_call(keys, lifetime)
        return bool(await self._acall(call, f"touching {name!r}"))

    async def adelete(self, key: Any, version: int | None = None) -> bool:
        name = self.guard_name(key, version)
        call = delete_call(self.async_guard().keys(name))
        return bool(await self._acall(call, f"deleting {name!r}"))

    async def aset_many(
        self,
        data: Mapping[Any, Any],
        timeout: Any = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> list[Any]:
        if not data:
            return []
        lifetime = self.get_backend_timeout(timeout)
        calls, failed = self._write_calls(data, lifetime, version)
        await self._apipelined(calls, f"writing {len(calls)} keys")
        return failed

    async def adelete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        names = [self.guard_name(key, version) for key in keys]
        if names:
            guard = self.async_guard()
            calls = [delete_call(guard.keys(name)) for name in names]
            await self._apipelined(calls, f"deleting {len(names)} keys")

    async def aincr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        name = self.guard_name(key, version)
        guard = self.async_guard()
        keys = guard.keys(name)
        for _ in range(_SWAP_TRIES):
            with _unavailable(f"reading {name!r}"):
                try:
                    raw = await guard.client.get(keys.value)
                except redis.ResponseError as exc:
                    raw = _not_ours(exc)
            seen, entry = self._swap_for(key, name, raw, delta)
            if await self._acall(swap_call(keys, seen, entry), f"writing {name!r}"):
                return unpack_entry(self._config.settings.codec, entry).value
        raise _too_busy(name)

    async def adecr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        return await self.aincr(key, -delta, version)

    async def aclear(self) -> None:
        """:meth:`clear` on the running loop's asyncio guard."""
        with _unavailable("clearing the cache"):
            await self.async_guard().invalidate_prefix(self._clear_prefix())

    async def aget_or_set(
        self,
        key: Any,
        default: Any,
        timeout: Any = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> Any:
        """:meth:`get_or_set` on the asyncio guard; a callable ``default`` may be an
        ``async def`` (awaited) or a plain function (called on the loop)."""
        if not callable(default):
            value = await self.aget(key, MISSING, version)
            if value is not MISSING:
                return value
            await self.aadd(key, default, timeout, version)
            return await self.aget(key, default, version)
        name = self.guard_name(key, version)
        lifetime = self.get_backend_timeout(timeout)
        if lifetime == 0:
            value = await self.aget(key, MISSING, version)
            if value is not MISSING:
                return value
            loaded = default()
            return await loaded if inspect.isawaitable(loaded) else loaded
        ttl = FOREVER if lifetime is None else lifetime
        try:
            return await self.async_guard().get_or_load(name, default, ttl=ttl, none_ttl=ttl)
        except UnpicklableValue:
            raise
        except SerializationError as exc:
            raise UnpicklableValue(str(exc)) from exc

    # -- shared by both APIs ---------------------------------------------------------------

    def _decoded(self, name: str, raw: Any) -> Any:
        """The value of an entry read, or MISSING: nothing there, or bytes that are not
        one of ours (corrupt, unsigned, signed with another key: never unpickled)."""
        if raw is None:
            return MISSING
        try:
            return unpack_entry(self._config.settings.codec, raw).value
        except ValueError as exc:
            log.warning("cache entry of %r does not decode, treated as a miss: %s", name, exc)
            return MISSING

    def _found(self, names: Mapping[str, Any], raws: Iterable[Any]) -> dict[Any, Any]:
        found: dict[Any, Any] = {}
        for (name, key), raw in zip(names.items(), raws, strict=True):
            value = self._decoded(name, raw)
            if value is not MISSING:
                found[key] = value
        return found

    def _entry(self, name: str, value: Any, lifetime: float | None) -> bytes | None:
        """``value``'s entry, or None when it is over ``max_value_bytes`` (logged);
        :class:`UnpicklableValue` when it cannot be pickled."""
        settings = self._config.settings
        entry = new_entry(settings, value, lifetime)
        if len(entry) > settings.max_value_bytes:
            log.warning(
                "value of %r is %d bytes, over max_value_bytes=%d: not cached",
                name,
                len(entry),
                settings.max_value_bytes,
            )
            return None
        return entry

    def _write_call(self, name: str, value: Any, lifetime: float | None) -> tuple[ScriptCall, bool]:
        """What a set of ``name`` sends: a store, or a delete for a timeout of 0 or
        less, or for a value too large (an older value must not stay); and whether
        that is what was asked (False: the value was too large)."""
        entry = self._entry(name, value, lifetime)
        keys = ResourceKeys(self.namespace, name)
        if lifetime == 0:
            return delete_call(keys), True
        if entry is None:
            return delete_call(keys), False
        return put_call(keys, entry, lifetime, only_new=False), True

    def _write_calls(
        self, data: Mapping[Any, Any], lifetime: float | None, version: int | None
    ) -> tuple[list[ScriptCall], list[Any]]:
        """A set_many's calls, and its keys that were not stored (values too large)."""
        calls: list[ScriptCall] = []
        failed: list[Any] = []
        for key, value in data.items():
            call, done = self._write_call(self.guard_name(key, version), value, lifetime)
            calls.append(call)
            if not done:
                failed.append(key)
        return calls, failed

    def _swap_for(self, key: Any, name: str, raw: Any, delta: Any) -> tuple[bytes, bytes]:
        """An incr's compare-and-set: the entry read and its replacement (the value
        plus ``delta``, same lifetime). Django's ``ValueError`` for a missing key; the
        sum's own error (``TypeError`` for None + 1) as Django's backends raise it."""
        codec = self._config.settings.codec
        entry: Entry | None = None
        if raw is not None:
            try:
                entry = unpack_entry(codec, raw)
            except ValueError as exc:
                log.warning("cache entry of %r does not decode, treated as a miss: %s", name, exc)
        if entry is None:
            raise ValueError(f"Key '{key}' not found")
        settings = self._config.settings
        replacement = pack_entry(
            codec,
            entry.value + delta,
            created=entry.created,
            ttl=entry.ttl,
            version=entry.version,
            load_duration=entry.load_duration,
            compress=settings.compress,
            compress_min_size=settings.compress_min_size,
        )
        return raw, replacement

    def _clear_prefix(self) -> str:
        """The names :meth:`clear` deletes: those of this ``KEY_PREFIX`` when Django's
        key function makes them (and the prefix is short enough to survive the guard's
        shortening of long names), else all of the namespace."""
        prefix = f"{self.key_prefix}:"
        # A shortened name keeps its first max_key_length - 33 characters (redis/keys.py).
        kept = self._max_key_length - 33
        if self.key_prefix and self.key_func is default_key_func and len(prefix) <= kept:
            return prefix
        return ""

    def _call(self, call: ScriptCall, what: str) -> Any:
        script, keys, args = call
        with _unavailable(what):
            return script(self.guard.client, keys, args)

    async def _acall(self, call: ScriptCall, what: str) -> Any:
        script, keys, args = call
        with _unavailable(what):
            return await script.acall(self.async_guard().client, keys, args)

    def _pipelined(self, calls: list[ScriptCall], what: str) -> None:
        with _unavailable(what):
            _raise_first(run_pipelined(self.guard.client, calls))

    async def _apipelined(self, calls: list[ScriptCall], what: str) -> None:
        with _unavailable(what):
            _raise_first(await arun_pipelined(self.async_guard().client, calls))


# -- configuration ------------------------------------------------------------------------------


class _Config:
    """A backend's checked configuration: where, the guard's settings, the clients'
    options. Equal configurations share their guards (see :class:`_Connections`)."""

    def __init__(
        self, location: str, settings: dict[str, Any], client: dict[str, Any], signing: bytes
    ) -> None:
        self.location = location
        self.guard_settings = settings
        self.client_options = client
        try:
            self.settings = GuardSettings(**settings)
        except (TypeError, ValueError) as exc:
            raise CacheBackendConfigError(f"CacheGuardCache OPTIONS: {exc}") from exc
        if self.settings.on_timeout == "stale":
            raise CacheBackendConfigError(
                "CacheGuardCache OPTIONS: on_timeout='stale' is not available: Django's cache "
                "API never serves an entry past its timeout (use 'load' or 'raise')"
            )
        options = sorted((name, repr(value)) for name, value in {**settings, **client}.items())
        self.identity = (location, tuple(o for o in options if o[0] != "codec"), signing)

    @classmethod
    def read(cls, server: Any, options: Mapping[str, Any]) -> _Config:
        if not isinstance(options, Mapping):
            raise CacheBackendConfigError(
                f"CacheGuardCache OPTIONS must be a dict, not {type(options).__name__}"
            )
        location = _location(server)
        for name in options:
            if name in _REFUSED_OPTIONS:
                raise CacheBackendConfigError(
                    f"CacheGuardCache OPTIONS: {name!r} is not available: {_REFUSED_OPTIONS[name]}"
                )
        unknown = sorted(str(name) for name in set(options) - _GUARD_OPTIONS - _OWN_OPTIONS)
        if unknown:
            raise CacheBackendConfigError(
                f"CacheGuardCache OPTIONS: unknown {', '.join(map(repr, unknown))}; it takes "
                f"{', '.join(sorted(_GUARD_OPTIONS | _OWN_OPTIONS))}"
            )
        settings: dict[str, Any] = {**_BACKEND_DEFAULTS}
        settings.update((k, v) for k, v in options.items() if k in _GUARD_OPTIONS)
        signing = _signing_key(options.get("signing_key"))
        settings["codec"] = _SignedPickle(signing)
        client = {k: v for k, v in options.items() if k in _OWN_OPTIONS - {"signing_key"}}
        return cls(location, settings, client, signing)

    def sync_guard(self) -> CacheGuard:
        options = {k: v for k, v in self.client_options.items() if k != "max_connections"}
        try:
            return CacheGuard.from_url(self.location, **options, **self.guard_settings)
        except (TypeError, ValueError) as exc:
            raise CacheBackendConfigError(f"CacheGuardCache: {exc}") from exc

    def async_guard(self) -> AsyncCacheGuard:
        try:
            return AsyncCacheGuard.from_url(
                self.location, **self.client_options, **self.guard_settings
            )
        except (TypeError, ValueError) as exc:
            raise CacheBackendConfigError(f"CacheGuardCache: {exc}") from exc


def _location(server: Any) -> str:
    """``LOCATION``: one URL that a guard's ``from_url`` takes (checked, no I/O)."""
    if isinstance(server, (list, tuple)):
        if len(server) != 1:
            raise CacheBackendConfigError(
                "CacheGuardCache LOCATION is one URL: a Sentinel URL "
                "(redis+sentinel://host:port,.../service) for a master and its replicas, "
                "a cluster URL (redis+cluster://host:port,...) for several masters"
            )
        server = server[0]
    if not isinstance(server, str) or not server:
        raise CacheBackendConfigError(
            f"CacheGuardCache LOCATION must be a Redis URL, not {server!r} "
            "(e.g. 'redis://127.0.0.1:6379/0')"
        )
    try:
        if parse_url(server).kind == "server":
            redis.connection.parse_url(server)  # type: ignore[no-untyped-call]  # redis-py's check
    except (TypeError, ValueError) as exc:
        raise CacheBackendConfigError(f"CacheGuardCache LOCATION {server!r}: {exc}") from exc
    return server


def _signing_key(given: Any) -> bytes:
    """The HMAC key of the pickles: ``OPTIONS["signing_key"]``, else one derived from
    ``SECRET_KEY`` (salted: the HMAC key is no other use's key). Rotating it makes every
    entry signed before a miss."""
    if given is not None:
        key = given.encode() if isinstance(given, str) else given
        if not isinstance(key, bytes) or len(key) < 16:
            raise CacheBackendConfigError(
                "CacheGuardCache OPTIONS: 'signing_key' must be a str or bytes of 16 bytes or more"
            )
        return key
    secret = django_settings.SECRET_KEY  # Django refuses an empty one (ImproperlyConfigured)
    if not secret:
        raise CacheBackendConfigError(
            "CacheGuardCache signs its pickles with a key derived from SECRET_KEY, which is "
            "empty: set SECRET_KEY or give OPTIONS['signing_key']"
        )
    material = secret.encode() if isinstance(secret, str) else bytes(secret)
    return hmac.new(material, _SIGNING_SALT, hashlib.sha256).digest()


# -- the guards of a configuration, shared in the process ----------------------------------------


class _Connections:
    """One configuration's guards in this process: one sync guard, and one asyncio
    guard per event loop (a ``redis.asyncio`` client belongs to one loop)."""

    def __init__(self, config: _Config) -> None:
        self.config = config
        # Reentrant: a closed loop's closer, stepped under it, takes it again.
        self._mutex = threading.RLock()
        self._sync: CacheGuard | None = None
        # The loop's guard and the async generator that closes it with the loop (the
        # guard's connections keep their loop alive: entries are dropped explicitly).
        self._loops: dict[asyncio.AbstractEventLoop, tuple[AsyncCacheGuard, Any, Any]] = {}

    def sync_guard(self) -> CacheGuard:
        guard = self._sync
        if guard is not None:
            return guard
        with self._mutex:
            if self._sync is None:
                self._sync = self.config.sync_guard()
            return self._sync

    def async_guard(self, loop: asyncio.AbstractEventLoop) -> AsyncCacheGuard:
        made = self._loops.get(loop)
        if made is not None:
            return made[0]
        with self._mutex:
            made = self._loops.get(loop)
            if made is None:
                self._drop_closed_loops()
                guard = self.config.async_guard()
                closer = self._closed_with(loop, guard)
                # Its first step, in this loop's thread, registers it with the loop, whose
                # shutdown_asyncgens() then runs its finally: the guard's aclose().
                started = asyncio.ensure_future(closer.__anext__())
                made = self._loops[loop] = (guard, closer, started)
        return made[0]

    async def _closed_with(
        self, loop: asyncio.AbstractEventLoop, guard: AsyncCacheGuard
    ) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            with self._mutex:
                if self._loops.get(loop, (None,))[0] is guard:
                    del self._loops[loop]
            if not loop.is_closed():  # closed: stepped by _drop_closed_loops, no I/O left
                await guard.aclose()

    def _drop_closed_loops(self) -> None:
        """Forget the guards of loops closed without shutting down their async
        generators (their connections are the garbage collector's then)."""
        for loop in [loop for loop in self._loops if loop.is_closed()]:
            _, closer, _ = self._loops.pop(loop)
            step = closer.aclose()
            try:
                step.send(None)  # runs its finally at once: the loop is closed, no awaits
            except StopIteration:
                pass
            except Exception as exc:
                log.debug("closing the guard of a closed loop: %s", exc)

    def shutdown(self) -> None:
        with self._mutex:
            guard, self._sync = self._sync, None
            self._drop_closed_loops()
        if guard is not None:
            guard.close()

    async def ashutdown(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._mutex:
            made = self._loops.pop(loop, None)
        if made is not None:
            await made[1].aclose()  # its finally closes the guard (it is no longer listed)

    def reset_after_fork(self) -> None:
        self._mutex = threading.RLock()
        self._loops = {}  # the parent's loops do not run here


_registry_mutex = threading.Lock()
# Kept for the process's life: Django drops and makes backend instances again (every
# override_settings(CACHES=...) does), and a configuration's guards must not be made
# anew, and the old ones left open, each time.
_registry: dict[Any, _Connections] = {}


def _connections_for(config: _Config) -> _Connections:
    """The guards shared by every backend instance of ``config`` in this process."""
    with _registry_mutex:
        connections = _registry.get(config.identity)
        if connections is None:
            connections = _registry[config.identity] = _Connections(config)
        return connections


def _reset_after_fork() -> None:
    global _registry_mutex
    _registry_mutex = threading.Lock()
    for connections in list(_registry.values()):
        connections.reset_after_fork()


on_fork_in_child(_reset_after_fork)


# -- errors -------------------------------------------------------------------------------------


@contextmanager
def _unavailable(what: str) -> Iterator[None]:
    """Redis down (unreachable, or refusing for now) -> :class:`BackendUnavailable`."""
    try:
        yield
    except REDIS_DOWN as exc:
        raise BackendUnavailable(f"Redis unavailable {what}: {exc}") from exc
    except redis.ResponseError as exc:
        refusal = classify(exc)
        if isinstance(refusal, REDIS_DOWN):
            raise BackendUnavailable(f"Redis unavailable {what}: {exc}") from exc
        raise


def _readable(read: Callable[[], Any]) -> Any:
    """A GET's reply; a key of another type at our name (not ours) reads as nothing."""
    try:
        return read()
    except redis.ResponseError as exc:
        return _not_ours(exc)


def _not_ours(exc: redis.ResponseError) -> bytes | None:
    """What a GET that failed with ``exc`` read: nothing, if the key is of another type."""
    if str(exc).startswith("WRONGTYPE"):
        return None
    raise exc


def _raise_first(results: list[Any]) -> None:
    for result in results:
        if isinstance(result, BaseException):
            raise result


def _too_busy(name: str) -> CacheGuardError:
    return CacheGuardError(
        f"incr of {name!r} lost its compare-and-set {_SWAP_TRIES} times in a row: other "
        "writers change the key faster than it can be read and written"
    )
