"""Stateful property test: the Lua lock against a small Python model of its rules.

Hypothesis drives random steps (reads, queued and one-shot writes, releases,
lease expiries, waiting-mark expiries, withdrawals, acquire calls whose reply was
lost and their give-backs, lost calls arriving after their give-back) by three
owners and checks after every step that Redis holds exactly what the model
predicts. A give-back takes back a lost call's hold or mark only while the
owner's record still names that call: so it never takes what another call made.
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
from cacheguard.locks import wire
from cacheguard.locks.protocol import Attempt
from cacheguard.locks.scripts import ACQUIRE, GIVE_BACK, WITHDRAW

OWNERS = st.sampled_from(["A", "B", "C"])
MODES = st.sampled_from(["read", "write"])


@dataclass
class OwnerModel:
    reads: int = 0
    writes: int = 0
    generation: int = 0  # bumps whenever a fresh holding begins
    # The owner's last acquire call that took a hold or left a mark: (attempt id, 'r',
    # 'w' or 'q'); "ok" for a call whose reply came. None once its holds and mark went.
    record: tuple[str, str] | None = None
    lost: list[str] = field(default_factory=list)  # calls whose reply was lost
    cancelled: list[str] = field(default_factory=list)  # given back

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

    def settle(self, owner: str) -> None:
        """The record goes with the owner's holds and mark."""
        m = self.owners[owner]
        if not m.holds and owner not in self.queue:
            m.record = None

    def expect_write(self, owner: str) -> str:
        me = self.owners[owner]
        if me.writes:
            return "granted"
        if me.reads:
            return "upgrade"
        first = (owner in self.queue and self.queue[0] == owner) or (
            owner not in self.queue and not self.queue
        )
        return "granted" if not self.any_holder() and first else "busy"

    def expect_read(self, owner: str) -> bool:
        me = self.owners[owner]
        return me.holds or (self.writer() is None and not [q for q in self.queue if q != owner])

    def acquired(self, owner: str, mode: str, attempt: str, *, queue: bool) -> str:
        """Apply an acquire call of ``owner`` (``attempt`` its id); returns what it got."""
        me = self.owners[owner]
        if mode == "read":
            if not self.expect_read(owner):
                return "busy"
            self.begin(owner)
            me.reads += 1
            me.record = (attempt, "r")
            return "granted"
        got = self.expect_write(owner)
        if got == "granted":
            self.begin(owner)
            me.writes += 1
            if owner in self.queue:
                self.queue.remove(owner)
            me.record = (attempt, "w")
        elif got == "busy" and queue:
            if owner not in self.queue:
                self.queue.append(owner)
            me.record = (attempt, "q")
        return got


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
        self.attempts = 0

    def teardown(self) -> None:
        self.client.delete(self.lock.keys.lock, self.lock.keys.fence)
        self.client.close()

    # -- steps ---------------------------------------------------------------------

    @rule(owner=OWNERS)
    def read(self, owner: str) -> None:
        m = self.model
        me = m.owners[owner]
        handle = self.lock.try_acquire_read(owner=owner)
        assert (handle is not None) == m.expect_read(owner)
        if handle is not None:
            m.acquired(owner, "read", "ok", queue=False)
            self.handles.append((handle, me.generation))

    @rule(owner=OWNERS, queue=st.booleans())
    def write(self, owner: str, queue: bool) -> None:
        m = self.model
        me = m.owners[owner]
        fresh = me.writes == 0
        attempt = self.lock._attempt("write", owner, queue=queue)
        got = "granted" if attempt.granted else "upgrade" if attempt.upgrade else "busy"
        expect = m.acquired(owner, "write", "ok", queue=queue)
        assert got == expect, (got, expect, m)
        if attempt.granted:
            if fresh:
                assert attempt.epoch > self.last_write_token
                self.last_write_token = attempt.epoch
            handle = LockHandle(self.lock, "write", owner, attempt.epoch, None)
            self.handles.append((handle, me.generation))

    @rule(owner=OWNERS, mode=MODES, queue=st.booleans())
    def lost_call(self, owner: str, mode: str, queue: bool) -> None:
        """An acquire call that ran, but whose caller saw no reply: no handle."""
        m = self.model
        me = m.owners[owner]
        fresh = me.writes == 0
        self.attempts += 1
        attempt_id = f"lost.{self.attempts}"
        reply = self._acquire_call(owner, mode, attempt_id, queue=queue)
        expect = m.acquired(owner, mode, attempt_id, queue=queue)
        got = "granted" if reply.granted else "upgrade" if reply.upgrade else "busy"
        assert got == expect, (got, expect, m)
        if reply.granted and mode == "write" and fresh:
            self.last_write_token = reply.epoch
        me.lost.append(attempt_id)

    @rule(owner=OWNERS)
    def give_back(self, owner: str) -> None:
        m = self.model
        me = m.owners[owner]
        if not me.lost:
            return
        call = wire.give_back_call(self.lock.keys, owner, 60_000, me.lost)
        taken = wire.parse_give_back(GIVE_BACK(self.client, call[1], call[2]))
        expect = False
        if me.record is not None and me.record[0] in me.lost:
            kind = me.record[1]
            if kind == "q" and owner in m.queue:
                m.queue.remove(owner)
                expect = True
            elif kind == "r" and me.reads:
                me.reads -= 1
                expect = True
            elif kind == "w" and me.writes:
                me.writes -= 1
                expect = True
            me.record = None
        m.settle(owner)
        assert taken == expect, (taken, expect, m)
        me.cancelled += me.lost
        me.lost = []

    @rule(owner=OWNERS, mode=MODES, data=st.data())
    def late_call(self, owner: str, mode: str, data: st.DataObject) -> None:
        """A lost call that reaches Redis after its give-back: it does nothing."""
        me = self.model.owners[owner]
        if not me.cancelled:
            return
        attempt_id = data.draw(st.sampled_from(me.cancelled))
        reply = self._acquire_call(owner, mode, attempt_id, queue=True)
        assert reply == Attempt(granted=False)

    def _acquire_call(self, owner: str, mode: str, attempt_id: str, *, queue: bool) -> Attempt:
        script, keys, args = wire.acquire_call(
            self.lock.keys,
            owner,
            mode,  # type: ignore[arg-type]
            lease_ms=self.lock.lease_ms,
            mark_ms=self.lock._mark_ms if queue else 0,
            attempt=attempt_id,
        )
        assert script is ACQUIRE
        return wire.parse_attempt(ACQUIRE(self.client, keys, args))

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
            self.model.settle(handle.owner)
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
        self.model.settle(owner)

    @rule(owner=OWNERS)
    def mark_ends(self, owner: str) -> None:
        """A waiting writer stops refreshing its mark (it died while waiting)."""
        if self.client.hexists(self.lock.keys.lock, f"q:{owner}"):
            self.client.hset(self.lock.keys.lock, f"q:{owner}", 1)
        if owner in self.model.queue:
            self.model.queue.remove(owner)
        self.model.settle(owner)

    @rule(owner=OWNERS)
    def withdraw(self, owner: str) -> None:
        removed = WITHDRAW(self.client, [self.lock.keys.lock], [owner, "chan"])
        assert bool(removed) == (owner in self.model.queue)
        if owner in self.model.queue:
            self.model.queue.remove(owner)
        self.model.settle(owner)

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
