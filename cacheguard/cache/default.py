"""The default guards: what ``@cached_with_lock`` made without a guard reads through.

::

    @cached_with_lock(key="menu:{menu_id}", ttl=300)     # at import: no guard yet
    async def load_menu(menu_id: int) -> dict: ...

    @asynccontextmanager
    async def lifespan(app):                             # each start of the app
        async with AsyncCacheGuard.from_url(url, namespace="menus") as guard:
            with cacheguard.use(guard):
                yield

A process has one default guard per driver: a :class:`~cacheguard.CacheGuard` for
plain functions, an :class:`~cacheguard.aio.AsyncCacheGuard` for ``async def``.
:func:`use` installs one; a decorated function looks its guard up on every call,
so a guard made later (in a FastAPI lifespan, on the event loop that serves the
requests) or made again (each ``TestClient``, each restart) is the one it uses.
A call finding none installed, or the installed one closed, raises
:class:`NoDefaultGuard`. This is process-wide state on purpose (a lifespan and the
requests it serves run in different contexts, so a context variable would not
reach them); functions decorated with an explicit guard never consult it.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any, Literal

from cacheguard.cache.guard import CacheGuard
from cacheguard.exceptions import NoDefaultGuard

if TYPE_CHECKING:
    from types import TracebackType

    from cacheguard.cache.async_guard import AsyncCacheGuard

__all__ = ["DefaultGuard", "Installed", "installed", "use"]

Driver = Literal["sync", "asyncio"]

# Looked up, not imported: a sync program never loads the asyncio guard, and an
# AsyncCacheGuard can only exist once its module was imported.
_ASYNC_GUARD = "cacheguard.cache.async_guard"

_GUARD_CLASS = {"sync": "CacheGuard", "asyncio": "AsyncCacheGuard"}
# Per driver, the installations in force, the newest last: the default is the newest.
_installed: dict[Driver, list[Installed]] = {"sync": [], "asyncio": []}
_changing = threading.Lock()  # installations begin and end from any thread


def _driver_of(guard: object) -> Driver:
    if isinstance(guard, CacheGuard):
        return "sync"
    async_module = sys.modules.get(_ASYNC_GUARD)
    if async_module is not None and isinstance(guard, async_module.AsyncCacheGuard):
        return "asyncio"
    raise TypeError(f"guard must be a CacheGuard or an AsyncCacheGuard, not {type(guard).__name__}")


class Installed:
    """What :func:`use` did: :meth:`restore` (or leaving its ``with`` block) ends
    this installation; the default is then the newest one still in force, whatever
    order installations end in."""

    def __init__(self, driver: Driver, guard: Any) -> None:
        self.driver = driver
        self.guard = guard

    def restore(self) -> None:
        with _changing:
            installations = _installed[self.driver]
            if self in installations:
                installations.remove(self)

    def __enter__(self) -> Installed:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.restore()


def use(guard: CacheGuard | AsyncCacheGuard) -> Installed:
    """Install ``guard`` as the default guard of its driver (sync or asyncio) for
    every function decorated without a guard, in front of the one installed before.
    Returns an :class:`Installed`: a context manager that ends this installation.
    Installations of closed guards are dropped as a new one comes (an app that
    installs a new guard on every start, never ending the old, keeps none of them)."""
    driver = _driver_of(guard)
    installation = Installed(driver, guard)
    with _changing:
        installations = _installed[driver]
        installations[:] = [i for i in installations if not i.guard._state.closed]
        installations.append(installation)
    return installation


def _newest(driver: Driver) -> Any:
    installations = _installed[driver]
    return installations[-1].guard if installations else None


def installed(driver: Driver) -> Any:
    """The default guard of ``driver``; :class:`NoDefaultGuard` if none is
    installed or the installed one was closed."""
    guard = _newest(driver)
    if guard is None:
        other = _newest("asyncio" if driver == "sync" else "sync")
        hint = (
            f" (an {type(other).__name__} is: it serves "
            f"{'async def functions' if driver == 'sync' else 'plain functions'})"
            if other is not None
            else ""
        )
        raise NoDefaultGuard(
            f"no default {_GUARD_CLASS[driver]} is installed{hint}: a function decorated "
            "without a guard reads through the one cacheguard.use(guard) installed; "
            "call it first (for an asyncio app, in its lifespan)"
        )
    if guard._state.closed:
        raise NoDefaultGuard(
            f"the default {_GUARD_CLASS[driver]} installed by cacheguard.use() is closed; "
            "install the guard that replaces it with cacheguard.use(guard)"
        )
    return guard


class DefaultGuard:
    """Stands for the default guard of one driver in a function decorated without
    a guard: every attribute is the installed guard's, looked up when used."""

    __slots__ = ("driver",)

    def __init__(self, driver: Driver) -> None:
        self.driver: Driver = driver

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # introspection (hasattr, copy, inspect) asks for dunders
            raise AttributeError(name)
        return getattr(installed(self.driver), name)

    def __repr__(self) -> str:
        return f"<the default {_GUARD_CLASS[self.driver]} (cacheguard.use)>"
