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
The operations of more than one step (``add``, ``touch``, ``incr``, ``clear``)
are written once, as generators that decide and yield their Redis calls; the
sync and the asyncio methods only carry those out.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import inspect
import logging
import pickle
import re
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Callable, Generator, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import redis
import redis.connection
from django.conf import settings as django_settings
from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache, default_key_func
from django.core.exceptions import ImproperlyConfigured

from cacheguard._identity import on_fork_in_child
from cacheguard.backoff import Backoff
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
from cacheguard.cache.invalidation import SCAN_BATCH, Invalidation
from cacheguard.cache.settings import GuardSettings
from cacheguard.exceptions import BackendUnavailable, CacheGuardError, SerializationError
from cacheguard.redis.async_scripts import arun_pipelined
from cacheguard.redis.clients import is_cluster, parse_url, pool_exhausted
from cacheguard.redis.errors import REDIS_DOWN, classify
from cacheguard.redis.keys import ResourceKeys, check_name
from cacheguard.redis.scripts import ScriptCall, run_pipelined

__all__ = ["CacheBackendConfigError", "CacheGuardCache", "PoolExhausted", "UnpicklableValue"]

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
    "stale_if_error": "it would answer a failing get_or_set() with a value this process saw "
    "before, past its timeout or after a delete(); Django's cache API never serves those",
    "outage_ttl": "with Redis down it would answer get_or_set() with a value this process "
    "saw before, past its timeout or after a delete(); Django's cache API never serves "
    "those (on_backend_error='bypass' calls the callable instead)",
    "fallback_maxsize": "it sizes the memory of 'stale_if_error' and 'outage_ttl', which "
    "are not available",
    "MAX_ENTRIES": "Redis evicts by its maxmemory-policy; nothing culls entries here (as "
    "with Django's own Redis backend)",
    "CULL_FREQUENCY": "Redis evicts by its maxmemory-policy; nothing culls entries here",
}
# Defaults that differ from a guard's: Django's timeouts are exact (no jitter), and a
# get_or_set() callable runs in its caller's request, never early in a worker thread.
_BACKEND_DEFAULTS: Final = {"namespace": "django", "ttl_jitter": 0.0, "early_refresh_beta": 0.0}
# Tries of an incr() or touch() whose compare-and-set keeps losing to other writers
# (other processes: this one's take turns), each after a jittered pause.
_SWAP_TRIES: Final = 200
_SWAP_PAUSES: Final = (0.001, 0.05)  # the pauses' first and longest, in seconds
_SIGNING_SALT: Final = b"cacheguard.integrations.django.CacheGuardCache"


class CacheBackendConfigError(CacheGuardError, ImproperlyConfigured):  # type: ignore[misc]
    """The ``CACHES`` entry of a :class:`CacheGuardCache` cannot be used (its
    ``LOCATION`` or an ``OPTIONS`` name or value). Also Django's
    ``ImproperlyConfigured``."""


class UnpicklableValue(SerializationError, pickle.PicklingError):
    """A value given to the backend cannot be pickled: nothing was stored. Also a
    ``pickle.PicklingError``, which Django's cache API raises for it."""


class PoolExhausted(CacheGuardError):
    """Every connection of the event loop's pool (``max_connections``) stayed in use
    for ``socket_timeout`` while a call waited for one: more calls at once than the
    pool allows, or Redis slow to answer them. Not :class:`BackendUnavailable`:
    Redis itself may be fine (raise ``max_connections``, or call less at once)."""


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
        self._shared = _registry.connections_for(self._config, self)
        self._max_key_length = self._config.settings.max_key_length
        # The key layout's SCAN pattern and names, for clear() (no I/O).
        self._layout = Invalidation(self.namespace, self._config.settings.version_ttl_ms)

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
        self._drive(_one(call), f"writing {name!r}", (name,))

    def add(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> bool:
        name = self.guard_name(key, version)
        flow = self._add_flow(name, value, self.get_backend_timeout(timeout))
        return bool(self._drive(flow, f"adding {name!r}", (name,)))

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        name = self.guard_name(key, version)
        flow = self._touch_flow(name, self.get_backend_timeout(timeout))
        return bool(self._drive(flow, f"touching {name!r}", (name,)))

    def delete(self, key: Any, version: int | None = None) -> bool:
        name = self.guard_name(key, version)
        return bool(self._drive(_one(delete_call(self._keys(name))), f"deleting {name!r}", (name,)))

    def set_many(
        self,
        data: Mapping[Any, Any],
        timeout: Any = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> list[Any]:
        if not data:
            return []
        lifetime = self.get_backend_timeout(timeout)
        names, calls, failed = self._write_calls(data, lifetime, version)
        self._drive(_all(calls), f"writing {len(calls)} keys", names)
        return failed

    def delete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        names = [self.guard_name(key, version) for key in keys]
        if names:
            calls = [delete_call(self._keys(name)) for name in names]
            self._drive(_all(calls), f"deleting {len(names)} keys", names)

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        name = self.guard_name(key, version)
        # This process's incrs of a key take turns: only other processes' writes make
        # a compare-and-set lose (and try again).
        with self._shared.incr_turn(name):
            return self._drive(self._incr_flow(key, name, delta), f"writing {name!r}", (name,))

    def clear(self) -> None:
        """Delete every entry of this cache: with Django's key function and a
        ``KEY_PREFIX``, the namespace's names ``KEY_PREFIX:<version>:...`` (not those
        of a longer prefix), else every name of the namespace; nothing of another
        namespace (no FLUSHDB). A SCAN of the keyspace, then one delete per name, which
        also fails a fill of it under way, as :meth:`delete` does."""
        prefix, _ = self._cleared()
        self._drive(self._clear_flow(), "clearing the cache", prefix=prefix)

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
        await self._adrive(_one(call), f"writing {name!r}", (name,))

    async def aadd(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> bool:
        name = self.guard_name(key, version)
        flow = self._add_flow(name, value, self.get_backend_timeout(timeout))
        return bool(await self._adrive(flow, f"adding {name!r}", (name,)))

    async def atouch(
        self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> bool:
        name = self.guard_name(key, version)
        flow = self._touch_flow(name, self.get_backend_timeout(timeout))
        return bool(await self._adrive(flow, f"touching {name!r}", (name,)))

    async def adelete(self, key: Any, version: int | None = None) -> bool:
        name = self.guard_name(key, version)
        flow = _one(delete_call(self._keys(name)))
        return bool(await self._adrive(flow, f"deleting {name!r}", (name,)))

    async def aset_many(
        self,
        data: Mapping[Any, Any],
        timeout: Any = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> list[Any]:
        if not data:
            return []
        lifetime = self.get_backend_timeout(timeout)
        names, calls, failed = self._write_calls(data, lifetime, version)
        await self._adrive(_all(calls), f"writing {len(calls)} keys", names)
        return failed

    async def adelete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        names = [self.guard_name(key, version) for key in keys]
        if names:
            calls = [delete_call(self._keys(name)) for name in names]
            await self._adrive(_all(calls), f"deleting {len(names)} keys", names)

    async def aincr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        name = self.guard_name(key, version)
        # The loop's aincrs of a key take turns (see incr): a task waiting for its turn
        # holds no connection, so many of them cannot use up the pool.
        async with self._shared.aincr_turn(asyncio.get_running_loop(), name):
            flow = self._incr_flow(key, name, delta)
            return await self._adrive(flow, f"writing {name!r}", (name,))

    async def adecr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        return await self.aincr(key, -delta, version)

    async def aclear(self) -> None:
        """:meth:`clear` on the running loop's asyncio guard."""
        prefix, _ = self._cleared()
        await self._adrive(self._clear_flow(), "clearing the cache", prefix=prefix)

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

    # -- the operations of several steps: flows, no I/O (both APIs drive them) ------------

    def _add_flow(self, name: str, value: Any, lifetime: float | None) -> _Flow:
        """``add``: store the entry unless the key holds one. Bytes that do not decode
        (signed with a rotated key, corrupt) are what ``get`` misses, so they hold
        nothing: the add takes their place (only while they are still there). A key
        of another type is someone else's: left as it is (False)."""
        entry = self._entry(name, value, lifetime)  # a value that cannot be pickled raises
        keys = self._keys(name)
        if lifetime == 0:  # stored and gone at once, as Django's backends do: was it free?
            raw = yield _Read(keys.value)
            return raw is not FOREIGN and self._decoded(name, raw) is MISSING
        if entry is None:  # over max_value_bytes: not stored
            return False
        for _ in range(_SWAP_TRIES):
            if (yield put_call(keys, entry, lifetime, only_new=True)):
                return True
            raw = yield _Read(keys.value)
            if raw is FOREIGN:
                return False
            if raw is not None:
                if self._decoded(name, raw) is not MISSING:
                    return False  # taken
                if (yield put_call(keys, entry, lifetime, only_new=False, replacing=raw)):
                    return True
            # Gone or changed since it was read: try again.
        return False

    def _touch_flow(self, name: str, lifetime: float | None) -> _Flow:
        """``touch``: a new lifetime for the entry, if the key holds one that decodes
        (what ``get`` would return; bytes that do not are nothing, as for ``get``),
        compared-and-set on the bytes read; a timeout of 0 deletes the key."""
        keys = self._keys(name)
        pauses: Backoff | None = None
        for _ in range(_SWAP_TRIES):
            raw = yield _Read(keys.value)
            readable = self._decoded(name, raw) is not MISSING
            if lifetime == 0:
                return bool((yield delete_call(keys))) and readable
            if not readable:
                return False
            if (yield touch_call(keys, lifetime, raw)):
                return True
            pauses = pauses or _swap_pauses()
            yield _Pause(pauses.next_delay())
        raise _too_busy("touch", name)

    def _incr_flow(self, key: Any, name: str, delta: Any) -> _Flow:
        """``incr``: the entry's value plus ``delta``, compared-and-set on the bytes
        read (same lifetime); another process's write meanwhile: read again, after a
        jittered pause. Django's ``ValueError`` for a missing key (or bytes that do not
        decode); the sum's own error (``TypeError`` for None + 1)."""
        keys = self._keys(name)
        codec, settings = self._config.settings.codec, self._config.settings
        pauses: Backoff | None = None
        for _ in range(_SWAP_TRIES):
            raw = yield _Read(keys.value)
            entry = self._entry_read(name, raw)
            if entry is None:
                raise ValueError(f"Key '{key}' not found")
            value = entry.value + delta
            replacement = pack_entry(
                codec,
                value,
                created=entry.created,
                ttl=entry.ttl,
                version=entry.version,
                load_duration=entry.load_duration,
                compress=settings.compress,
                compress_min_size=settings.compress_min_size,
            )
            if (yield swap_call(keys, raw, replacement)):
                return value
            pauses = pauses or _swap_pauses()
            yield _Pause(pauses.next_delay())
        raise _too_busy("incr", name)

    def _clear_flow(self) -> _Flow:
        """``clear``: the names :meth:`_cleared` picks among the namespace's keys, each
        deleted as ``delete`` deletes (failing a fill in flight). No invalidation
        stamp: nothing is left behind for ``version_ttl`` per entry cleared."""
        prefix, belongs = self._cleared()
        found = yield _Scan(self._layout.scan_pattern(prefix))
        names = set()
        for raw in found:
            key = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
            name = self._layout.name_of(key)
            if name is not None and belongs(name):
                names.add(name)
        ordered = sorted(names)
        for start in range(0, len(ordered), SCAN_BATCH):
            batch = ordered[start : start + SCAN_BATCH]
            yield from _all([delete_call(self._keys(name)) for name in batch])

    def _cleared(self) -> tuple[str, Callable[[str], bool]]:
        """What :meth:`clear` deletes: the prefix of the names to SCAN for, and which of
        them are this cache's. With Django's key function and a ``KEY_PREFIX`` short
        enough to survive the guard's shortening of long names, the names
        ``KEY_PREFIX:<version>:...`` (a cache of ``KEY_PREFIX`` "a:b" is not one of
        "a"'s); else every name of the namespace."""
        # A shortened name keeps its first max_key_length - 33 characters (redis/keys.py),
        # room for the prefix and a version.
        kept = self._max_key_length - 33
        if (
            self.key_prefix
            and self.key_func is default_key_func
            and len(self.key_prefix) + _VERSION_ROOM <= kept
        ):
            shape = re.compile(re.escape(self.key_prefix) + r":-?\d+:")
            return f"{self.key_prefix}:", lambda name: shape.match(name) is not None
        return "", lambda name: True

    # -- the drivers of the flows ------------------------------------------------------------

    def _drive(
        self, flow: _Flow, what: str, written: Iterable[str] = (), *, prefix: str | None = None
    ) -> Any:
        """Carry out ``flow``'s steps with the sync guard's client; its result. Then
        (however it ended) tell this configuration's guards that ``written`` (and the
        names under ``prefix``) were written: loads of them under way in this process
        may predate the write, so later calls must neither wait for nor share them."""
        client = self.guard.client
        reply: Any = None
        try:
            with _unavailable(what):
                while True:
                    try:
                        step = flow.send(reply)
                    except StopIteration as done:
                        return done.value
                    reply = _answer(client, step)
        finally:
            flow.close()
            self._shared.note_written(written, prefix)

    async def _adrive(
        self, flow: _Flow, what: str, written: Iterable[str] = (), *, prefix: str | None = None
    ) -> Any:
        """:meth:`_drive` with the running loop's asyncio guard."""
        client = self.async_guard().client
        reply: Any = None
        try:
            with _unavailable(what):
                while True:
                    try:
                        step = flow.send(reply)
                    except StopIteration as done:
                        return done.value
                    reply = await _aanswer(client, step)
        finally:
            flow.close()
            self._shared.note_written(written, prefix)

    # -- shared by both APIs ---------------------------------------------------------------

    def _keys(self, name: str) -> ResourceKeys:
        return ResourceKeys(self.namespace, name)

    def _entry_read(self, name: str, raw: Any) -> Entry | None:
        """The entry read, or None: nothing there, a key of another type, or bytes that
        are not one of ours (corrupt, unsigned, signed with another key: never
        unpickled)."""
        if raw is None or raw is FOREIGN:
            return None
        try:
            return unpack_entry(self._config.settings.codec, raw)
        except ValueError as exc:
            log.warning("cache entry of %r does not decode, treated as a miss: %s", name, exc)
            return None

    def _decoded(self, name: str, raw: Any) -> Any:
        """The value of an entry read, or MISSING (see :meth:`_entry_read`)."""
        entry = self._entry_read(name, raw)
        return MISSING if entry is None else entry.value

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
        keys = self._keys(name)
        if lifetime == 0:
            return delete_call(keys), True
        if entry is None:
            return delete_call(keys), False
        return put_call(keys, entry, lifetime, only_new=False), True

    def _write_calls(
        self, data: Mapping[Any, Any], lifetime: float | None, version: int | None
    ) -> tuple[list[str], list[ScriptCall], list[Any]]:
        """A set_many's names, calls, and keys that were not stored (values too large)."""
        names: list[str] = []
        calls: list[ScriptCall] = []
        failed: list[Any] = []
        for key, value in data.items():
            name = self.guard_name(key, version)
            call, done = self._write_call(name, value, lifetime)
            names.append(name)
            calls.append(call)
            if not done:
                failed.append(key)
        return names, calls, failed


# -- the flows' steps and their drivers' answers -------------------------------------------------


class _Foreign:
    """What a GET of a key of another Redis type (not ours) answers a flow."""

    def __repr__(self) -> str:
        return "FOREIGN"


FOREIGN: Final = _Foreign()


@dataclass(frozen=True, slots=True)
class _Read:
    """Step: GET ``key``. Answer: its bytes, None, or :data:`FOREIGN`."""

    key: str


@dataclass(frozen=True, slots=True)
class _Pipelined:
    """Step: run ``calls`` in one round trip (one pipeline per node on a cluster).
    Answer: their replies, errors in place."""

    calls: tuple[ScriptCall, ...]


@dataclass(frozen=True, slots=True)
class _Scan:
    """Step: every key matching ``pattern`` (SCAN). Answer: the keys."""

    pattern: str


@dataclass(frozen=True, slots=True)
class _Pause:
    """Step: wait ``seconds`` (a compare-and-set lost to another process). Answer: None."""

    seconds: float


# A ScriptCall (a tuple) is a step too: run the script. Answer: its reply.
_Flow = Generator[Any, Any, Any]
# Room for ":<version>:" in a name's kept head (see CacheGuardCache._cleared).
_VERSION_ROOM: Final = 24


def _one(call: ScriptCall) -> _Flow:
    """The flow of one script call: its reply."""
    return (yield call)


def _all(calls: list[ScriptCall]) -> _Flow:
    """The flow of calls sent in one round trip; the first error among them raises."""
    _raise_first((yield _Pipelined(tuple(calls))))


def _swap_pauses() -> Backoff:
    return Backoff(initial=_SWAP_PAUSES[0], cap=_SWAP_PAUSES[1])


def _answer(client: Any, step: Any) -> Any:
    """A flow's step carried out with a sync client."""
    if isinstance(step, _Read):
        try:
            return client.get(step.key)
        except redis.ResponseError as exc:
            return _foreign(exc)
    if isinstance(step, _Pipelined):
        return run_pipelined(client, list(step.calls))
    if isinstance(step, _Scan):
        return list(client.scan_iter(match=step.pattern, count=1000))
    if isinstance(step, _Pause):
        time.sleep(step.seconds)
        return None
    script, keys, args = step
    return script(client, keys, args)


async def _aanswer(client: Any, step: Any) -> Any:
    """A flow's step carried out with an asyncio client."""
    if isinstance(step, _Read):
        try:
            return await client.get(step.key)
        except redis.ResponseError as exc:
            return _foreign(exc)
    if isinstance(step, _Pipelined):
        return await arun_pipelined(client, list(step.calls))
    if isinstance(step, _Scan):
        return [key async for key in client.scan_iter(match=step.pattern, count=1000)]
    if isinstance(step, _Pause):
        await asyncio.sleep(step.seconds)
        return None
    script, keys, args = step
    return await script.acall(client, keys, args)


def _foreign(exc: redis.ResponseError) -> _Foreign:
    """What a GET that failed with ``exc`` read: :data:`FOREIGN` for a key of another
    type; any other error raises."""
    if str(exc).startswith("WRONGTYPE"):
        return FOREIGN
    raise exc


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


class _Turn:
    """A key's turn for this process's incrs (threads); weakly kept, so a key's turn
    lives only while someone takes it."""

    __slots__ = ("__weakref__", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> _Turn:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class _Connections:
    """One configuration's guards in this process: one sync guard, and one asyncio
    guard per event loop (a ``redis.asyncio`` client belongs to one loop). Counted
    by the backend instances using it (see :class:`_Registry`)."""

    def __init__(self, config: _Config) -> None:
        self.config = config
        self.users = 0  # backend instances alive that use it (the registry's count)
        # Reentrant: a closed loop's closer, stepped under it, takes it again.
        self._mutex = threading.RLock()
        self._sync: CacheGuard | None = None
        # The loop's guard and the async generator that closes it with the loop (the
        # guard's connections keep their loop alive: entries are dropped explicitly).
        self._loops: dict[asyncio.AbstractEventLoop, tuple[AsyncCacheGuard, Any, Any]] = {}
        # Each key's turn for incr: threads' and, per loop, tasks'.
        self._turns: weakref.WeakValueDictionary[str, _Turn] = weakref.WeakValueDictionary()
        self._aturns: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, weakref.WeakValueDictionary[str, asyncio.Lock]
        ] = weakref.WeakKeyDictionary()

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

    def note_written(self, names: Iterable[str], prefix: str | None) -> None:
        """``names`` (and the names under ``prefix``) were just written: every guard of
        the configuration in this process stops sharing loads of them under way (see
        :meth:`CacheGuard.note_written`). Thread-safe; no I/O."""
        names = tuple(names)
        if not names and prefix is None:
            return
        with self._mutex:
            guards: list[Any] = [self._sync, *(made[0] for made in self._loops.values())]
        for guard in guards:
            if guard is not None:
                guard.note_written(*names, prefix=prefix)

    def incr_turn(self, name: str) -> _Turn:
        """The turn of ``name`` for this process's threads' incrs."""
        with self._mutex:
            turn = self._turns.get(name)
            if turn is None:
                turn = self._turns[name] = _Turn()
            return turn

    def aincr_turn(self, loop: asyncio.AbstractEventLoop, name: str) -> asyncio.Lock:
        """The turn of ``name`` for the loop's tasks' aincrs (called in the loop's thread)."""
        with self._mutex:
            turns = self._aturns.get(loop)
            if turns is None:
                turns = self._aturns[loop] = weakref.WeakValueDictionary()
            turn = turns.get(name)
            if turn is None:
                turn = turns[name] = asyncio.Lock()
            return turn

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
            _step_closed(closer)

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

    def close_all(self) -> None:
        """Close every guard: the sync one at once, each live loop's on its loop (no
        backend instance uses the configuration any more)."""
        with self._mutex:
            guard, self._sync = self._sync, None
            loops, self._loops = self._loops, {}
        if guard is not None:
            guard.close()
        for loop, (_, closer, _) in loops.items():
            if loop.is_closed():
                _step_closed(closer)
            else:
                try:
                    loop.call_soon_threadsafe(_close_on_loop, closer)
                except RuntimeError:  # closed meanwhile
                    _step_closed(closer)

    def reset_after_fork(self) -> None:
        self._mutex = threading.RLock()
        self._loops = {}  # the parent's loops do not run here
        self._turns = weakref.WeakValueDictionary()
        self._aturns = weakref.WeakKeyDictionary()


def _step_closed(closer: Any) -> None:
    """Run the finally of a closed loop's closer at once (no awaits: the loop is closed)."""
    step = closer.aclose()
    try:
        step.send(None)
    except StopIteration:
        pass
    except Exception as exc:
        log.debug("closing the guard of a closed loop: %s", exc)


# The tasks closing loops' guards, kept until done (a loop keeps only weak references).
_closing: set[asyncio.Future[None]] = set()


def _close_on_loop(closer: Any) -> None:
    """In the loop's thread: close the loop's guard (the closer's finally) in a task."""
    task = asyncio.ensure_future(_aclosed(closer))
    _closing.add(task)
    task.add_done_callback(_closing.discard)


async def _aclosed(closer: Any) -> None:
    await closer.aclose()


class _Registry:
    """The configurations' guards in this process, shared by their backend instances.

    Django makes backend instances anew in every thread, every async context (a
    request under ASGI) and every ``override_settings(CACHES=...)``, and drops them
    as those end: one configuration's instances share one :class:`_Connections`
    while any of them lives. One no instance uses any more is kept while it is the
    only kind (its next instance, maybe in the next request, finds its connections
    open) and closed as soon as an instance of a configuration not seen before is
    made (a test's override of ``SECRET_KEY`` or ``CACHES``), so the configurations a
    process ever had do not each keep their connections open.
    """

    def __init__(self) -> None:
        # Reentrant: an instance's finalizer (release) may run in any thread, at any
        # allocation, also while this thread is inside connections_for.
        self._mutex = threading.RLock()
        self._entries: dict[Any, _Connections] = {}

    def connections_for(self, config: _Config, instance: object) -> _Connections:
        """The guards of ``config``, counted as used by ``instance`` while it lives."""
        unused: list[_Connections] = []
        with self._mutex:
            connections = self._entries.get(config.identity)
            if connections is None:
                unused = [c for c in self._entries.values() if c.users == 0]
                for stale in unused:
                    del self._entries[stale.config.identity]
                connections = self._entries[config.identity] = _Connections(config)
            connections.users += 1
        weakref.finalize(instance, self._release, connections)
        for stale in unused:
            stale.close_all()
        return connections

    def _release(self, connections: _Connections) -> None:
        with self._mutex:
            connections.users -= 1

    def __len__(self) -> int:
        return len(self._entries)

    def reset_after_fork(self) -> None:
        self._mutex = threading.RLock()
        for connections in list(self._entries.values()):
            connections.reset_after_fork()


_registry = _Registry()

on_fork_in_child(_registry.reset_after_fork)


# -- errors -------------------------------------------------------------------------------------


@contextmanager
def _unavailable(what: str) -> Iterator[None]:
    """Redis down (unreachable, or refusing for now) -> :class:`BackendUnavailable`;
    the asyncio pool used up for its whole wait -> :class:`PoolExhausted`."""
    try:
        yield
    except REDIS_DOWN as exc:
        if isinstance(exc, redis.ConnectionError) and pool_exhausted(exc):
            raise PoolExhausted(
                f"no connection of the pool came free {what}: {exc} (every one of "
                "max_connections stayed in use for socket_timeout)"
            ) from exc
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


def _too_busy(operation: str, name: str) -> CacheGuardError:
    return CacheGuardError(
        f"{operation} of {name!r} lost its compare-and-set {_SWAP_TRIES} times in a row: "
        "other processes change the key faster than it can be read and written"
    )
