"""Exceptions raised by cacheguard.

Every error cacheguard raises on purpose derives from one root, so callers can
catch the whole family at once::

    CacheGuardError
    ├── LockError                 (carries the lock name, owner and mode)
    │   ├── LockTimeout           a wait hit its deadline
    │   ├── LockUpgradeError      a read holder asked for the write lock
    │   ├── LockLostError         the lock expired or was taken while we held it
    │   └── LockNotHeldError      release of a lock this thread/handle does not hold
    ├── BackendUnavailable        Redis, or a lock store (PostgreSQL, ZooKeeper, a Redlock
    │   │                         majority), could not be reached (wraps the client's error)
    │   └── WriteNotConfirmed     too few replicas acknowledged an invalidation in time
    ├── SerializationError        a value could not be encoded (or a codec is misconfigured)
    ├── KeyTemplateError          a key template names a parameter the call does not have
    ├── FillFailed                another process's load kept failing while we waited
    ├── IncompleteLoad            a batch loader left out names it was asked for
    │                             (also a KeyError)
    ├── RecursiveLoadError        a loader asked for the very key it is loading
    ├── WrongEventLoop            an asyncio object used from a second event loop
    │                             (also a RuntimeError)
    ├── GuardClosed               a call on a guard after its close()/aclose()
    │                             (also a RuntimeError)
    ├── NoDefaultGuard            a function decorated without a guard was called while
    │                             cacheguard.use() had installed none of its driver
    │                             (also a RuntimeError)
    ├── BackendArgumentError      a dogpile.cache backend argument is wrong (defined in
    │                             cacheguard.integrations.dogpile; also dogpile's
    │                             ValidationError and a ValueError)
    └── ManualTransactionError    a tracked Django model written with autocommit off outside
                                  transaction.atomic (defined in
                                  cacheguard.integrations.django.orm; also Django's
                                  TransactionManagementError)

Bad arguments given at construction (an empty name, a lease or timeout <= 0)
raise :class:`ValueError` or :class:`TypeError` as usual in Python; they are
programming errors, not runtime conditions. So do bad key names given to a
guard's calls (not a str: ``TypeError``; empty or not encodable as UTF-8, such
as a lone surrogate: ``ValueError``), before Redis is touched.
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailable",
    "CacheGuardError",
    "FillFailed",
    "GuardClosed",
    "IncompleteLoad",
    "KeyTemplateError",
    "LockError",
    "LockLostError",
    "LockNotHeldError",
    "LockTimeout",
    "LockUpgradeError",
    "NoDefaultGuard",
    "RecursiveLoadError",
    "SerializationError",
    "WriteNotConfirmed",
    "WrongEventLoop",
]


class CacheGuardError(Exception):
    """Root of every exception cacheguard raises on purpose.

    Every one pickles with its message and its context (a process pool, a task
    queue or a multiprocessing test hands errors over as pickles): most take
    keyword-only context, which ``Exception``'s own pickling cannot call back with.
    """

    def __reduce__(self) -> tuple[object, ...]:
        return _rebuilt, (self.__class__, self.args, self.__dict__.copy())


def _rebuilt(
    cls: type[CacheGuardError], args: tuple[object, ...], state: dict[str, object]
) -> CacheGuardError:
    """An unpickled error: its message as raised and its context attributes, without
    calling the class's own ``__init__`` (whose arguments are not the message)."""
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class LockError(CacheGuardError):
    """A lock operation failed; ``name``, ``owner`` and ``mode`` say which lock."""

    def __init__(
        self,
        message: str,
        *,
        name: str,
        owner: str | None = None,
        mode: str | None = None,
    ) -> None:
        super().__init__(message)
        self.name = name
        self.owner = owner
        self.mode = mode


class LockTimeout(LockError):
    """The lock could not be acquired before the deadline."""

    def __init__(
        self,
        *,
        name: str,
        mode: str,
        waited: float,
        owner: str | None = None,
    ) -> None:
        super().__init__(
            f"timed out after {waited:.3f}s waiting for the {mode} lock {name!r}",
            name=name,
            owner=owner,
            mode=mode,
        )
        self.waited = waited


class LockUpgradeError(LockError):
    """A holder of the read lock asked for the write lock.

    Upgrading in place would deadlock as soon as two readers try it at once, so
    it is refused: release the read lock first, then take the write lock.
    """

    def __init__(self, *, name: str, owner: str | None = None) -> None:
        super().__init__(
            f"cannot upgrade the read lock {name!r} to a write lock: release the read lock first",
            name=name,
            owner=owner,
            mode="write",
        )


class LockLostError(LockError):
    """The lock was no longer ours: its lease ran out or its key was removed.

    Raised by ``release()`` when the handle had already lost its lock; the lock
    that may now be in Redis belongs to someone else and was left untouched.
    Raised too when a ``guard.write`` block exits (after its closing
    invalidation) and when a tracked session commits, if a write lock they held
    was lost meanwhile: another writer may have run at the same time.
    """


class LockNotHeldError(LockError):
    """Release of a lock the caller does not hold (a programming error)."""


class BackendUnavailable(CacheGuardError):
    """Redis (or a lock store: PostgreSQL, ZooKeeper, a majority of Redlock masters)
    could not be reached or did not answer in time.

    The client's original exception is chained as ``__cause__``.
    """


class WriteNotConfirmed(BackendUnavailable):
    """An invalidation reached the master, but fewer replicas than the guard's
    ``confirm_replicas`` acknowledged it within ``confirm_timeout`` (WAIT): a
    failover now could lose it, so the write it belongs to is reported as failed."""


class SerializationError(CacheGuardError):
    """A value could not be encoded by the codec; nothing was cached.

    ``key`` names the cache key, the codec's own error is chained as ``__cause__``.
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class KeyTemplateError(CacheGuardError, ValueError):
    """A key template cannot be filled from the call's arguments."""


class FillFailed(CacheGuardError):
    """The process filling a key failed repeatedly while this caller waited for it.

    The failing process's own callers got its loader's exception; waiters in
    other processes retry a bounded number of times, then get this.
    """

    def __init__(self, *, key: str, attempts: int) -> None:
        super().__init__(
            f"the fill of {key!r} by another process failed {attempts} times while waiting"
        )
        self.key = key
        self.attempts = attempts


class IncompleteLoad(CacheGuardError, KeyError):
    """A ``load_many`` given to ``get_or_load_many`` returned no value for some of
    the names it was asked for (``missing``, in the order asked).

    Nothing is cached for those names and their fills end (waiters elsewhere try
    again); the names it did return are cached as usual. Return ``None`` for a
    name that has no value: it is cached as any loader's None (``none_ttl``).
    """

    def __init__(self, missing: tuple[str, ...]) -> None:
        super().__init__(f"load_many returned no value for {list(missing)!r}")
        self.missing = missing

    def __str__(self) -> str:  # KeyError's own would show the message's repr
        return str(self.args[0])


class RecursiveLoadError(CacheGuardError):
    """A loader asked for (or refreshed) the key it is loading, in the same thread.

    Waiting would deadlock the loader with itself until ``wait_timeout``, so the
    inner call fails at once; the outer load gets this error unless it catches it.
    """

    def __init__(self, *, key: str) -> None:
        super().__init__(
            f"the loader of {key!r} asked for {key!r} itself: a loader must not read "
            "or refresh its own key (load the data directly instead)"
        )
        self.key = key


class WrongEventLoop(CacheGuardError, RuntimeError):
    """An asyncio lock, notifier or watchdog was used from another event loop than
    the one it was first used on.

    A ``redis.asyncio`` client and everything built on it belong to one loop:
    create one client (and its locks and guards) per event loop.
    """


class GuardClosed(CacheGuardError, RuntimeError):
    """A guard was used after its ``close()`` (or ``aclose()``).

    Raised before Redis is touched, by every call that would talk to Redis
    (reads, loads, invalidations, writes, the watermark, ``rwlock`` and
    ``write_lock``). A client the guard made (``from_url``) is closed with it; to
    go on, make a new guard.
    """


class NoDefaultGuard(CacheGuardError, RuntimeError):
    """A function decorated without a guard (``@cached_with_lock(key=..., ttl=...)``)
    was called while no default guard of its driver was installed, or the installed
    one was closed: install one with :func:`cacheguard.use` first (see
    :mod:`cacheguard.cache.default`)."""
