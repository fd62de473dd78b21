"""A write lock lost while its write runs is the writer's error (both guards).

The lock's hash is deleted in the middle of the body (as an expiry, a flush or an
operator would remove it), another writer then gets in and out, and a reader
stores a value: the first write's exit must still invalidate (the value goes,
the version moves on), release everything it holds, and raise
:class:`LockLostError`, unless its body raised, whose error then wins.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable

import pytest
import redis

from cacheguard import MISSING, LockLostError
from tests.guard_drivers import KINDS, Guard, guards_on

Make = Callable[..., Guard]


@pytest.fixture(params=KINDS)
async def make(
    request: pytest.FixtureRequest, redis_url: str, namespace: str
) -> AsyncIterator[Make]:
    async with guards_on(request.param, redis_url, namespace=namespace, ttl_jitter=0) as build:
        yield build


async def lose_the_lock_and_let_another_writer_in(
    client: redis.Redis, guard: Guard, other: Guard, name: str
) -> bytes | None:
    """Inside ``guard``'s write of ``name``: its lock vanishes, ``other`` writes and a
    read stores a value; the version key's value afterwards."""
    assert client.delete(guard.keys(name).lock) == 1
    async with other.write(name, timeout=10):  # gets in: nothing excludes it now
        pass
    assert await other.get_or_load(name, lambda: "stored meanwhile", ttl=60) == "stored meanwhile"
    assert await other.peek(name) == "stored meanwhile"
    return client.get(guard.keys(name).version)  # type: ignore[return-value]


async def test_a_write_whose_lock_was_lost_raises_after_invalidating(
    make: Make, client: redis.Redis
) -> None:
    guard, other = make(), make()
    with pytest.raises(LockLostError) as lost:
        async with guard.write("k"):
            version = await lose_the_lock_and_let_another_writer_in(client, guard, other, "k")
    assert lost.value.name == "k"
    assert lost.value.mode == "write"
    assert lost.value.owner
    # The closing invalidation ran before the error: the value is gone, the version moved.
    assert not client.exists(guard.keys("k").value)
    assert await other.peek("k") is MISSING
    assert client.get(guard.keys("k").version) != version
    # Nothing is held: Redis has no lock, and both guards write again at once.
    assert not client.exists(guard.keys("k").lock)
    for writer in (guard, other):
        async with writer.write("k", timeout=5):
            pass
    assert not client.exists(guard.keys("k").lock)


async def test_the_bodys_error_wins_over_a_lost_lock(make: Make, client: redis.Redis) -> None:
    guard, other = make(), make()

    class Boom(Exception):
        pass

    async def body() -> None:
        await lose_the_lock_and_let_another_writer_in(client, guard, other, "k")
        raise Boom

    with pytest.raises(Boom) as raised:
        async with guard.write("k"):
            await body()
    if sys.version_info >= (3, 11):  # (3.10 logs the note instead)
        notes: list[str] = raised.value.__notes__
        assert any("was lost" in note for note in notes), notes
    assert not client.exists(guard.keys("k").value)
    assert not client.exists(guard.keys("k").lock)
    async with guard.write("k", timeout=5):
        pass


async def test_only_the_lost_lock_of_a_write_is_reported(make: Make, client: redis.Redis) -> None:
    guard, other = make(), make()

    async def body() -> None:
        await lose_the_lock_and_let_another_writer_in(client, guard, other, "b")
        assert client.exists(guard.keys("a").lock)

    with pytest.raises(LockLostError) as lost:
        async with guard.write("a", "b"):
            await body()
    assert lost.value.name == "b"
    assert not any(client.exists(guard.keys(n).lock) for n in ("a", "b"))
    assert await other.peek("b") is MISSING


async def test_a_write_that_kept_its_locks_raises_nothing(make: Make, client: redis.Redis) -> None:
    guard = make()
    async with guard.write("a", "b"):
        assert all(client.exists(guard.keys(n).lock) for n in ("a", "b"))
    assert not any(client.exists(guard.keys(n).lock) for n in ("a", "b"))
