"""The prefixes a process's fills check stay bounded however many distinct prefixes
it invalidates, and a prefix invalidation is still honoured: while its prefix is
kept, through its stamp; once forgotten early, through the floor.

Sizes are asserted with an injected timer, never time itself (bench/cache.py
compares the cost of registering and of a fill's look-up).
"""

from __future__ import annotations

import time

import pytest
import redis

from cacheguard import MISSING
from cacheguard.cache import invalidation
from cacheguard.cache.invalidation import Invalidation, Prefixes
from cacheguard.cache.watermark import note_snapshot
from tests.helpers import make_guard


class Timer:
    """A monotonic timer the test moves forward."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_many_prefixes_keep_the_bookkeeping_bounded() -> None:
    timer = Timer()
    prefixes = Prefixes(lifetime=60.0, timer=timer, capacity=100)
    prefixes.watch("menu:")
    for stamp in range(1, 100_001):
        prefixes.remember(f"user:{stamp}:", stamp)
        assert len(prefixes) <= 101  # the watched one and at most 100 recent ones
    assert len(prefixes) == 101
    assert prefixes.floor == 100_000 - 100  # the newest stamp forgotten early
    # A fill looks up one prefix per distinct length in use, not every prefix kept.
    assert prefixes.lengths <= len("user:100000:") + 1
    covering, floor = prefixes.covering("user:99999:cart")
    assert covering == ["user:99999:"]
    assert floor == 99_900
    assert prefixes.covering("menu:3") == (["menu:"], 99_900)
    assert prefixes.covering("user:5:cart") == ([], 99_900)  # forgotten: the floor covers it


def test_a_prefix_is_forgotten_when_its_stamp_has_expired() -> None:
    """Kept for the stamp's lifetime only; forgetting an expired stamp raises no
    floor (the stamp is gone from Redis too)."""
    timer = Timer()
    prefixes = Prefixes(lifetime=60.0, timer=timer, capacity=100)
    for stamp in range(1, 51):
        prefixes.remember(f"p{stamp}:", stamp)
    assert prefixes.covering("p7:x") == (["p7:"], 0)
    timer.now += 59.0
    assert prefixes.covering("p7:x") == (["p7:"], 0)
    timer.now += 1.0  # 60 s: every stamp has expired
    assert prefixes.covering("p7:x") == ([], 0)
    prefixes.remember("q:", 51)
    assert len(prefixes) == 1  # the expired ones went with the next registration
    assert prefixes.lengths == 1
    assert prefixes.floor == 0


def test_remembering_again_renews_a_prefix_and_keeps_its_newest_stamp() -> None:
    timer = Timer()
    prefixes = Prefixes(lifetime=60.0, timer=timer, capacity=2)
    prefixes.remember("a:", 5)
    prefixes.remember("b:", 6)
    prefixes.remember("a:", 3)  # renewed: now the newest, its stamp still 5
    prefixes.remember("c:", 7)  # over capacity: "b:" (the oldest) is forgotten
    assert prefixes.floor == 6
    assert prefixes.covering("a:1") == (["a:"], 6)
    assert prefixes.covering("b:1") == ([], 6)
    prefixes.watch("c:")  # watched for good: no longer a recent one
    timer.now += 3600
    assert prefixes.covering("c:1") == (["c:"], 6)
    assert len(prefixes) == 2  # "a:" (expired, dropped at the next registration) and "c:"


def test_a_fill_checks_the_prefixes_only_when_its_snapshot_is_known() -> None:
    inv = Invalidation("ns", 60_000, recent_prefixes=4)
    inv.watch("menu:")
    inv.remember("user:1:", 9)
    assert inv.stamps_for("menu:3") == (("ns:{menu:}:ps",), 0)
    assert inv.stamps_for("user:1:x") == (("ns:{user:1:}:ps",), 0)
    assert inv.stamps_for("other") == ((), 0)


def test_a_forgotten_prefix_invalidation_is_still_honoured(
    client: redis.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many prefixes invalidated: the guard keeps a few, and a fill of a key under a
    forgotten one, loaded from a snapshot older than its invalidation, still does
    not store; a fill from a newer snapshot does."""
    monkeypatch.setattr(invalidation, "RECENT_PREFIXES", 3)
    timer = Timer()
    guard = make_guard(client, namespace, timer=lambda: time.monotonic() + timer.now)
    before = guard.watermark()  # a snapshot taken before the invalidations
    for i in range(20):
        guard.invalidate_prefix(f"tenant:{i}:")
        if i == 17:
            between = guard.watermark()  # after every forgotten one, before tenant:18's
    assert len(guard._state.invalidation.prefixes) == 3  # tenant:17:, 18: and 19:

    def load_from(snapshot: int, value: str) -> str:
        note_snapshot(snapshot)
        return value

    assert guard.get_or_load("tenant:0:menu", lambda: load_from(before, "old"), ttl=60) == "old"
    assert guard.peek("tenant:0:menu") is MISSING  # refused: the floor is above the snapshot
    after = guard.watermark()
    assert guard.get_or_load("tenant:0:menu", lambda: load_from(after, "new"), ttl=60) == "new"
    assert guard.peek("tenant:0:menu") == "new"
    # A snapshot newer than the floor: only a kept prefix's own stamp refuses it.
    assert guard.get_or_load("tenant:19:menu", lambda: load_from(between, "old"), ttl=60) == "old"
    assert guard.peek("tenant:19:menu") is MISSING
    assert guard.get_or_load("tenant:5:menu", lambda: load_from(between, "v"), ttl=60) == "v"
    assert guard.peek("tenant:5:menu") == "v"
    # Past version_ttl every stamp has expired in Redis; the kept ones are dropped.
    timer.now += guard.settings.version_ttl + 1
    guard.invalidate_prefix("other:")
    assert len(guard._state.invalidation.prefixes) == 1
