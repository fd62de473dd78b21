"""Stateful property test: the Lua lock against a small Python model of its rules.

Hypothesis drives random steps (reads, queued and one-shot writes, releases,
lease expiries, waiting-mark expiries, withdrawals) by three owners and checks
after every step that Redis holds exactly what the model predicts.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from cacheguard import LockHandle, LockLostError, RedisRWLock
from cacheguard.locks.redis.lua import WITHDRAW

OWNERS = st.sampled_from(["A", "B", "C"])
MODES = st.sampled_from(["read", "write"])


@dataclass
class OwnerModel:
    reads: int = 0
    writes: int = 0
    generation: int = 0  # bumps whenever a fresh holding begins

    @property
    def holds(self) -> bool:
        return self.reads > 0 or self.writes > 0


@dataclass
class Model:
    owners: dict[str, OwnerModel] = field(default_factory=lambda: {o: OwnerModel() for o in "ABC"})
    queue: list[str] = field(default_factory=list)  # waiting writers, oldest first

    def writer(self) -> str | None:
        return next((o for o, m in self.owners.items() if m.writes), None)

    def any_holder(self) -> bool:
        return any(m.holds for m in self.owners.values())

    def begin(self, owner: str) -> None:
        m = self.owners[owner]
        if not m.holds:
            m.generation += 1


class LockMachine(RuleBasedStateMachine):
    url = ""

    def __init__(self) -> None:
        super().__init__()
        self.client = redis.Redis.from_url(self.url)
        self.ns = f"m{uuid.uuid4().hex[:10]}"
        self.lock = RedisRWLock(self.client, "k", namespace=self.ns, lease=60, watchdog=False)
        self.model = Model()
        self.handles: list[tuple[LockHandle, int]] = []  # (handle, owner generation)
        self.last_write_token = 0

    def teardown(self) -> None:
        self.client.delete(self.lock.keys.lock, self.lock.keys.fence)
        self.client.close()

    # -- steps ---------------------------------------------------------------------

    @rule(owner=OWNERS)
    def read(self, owner: str) -> None:
        m = self.model
        me = m.owners[owner]
        expect = me.holds or (m.writer() is None and not [q for q in m.queue if q != owner])
        handle = self.lock.try_acquire_read(owner=owner)
        assert (handle is not None) == expect
        if handle is not None:
            m.begin(owner)
            me.reads += 1
            self.handles.append((handle, me.generation))

    @rule(owner=OWNERS, queue=st.booleans())
    def write(self, owner: str, queue: bool) -> None:
        m = self.model
        me = m.owners[owner]
        attempt = self.lock._attempt("write", owner, queue=queue)
        if me.writes:
            expect = "granted"
        elif me.reads:
            expect = "upgrade"
        elif not m.any_holder() and (
            (owner in m.queue and m.queue[0] == owner) or (owner not in m.queue and not m.queue)
        ):
            expect = "granted"
        else:
            expect = "busy"
        got = "granted" if attempt.granted else "upgrade" if attempt.upgrade else "busy"
        assert got == expect, (got, expect, m)
        if attempt.granted:
            fresh = me.writes == 0
            m.begin(owner)
            me.writes += 1
            if owner in m.queue:
                m.queue.remove(owner)
            if fresh:
                assert attempt.epoch > self.last_write_token
                self.last_write_token = attempt.epoch
            handle = LockHandle(self.lock, "write", owner, attempt.epoch, None)
            self.handles.append((handle, me.generation))
        elif expect == "busy" and queue and owner not in m.queue:
            m.queue.append(owner)

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        if not self.handles:
            return
        index = data.draw(st.integers(0, len(self.handles) - 1))
        handle, generation = self.handles.pop(index)
        me = self.model.owners[handle.owner]
        count = me.reads if handle.mode == "read" else me.writes
        valid = generation == me.generation and count > 0
        if valid:
            handle.release()
            if handle.mode == "read":
                me.reads -= 1
            else:
                me.writes -= 1
        else:
            with pytest.raises(LockLostError):
                handle.release()

    @rule(owner=OWNERS)
    def lease_ends(self, owner: str) -> None:
        """The owner's lease runs out (as if its process froze or died)."""
        if self.client.hexists(self.lock.keys.lock, f"e:{owner}"):
            self.client.hset(self.lock.keys.lock, f"e:{owner}", 1)
        me = self.model.owners[owner]
        me.reads = me.writes = 0

    @rule(owner=OWNERS)
    def mark_ends(self, owner: str) -> None:
        """A waiting writer stops refreshing its mark (it died while waiting)."""
        if self.client.hexists(self.lock.keys.lock, f"q:{owner}"):
            self.client.hset(self.lock.keys.lock, f"q:{owner}", 1)
        if owner in self.model.queue:
            self.model.queue.remove(owner)

    @rule(owner=OWNERS)
    def withdraw(self, owner: str) -> None:
        removed = WITHDRAW(self.client, [self.lock.keys.lock], [owner, "chan"])
        assert bool(removed) == (owner in self.model.queue)
        if owner in self.model.queue:
            self.model.queue.remove(owner)

    # -- what must hold after every step ------------------------------------------

    @invariant()
    def redis_matches_model(self) -> None:
        # Reading through a script sweeps expired entries first, like every real step.
        raw = self.client.hgetall(self.lock.keys.lock)
        now_ms = int(self.client.time()[0]) * 1000
        lease_over = {k[2:] for k, v in raw.items() if k[:2] == b"e:" and int(v) <= now_ms}
        mark_over = {k[2:] for k, v in raw.items() if k[:2] == b"q:" and int(v) <= now_ms}
        live = {
            k.decode(): int(v)
            for k, v in raw.items()
            if k[:2] in (b"r:", b"w:") and k[2:] not in lease_over
        }
        expected = {}
        for owner, m in self.model.owners.items():
            if m.reads:
                expected[f"r:{owner}"] = m.reads
            if m.writes:
                expected[f"w:{owner}"] = m.writes
        assert live == expected
        writers = [o for o, m in self.model.owners.items() if m.writes]
        readers = [o for o, m in self.model.owners.items() if m.reads and not m.writes]
        assert len(writers) <= 1
        assert not (writers and readers)
        queued = {k[2:].decode() for k in raw if k[:2] == b"q:" and k[2:] not in mark_over}
        assert queued == set(self.model.queue)


@pytest.mark.slow  # over a second: the whole suite runs it, -m 'not slow' does not
def test_lock_matches_model(redis_url: str) -> None:
    LockMachine.url = redis_url
    run_state_machine_as_test(
        LockMachine,
        settings=settings(
            max_examples=150,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
