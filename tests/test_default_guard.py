"""The default guard (issue #26): functions decorated without a guard at import time
read through the guard cacheguard.use() installed, looked up on every call, so an
asyncio guard made in a FastAPI lifespan serves them across restarts and
TestClients; a clear error when none is installed."""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

import cacheguard
from cacheguard import CacheGuard, NoDefaultGuard, cached_with_lock
from cacheguard.aio import AsyncCacheGuard
from cacheguard.cache.default import Installed, _installed, installed

loaded: list[Any] = []


@cached_with_lock(key="menu:{menu_id}", ttl=60)
def menu_of(menu_id: int) -> dict[str, Any]:
    loaded.append(("sync", menu_id))
    return {"id": menu_id}


@cached_with_lock(key="dish:{dish_id}", ttl=60)
async def dish_of(dish_id: int) -> dict[str, Any]:
    loaded.append(("async", dish_id))
    return {"id": dish_id}


class Menus:
    @cached_with_lock(ttl=60)  # the default key: qualified name and arguments
    def named(self, name: str) -> str:
        loaded.append(("method", name))
        return name.upper()


@pytest.fixture(autouse=True)
def nothing_installed() -> Iterator[None]:
    loaded.clear()
    for driver in ("sync", "asyncio"):
        with pytest.raises(NoDefaultGuard):
            installed(driver)
    yield
    for driver in ("sync", "asyncio"):  # every test put back what it installed
        with pytest.raises(NoDefaultGuard):
            installed(driver)


def test_a_call_without_a_default_guard_says_what_to_do() -> None:
    with pytest.raises(NoDefaultGuard, match=r"no default CacheGuard is installed.*use\(guard\)"):
        menu_of(1)
    assert loaded == []  # nothing was loaded, nothing cached


def test_a_function_decorated_without_a_guard_reads_through_the_installed_one(
    redis_url: str, namespace: str
) -> None:
    with CacheGuard.from_url(redis_url, namespace=namespace) as guard:
        with cacheguard.use(guard):
            assert menu_of(7) == {"id": 7}
            assert menu_of(7) == {"id": 7}  # a hit
            assert guard.peek("menu:7") == {"id": 7}  # the installed guard's entry
            assert menu_of.key(7) == "menu:7"
            menu_of.invalidate(7)
            assert menu_of(menu_id=7) == {"id": 7}
        assert loaded == [("sync", 7), ("sync", 7)]
        with pytest.raises(NoDefaultGuard):  # uninstalled when the block ended
            menu_of(7)


def test_use_replaces_and_puts_back(redis_url: str, namespace: str) -> None:
    with (
        CacheGuard.from_url(redis_url, namespace=namespace) as first,
        CacheGuard.from_url(redis_url, namespace=f"{namespace}-2") as second,
    ):
        outer = cacheguard.use(first)
        try:
            menu_of(1)
            with cacheguard.use(second):
                menu_of(1)  # another namespace: loaded again, through the second
                assert second.peek("menu:1") == {"id": 1}
            menu_of(1)  # the first again: a hit
            assert loaded == [("sync", 1), ("sync", 1)]
            inner = cacheguard.use(second)
            outer.restore()  # ended under a newer one: the newer stands
            assert installed("sync") is second
            inner.restore()
            with pytest.raises(NoDefaultGuard):  # both ended: none is left
                installed("sync")
            # Installations ending out of order: the newest still in force is the default.
            with CacheGuard.from_url(redis_url, namespace=f"{namespace}-3") as third:
                a, b, c = cacheguard.use(first), cacheguard.use(second), cacheguard.use(third)
                b.restore()
                assert installed("sync") is third
                c.restore()
                assert installed("sync") is first  # a's, not b's (b ended first)
                a.restore()
        finally:
            outer.restore()
            second.invalidate("menu:1")


def test_installations_of_closed_guards_do_not_pile_up(redis_url: str, namespace: str) -> None:
    installs = []
    for _ in range(5):  # an app that installs a new guard on every start, never ending any
        guard = CacheGuard.from_url(redis_url, namespace=namespace)
        installs.append(cacheguard.use(guard))
        guard.close()
    assert len(_installed["sync"]) == 1  # only the newest, closed: the others were dropped
    with pytest.raises(NoDefaultGuard, match="closed"):
        menu_of(1)
    installs[-1].restore()
    assert not hasattr(menu_of.guard, "__wrapped__")  # introspection: AttributeError


def test_a_closed_default_guard_is_refused_clearly(redis_url: str, namespace: str) -> None:
    guard = CacheGuard.from_url(redis_url, namespace=namespace)
    with cacheguard.use(guard):
        guard.close()
        with pytest.raises(NoDefaultGuard, match="is closed; install the guard that replaces it"):
            menu_of(1)


def test_each_driver_has_its_own_default(redis_url: str, namespace: str) -> None:
    async def run() -> None:
        async with AsyncCacheGuard.from_url(redis_url, namespace=namespace) as guard:
            with cacheguard.use(guard):
                assert await dish_of(3) == {"id": 3}
                with pytest.raises(NoDefaultGuard, match="an AsyncCacheGuard is: it serves"):
                    menu_of(3)  # a plain function needs the sync default

    asyncio.run(run())
    assert loaded == [("async", 3)]


def test_methods_and_shortened_keys_follow_the_installed_guard(
    redis_url: str, namespace: str
) -> None:
    with CacheGuard.from_url(redis_url, namespace=namespace, max_key_length=80) as guard:
        with cacheguard.use(guard):
            menus = Menus()
            long = "x" * 120
            assert menus.named(long) == long.upper()
            assert menus.named(long) == long.upper()
            key = menus.named.key(long)
            assert len(key) == 80  # shortened as the installed guard shortens names
            assert guard.peek(key) == long.upper()
        assert loaded == [("method", long)]


def test_decorated_functions_pickle_and_explicit_guards_need_no_default(
    redis_url: str, namespace: str
) -> None:
    assert pickle.loads(pickle.dumps(menu_of)) is menu_of
    with CacheGuard.from_url(redis_url, namespace=namespace) as guard:

        @cached_with_lock(guard, key="explicit", ttl=60)
        def explicit() -> int:
            return 1

        assert explicit() == 1  # nothing installed: an explicit guard never asks


def test_use_refuses_what_is_not_a_guard() -> None:
    with pytest.raises(TypeError, match="must be a CacheGuard or an AsyncCacheGuard"):
        cacheguard.use("redis://127.0.0.1")  # type: ignore[arg-type]
    # (the decorator's and the loaders' own `type=` parameter does not hide the builtin)
    with pytest.raises(TypeError, match="must be a CacheGuard or an AsyncCacheGuard, not str"):
        cached_with_lock("redis://127.0.0.1", ttl=60)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="guard must be a CacheGuard, not str"):
        cacheguard.CacheLoader("redis://", key="k", load=lambda: 1, ttl=60)  # type: ignore[arg-type]


def _app(redis_url: str, namespace: str, installs: list[Installed] | None) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The guard is made on the loop that serves the requests, each start anew.
        async with AsyncCacheGuard.from_url(redis_url, namespace=namespace) as guard:
            if installs is None:
                with cacheguard.use(guard):  # put back what was there on shutdown
                    yield
            else:
                installs.append(cacheguard.use(guard))  # left installed, closed
                yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/dishes/{dish_id}")
    async def dish(dish_id: int) -> dict[str, Any]:
        return await dish_of(dish_id)

    return app


@pytest.mark.parametrize("restores", [True, False], ids=["with-use", "use-left-installed"])
def test_an_asyncio_default_guard_from_a_lifespan_serves_every_test_client(
    redis_url: str, namespace: str, restores: bool
) -> None:
    # Each TestClient runs the app on an event loop of its own: a guard made at import
    # would fail the second with WrongEventLoop; the lifespan's guard does not.
    installs: list[Installed] | None = None if restores else []
    try:
        for _ in range(3):
            with TestClient(_app(redis_url, namespace, installs)) as client:
                assert client.get("/dishes/5").json() == {"id": 5}
                assert client.get("/dishes/5").json() == {"id": 5}
        assert loaded == [("async", 5)]  # loaded once, then served from Redis by each app
        other = f"{namespace}-{uuid.uuid4().hex[:6]}"
        with TestClient(_app(redis_url, other, installs)) as client:
            assert client.get("/dishes/5").json() == {"id": 5}  # another namespace: loaded
        assert loaded == [("async", 5), ("async", 5)]
        with pytest.raises(NoDefaultGuard):  # none installed, or the last one closed
            asyncio.run(dish_of(5))
    finally:
        for done in reversed(installs or []):
            done.restore()
