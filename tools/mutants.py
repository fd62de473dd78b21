"""The mutation check: every guarantee the docs promise must fail a test when removed.

Each mutant below is a small textual patch that removes one guarantee, and names
the tests that must fail under it. The check copies the project into a scratch
directory, applies one mutant at a time, runs only that mutant's tests there and
fails if any mutant survives (its tests pass), if a mutant no longer applies (its
code changed: update the mutant with the code), or if its tests cannot run.

A patch is anchored: ``within`` names the def, class or module-level assignment
holding its find text, which must occur exactly once inside it. A file that moved,
or an anchor that moved to another module, is found again by the anchor (the one
module of cacheguard/, or of the file's own top folder, defining it) with a warning
to update ``file``. A patch that no longer applies is reported with what is missing
or ambiguous and the lines now closest to its find text.

    python tools/mutants.py                  # all mutants (CI: --jobs 4)
    python tools/mutants.py --only fence     # the mutants whose id contains "fence"
    python tools/mutants.py --list           # id, guarantee, where it applies, tests
    python tools/mutants.py --discover ID tests/test_x.py ...
                                             # which tests of those files kill ID

docs/testing.md lists the mutants; tests/test_mutants.py keeps both in step with
the code (every patch applies exactly once inside its anchor, every named test
exists).
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import dataclasses
import difflib
import functools
import itertools
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What a run needs (docs too: some tests read tables from it); the venv and git stay behind.
COPIED = (
    "cacheguard",
    "testing",  # the test rigs (cacheguard_testing)
    "tests",
    "examples",
    "bench",
    "docs",
    "pyproject.toml",
    "MANIFEST.in",  # tests/test_packaging.py builds the sdist and the wheel
    "README.md",
    "DEVELOPERS.md",
    "mkdocs.yml",
    "tools",  # the docs site: tests/test_docs.py builds it
)


@dataclass(frozen=True)
class Mutant:
    id: str
    guarantee: str
    # Where the code lives: a hint. A file that moved, or an anchor that moved to another
    # module, is found again by ``within`` (with a warning to update this path).
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    # The qualified name of the def, class or module/class-level assignment holding
    # ``find`` ("LuaScript.__call__", "acquire_flow", "_ACQUIRE_BODY"): the patch applies
    # exactly once inside its lines, so refactors elsewhere in the file leave it be.
    within: str = ""


MUTANTS: tuple[Mutant, ...] = (
    # -- the read-write lock (locks/redis/lua.py, watchdog.py, notifier.py) -----------------
    Mutant(
        "lock-writer-excludes-readers",
        "a reader never enters while a writer holds the lock",
        "cacheguard/locks/redis/lua.py",
        "  if mode == 'write' then return false end\n",
        "",
        ("tests/test_redis_lock.py::test_lock_timeout_within_deadline",),
        within="LOCK_PRELUDE",
    ),
    Mutant(
        "lock-writer-excludes-writers",
        "one writer at a time, and none while readers hold the lock",
        "cacheguard/locks/redis/lua.py",
        "    first = not mode\n",
        "    first = true\n",
        ("tests/test_redis_lock.py::test_readers_overlap_and_writer_excluded",),
        within="_ACQUIRE_BODY",
    ),
    Mutant(
        "lock-waiting-writer-holds-off-readers",
        "new readers wait behind a queued writer (writers are not starved)",
        "cacheguard/locks/redis/lua.py",
        "  for who in pairs(s.q) do\n    if who ~= owner then return false end\n  end\n",
        "",
        ("tests/test_redis_lock.py::test_waiting_writer_blocks_new_readers",),
        within="LOCK_PRELUDE",
    ),
    Mutant(
        "lock-fencing-tokens",
        "every fresh write holding takes a new, higher fencing token",
        "cacheguard/locks/redis/lua.py",
        "    redis.call('INCR', fence)\n",
        "",
        ("tests/test_redis_lock.py::test_fencing_tokens_strictly_increase",),
        within="LOCK_PRELUDE",
    ),
    Mutant(
        "lock-fencing-after-expiry",
        "fencing tokens still increase after the lock's counter expired: a new counter "
        "starts from the server clock (µs), above every token handed out before",
        "cacheguard/locks/redis/lua.py",
        "  local token = time_epoch()\n",
        "  local token = '1'\n",
        ("tests/test_redis_lock.py::test_fencing_tokens_increase_after_the_counter_expired",),
        within="LOCK_PRELUDE",
    ),
    Mutant(
        "lock-fence-counter-expires",
        "a lock's fencing counter expires (a day after its last token): every key cacheguard "
        "writes has a TTL but the namespace's invalidation sequence",
        "cacheguard/locks/redis/lua.py",
        "  redis.call('SET', fence, token, 'PX', FENCE_TTL_MS)\n",
        "  redis.call('SET', fence, token)\n",
        (
            "tests/test_key_lifetimes.py::test_the_lock_alone_leaves_nothing_without_a_ttl",
            "tests/test_key_lifetimes.py::"
            "test_a_guards_workload_leaves_only_the_sequence_without_a_ttl[sync]",
            "tests/test_key_lifetimes.py::"
            "test_a_guards_workload_leaves_only_the_sequence_without_a_ttl[async]",
        ),
        within="LOCK_PRELUDE",
    ),
    Mutant(
        "lock-fence-counter-lifetime-renewed",
        "each token taken from a fencing counter renews its lifetime (also a counter an "
        "older version left without one)",
        "cacheguard/locks/redis/lua.py",
        "    redis.call('PEXPIRE', fence, FENCE_TTL_MS)\n",
        "",
        ("tests/test_redis_lock.py::test_a_counter_without_a_lifetime_gets_one_on_its_next_token",),
        within="LOCK_PRELUDE",
    ),
    Mutant(
        "redlock-raised-fence-expires",
        "a Redlock token written back to a master's fencing counter keeps the counter expiring",
        "cacheguard/locks/redlock/lua.py",
        "  redis.call('SET', KEYS[1], ARGV[1], 'PX', FENCE_TTL_MS)\n",
        "  redis.call('SET', KEYS[1], ARGV[1])\n",
        ("tests/test_lock_redlock.py::test_fencing_counters_expire_and_tokens_still_increase",),
        within="_RAISE_FENCE_BODY",
    ),
    Mutant(
        "lock-expired-holders-swept",
        "a holder whose lease ended stops counting, even while others keep the hash alive",
        "cacheguard/locks/redis/lua.py",
        "  for who, ends in pairs(s.e) do\n    if ends <= now then\n",
        "  for who, ends in pairs(s.e) do\n    if false then\n",
        ("tests/test_redis_lock.py::test_crashed_reader_stops_counting_when_its_lease_ends",),
        within="LOCK_PRELUDE",
    ),
    Mutant(
        "lock-release-checks-epoch",
        "a stale handle cannot release the owner's newer holding",
        "cacheguard/locks/redis/lua.py",
        "if (s[kind][owner] or 0) == 0 or s.g[owner] ~= epoch then",
        "if (s[kind][owner] or 0) == 0 then",
        ("tests/test_redis_lock.py::test_same_owner_stale_handle_cannot_release_new_holding",),
        within="_RELEASE_BODY",
    ),
    Mutant(
        "lock-lease-renewal",
        "the watchdog extends a live holder's lease",
        "cacheguard/locks/redis/lua.py",
        "s.e[owner] = now + lease\nput(s, 'e:' .. owner, s.e[owner])\nsettle(key, s, now)\n"
        "for who in pairs(s.q) do",
        "settle(key, s, now)\nfor who in pairs(s.q) do",
        ("tests/test_redis_lock.py::test_watchdog_keeps_live_holder_then_stops",),
        within="_RENEW_BODY",
    ),
    Mutant(
        "lock-release-announced",
        "a release that frees or downgrades the lock is announced on the key's channel",
        "cacheguard/locks/redis/lua.py",
        "if after ~= before then redis.call('SPUBLISH', channel, after or 'free') end",
        "",
        ("tests/test_guarantees.py::test_lock_waiter_is_woken_by_the_release_announcement",),
        within="_RELEASE_BODY",
    ),
    Mutant(
        "notifier-delivers",
        "the process's one pub/sub listener hands every message to the channel's waiters",
        "cacheguard/redis/notifier.py",
        "        for waiter in waiters:  # outside the mutex, which the waiters' threads need\n"
        "            waiter._deliver(payload)\n",
        "",
        ("tests/test_notifier.py::test_subscription_is_confirmed_and_woken",),
        within="Notifier._dispatch",
    ),
    # -- ownership follows the holder (cacheguard/_identity.py, locks/; issue #23) ----------------
    Mutant(
        "holder-not-thread",
        "a hold belongs to its holder, not to the thread: the next request on a pool thread "
        "does not re-enter a hold another request entered there",
        "cacheguard/_identity.py",
        "            holder = Holder()\n            _ambient.set(holder)\n",
        "            holder = globals().setdefault('_by_thread', {}).setdefault(\n"
        "                threading.get_ident(), Holder()\n            )\n",
        (
            "tests/test_ownership.py::test_guard_write_excludes_requests_sharing_pool_threads",
            "tests/test_ownership.py::test_two_tier_write_excludes_requests_sharing_pool_threads",
        ),
        within="enter_holder",
    ),
    Mutant(
        "holder-owner-never-reused",
        "a store's default owner is its holder's, never a thread's: a pool's next caller and "
        "a thread with a reused ident are other owners",
        "cacheguard/_identity.py",
        '        return f"{_process_id}:h{self.number}"\n',
        '        return f"{_process_id}:{threading.get_ident()}"\n',
        (
            "tests/test_lock_contract.py::"
            "test_a_hold_handed_between_pool_threads_stays_one_owners[redis]",
            "tests/test_ownership.py::test_ident_reuse_does_not_inherit_a_store_hold",
        ),
        within="Holder.owner",
    ),
    Mutant(
        "holder-context-reentry",
        "nested acquisitions in one context, and in copies of it, re-enter the context's hold",
        "cacheguard/_identity.py",
        "    if holder is None:\n        holder = ambient_holder()\n        if holder is None:\n",
        "    if holder is None:\n        holder = None\n        if holder is None:\n",
        ("tests/test_ownership.py::test_nested_blocks_in_one_context_reenter_and_copies_carry_it",),
        within="enter_holder",
    ),
    Mutant(
        "holder-abandoned-holds-end",
        "a holder collected while holding (its thread ended) has its local holds ended",
        "cacheguard/locks/local.py",
        "            self._holders[n] = weakref.ref(holder, lambda _ref: self._collected(n))\n",
        "            self._holders[n] = weakref.ref(holder)\n",
        ("tests/test_ownership.py::test_ended_thread_neither_lends_its_hold_nor_keeps_it",),
        within="LocalRWLock._track",
    ),
    Mutant(
        "holder-abandoned-distributed-hold-released",
        "an abandoned two-tier write hold is given back in Redis too, not renewed for ever",
        "cacheguard/locks/two_tier.py",
        "                    if self._write_handle is not None:\n"
        "                        released.append(self._write_handle)\n",
        "",
        ("tests/test_ownership.py::test_ended_thread_neither_lends_its_hold_nor_keeps_it",),
        within="TwoTierRWLock._abandoned",
    ),
    Mutant(
        "holder-abandoned-local-last",
        "an abandoned holder's distributed holds are given back before its local holds end, "
        "so no local writer meets the process's own read hold in Redis (LockUpgradeError)",
        "cacheguard/locks/two_tier.py",
        "            depth, reads = self._local.abandoned_holds(number)\n",
        "            depth, reads = self._local.take_abandoned(number)\n",
        (
            "tests/test_ownership.py::"
            "test_an_abandoned_read_hold_is_given_back_before_local_writers_go_on",
        ),
        within="TwoTierRWLock._abandoned",
    ),
    Mutant(
        "watchdog-weak-store-handles",
        "a RedisRWLock handle dropped unreleased (its thread ended) is no longer renewed",
        "cacheguard/locks/redis/rwlock.py",
        "            self._watchdog.watch(handle, renew_for=renew_for, weak=True)\n",
        "            self._watchdog.watch(handle, renew_for=renew_for)\n",
        ("tests/test_ownership.py::test_a_dropped_store_hold_is_given_back_not_renewed",),
        within="RedisRWLock._granted",
    ),
    Mutant(
        "aio-watchdog-weak-store-handles",
        "an AsyncRedisRWLock handle dropped unreleased (its task ended) is no longer renewed",
        "cacheguard/locks/redis/async_rwlock.py",
        "            watchdog.watch(handle, renew_for=renew_for, weak=True)\n",
        "            watchdog.watch(handle, renew_for=renew_for)\n",
        ("tests/test_ownership.py::test_async_a_dropped_store_hold_is_given_back_not_renewed",),
        within="AsyncRedisRWLock._granted",
    ),
    Mutant(
        "redlock-watchdog-weak-handles",
        "a Redlock handle dropped unreleased (its thread ended) is given back on every master, "
        "not renewed",
        "cacheguard/locks/redlock/rwlock.py",
        "            self._watchdog.watch(handle, weak=True)\n",
        "            self._watchdog.watch(handle)\n",
        (
            "tests/test_lock_redlock.py::"
            "test_a_handle_dropped_unreleased_is_given_back_on_every_master",
        ),
        within="RedlockRWLock._granted",
    ),
    Mutant(
        "aio-redlock-watchdog-weak-handles",
        "an AsyncRedlockRWLock handle dropped unreleased (its task ended) is given back",
        "cacheguard/locks/redlock/async_rwlock.py",
        "            watchdog.watch(handle, weak=True)"
        "  # a handle its task dropped is given back\n",
        "            watchdog.watch(handle)\n",
        (
            "tests/test_lock_redlock.py::"
            "test_async_a_handle_dropped_unreleased_is_given_back_on_every_master",
        ),
        within="AsyncRedlockRWLock._granted",
    ),
    Mutant(
        "redlock-dropped-handle-forgets-its-epochs",
        "a dropped Redlock handle's epochs no longer keep tidy-ups off its masters",
        "cacheguard/locks/redlock/quorum.py",
        "        # Collected unreleased: its epochs no longer keep tidy-ups off its masters.\n"
        "        process_holdings().remove(self)\n",
        "        pass\n",
        (
            "tests/test_lock_redlock.py::"
            "test_a_handle_dropped_unreleased_is_given_back_on_every_master",
        ),
        within="RedlockHandleState._dropped",
    ),
    Mutant(
        "watchdog-releases-dropped-handles",
        "the watchdog releases a dropped handle's holding at once instead of renewing it",
        "cacheguard/locks/redis/lease.py",
        "            if not entry.releasing and entry.abandoned:\n",
        "            if False:\n",
        ("tests/test_ownership.py::test_a_dropped_store_hold_is_given_back_not_renewed",),
        within="LeaseBook._batches",
    ),
    Mutant(
        "two-tier-reentered-read-joins",
        "a holder re-entering a two-tier read lock joins its own shared hold even while a "
        "remote writer waits (no wait for itself)",
        "cacheguard/locks/two_tier.py",
        "                joinable = reentry or self._gate.wait_for(\n",
        "                joinable = self._gate.wait_for(\n",
        (
            "tests/test_ownership.py::"
            "test_reentered_read_does_not_wait_behind_a_queued_remote_writer",
        ),
        within="TwoTierRWLock.acquire_read",
    ),
    Mutant(
        "aio-two-tier-reentered-read-joins",
        "a task re-entering an asyncio two-tier read lock joins its own shared hold even while "
        "a remote writer waits",
        "cacheguard/locks/async_two_tier.py",
        "            if self._readers and stale and not reentry:\n",
        "            if self._readers and stale:\n",
        (
            "tests/test_ownership.py::"
            "test_async_reentered_read_does_not_wait_behind_a_queued_remote_writer",
        ),
        within="AsyncTwoTierRWLock._join_read",
    ),
    # -- the read-through cache (cache/scripts.py, flow.py, guard.py) ---------------------
    Mutant(
        "fill-store-checks-version",
        "a fill stores only if no invalidation moved the key's version since it began",
        "cacheguard/cache/scripts.py",
        "if fresh and (redis.call('GET', verkey) or '0') == seen then",
        "if fresh then",
        ("tests/test_cache.py::test_a_version_moved_without_the_fill_mark_rejects_the_store",),
        within="_FILL_END_BODY",
    ),
    Mutant(
        "fill-store-checks-watermark",
        "a fill from a database snapshot older than the last invalidation does not store",
        "cacheguard/cache/scripts.py",
        "local fresh = watermark == nil or tonumber(seen) <= watermark",
        "local fresh = true",
        ("tests/test_sqlalchemy.py::test_a_reader_with_an_old_snapshot_cannot_fill_a_stale_row",),
        within="_FILL_END_BODY",
    ),
    Mutant(
        "fill-store-needs-its-mark",
        "a fill stores only while its lock hash still says no invalidation came since it "
        "began, so an evicted version key cannot pass it off as never invalidated",
        "cacheguard/cache/scripts.py",
        "if ours and may_store and entry ~= '' and now - begun < verttl then",
        "if ours and entry ~= '' and now - begun < verttl then",
        (
            "tests/test_guard_both_drivers.py::"
            "test_an_evicted_version_key_does_not_let_the_old_value_in",
            "tests/test_eviction.py::test_an_evicted_version_key_never_lets_an_old_value_in",
        ),
        within="_FILL_END_BODY",
    ),
    Mutant(
        "invalidate-fails-fills-in-flight",
        "an invalidation fails the fill in flight in the fill's own lock hash, whatever "
        "happens to the version key (eviction, or a version write refused out of memory)",
        "cacheguard/cache/scripts.py",
        "redis.call('HDEL', KEYS[3], 'fs')\n",
        "",
        (
            "tests/test_guard_both_drivers.py::"
            "test_an_evicted_version_key_does_not_let_the_old_value_in",
            "tests/test_eviction.py::test_an_evicted_version_key_never_lets_an_old_value_in",
            "tests/test_eviction.py::test_noeviction_refuses_writes_and_caches_no_wrong_value",
        ),
        within="INVALIDATE",
    ),
    Mutant(
        "invalidate-deletes-before-it-writes",
        "an invalidation's first writes are deletes, which Redis runs even out of memory "
        "(noeviction): the value goes and the fill in flight fails even when memory is full",
        "cacheguard/cache/scripts.py",
        "redis.call('DEL', KEYS[1])\nredis.call('HDEL', KEYS[3], 'fs')\n"
        "local raw = redis.call('GET', KEYS[2])\n",
        "local raw = redis.call('GET', KEYS[2])\nredis.call('SET', KEYS[2], raw or '0')\n"
        "redis.call('DEL', KEYS[1])\nredis.call('HDEL', KEYS[3], 'fs')\n",
        ("tests/test_eviction.py::test_noeviction_refuses_writes_and_caches_no_wrong_value",),
        within="INVALIDATE",
    ),
    Mutant(
        "full-redis-poisons-on-one-server",
        "an invalidation whose sequence number Redis refuses out of memory still goes "
        "through (poisoned), also on one server",
        "cacheguard/cache/flows/write.py",
        "    if isinstance(result, OutOfMemoryError) and not required:\n",
        "    if False:\n",
        (
            "tests/test_write_path_scripted.py::test_a_full_redis_poisons_even_on_one_server",
            "tests/test_eviction.py::test_noeviction_refuses_writes_and_caches_no_wrong_value",
        ),
        within="stamp_flow",
    ),
    Mutant(
        "out-of-memory-is-redis-refusing",
        "Redis refusing writes out of memory is Redis down for every policy: never a raw "
        "redis-py error past on_backend_error",
        "cacheguard/redis/errors.py",
        "    NoReplicasError,\n    OutOfMemoryError,\n)",
        "    NoReplicasError,\n)",
        (
            "tests/test_write_path_scripted.py::test_a_full_redis_poisons_even_on_one_server",
            "tests/test_eviction.py::test_noeviction_refuses_writes_and_caches_no_wrong_value",
        ),
        within="REDIS_REFUSING",
    ),
    Mutant(
        "fill-takes-read-hold",
        "a fill does not begin while a writer holds or waits for the key",
        "cacheguard/cache/scripts.py",
        "if not may_read(s, owner, mode) then\n  local wait = soonest_end(s, now, owner)",
        "if false then\n  local wait = soonest_end(s, now, owner)",
        ("tests/test_cache.py::test_write_waits_for_fill_and_fill_waits_for_write",),
        within="_FILL_BEGIN_BODY",
    ),
    Mutant(
        "fill-one-filler",
        "one fill per key at a time across all processes",
        "cacheguard/cache/scripts.py",
        "if s.fill then\n  -- One fill at a time",
        "if false then\n  -- One fill at a time",
        (
            "tests/test_cache_regressions.py::test_two_fills_in_one_process_leave_no_hold",
            "tests/test_cache_processes.py::test_cold_key_stampede_loads_once",
        ),
        within="_FILL_BEGIN_BODY",
    ),
    Mutant(
        "fill-dead-filler-abandoned",
        "a fill whose owner's lease ended is abandoned, so another process can take over",
        "cacheguard/locks/redis/lua.py",
        "  if s.fill and not s.e[s.fill] then\n",
        "  if false then\n",
        (
            "tests/test_guarantees.py::"
            "test_a_dead_fillers_fill_ends_with_its_lease_while_others_keep_the_lock_alive",
        ),
        within="LOCK_PRELUDE",
    ),
    Mutant(
        "invalidate-broadcasts-to-l1",
        "an invalidation drops the key from every process's L1",
        "cacheguard/cache/scripts.py",
        "if ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[2], ARGV[3]) end",
        "",
        ("tests/test_cache.py::test_l1_hits_and_cross_guard_invalidation",),
        within="INVALIDATE",
    ),
    Mutant(
        "announcement-from-fill-seen-or-later",
        "a waiter takes an announced value only from the fill it saw under way or a later one",
        "cacheguard/cache/flows/fill.py",
        "if message.fill_began_us >= begin.since_us and entry.version >= int(begin.version):",
        "if entry.version >= int(begin.version):",
        (
            "tests/test_guarantees.py::"
            "test_an_older_fills_announcement_is_refused_even_at_the_same_version",
        ),
        within="_served_by",
    ),
    Mutant(
        "prefix-invalidation-stamps-honoured",
        "a fill from a snapshot older than a prefix invalidation covering its key does not store",
        "cacheguard/cache/flows/fill.py",
        "    return -1 if stamps and max(stamps) > snapshot else snapshot\n",
        "    return snapshot\n",
        ("tests/test_sqlalchemy.py::test_prefix_invalidation_refuses_fills_from_older_snapshots",),
        within="_oldest_allowed",
    ),
    Mutant(
        "fill-store-younger-than-version-ttl",
        "a fill older than version_ttl stores nothing (the version it began with may have "
        "expired after an invalidation, and look unchanged)",
        "cacheguard/cache/scripts.py",
        "now - begun < verttl",
        "true",
        ("tests/test_guarantees.py::test_a_fill_older_than_version_ttl_does_not_store",),
        within="_FILL_END_BODY",
    ),
    Mutant(
        "fill-begin-renews-version",
        "fill_begin renews the key's version for version_ttl, so the fill's store can "
        "still compare against it",
        "cacheguard/cache/scripts.py",
        "if version then redis.call('PEXPIRE', verkey, verttl) else version = '0' end",
        "if not version then version = '0' end",
        ("tests/test_guarantees.py::test_a_fill_keeps_its_keys_version_alive_until_it_stores",),
        within="_FILL_BEGIN_BODY",
    ),
    Mutant(
        "prefix-bookkeeping-bounded",
        "a process keeps at most RECENT_PREFIXES of the prefixes it invalidated, however "
        "many distinct ones it used",
        "cacheguard/cache/invalidation.py",
        "if ends > now and len(recent) <= self.capacity:",
        "if ends > now:",
        ("tests/test_prefix_bookkeeping.py::test_many_prefixes_keep_the_bookkeeping_bounded",),
        within="Prefixes.remember",
    ),
    Mutant(
        "prefix-forgotten-raises-floor",
        "a prefix forgotten before its stamp expired still refuses fills from snapshots "
        "older than its invalidation (its stamp raises the floor)",
        "cacheguard/cache/invalidation.py",
        "                    self.floor = max(self.floor, old_stamp)\n",
        "                    pass\n",
        (
            "tests/test_prefix_bookkeeping.py::test_a_forgotten_prefix_invalidation_is_still_honoured",
        ),
        within="Prefixes.remember",
    ),
    Mutant(
        "prefix-floor-refuses-older-snapshots",
        "a fill from a snapshot older than the floor of forgotten prefixes does not store",
        "cacheguard/cache/flows/fill.py",
        "    if floor > snapshot:\n        return -1",
        "    if False:\n        return -1",
        (
            "tests/test_prefix_bookkeeping.py::test_a_forgotten_prefix_invalidation_is_still_honoured",
        ),
        within="_oldest_allowed",
    ),
    Mutant(
        "session-end-invalidates-again",
        "the end of a tracked transaction invalidates its keys again before releasing them",
        "cacheguard/integrations/sqlalchemy/tracker.py",
        "    try:\n        guard.invalidate(*names)\n        invalidated = set(names)\n"
        "    except Exception:\n",
        "    try:\n        invalidated = set(names)\n    except Exception:\n",
        (
            "tests/test_sqlalchemy.py::"
            "test_lock_timeout_midway_in_a_savepoint_invalidates_and_releases",
        ),
        within="_release",
    ),
    Mutant(
        "write-invalidates-after-body",
        "guard.write invalidates again after its body returned",
        "cacheguard/cache/flows/write.py",
        "            raise\n        yield from invalidate_flow(state, ordered, checked=True)\n",
        "            raise\n",
        (
            "tests/test_guarantees.py::"
            "test_a_value_filled_while_the_writer_lost_its_lock_is_dropped_at_the_end",
        ),
        within="write_flow",
    ),
    Mutant(
        "write-invalidates-after-failed-body",
        "guard.write invalidates again after its body raised",
        "cacheguard/cache/flows/write.py",
        "            try:\n"
        "                yield from invalidate_flow(state, ordered, checked=True)\n"
        "            except Exception as closing_error:\n",
        "            try:\n                pass\n            except Exception as closing_error:\n",
        (
            "tests/test_guarantees.py::"
            "test_a_value_filled_while_the_writer_lost_its_lock_is_dropped_at_the_end",
        ),
        within="write_flow",
    ),
    Mutant(
        "writer-reads-its-own-view",
        "a thread or task holding a key's write lock that reads the key loads its own view "
        "at once, never waiting on (or taking the value of) another caller's fill of it",
        "cacheguard/cache/flows/read.py",
        "        if lock.local.is_write_held_by_me():\n",
        "        if False:\n",
        (
            "tests/test_review_guard.py::"
            "test_a_sync_writer_reads_its_own_view_while_another_thread_leads_the_key",
            "tests/test_review_guard.py::"
            "test_an_async_writer_reads_its_own_view_while_another_task_leads_the_key",
        ),
        within="read_flow",
    ),
    # -- trust fixes (tests/test_trust.py) ----------------------------------------------
    Mutant(
        "write-releases-from-any-thread",
        "a write context exited in another thread than it entered releases its locks",
        "cacheguard/cache/flows/write.py",
        "    errors = yield ReleaseWrites(tuple(held), holder)\n",
        "    errors = yield ReleaseWrites(tuple(held), None)\n",
        ("tests/test_trust.py::test_a_write_exited_in_another_thread_releases_its_locks",),
        within="release_writes",
    ),
    Mutant(
        "write-lost-lock-raises",
        "a write whose lock was lost during its body raises LockLostError when it exits, "
        "after its closing invalidation",
        "cacheguard/cache/flows/write.py",
        "        raise losses[0]\n",
        "        pass\n",
        (
            "tests/test_lost_write_locks.py::"
            "test_a_write_whose_lock_was_lost_raises_after_invalidating[sync]",
            "tests/test_lost_write_locks.py::"
            "test_a_write_whose_lock_was_lost_raises_after_invalidating[async]",
        ),
        within="write_flow",
    ),
    Mutant(
        "write-lost-handle-counts",
        "a write lock whose handle a renewal marked lost fails the write even when its "
        "release goes through (locks from another store)",
        "cacheguard/cache/flows/write.py",
        '        if isinstance(error, LockLostError) or getattr(handle, "lost", False):\n',
        "    if isinstance(error, LockLostError):\n",
        (
            "tests/test_write_locks.py::"
            "test_a_stores_lock_lost_during_a_write_fails_the_write[redis]",
        ),
        within="release_writes",
    ),
    Mutant(
        "write-lost-lock-noted-on-body-error",
        "a lock lost during a write whose body raised is attached to the body's error",
        "cacheguard/cache/flows/write.py",
        '                add_note(error, f"cacheguard: {lost}")\n',
        "                pass\n",
        ("tests/test_lost_write_locks.py::test_the_bodys_error_wins_over_a_lost_lock[async]",),
        within="write_flow",
    ),
    Mutant(
        "sqlalchemy-lost-lock-fails-commit",
        "a tracked transaction whose write lock was lost does not commit (LockLostError)",
        "cacheguard/integrations/sqlalchemy/tracker.py",
        '            if getattr(handle, "lost", False):\n',
        "            if False:\n",
        (
            "tests/test_sqlalchemy.py::test_a_write_lock_lost_before_the_commit_fails_it[sqlite]",
            "tests/test_sqlalchemy_async.py::"
            "test_a_write_lock_lost_before_the_commit_fails_it[sqlite]",
        ),
        within="ModelTracker._on_before_commit",
    ),
    # -- the outbox (issue #24: integrations/sqlalchemy/outbox.py, tests/test_outbox.py) ----------
    Mutant(
        "outbox-rows-in-the-writers-transaction",
        "a tracked write's outbox rows are written in its own transaction: unseen by others "
        "before the commit, gone with a rollback",
        "cacheguard/integrations/sqlalchemy/outbox.py",
        '        connection = session.connection(bind_arguments={"clause": self._insert})\n'
        "        ids = _insert(connection, self.table, rows)\n",
        "        with self._engine.begin() as connection:\n"
        "            ids = _insert(connection, self.table, rows)\n",
        (
            "tests/test_outbox.py::"
            "test_a_tracked_write_commits_with_its_invalidations_in_the_same_transaction"
            "[sqlite-killed]",
        ),
        within="TrackerOutbox.write",
    ),
    Mutant(
        "outbox-rows-deleted-after-confirmed-invalidation",
        "the closing step deletes only the outbox rows whose invalidation went through; "
        "the others wait for a replay",
        "cacheguard/integrations/sqlalchemy/tracker.py",
        "        confirmed = [row for named, row in rows.items() if named in invalidated]\n",
        "        confirmed = list(rows.values())\n",
        (
            "tests/test_outbox.py::"
            "test_a_tracked_write_commits_with_its_invalidations_in_the_same_transaction"
            "[sqlite-killed]",
        ),
        within="_release_all",
    ),
    Mutant(
        "outbox-replay-before-serving",
        "a guard that saw Redis fail replays the outbox before it serves a value read from Redis",
        "cacheguard/cache/flows/read.py",
        "                if state.recovery.pending:\n"
        "                    raw = yield from replayed_then_reread(state, name, template)\n",
        "                if False:\n"
        "                    raw = yield from replayed_then_reread(state, name, template)\n",
        (
            "tests/test_outbox.py::"
            "test_a_guard_that_saw_the_outage_replays_before_serving_from_redis[sqlite]",
            "tests/test_outbox.py::test_an_asyncio_guard_replays_before_serving_from_redis[sqlite]",
            "tests/test_fallback.py::test_a_read_replays_before_it_serves_from_redis[sync]",
            "tests/test_fallback.py::test_a_read_replays_before_it_serves_from_redis[async]",
        ),
        within="read_flow",
    ),
    Mutant(
        "outbox-replay-waits-for-held-rows",
        "on PostgreSQL a replay waits for the rows another replayer holds and replays what it "
        "could not: none is skipped before a guard serves",
        "cacheguard/integrations/sqlalchemy/outbox.py",
        "            [(claim.with_for_update(skip_locked=True), False), "
        "(claim.with_for_update(), True)]\n",
        "            [(claim.with_for_update(skip_locked=True), False)]\n",
        (
            "tests/test_outbox.py::"
            "test_a_replay_waits_for_the_rows_another_replayer_holds[postgresql]",
        ),
        within="_Replay.__init__",
    ),
    Mutant(
        "outbox-replay-then-read-again",
        "after the replay the key is read again: the value read before it is not served",
        "cacheguard/cache/flows/read.py",
        "                    raw = yield from replayed_then_reread(state, name, template)\n",
        "                    yield from replayed_then_reread(state, name, template)\n",
        (
            "tests/test_outbox.py::"
            "test_a_guard_that_saw_the_outage_replays_before_serving_from_redis[sqlite]",
        ),
        within="read_flow",
    ),
    Mutant(
        "outbox-poller-replays",
        "every tracking process replays the outbox on a timer: one that never saw the outage "
        "stops serving the old value within outbox_poll",
        "cacheguard/integrations/sqlalchemy/outbox.py",
        "                if self._replayer.has_rows():\n",
        "                if False:\n",
        (
            "tests/test_outbox.py::test_a_process_that_never_saw_the_outage_stops_serving_"
            "the_old_value_within_the_poll[sqlite-sync]",
        ),
        within="_ThreadPoller._run",
    ),
    Mutant(
        "outbox-asyncio-poller-replays",
        "the asyncio guard's poller task replays the outbox on a timer too",
        "cacheguard/integrations/sqlalchemy/outbox.py",
        "                if await self._replayer.has_rows():\n",
        "                if False:\n",
        (
            "tests/test_outbox.py::test_a_process_that_never_saw_the_outage_stops_serving_"
            "the_old_value_within_the_poll[sqlite-asyncio]",
        ),
        within="_TaskPoller._run",
    ),
    Mutant(
        "outbox-dead-shard-rows-wait",
        "on a cluster the rows of keys whose node's circuit is open wait in the outbox while "
        "the others are replayed: a dead shard does not keep the others' keys from Redis",
        "cacheguard/integrations/sqlalchemy/outbox.py",
        '        waiting.update(row.id for row in rows if circuits.get(row.name) == "open")\n',
        "",
        (
            "tests/test_outbox.py::"
            "test_a_dead_shards_rows_wait_while_the_other_shards_keys_are_served_from_redis"
            "[sqlite]",
        ),
        within="_Replay._invalidate",
    ),
    Mutant(
        "outbox-replay-wait-bounded",
        "on PostgreSQL a replay waits for the rows another replayer holds at most the guard's "
        "wait_timeout: a frozen replayer elsewhere does not block reads",
        "cacheguard/integrations/sqlalchemy/outbox.py",
        "                _bound_lock_waits(connection, deadline)\n",
        "",
        (
            "tests/test_outbox.py::"
            "test_a_replay_waits_for_held_rows_at_most_wait_timeout[postgresql]",
        ),
        within="_Replay._replay_batch",
    ),
    Mutant(
        "outbox-sqlite-replay-never-waits-for-itself",
        "on SQLite the replay before serving does not wait for the write lock to delete its "
        "rows (it may be the reader's own transaction's)",
        "cacheguard/integrations/sqlalchemy/outbox.py",
        "                self._delete_sqlite([row.id for row in replayed], wait=not serving)\n",
        "                self._delete_sqlite([row.id for row in replayed], wait=True)\n",
        (
            "tests/test_outbox.py::"
            "test_a_sqlite_transaction_reading_through_a_pending_guard_does_not_wait_for_itself"
            "[sqlite]",
        ),
        within="_Replay._replay_batch",
    ),
    Mutant(
        "outbox-asyncio-poller-on-the-guards-loop",
        "the asyncio poller starts only on the loop the guard is bound to",
        "cacheguard/integrations/sqlalchemy/outbox.py",
        "        if self._guard._binding.loop is not loop:\n",
        "        if self._guard._binding.loop not in (None, loop):\n",
        (
            "tests/test_outbox.py::"
            "test_the_asyncio_poller_starts_only_on_the_loop_the_guard_is_bound_to[sqlite]",
        ),
        within="_TaskPoller.ensure_running",
    ),
    Mutant(
        "write-body-error-wins",
        "the body's error reaches the caller even when the closing invalidation fails",
        "cacheguard/cache/flows/write.py",
        "                add_note(body_error, closing_failed_note(ordered, closing_error))\n",
        "                raise closing_error\n",
        ("tests/test_trust.py::test_the_bodys_error_wins_over_a_failing_closing_invalidation",),
        within="write_flow",
    ),
    Mutant(
        "l1-resubscribes-after-fork",
        "a forked worker's L1 is invalidated like its parent's",
        "cacheguard/cache/l1.py",
        "        self.tier.reset_after_fork()\n        self._listener = None\n",
        "        self.tier.reset_after_fork()\n",
        ("tests/test_trust.py::test_a_forked_worker_drops_its_l1_copy_when_the_parent_writes",),
        within="L1Feed.reset_after_fork",
    ),
    Mutant(
        "l1-bounded-by-entry-expiry",
        "an L1 copy never outlives its entry in Redis",
        "cacheguard/cache/l1.py",
        "        lifetime = min(lifetime, self.ttl)\n",
        "        lifetime = self.ttl\n",
        ("tests/test_trust.py::test_an_l1_copy_never_outlives_its_entry",),
        within="LocalTier.put",
    ),
    Mutant(
        "l1-refuses-copies-older-than-a-drop",
        "L1 refuses a copy read before an invalidation of the name",
        "cacheguard/cache/l1.py",
        "            if self.epoch != epoch:\n                return False\n",
        "",
        ("tests/test_trust.py::test_l1_refuses_a_copy_read_before_an_invalidation",),
        within="LocalTier.put",
    ),
    Mutant(
        "recursive-load-refused",
        "a loader asking for its own key fails at once with RecursiveLoadError",
        "cacheguard/cache/loading.py",
        "        if (id(self), name) in _LOADING.get():\n",
        "        if False:\n",
        ("tests/test_trust.py::test_a_loader_reading_its_own_key_fails_at_once",),
        within="Loads.refuse_recursion",
    ),
    Mutant(
        "max-load-time-ends-renewal",
        "a fill whose loader overruns max_load_time stops blocking writers",
        "cacheguard/locks/redis/lease.py",
        "entry.renew_until is not None and now >= entry.renew_until",
        "entry.renew_until is not None and False",
        ("tests/test_trust.py::test_a_hung_loader_stops_blocking_writers_after_max_load_time",),
        within="LeaseBook._batches",
    ),
    Mutant(
        "stale-policy-keeps-values",
        'on_timeout="stale" keeps entries past expiry and serves them after a wait timeout',
        "cacheguard/cache/settings.py",
        '(lifetime if self.on_timeout == "stale" else 0.0)',
        "0.0",
        ("tests/test_trust.py::test_on_timeout_stale_serves_the_last_value_after_a_wait_timeout",),
        within="GuardSettings.kept_for",
    ),
    Mutant(
        "expired-entry-is-not-a-hit",
        "an entry past its expiry that Redis still keeps is never served as fresh",
        "cacheguard/cache/wire.py",
        "        if now >= entry.expires_at:  # kept only for stale serving\n",
        "        if False:\n",
        ("tests/test_trust.py::test_on_timeout_stale_serves_the_last_value_after_a_wait_timeout",),
        within="parse_fill_begin",
    ),
    Mutant(
        "breaker-guards-peek",
        "an open circuit keeps peek off Redis",
        "cacheguard/cache/flows/read.py",
        '    closed = state.circuit_open(f"reading {name!r}", (name,))\n',
        "    closed = None\n",
        ("tests/test_trust.py::test_every_entry_point_honours_an_open_circuit",),
        within="peek_flow",
    ),
    Mutant(
        "refresh-follows-backend-policy",
        "refresh with Redis down follows on_backend_error",
        "cacheguard/cache/flows/read.py",
        "    except BackendUnavailable as exc:  # raised before any load ran (see fill_flow)\n"
        "        return (yield from bypass(state, call, exc, fallbacks=False))\n"
        "    return outcome.value",
        "    except ZeroDivisionError as exc:\n"
        "        return (yield from bypass(state, call, exc, fallbacks=False))\n"
        "    return outcome.value",
        ("tests/test_trust.py::test_refresh_follows_on_backend_error",),
        within="refresh_flow",
    ),
    Mutant(
        "nested-namespaces-separate",
        "nested namespaces (x and x:ps) never share a key",
        "cacheguard/redis/keys.py",
        'return f"{namespace}:{{{hash_tag(prefix)}}}:ps"',
        'return f"{namespace}:ps:{hash_tag(prefix)}"',
        ("tests/test_trust.py::test_nested_namespaces_do_not_share_keys",),
        within="prefix_stamp_key",
    ),
    Mutant(
        "durations-bounded",
        "a duration Redis cannot take (ttl=1e300) is refused up front",
        "cacheguard/checks.py",
        "    if number > MAX_SECONDS:\n        raise ValueError(\n",
        "    if False:\n        raise ValueError(\n",
        ("tests/test_trust.py::test_durations_redis_cannot_take_are_refused_up_front",),
        within="check_positive",
    ),
    Mutant(
        "corrupt-counted-once",
        "a corrupt entry is counted once per read",
        "cacheguard/cache/flows/fill.py",
        "parse_fill_begin(reply, job.decode_quiet, job.clock())",
        "parse_fill_begin(reply, job.decode, job.clock())",
        ("tests/test_trust.py::test_a_corrupt_entry_is_counted_once_per_read",),
        within="fill_flow",
    ),
    # -- key names (cache/templates.py, tests/test_key_names.py) ------------------------------
    Mutant(
        "keys-closures-refused",
        "functions made by one factory (closures) need a key template",
        "cacheguard/cache/templates.py",
        '    elif "<locals>" in target.__qualname__:\n',
        "    elif False:\n",
        (
            "tests/test_key_names.py::test_functions_made_by_one_factory_are_refused_without_a_template",
        ),
        within="stable_name",
    ),
    Mutant(
        "keys-lambdas-refused",
        "lambdas need a key template",
        "cacheguard/cache/templates.py",
        '    elif target.__name__ == "<lambda>":\n',
        "    elif False:\n",
        ("tests/test_key_names.py::test_lambdas_partials_and_callable_objects_need_a_template",),
        within="stable_name",
    ),
    Mutant(
        "keys-self-left-out-only-for-methods",
        "only a method's instance is left out of a default key, never a plain argument",
        "cacheguard/cache/templates.py",
        '        if self.binding != "function" and names:\n',
        '        if names and names[0] in ("self", "cls"):\n',
        (
            "tests/test_key_names.py::test_a_plain_function_keeps_a_first_argument_named_cls_or_self",
        ),
        within="KeyBuilder._build",
    ),
    Mutant(
        "keys-classmethod-by-class",
        "a classmethod's default key names the class it was called on",
        "cacheguard/cache/templates.py",
        '                prefix = f"{prefix}[{stable_type_name(first)}]"\n',
        "                prefix = prefix\n",
        ("tests/test_key_names.py::test_a_classmethod_is_keyed_by_the_class_it_is_called_on",),
        within="KeyBuilder._build",
    ),
    Mutant(
        "template-adjacent-fields-refused",
        "a template with two fields and nothing between them is refused",
        "cacheguard/cache/templates.py",
        "                if not literal:\n",
        "                if False:\n",
        ("tests/test_key_names.py::test_adjacent_fields_are_refused",),
        within="_Template.__init__",
    ),
    Mutant(
        "template-separators-escaped",
        "values cannot spell a template's separators, so every template is unambiguous",
        "cacheguard/cache/templates.py",
        "        escaped = set(_ALWAYS_ESCAPED) | {sep[0] for sep in separators}\n",
        "        escaped = set(_ALWAYS_ESCAPED)\n",
        ("tests/test_key_names.py::test_any_separator_keeps_fields_apart",),
        within="_Template.__init__",
    ),
    # -- codecs (cache/codec.py, tests/test_codecs.py) -----------------------------------
    Mutant(
        "codec-refuses-what-would-not-decode",
        "a value whose bytes would not decode is refused at the store, not stored",
        "cacheguard/cache/codec.py",
        "        codec.decode(data)\n",
        "        pass\n",
        (
            "tests/test_codecs.py::test_a_value_that_would_not_decode_is_refused_once_and_nothing_is_left",
        ),
        within="_check_round_trip",
    ),
    Mutant(
        "codecs-read-each-others-entries",
        "guards with different built-in codecs on one namespace read each other's entries",
        "cacheguard/cache/codec.py",
        "    return _READERS.get(codec_id)\n",
        "    return None\n",
        ("tests/test_codecs.py::test_guards_with_different_codecs_read_each_others_entries",),
        within="reader_for",
    ),
    Mutant(
        "custom-codec-ids-checked",
        "a custom codec cannot claim a built-in codec's id",
        "cacheguard/cache/codec.py",
        "    if built_in is not None and not isinstance(codec, built_in):\n",
        "    if False:\n",
        ("tests/test_codecs.py::test_custom_codecs_are_checked",),
        within="check_codec",
    ),
    # -- compression (cache/compression.py, cache/entry.py, tests/test_compression.py) ------
    Mutant(
        "compress-format-in-the-entry",
        "a compressed entry says how in its header: every guard reads it, whatever its own "
        "compress setting",
        "cacheguard/cache/entry.py",
        "            magic, payload = _COMPRESSED_MAGIC[compress], packed\n",
        "            magic, payload = _MAGIC, packed\n",
        (
            "tests/test_compression.py::test_compressed_entries_name_their_format_and_decode_anywhere[zlib]",
            "tests/test_compression.py::test_entries_of_every_setting_read_in_every_guard[sync]",
            "tests/test_compression.py::test_entries_of_every_setting_read_in_every_guard[async]",
        ),
        within="pack_entry",
    ),
    Mutant(
        "compress-old-entries-read",
        "entries written before compression (format 1) still decode, and uncompressed "
        "entries are still written that way",
        "cacheguard/cache/entry.py",
        '_MAGIC = b"\\xcb\\x01"',
        '_MAGIC = b"\\xcb\\x04"',
        (
            "tests/test_compression.py::test_entries_written_before_compression_still_decode",
            "tests/test_compression.py::test_entries_of_every_setting_read_in_every_guard[sync]",
        ),
        within="_MAGIC",
    ),
    Mutant(
        "compress-stores-compressed",
        "a guard with compress stores large values compressed on every path that stores "
        "(get_or_load, loaders, the decorator, refresh)",
        "cacheguard/cache/flows/fill.py",
        "            compress=settings.compress,\n",
        "            compress=None,\n",
        (
            "tests/test_compression.py::test_every_way_in_stores_and_reads_compressed_entries[sync-zlib]",
            "tests/test_compression.py::test_every_way_in_stores_and_reads_compressed_entries[async-zstd]",
        ),
        within="plan_store",
    ),
    Mutant(
        "compress-threshold-inclusive",
        "payloads of compress_min_size bytes or more are compressed, smaller ones are not",
        "cacheguard/cache/entry.py",
        "len(payload) >= compress_min_size",
        "len(payload) > compress_min_size",
        (
            "tests/test_compression.py::test_the_threshold_is_the_smallest_payload_compressed[1024-zlib]",
            "tests/test_compression.py::test_the_threshold_is_the_smallest_payload_compressed[300-zstd]",
        ),
        within="pack_entry",
    ),
    Mutant(
        "compress-only-when-smaller",
        "a payload compression would not shrink is stored uncompressed",
        "cacheguard/cache/compression.py",
        "    return packed if len(packed) < len(payload) else None\n",
        "    return packed\n",
        (
            "tests/test_compression.py::test_a_payload_compression_would_not_shrink_is_stored_plain[zlib]",
            "tests/test_compression.py::test_a_payload_compression_would_not_shrink_is_stored_plain[zstd]",
        ),
        within="deflate",
    ),
    Mutant(
        "compress-zlib-corrupt-is-a-miss",
        "a zlib payload that does not inflate is a counted miss, never a crash of the read",
        "cacheguard/cache/compression.py",
        "    except zlib.error as exc:\n",
        "    except ArithmeticError as exc:\n",
        (
            "tests/test_compression.py::test_every_bit_flip_of_a_compressed_payload_is_refused_or_harmless[zlib]",
            "tests/test_compression.py::test_a_corrupt_compressed_entry_is_a_counted_miss_and_is_replaced"
            "[sync-flipped-byte-zlib]",
            "tests/test_compression.py::test_a_corrupt_compressed_entry_is_a_counted_miss_and_is_replaced"
            "[async-garbage-after-the-header-zlib]",
        ),
        within="_inflate_zlib",
    ),
    Mutant(
        "compress-zstd-corrupt-is-a-miss",
        "a zstd payload that does not inflate is a counted miss, never a crash of the read",
        "cacheguard/cache/compression.py",
        "    except zstandard.ZstdError as exc:\n",
        "    except ArithmeticError as exc:\n",
        (
            "tests/test_compression.py::test_every_bit_flip_of_a_compressed_payload_is_refused_or_harmless[zstd]",
            "tests/test_compression.py::test_a_corrupt_compressed_entry_is_a_counted_miss_and_is_replaced"
            "[sync-flipped-byte-zstd]",
            "tests/test_compression.py::test_a_corrupt_compressed_entry_is_a_counted_miss_and_is_replaced"
            "[async-garbage-after-the-header-zstd]",
        ),
        within="_inflate_zstd",
    ),
    Mutant(
        "compress-zlib-whole-stream",
        "a zlib payload must be one whole stream: bytes after it are refused",
        "cacheguard/cache/compression.py",
        "    if not stream.eof or stream.unused_data or stream.unconsumed_tail:\n",
        "    if False:\n",
        (
            "tests/test_compression.py::test_truncated_or_extended_compressed_payloads_are_refused[zlib]",
        ),
        within="_inflate_zlib",
    ),
    Mutant(
        "compress-zstd-whole-frame",
        "a zstd payload must be one whole frame of the size it records: bytes after it are refused",
        "cacheguard/cache/compression.py",
        "    if not stream.eof or stream.unused_data or len(payload) != size:\n",
        "    if False:\n",
        (
            "tests/test_compression.py::test_truncated_or_extended_compressed_payloads_are_refused[zstd]",
        ),
        within="_inflate_zstd",
    ),
    Mutant(
        "compress-zlib-inflate-bounded",
        "a zlib payload inflating past MAX_INFLATED is refused before it is all in memory",
        "cacheguard/cache/compression.py",
        "        payload = stream.decompress(data, MAX_INFLATED)\n",
        "        payload = stream.decompress(data)\n",
        ("tests/test_compression.py::test_inflating_is_bounded[zlib]",),
        within="_inflate_zlib",
    ),
    Mutant(
        "compress-zstd-inflate-bounded",
        "a zstd frame recording a size past MAX_INFLATED, or none, is refused before inflating",
        "cacheguard/cache/compression.py",
        "not 0 <= size <= MAX_INFLATED",
        "not 0 <= size",
        ("tests/test_compression.py::test_inflating_is_bounded[zstd]",),
        within="_inflate_zstd",
    ),
    Mutant(
        "compress-zstd-checksum-required",
        "a zstd frame without its checksum is not one of ours (refused)",
        "cacheguard/cache/compression.py",
        "not frame.has_checksum or ",
        "",
        ("tests/test_compression.py::test_a_zstd_frame_that_lies_about_its_size_is_refused",),
        within="_inflate_zstd",
    ),
    Mutant(
        "compress-zstd-missing-entry-is-a-miss",
        "a zstd entry read where zstandard is not installed is a counted miss naming the "
        "extra, never a crash",
        "cacheguard/cache/compression.py",
        "    except ImportError as exc:\n        raise ValueError(",
        "    except ArithmeticError as exc:\n        raise ValueError(",
        (
            "tests/test_compression.py::test_a_zstd_entry_without_zstandard_is_refused_naming_the_extra",
            "tests/test_compression.py::test_a_zstd_entry_read_without_zstandard_is_a_counted_miss[sync]",
            "tests/test_compression.py::test_a_zstd_entry_read_without_zstandard_is_a_counted_miss[async]",
        ),
        within="_inflate_zstd",
    ),
    Mutant(
        "compress-name-checked",
        "an unknown compress name is refused with ValueError when the guard is made",
        "cacheguard/cache/compression.py",
        "    if not isinstance(name, str) or name not in NAMES:\n",
        "    if not isinstance(name, str):\n",
        (
            "tests/test_compression.py::test_an_unknown_compression_is_refused_at_construction[gzip-sync]",
            "tests/test_compression.py::test_an_unknown_compression_is_refused_at_construction[gzip-async]",
        ),
        within="check_compress",
    ),
    Mutant(
        "compress-zstd-needs-its-extra",
        "compress='zstd' without zstandard is refused when the guard is made, naming the extra",
        "cacheguard/cache/compression.py",
        '    if name == "zstd":\n        _zstandard()\n',
        "",
        (
            "tests/test_compression.py::test_zstd_without_zstandard_is_refused_naming_the_extra[sync]",
            "tests/test_compression.py::test_zstd_without_zstandard_is_refused_naming_the_extra[async]",
        ),
        within="check_compress",
    ),
    # -- tests that can fail (issue "Trust"): the hit path, wake-ups, refresh, two tiers ---
    Mutant(
        "hit-is-one-get",
        "a fresh L2 entry is served from its one GET (no script, no lock)",
        "cacheguard/cache/flows/read.py",
        "    if verdict <= REFRESH:\n",
        "    if verdict <= REFRESH and False:\n",
        ("tests/test_cache.py::test_a_warm_hit_is_one_get",),
        within="serve",
    ),
    Mutant(
        "hit-get-seals-the-flight",
        "a read that starts after guard.write returned never takes the answer of a GET "
        "sent before it (the flight is sealed for the leader's GET)",
        "cacheguard/cache/flows/read.py",
        "sealed = flight.generation  # born sealed for this GET",
        "sealed = flight.generation + 1  # born sealed for this GET",
        (
            "tests/test_guarantees.py::"
            "test_a_read_that_starts_after_a_write_never_shares_a_get_sent_before_it",
            "tests/test_guarantees.py::"
            "test_an_async_read_that_starts_after_a_write_never_shares_a_get_sent_before_it",
        ),
        within="hit",
    ),
    Mutant(
        "flow-get-seals-the-flight",
        "the same for a leader's GET sent by the read flow (not the hit path): a read "
        "that starts after guard.write returned never takes its answer",
        "cacheguard/cache/flows/read.py",
        "sealed = flight.generation  # flights are born sealed",
        "sealed = flight.generation + 1  # flights are born sealed",
        (
            "tests/test_guarantees.py::"
            "test_a_read_through_the_flow_that_starts_after_a_write_never_shares_a_get_sent_before_it",
        ),
        within="read_flow",
    ),
    Mutant(
        "hit-judged-by-server-clock",
        "an entry's age is judged by the Redis server's clock: a host whose clock is off "
        "loads nothing again",
        "cacheguard/cache/flows/read.py",
        "    now = state.server_clock.now()\n    verdict = judge(",
        "    now = state.clock()\n    verdict = judge(",
        (
            "tests/test_clock_skew.py::"
            "test_a_host_whose_clock_is_off_loads_nothing_again[sync-10 min fast]",
            "tests/test_clock_skew.py::"
            "test_a_host_whose_clock_is_off_loads_nothing_again[async-10 min fast]",
        ),
        within="judge_read",
    ),
    Mutant(
        "read-samples-server-clock",
        "a read samples the server's clock in its GET's round trip when its last sample "
        "is old (or there is none), before it judges an entry",
        "cacheguard/cache/flows/read.py",
        "if state.timer() < state.server_clock.resample_at:",
        "if True:",
        (
            "tests/test_clock_skew.py::"
            "test_a_host_whose_clock_is_off_loads_nothing_again[sync-10 min fast]",
            "tests/test_clock_skew.py::"
            "test_a_host_whose_clock_is_off_loads_nothing_again[async-10 min fast]",
        ),
        within="read_flow",
    ),
    Mutant(
        "entries-stamped-by-server-clock",
        "a fill stamps its entry (and judges what fill_begin returns) by the server's clock, "
        "so entries a skewed host writes are fresh to the others",
        "cacheguard/cache/flows/read.py",
        "        clock=state.server_clock.now,\n",
        "        clock=state.clock,\n",
        (
            "tests/test_clock_skew.py::"
            "test_a_host_whose_clock_is_off_loads_nothing_again[sync-10 min slow]",
            "tests/test_clock_skew.py::"
            "test_a_host_whose_clock_is_off_loads_nothing_again[async-10 min slow]",
        ),
        within="fill_job",
    ),
    Mutant(
        "fill-samples-server-clock",
        "a fill takes the server's clock from fill_begin's reply (a refresh stamps its entry "
        "by it with no read before)",
        "cacheguard/cache/flows/fill.py",
        "                job.saw_server_clock(begin.begun_ms / 1000, (sent + timer()) / 2)\n",
        "                pass\n",
        (
            "tests/test_clock_skew.py::"
            "test_a_host_whose_clock_is_off_loads_nothing_again[sync-10 min slow]",
            "tests/test_clock_skew.py::"
            "test_a_host_whose_clock_is_off_loads_nothing_again[async-10 min slow]",
        ),
        within="fill_flow",
    ),
    Mutant(
        "l1-hit-sends-nothing",
        "an L1 hit is served from the process's memory, without a Redis command",
        "cacheguard/cache/flows/read.py",
        "        kept = l1.tier.get(name)\n",
        "        kept = ABSENT\n",
        ("tests/test_cache.py::test_an_l1_hit_sends_nothing",),
        within="read_flow",
    ),
    Mutant(
        "cache-waiter-woken-by-announcement",
        "a fill's end announces the stored entry, waking the key's waiters in other processes",
        "cacheguard/cache/scripts.py",
        "  redis.call('SPUBLISH', channel, 'V' .. begun_us .. ':' .. entry)\n",
        "",
        (
            "tests/test_cache_processes.py::"
            "test_waiter_in_another_process_is_woken_by_the_fills_announcement",
        ),
        within="_FILL_END_BODY",
    ),
    Mutant(
        "fill-end-releases-hold",
        "a fill's end releases its read hold on the key's lock",
        "cacheguard/cache/scripts.py",
        "  drop(s, owner, 'r')\n",
        "",
        ("tests/test_cache.py::test_early_refresh_reloads_in_background",),
        within="_FILL_END_BODY",
    ),
    Mutant(
        "refresh-loads-itself",
        "a refresh waits for a fill under way and then loads; it never takes that fill's value",
        "cacheguard/cache/flows/fill.py",
        "for message in messages if not refresh else ():",
        "for message in messages:",
        ("tests/test_cache.py::test_explicit_refresh_waits_for_a_fill_in_progress",),
        within="fill_flow",
    ),
    Mutant(
        "two-tier-owners-distinct",
        "two processes' two-tier locks are distinct owners in Redis, so they exclude each other",
        "cacheguard/locks/two_tier.py",
        'return f"{process_id()}:tt{self._instance}"',
        'return f"{process_id()}:tt"',
        ("tests/test_two_tier.py::test_other_processes_are_excluded_through_redis_until_release",),
        within="TwoTierRWLock.owner",
    ),
    # -- the sans-I/O core (cache/flows/fill.py, wire.py, templates.py) ------------------------
    Mutant(
        "remembered-names-by-exact-type",
        "a remembered key name is reused only for arguments of the same exact types "
        "(True and 1 are equal dict keys, not equal names)",
        "cacheguard/cache/templates.py",
        "                if arg.__class__ is not int and arg.__class__ is not str:\n",
        "                if not isinstance(arg, (int, str)):\n",
        (
            "tests/test_key_names.py::test_remembered_names_keep_equal_arguments_of_other_types_apart",
        ),
        within="KeyBuilder.build",
    ),
    Mutant(
        "fill-end-argv-order",
        "fill_end gets its ARGV in the order its contract states (the store's version "
        "check compares the version fill_begin saw)",
        "cacheguard/cache/wire.py",
        "            begin.epoch,\n            begin.version,\n",
        "            begin.version,\n            begin.epoch,\n",
        (
            "tests/test_flow_scripted.py::"
            "test_the_filler_adopts_its_hold_loads_and_ends_with_a_versioned_store",
        ),
        within="fill_end_call",
    ),
    Mutant(
        "flow-drains-before-begin",
        "announcements received before a retried begin are dropped (they are about a "
        "state the begin re-reads)",
        "cacheguard/cache/flows/fill.py",
        "            if waited_from is not None:\n                yield DRAIN",
        "            if False:\n                yield DRAIN",
        ("tests/test_flow_scripted.py::test_a_late_announcement_from_before_the_begin_is_ignored",),
        within="fill_flow",
    ),
    Mutant(
        "flow-seals-before-begin",
        "the single flight is sealed before each begin, so late followers never take an "
        "answer read before they joined",
        "cacheguard/cache/flows/fill.py",
        "        while True:\n            yield SEAL\n",
        "        while True:\n",
        (
            "tests/test_flow_scripted.py::test_a_value_that_appeared_meanwhile_is_served_from_the_begin",
        ),
        within="fill_flow",
    ),
    # -- the asyncio guard (cacheguard/cache/async_guard.py, async_driver.py) ----------------------
    Mutant(
        "interrupted-leader-frees-followers",
        "followers of a leader that was cancelled or interrupted carry on (one of them "
        "loads); they do not inherit its cancellation or its KeyboardInterrupt",
        "cacheguard/cache/flows/read.py",
        "    if isinstance(exc, Exception):\n"
        "        state.flights.finish(name, flight, error=exc)\n",
        "    if True:\n        state.flights.finish(name, flight, error=exc)\n",
        (
            "tests/test_aio_guard.py::"
            "test_a_filler_cancelled_mid_load_ends_its_fill_and_followers_carry_on",
            "tests/test_review_guard.py::test_followers_of_an_interrupted_sync_leader_carry_on",
        ),
        within="leader_failed",
    ),
    Mutant(
        "aio-cancelled-filler-ends-its-fill",
        "a filler task cancelled while loading still ends its fill and releases its hold",
        "cacheguard/cache/async_driver.py",
        "            except BaseException as exc:\n                step = flow.throw(exc)\n",
        "            except Exception as exc:\n                step = flow.throw(exc)\n",
        (
            "tests/test_aio_guard.py::"
            "test_a_filler_cancelled_mid_load_ends_its_fill_and_followers_carry_on",
        ),
        within="drive_fill_async",
    ),
    Mutant(
        "aio-fill-call-survives-a-second-cancel",
        "a filler task cancelled again during a fill script's round trip still lets the "
        "call finish and ends its fill (no hold left for its lease)",
        "cacheguard/cache/async_driver.py",
        "                self.cancelled = True\n",
        "                self.cancelled = True\n                return await task\n",
        (
            "tests/test_review_guard.py::"
            "test_a_filler_cancelled_twice_during_fill_begin_still_ends_its_fill",
        ),
        within="Deferral.through",
    ),
    Mutant(
        "aio-write-closing-invalidation-shielded",
        "a writer task cancelled during the invalidation after its body still completes it",
        "cacheguard/cache/async_guard.py",
        '        await self._run(flow, "the write", to_the_end=True)\n',
        '        await self._run(flow, "the write")\n',
        (
            "tests/test_review_guard.py::"
            "test_a_writer_cancelled_during_its_closing_invalidation_still_invalidates",
        ),
        within="AsyncCacheGuard.write",
    ),
    Mutant(
        "aio-write-releases-every-lock",
        "a writer task cancelled again while releasing still releases every write lock",
        "cacheguard/cache/async_guard.py",
        "                    elif to_the_end or isinstance(step, ReleaseWrites):\n",
        "                    elif to_the_end:\n",
        (
            "tests/test_review_guard.py::"
            "test_a_writer_cancelled_again_while_releasing_releases_every_lock",
            "tests/test_review_guard.py::"
            "test_a_writer_cancelled_while_acquiring_and_again_while_releasing_frees_its_locks",
        ),
        within="AsyncCacheGuard._run",
    ),
    Mutant(
        "aio-guard-one-event-loop",
        "an AsyncCacheGuard used from a second event loop fails with WrongEventLoop",
        "cacheguard/cache/async_guard.py",
        "        self._binding.check()\n        # template:",
        "        # template:",
        ("tests/test_aio_guard.py::test_a_guard_used_from_a_second_event_loop_fails_clearly",),
        within="AsyncCacheGuard._get_or_load",
    ),
    Mutant(
        "async-tracker-own-session-class",
        "tracking an async_sessionmaker tracks its sessions only, never every Session "
        "of the program",
        "cacheguard/integrations/sqlalchemy/guards.py",
        "        if sync_class is Session:\n",
        "        if False:\n",
        ("tests/test_sqlalchemy_async.py::test_mismatched_guards_and_factories_are_refused",),
        within="session_class_of",
    ),
    Mutant(
        "async-session-hooks-hold-the-keys",
        "an AsyncSession's flush write-locks and invalidates its keys until the commit",
        "cacheguard/integrations/sqlalchemy/guards.py",
        "        return self._run(lock.acquire_write(timeout))"
        "  # for the calling task, the holder\n",
        "        lock.acquire_write(timeout).close()  # type: ignore[union-attr]\n"
        "        return None\n",
        (
            "tests/test_sqlalchemy_async.py::"
            "test_a_reader_waits_for_the_transaction_and_sees_the_commit",
        ),
        within="_Awaiting.acquire_write",
    ),
    Mutant(
        "aio-background-work-own-context",
        "a background refresh starts in a context of its own (not the caller's loads "
        "or database snapshots)",
        "cacheguard/cache/async_guard.py",
        "        task = contextvars.Context().run(loop.create_task, coro, name=name)\n",
        "        task = loop.create_task(coro, name=name)\n",
        ("tests/test_aio_guard.py::test_background_work_starts_in_a_context_of_its_own",),
        within="AsyncCacheGuard._spawn",
    ),
    Mutant(
        "loader-errors-are-the-loaders",
        "a loader's own OSError or redis.ConnectionError is its error: raised once, "
        "never taken for Redis being down (no bypass that loads again, no breaker count)",
        "cacheguard/cache/driver.py",
        "    return isinstance(step, (Load, LoadUnlocked, LoadNow, LoadShared, RunFill, Gutter, "
        "Replay))\n",
        "    return False\n",
        (
            "tests/test_guard_both_drivers.py::"
            "test_a_loaders_own_oserror_is_its_error_not_redis_being_down",
        ),
        within="is_loader",
    ),
    Mutant(
        "unanswered-end-is-not-a-rejection",
        "a fill whose end script got no answer is counted as a backend error, not as a "
        "rejected store",
        "cacheguard/cache/flows/fill.py",
        "        stored = None  # no answer: not a rejection (counted as a backend error)\n",
        "        stored = 0\n",
        (
            "tests/test_flow_scripted.py::"
            "test_a_lost_end_reply_keeps_the_value_and_releases_in_the_background",
        ),
        within="_end",
    ),
    # -- asyncio locks (cacheguard/aio/, locks/redis/wire.py) ------------------------------------
    Mutant(
        "aio-waiters-woken-by-pubsub",
        "the asyncio notifier hands every message to the waiting tasks of its channel",
        "cacheguard/redis/async_notifier.py",
        "                for waiter in list(channel.waiters):"
        "  # a callback may close its subscription\n"
        "                    waiter._deliver(push.payload)\n",
        "                pass\n",
        (
            "tests/test_locks_both_drivers.py::test_a_release_wakes_a_waiter_through_pubsub[async]",
            "tests/test_aio_locks.py::"
            "test_a_sync_holder_blocks_an_async_acquirer_and_its_release_wakes_it",
        ),
        within="AsyncNotifier._dispatch",
    ),
    Mutant(
        "aio-cancel-while-waiting-withdraws",
        "a writer task cancelled while it waits withdraws its waiting mark",
        "cacheguard/locks/redis/async_rwlock.py",
        "                except BaseException as exc:"
        "  # the flow decides; a cancel withdraws a mark\n",
        "                except Exception as exc:\n",
        (
            "tests/test_aio_locks.py::test_a_task_cancelled_while_waiting_leaves_nothing_behind",
            "tests/test_lock_contract_async.py::"
            "test_a_writer_cancelled_while_waiting_leaves_nothing_behind[redis-async]",
        ),
        within="AsyncRedisRWLock._drive",
    ),
    Mutant(
        "aio-cancel-during-acquire-takes-back",
        "a task cancelled during the acquire round trip takes back the hold or mark it got",
        "cacheguard/locks/redis/async_rwlock.py",
        "            undo = self._spawn(self._undo_attempt(running, mode, owner, queued=queue))\n",
        "            undo = self._spawn(asyncio.sleep(0))\n",
        (
            "tests/test_aio_locks.py::"
            "test_a_task_cancelled_during_the_acquire_round_trip_leaks_nothing",
        ),
        within="AsyncRedisRWLock._attempt",
    ),
    Mutant(
        "aio-cancelled-body-releases",
        "a cancelled body inside async with lock.write() releases the lock",
        "cacheguard/locks/async_shape.py",
        "    except BaseException:\n        try:\n            await release()\n",
        "    except BaseException:\n        try:\n            pass\n",
        ("tests/test_aio_locks.py::test_a_cancelled_body_releases",),
        within="release_on_exit",
    ),
    Mutant(
        "aio-watchdog-close-stops-its-task",
        "a closed asyncio watchdog's task (the lease watchdog's and Redlock's) stops even when "
        "a round trip swallowed the cancellation: no renewing for ever, aclose returns",
        "cacheguard/_loop.py",
        "            while number == self._run_number:\n",
        "            while True:\n",
        (
            "tests/test_aio_locks.py::"
            "test_a_closed_watchdog_stops_even_if_its_round_trip_swallows_the_cancel",
            "tests/test_aio_locks.py::"
            "test_a_closed_redlock_watchdog_stops_even_if_its_round_trip_swallows_the_cancel",
        ),
        within="LoopTask._run",
    ),
    Mutant(
        "aio-watchdog-renews",
        "the asyncio watchdog extends a live holder's lease",
        "cacheguard/locks/redis/async_watchdog.py",
        "    return await arun_pipelined(client, [renewal_call(e) for e in entries])\n",
        "    return [1 for _ in entries]\n",
        ("tests/test_locks_both_drivers.py::test_the_watchdog_renews_past_the_lease[async]",),
        within="_run_batch",
    ),
    Mutant(
        "aio-notifier-resubscribes",
        "after a reconnect the asyncio notifier subscribes again to every channel in use",
        "cacheguard/redis/async_notifier.py",
        "        self._unsent = list(self._channels.values())\n",
        "        self._unsent = list(self._channels.values()) if not self.reconnects else []\n",
        ("tests/test_aio_locks.py::test_the_notifier_reconnects_and_waiters_are_still_woken",),
        within="AsyncNotifier._reconnect",
    ),
    Mutant(
        "aio-one-event-loop",
        "an asyncio lock, notifier or watchdog used from a second event loop fails clearly",
        "cacheguard/_loop.py",
        "        elif self._loop() is not loop:\n",
        "        elif False:\n",
        ("tests/test_aio_locks.py::test_a_second_event_loop_is_refused",),
        within="LoopBinding.check",
    ),
    Mutant(
        "wire-acquire-argument-order",
        "the acquire call passes its ARGV in the order of the script's contract",
        "cacheguard/locks/redis/wire.py",
        "        [owner, mode, lease_ms, mark_ms, keys.released_channel],\n",
        "        [owner, mode, mark_ms, lease_ms, keys.released_channel],\n",
        ("tests/test_lock_wire.py::test_acquire_call_follows_its_contract",),
        within="acquire_call",
    ),
    # -- deployments: cluster, Sentinel (issue #13) -------------------------------------------
    Mutant(
        "refusals-are-redis-down",
        "CLUSTERDOWN, TRYAGAIN, MASTERDOWN, READONLY and an uncovered slot are Redis being "
        "down (the backend policy, never a raw error or a corrupt entry)",
        "cacheguard/redis/errors.py",
        "REDIS_DOWN: Final = (*REDIS_UNREACHABLE, *REDIS_REFUSING, NoPermissionError)\n",
        "REDIS_DOWN: Final = (*REDIS_UNREACHABLE, NoPermissionError)\n",
        (
            "tests/test_guard_both_drivers.py::"
            "test_a_deployment_in_transition_is_redis_down_not_a_corrupt_entry",
        ),
        within="REDIS_DOWN",
    ),
    Mutant(
        "sharded-channels-subscribed-alone",
        "each sharded channel gets its own SSUBSCRIBE (a cluster refuses channels of "
        "several slots in one)",
        "cacheguard/redis/pubsub.py",
        "    commands.extend((verbs[True], name) for name in sharded)\n",
        "    commands.extend([(verbs[True], *sharded)] if sharded else [])\n",
        (
            "tests/test_pubsub_wire.py::"
            "test_broadcast_channels_share_a_command_and_sharded_ones_go_alone",
        ),
        within="_commands",
    ),
    Mutant(
        "revoked-channel-wakes-waiters",
        "a sharded channel the server revokes (its slot left the node) wakes its waiters "
        "and is forgotten, so they subscribe again where the slot lives",
        "cacheguard/redis/notifier.py",
        "                    waiters, payload = list(channel.waiters), None\n",
        "                    waiters = []\n",
        (
            "tests/test_notifier_revocation.py::test_a_revoked_channel_wakes_its_waiters_and_is_forgotten",
        ),
        within="Notifier._dispatch",
    ),
    Mutant(
        "aio-revoked-channel-wakes-waiters",
        "the asyncio notifier wakes the waiting tasks of a revoked sharded channel",
        "cacheguard/redis/async_notifier.py",
        "            channel.confirmed.set()\n"
        "            for waiter in list(channel.waiters):\n"
        "                waiter._deliver(None)\n",
        "            channel.confirmed.set()\n",
        (
            "tests/test_notifier_revocation.py::"
            "test_a_revoked_channel_wakes_its_waiting_tasks_and_is_forgotten",
        ),
        within="AsyncNotifier._dispatch",
    ),
    Mutant(
        "cluster-scripts-per-node",
        "script batches on a cluster run as one plain pipeline per node (a cluster "
        "pipeline refuses scripts), so invalidations and renewals work across slots",
        "cacheguard/redis/scripts.py",
        "    if isinstance(client, RedisCluster):\n"
        "        return _run_per_node(client, calls, confirm)\n",
        "",
        ("tests/test_cluster.py::test_every_master_serves_fills_writes_and_invalidations[sync]",),
        within="run_pipelined",
    ),
    Mutant(
        "breaker-per-node",
        "one circuit breaker per cluster node: a dead shard sends only its own keys to "
        "the loaders, the other masters' keys keep hitting",
        "cacheguard/cache/guard.py",
        "            node_of=node_namer(client),\n",
        "            node_of=None,\n",
        ("tests/test_cluster.py::test_a_dead_shard_bypasses_only_its_own_keys[sync]",),
        within="CacheGuard.__init__",
    ),
    Mutant(
        "script-loaded-on-its-own-node",
        "a script missing from a node's cache is loaded on the keys' own node (EVAL), "
        "not on every master, so a dead master does not fail writes elsewhere",
        "cacheguard/redis/scripts.py",
        "            return client.eval(self.source, len(keys), *keys, *args)\n",
        "            client.script_load(self.source)\n"
        "            return client.evalsha(self.sha, len(keys), *keys, *args)\n",
        ("tests/test_cluster.py::test_a_dead_shard_bypasses_only_its_own_keys[sync]",),
        within="LuaScript.__call__",
    ),
    Mutant(
        "write-waits-for-replicas",
        "a write-path invalidation waits for confirm_replicas replicas (WAIT); when too "
        "few acknowledge it, the write fails before its body",
        "cacheguard/cache/flows/write.py",
        "        results = yield Pipelined(tuple(invalidation.calls(names, stamp)), "
        "state.confirm())\n",
        "        results = yield Pipelined(tuple(invalidation.calls(names, stamp)), None)\n",
        (
            "tests/test_write_path_scripted.py::"
            "test_an_unconfirmed_invalidation_fails_the_write_before_its_body",
            "tests/test_guard_both_drivers.py::"
            "test_an_unconfirmed_invalidation_fails_the_write_before_its_body",
            "tests/test_failovers.py::test_sentinel_planned_failover_under_load[sync]",
        ),
        within="invalidate_flow",
    ),
    Mutant(
        "noreplicas-is-refusing",
        "a master refusing writes for want of replicas (NOREPLICAS) is Redis refusing "
        "for now: bypass or BackendUnavailable, never a raw error or a corrupt entry",
        "cacheguard/redis/errors.py",
        '    if type(error) is redis.ResponseError and str(error).startswith("NOREPLICAS"):\n',
        "    if False:\n",
        (
            "tests/test_clients.py::"
            "test_a_master_without_its_replicas_is_redis_refusing_not_an_error",
        ),
        within="classify",
    ),
    Mutant(
        "breaker-probe-expires",
        "a half-open circuit's probe whose outcome never comes back expires after a "
        "cooldown (the circuit does not stay open for good)",
        "cacheguard/cache/outage/breaker.py",
        "            if self._probing and now - self._probe_at < self.cooldown:\n",
        "            if self._probing:\n",
        ("tests/test_breaker.py::test_a_probe_whose_outcome_never_comes_back_expires",),
        within="CircuitBreaker.allow",
    ),
    Mutant(
        "write-lock-failure-counts",
        "a write whose lock script fails counts toward the circuit breaker and "
        "backend_errors, like any Redis failure",
        "cacheguard/cache/flows/write.py",
        "                state.backend_failed(name, client_error(exc))\n                raise\n",
        "                raise\n",
        (
            "tests/test_guard_both_drivers.py::"
            "test_a_write_failing_in_the_lock_layer_counts_toward_the_circuit",
        ),
        within="write_flow",
    ),
    Mutant(
        "circuit-asks-each-breaker-once",
        "a call needing several keys asks each node's breaker once, so a multi-key write "
        "can be the probe of a half-open circuit",
        "cacheguard/cache/flows/state.py",
        "        breakers = {id(breaker): breaker for breaker in needed}.values()\n",
        "        breakers = needed\n",
        (
            "tests/test_trust.py::"
            "test_a_write_of_several_keys_can_be_the_probe_of_a_half_open_circuit",
        ),
        within="GuardState.circuit_open",
    ),
    # -- the invalidation sequence's shard down (issue #13) -------------------------------------
    Mutant(
        "sequence-outage-poisons-instead-of-failing",
        "on a cluster, an invalidation goes through while the namespace's sequence shard is "
        "down (it poisons the versions): writes of keys on healthy shards succeed",
        "cacheguard/cache/flows/write.py",
        "    strict = required or state.breakers.single\n",
        "    strict = True\n",
        (
            "tests/test_write_path_scripted.py::"
            "test_an_unreachable_sequence_on_a_cluster_poisons_instead_of_failing",
            "tests/test_cluster.py::"
            "test_writes_go_on_while_the_invalidation_sequence_shard_is_dead[sync]",
        ),
        within="stamp_flow",
    ),
    Mutant(
        "write-needs-only-its-keys-nodes",
        "a write is not refused because the sequence's circuit is open",
        "cacheguard/cache/flows/write.py",
        "closed = state.circuit_open(f\"writing {', '.join(map(repr, ordered))}\", ordered)",
        "closed = state.circuit_open(f\"writing {', '.join(map(repr, ordered))}\", ordered, "
        "state.invalidation.watermark_key)",
        (
            "tests/test_write_path_scripted.py::"
            "test_a_dead_sequence_opens_its_own_circuit_and_is_not_asked_again",
        ),
        within="write_flow",
    ),
    Mutant(
        "poison-outranks-every-watermark",
        "a poisoned version is above every snapshot watermark: no tracked fill stores it",
        "cacheguard/cache/scripts.py",
        "  if version < floor then version = floor + version + 1 else version = version + 1 end\n",
        "  version = version + 1\n",
        ("tests/test_cache.py::test_a_poisoned_version_refuses_tracked_fills_until_a_heal",),
        within="INVALIDATE",
    ),
    Mutant(
        "heal-only-the-healers-own-poison",
        "a heal replaces a poisoned version only if nobody invalidated the key since",
        "cacheguard/cache/scripts.py",
        "elseif ARGV[5] ~= '' and raw == ARGV[5] then\n",
        "elseif ARGV[5] ~= '' then\n",
        ("tests/test_cache.py::test_a_poisoned_version_refuses_tracked_fills_until_a_heal",),
        within="INVALIDATE",
    ),
    Mutant(
        "poisoned-versions-are-healed",
        "an invalidation that finds a version poisoned heals it with a later number",
        "cacheguard/cache/flows/write.py",
        "        if poisoned:\n",
        "        if False:\n",
        (
            "tests/test_write_path_scripted.py::"
            "test_versions_found_poisoned_are_healed_with_a_number_taken_afterwards",
            "tests/test_cluster.py::"
            "test_writes_go_on_while_the_invalidation_sequence_shard_is_dead[sync]",
        ),
        within="tend_sequence",
    ),
    Mutant(
        "lift-ignores-poison",
        "the sequence is never lifted to a poisoned version",
        "cacheguard/cache/invalidation.py",
        "if isinstance(r, int) and r < POISON_FLOOR),",
        "if isinstance(r, int)),",
        ("tests/test_write_path_scripted.py::test_the_lift_ignores_poisoned_versions",),
        within="Invalidation.lift",
    ),
    Mutant(
        "stamps-are-confirmed",
        "an invalidation number is confirmed by replicas before it is used",
        "cacheguard/cache/flows/write.py",
        "yield Pipelined((invalidation.next_stamp(),), state.confirm())",
        "yield Pipelined((invalidation.next_stamp(),), None)",
        (
            "tests/test_write_path_scripted.py::"
            "test_a_stamp_is_taken_then_every_key_is_stamped_with_it",
        ),
        within="stamp_flow",
    ),
    Mutant(
        "watermark-read-is-confirmed",
        "a snapshot watermark counts only numbers replicas hold",
        "cacheguard/cache/flows/write.py",
        "yield Pipelined((invalidation.read_watermark(),), state.confirm())",
        "yield Pipelined((invalidation.read_watermark(),), None)",
        ("tests/test_write_path_scripted.py::test_the_watermark_is_read_as_a_confirmed_write",),
        within="watermark_flow",
    ),
    Mutant(
        "unplaced-calls-go-again",
        "a call whose slot the client's map does not cover goes again after the map is read anew",
        "cacheguard/redis/scripts.py",
        "            results[index] = exc\n            again.append(index)\n",
        "            results[index] = exc\n",
        (
            "tests/test_cluster.py::"
            "test_a_call_outside_the_clients_slot_map_goes_again_after_reading_it_anew",
        ),
        within="_by_node",
    ),
    # -- the menu-service demo (examples/menu_service, issue #14) ------------------------------
    Mutant(
        "demo-refuses-a-database-with-tables",
        "the demo and serve refuse a DATABASE_URL database that holds tables, unless --reset",
        "examples/menu_service/infra.py",
        "    if found.database_is_ours or reset:\n        return\n",
        "    return\n",
        (
            "tests/test_menu_service.py::"
            "test_a_database_of_yours_that_holds_tables_is_refused_without_reset",
        ),
        within="check_database",
    ),
    Mutant(
        "demo-table-of-its-own",
        "the demo drops and fills only a table of its own name, never a table of yours",
        "examples/menu_service/models.py",
        '    __tablename__ = "cacheguard_demo_menu"\n',
        '    __tablename__ = "menu"\n',
        ("tests/test_menu_service.py::test_with_reset_the_demo_fills_only_its_own_table",),
        within="Menu.__tablename__",
    ),
    Mutant(
        "heal-never-below-the-carried-version",
        "a heal never sets a version below the real version its poison replaced (+1), so "
        "versions only move up even when the sequence went back",
        "cacheguard/cache/scripts.py",
        "  version = math.max(stamp, version - floor + 1)\n",
        "  version = stamp\n",
        ("tests/test_cache.py::test_a_poisoned_version_refuses_tracked_fills_until_a_heal",),
        within="INVALIDATE",
    ),
    Mutant(
        "partial-invalidation-still-lifts",
        "an invalidation that failed for some keys still lifts the sequence to the versions "
        "of the others",
        "cacheguard/cache/flows/write.py",
        "    if stamp is not None:  # also when some keys failed",
        "    if stamp is not None and failed is None:  # also when some keys failed",
        (
            "tests/test_write_path_scripted.py::"
            "test_a_partly_failed_invalidation_still_lifts_the_sequence",
        ),
        within="invalidate_flow",
    ),
    Mutant(
        "sequence-failure-counted-once",
        "a dead node holding both the sequence and the keys counts one failure per call",
        "cacheguard/cache/flows/write.py",
        "    if breaker not in [state.breaker(name) for name in names]:\n",
        "    if True:\n",
        (
            "tests/test_write_path_scripted.py::"
            "test_a_sequence_on_a_node_of_the_keys_is_counted_once",
        ),
        within="stamp_flow",
    ),
    # -- the ZooKeeper lock store (cacheguard/locks/zookeeper/rwlock.py, issue #15) ---------------
    Mutant(
        "zookeeper-reader-waits-for-writers",
        "a ZooKeeper reader waits while a write node is before its own",
        "cacheguard/locks/zookeeper/rwlock.py",
        '            if kind != "write":\n                continue\n',
        "            continue\n",
        ("tests/test_lock_contract.py::test_a_writer_excludes_readers_and_writers[zookeeper]",),
        within="ZooKeeperRWLock._blocker",
    ),
    Mutant(
        "zookeeper-writer-waits-for-everyone",
        "a ZooKeeper writer waits until no node at all is before its own (readers too)",
        "cacheguard/locks/zookeeper/rwlock.py",
        '            if mode == "write":\n                if self._request(',
        "            if False:\n                if self._request(",
        (
            "tests/test_lock_contract.py::"
            "test_a_writer_waits_for_the_readers_then_gets_in[zookeeper]",
        ),
        within="ZooKeeperRWLock._blocker",
    ),
    Mutant(
        "zookeeper-downgrade-in-place",
        "a ZooKeeper downgrade turns the node to read in place and lets queued readers in",
        "cacheguard/locks/zookeeper/rwlock.py",
        "        elif downgrade:\n            self._downgrade(holding)\n",
        "        elif downgrade:\n            pass\n",
        ("tests/test_lock_zookeeper.py::test_a_downgrade_lets_in_the_readers_already_waiting",),
        within="ZooKeeperRWLock.release",
    ),
    Mutant(
        "zookeeper-suspension-marks-lost",
        "a suspended ZooKeeper connection marks every holding of the client lost",
        "cacheguard/locks/zookeeper/rwlock.py",
        "            if state == KazooState.CONNECTED:\n                self.connected.set()",
        "            if state != KazooState.LOST:\n                self.connected.set()",
        (
            "tests/test_lock_zookeeper.py::"
            "test_a_restart_marks_holders_lost_deletes_their_nodes_and_waiters_get_in",
        ),
        within="_Session._on_state",
    ),
    Mutant(
        "zookeeper-lost-release-raises",
        "releasing a lost ZooKeeper handle raises LockLostError",
        "cacheguard/locks/zookeeper/rwlock.py",
        "            if holding.lost:\n                raise handle._lost_at_release()",
        "            if holding.lost:\n                return",
        (
            "tests/test_lock_zookeeper.py::"
            "test_an_expired_session_loses_the_holding_and_frees_the_lock",
        ),
        within="ZooKeeperRWLock.release",
    ),
    Mutant(
        "zookeeper-lost-nodes-swept",
        "a lost holding's znode that survived with the session is deleted once reconnected",
        "cacheguard/locks/zookeeper/rwlock.py",
        "        if state == KazooState.CONNECTED:\n            self.sweep()\n",
        "",
        (
            "tests/test_lock_zookeeper.py::"
            "test_a_restart_marks_holders_lost_deletes_their_nodes_and_waiters_get_in",
        ),
        within="_Session._on_state",
    ),
    Mutant(
        "zookeeper-down-is-unavailable",
        "an acquire that finds ZooKeeper unreachable at its deadline raises BackendUnavailable",
        "cacheguard/locks/zookeeper/rwlock.py",
        "        if not blocking or not self._session.connected.is_set():",
        "        if not blocking:",
        (
            "tests/test_lock_zookeeper.py::"
            "test_a_restart_marks_holders_lost_deletes_their_nodes_and_waiters_get_in",
        ),
        within="ZooKeeperRWLock._give_up",
    ),
    Mutant(
        "zookeeper-fencing-czxid",
        "a ZooKeeper write token is its node's czxid, higher than every earlier write holding's",
        "cacheguard/locks/zookeeper/rwlock.py",
        "            return str(path), int(stat.czxid)",
        "            return str(path), int(str(path)[-10:])",
        ("tests/test_lock_contract.py::test_fencing_tokens_increase[zookeeper]",),
        within="ZooKeeperRWLock._create",
    ),
    Mutant(
        "zookeeper-timeout-withdraws",
        "a ZooKeeper waiter that gives up takes its node out of the queue",
        "cacheguard/locks/zookeeper/rwlock.py",
        "            if node:\n                self._withdraw(node)\n",
        "            if node:\n                pass\n",
        (
            "tests/test_lock_zookeeper.py::"
            "test_a_timed_out_writer_and_a_failed_try_leave_nothing_queued",
        ),
        within="ZooKeeperRWLock._queue_up",
    ),
    Mutant(
        "zookeeper-waiter-requeues",
        "a ZooKeeper waiter whose node went with an expired session queues again",
        "cacheguard/locks/zookeeper/rwlock.py",
        "                except NoNodeError:  # our node went with an expired session\n"
        '                    node = ""\n',
        "                except NoNodeError:  # our node went with an expired session\n"
        "                    self._give_up(mode, owner, start, blocking)\n",
        ("tests/test_lock_zookeeper.py::test_a_waiter_whose_session_expired_queues_again",),
        within="ZooKeeperRWLock._queue_up",
    ),
    Mutant(
        "zookeeper-owners-per-client",
        "ZooKeeper holdings are counted per kazoo client, shared by its lock objects",
        "cacheguard/locks/zookeeper/rwlock.py",
        "            client._cacheguard_session = session\n",
        "",
        ("tests/test_lock_zookeeper.py::test_owners_are_counted_per_client_across_lock_objects",),
        within="_session_of",
    ),
    Mutant(
        "zookeeper-reentrant",
        "a ZooKeeper owner re-enters its holding without a new node",
        "cacheguard/locks/zookeeper/rwlock.py",
        "                if holding is not None:\n                    return self._reenter(",
        "                if False:\n                    return self._reenter(",
        ("tests/test_lock_contract.py::test_reentrant_and_downgrade[zookeeper]",),
        within="ZooKeeperRWLock._acquire_or_none",
    ),
    Mutant(
        "zookeeper-upgrade-refused",
        "a ZooKeeper read holder asking for the write lock gets LockUpgradeError",
        "cacheguard/locks/zookeeper/rwlock.py",
        "                raise LockUpgradeError(name=self.name, owner=owner)\n",
        "                pass\n",
        ("tests/test_lock_contract.py::test_upgrade_is_refused[zookeeper]",),
        within="ZooKeeperRWLock._reenter",
    ),
    # -- Redlock (cacheguard/locks/redlock/: quorum.py and its drivers rwlock.py, async_rwlock.py) -
    Mutant(
        "redlock-majority-needed",
        "a Redlock is granted only when a majority of its masters granted it",
        "cacheguard/locks/redlock/quorum.py",
        "        return len(self.granted) >= quorum\n",
        "        return len(self.granted) >= 1\n",
        (
            "tests/test_lock_redlock.py::test_a_round_without_a_majority_gives_back_its_grants",
            "tests/test_lock_redlock.py::"
            "test_three_of_five_masters_down_refuses_and_leaves_nothing[read]",
        ),
        within="Round.has_majority",
    ),
    Mutant(
        "redlock-validity-checked",
        "a majority that granted after the lease minus elapsed time minus drift ran out is refused",
        "cacheguard/locks/redlock/quorum.py",
        "    if outcome.has_majority(quorum) and fenced and now < valid_until:\n",
        "    if outcome.has_majority(quorum) and fenced:\n",
        ("tests/test_lock_redlock.py::test_a_grant_that_came_too_late_is_refused",),
        within="settle_round",
    ),
    Mutant(
        "redlock-failed-round-gives-back",
        "a round without a majority releases what it was granted, on every master that granted it",
        "cacheguard/locks/redlock/quorum.py",
        "i: wire.release_call(keys, owner, mode, epoch) for i, epoch in granted.items()",
        "i: wire.withdraw_call(keys, owner) for i, epoch in granted.items()",
        ("tests/test_lock_redlock.py::test_a_round_without_a_majority_gives_back_its_grants",),
        within="give_back_calls",
    ),
    Mutant(
        "redlock-release-on-every-master",
        "release goes to every master holding the handle, not just a majority of them",
        "cacheguard/locks/redlock/quorum.py",
        "        for i, epoch in enumerate(handle.epochs)\n        if epoch is not None\n",
        "        for i, epoch in enumerate(handle.epochs)\n"
        "        if epoch is not None and i < 3\n",
        ("tests/test_lock_redlock.py::test_release_frees_every_master",),
        within="release_calls",
    ),
    Mutant(
        "redlock-frozen-master-bounded",
        "a frozen master costs one instance_timeout per round, whatever its client's timeouts "
        "(sync and asyncio clients alike)",
        "cacheguard/locks/redlock/quorum.py",
        "kwargs[setting] = instance_timeout if value is None else min(value, instance_timeout)",
        "kwargs[setting] = value",
        (
            "tests/test_lock_redlock.py::test_a_frozen_master_does_not_stall_an_acquire",
            "tests/test_lock_redlock.py::test_async_frozen_master_does_not_stall_an_acquire",
        ),
        within="master_connection_kwargs",
    ),
    Mutant(
        "redlock-unanswered-master-tidied",
        "a master that did not answer an acquire call is tidied: what the call left there "
        "is released",
        "cacheguard/locks/redlock/quorum.py",
        "    unanswered += outcome.unanswered\n",
        "",
        ("tests/test_lock_redlock.py::test_a_master_that_did_not_answer_is_tidied_once_it_wakes",),
        within="round_flow",
    ),
    Mutant(
        "redlock-renewal-needs-majority",
        "a renewal counts only when a majority renewed; a handle left on a minority is lost",
        "cacheguard/locks/redlock/quorum.py",
        "    if renewed >= quorum and in_time:\n",
        "    if renewed >= 1 and in_time:\n",
        ("tests/test_lock_redlock.py::test_renewal_needs_a_majority",),
        within="renewal_verdict",
    ),
    Mutant(
        "redlock-fencing-across-majorities",
        "a write token is written back to the granting masters' counters, so tokens increase "
        "across different majorities",
        "cacheguard/locks/redlock/quorum.py",
        "        calls = {i: raise_call for i in outcome.granted}\n",
        "        calls = {i: (RAISE_FENCE, [keys.fence], [0]) for i in outcome.granted}\n",
        ("tests/test_lock_redlock.py::test_fencing_tokens_increase_across_different_majorities",),
        within="round_flow",
    ),
    Mutant(
        "redlock-writer-queued-on-majority",
        "a waiting Redlock writer leaves its mark on the masters, so new readers queue behind it",
        "cacheguard/locks/redlock/quorum.py",
        "            mark_ms=self._mark_ms if queued else 0,\n",
        "            mark_ms=0,\n",
        (
            "tests/test_lock_contract.py::test_writer_preference[redlock]",
            "tests/test_lock_contract_async.py::test_writer_preference[redlock-async]",
        ),
        within="RedlockCommon._round_flow",
    ),
    Mutant(
        "redlock-give-back-releases-grants",
        "a writer that gives a round back releases the masters that granted it (withdrawing "
        "its mark there would leave the holding)",
        "cacheguard/locks/redlock/quorum.py",
        "        calls.setdefault(i, wire.withdraw_call(keys, owner))\n",
        "        calls[i] = wire.withdraw_call(keys, owner)\n",
        (
            "tests/test_quorum_scripted.py::"
            "test_a_caller_that_gave_up_gets_its_grant_released_not_withdrawn",
            "tests/test_lock_redlock.py::"
            "test_async_task_cancelled_during_a_round_gives_back_what_it_got",
        ),
        within="give_back_calls",
    ),
    Mutant(
        "redlock-split-vote-withdraws",
        "writers that split the masters withdraw their marks, so the next round is not "
        "ordered differently on each master for ever",
        "cacheguard/locks/redlock/quorum.py",
        "        withdraw=tuple(outcome.marked) if (split or upgrade or unreachable) else (),\n",
        "        withdraw=(),\n",
        ("tests/test_quorum_scripted.py::test_a_split_vote_gives_back_and_says_so",),
        within="settle_round",
    ),
    Mutant(
        "redlock-async-cancelled-round-gives-back",
        "an asyncio task cancelled during a Redlock round gives back what the round got",
        "cacheguard/locks/redlock/async_rwlock.py",
        "        if calls:\n            await self._masters.run(FanOut(calls))\n",
        "        if calls:\n            pass\n",
        (
            "tests/test_lock_redlock.py::"
            "test_async_task_cancelled_during_a_round_gives_back_what_it_got",
        ),
        within="AsyncRedlockRWLock._give_back",
    ),
    Mutant(
        "redlock-async-waiter-withdraws",
        "an asyncio Redlock writer cancelled while it waits withdraws its marks on every master",
        "cacheguard/locks/redlock/async_rwlock.py",
        "                        await self._shielded("
        "self._masters.run(self._withdraw_step(owner)))\n",
        "                        pass\n",
        (
            "tests/test_lock_redlock.py::test_async_cancelled_waiting_writer_withdraws_its_marks",
            "tests/test_lock_contract_async.py::"
            "test_a_writer_cancelled_while_waiting_leaves_nothing_behind[redlock-async]",
        ),
        within="AsyncRedlockRWLock._drive",
    ),
    # -- the PostgreSQL lock store (cacheguard/locks/postgres/core.py: the decisions both --------
    # drivers share; locks/postgres/rwlock.py and async_rwlock.py: sessions and watches)
    Mutant(
        "pg-upgrade-refused",
        "an owner that only reads gets LockUpgradeError for the write lock (PostgreSQL would "
        "grant it while no one else reads)",
        "cacheguard/locks/postgres/core.py",
        "            return Plan.UPGRADE if count.reads else Plan.CALL\n",
        "            return Plan.CALL\n",
        (
            "tests/test_lock_contract.py::test_upgrade_is_refused[postgres]",
            "tests/test_lock_contract_async.py::test_upgrade_is_refused[postgres-async]",
        ),
        within="Holds.plan",
    ),
    Mutant(
        "pg-downgrade-takes-the-shared-lock",
        "a read while writing takes the shared lock at the server too, so it outlasts the write",
        "cacheguard/locks/postgres/core.py",
        "        return Plan.REENTER if count.reads else Plan.CALL\n",
        "        return Plan.REENTER\n",
        (
            "tests/test_lock_contract.py::test_reentrant_and_downgrade[postgres]",
            "tests/test_lock_contract_async.py::test_reentrant_and_downgrade[postgres-async]",
        ),
        within="Holds.plan",
    ),
    Mutant(
        "pg-reentrant-unlock-on-last",
        "nested holds of one mode are counted: only the last release unlocks at the server",
        "cacheguard/locks/postgres/core.py",
        "            last = count.writes == 0\n",
        "            last = True\n",
        (
            "tests/test_lock_contract.py::test_reentrant_and_downgrade[postgres]",
            "tests/test_lock_contract_async.py::test_reentrant_and_downgrade[postgres-async]",
        ),
        within="Holds.released",
    ),
    Mutant(
        "pg-connection-parked-only-empty",
        "an owner's connection goes back for reuse only when it holds no lock",
        "cacheguard/locks/postgres/rwlock.py",
        "        if not session.broken and not session.holds and session.conn is not None:\n",
        "        if not session.broken and session.conn is not None:\n",
        ("tests/test_lock_contract.py::test_a_writer_excludes_readers_and_writers[postgres]",),
        within="_Book.leave",
    ),
    Mutant(
        "pg-fencing-tokens",
        "a fresh write holding draws a new, higher token from the fencing sequence",
        "cacheguard/locks/postgres/core.py",
        '_FENCE_TOKEN: Final = "nextval(to_regclass(%(fence)s))"\n',
        '_FENCE_TOKEN: Final = "1::bigint"\n',
        (
            "tests/test_lock_contract.py::test_fencing_tokens_increase[postgres]",
            "tests/test_lock_contract_async.py::test_fencing_tokens_increase[postgres-async]",
        ),
        within="_FENCE_TOKEN",
    ),
    Mutant(
        "pg-deadline-is-lock-timeout",
        "a wait ends at its deadline: lock_timeout is what is left of it",
        "cacheguard/locks/postgres/core.py",
        '        params["ms"] = lock_timeout_ms(deadline - timer())\n',
        '        params["ms"] = "0"\n',
        ("tests/test_lock_postgres.py::test_a_wait_ends_at_its_deadline",),
        within="_lock_call",
    ),
    Mutant(
        "pg-timeout-raises-lock-timeout",
        "a wait that ends at its deadline raises LockTimeout, not BackendUnavailable",
        "cacheguard/locks/postgres/core.py",
        "                if _sqlstate(exc) in _WAIT_ENDED:\n",
        "                if False:\n",
        (
            "tests/test_lock_contract.py::"
            "test_timeout_raises_lock_timeout_naming_the_lock[postgres]",
            "tests/test_lock_contract_async.py::"
            "test_timeout_raises_lock_timeout_naming_the_lock[postgres-async]",
        ),
        within="_lock_call",
    ),
    Mutant(
        "pg-lock-not-available-is-a-timeout",
        "lock_not_available (SQLSTATE 55P03: lock_timeout at the deadline) means LockTimeout, "
        "for the session locks and the transaction-scoped ones alike",
        "cacheguard/locks/postgres/core.py",
        '_WAIT_ENDED: Final = frozenset({"55P03", "57014", "40P01"})\n',
        '_WAIT_ENDED: Final = frozenset({"57014", "40P01"})\n',
        (
            "tests/test_lock_postgres.py::test_a_wait_ends_at_its_deadline",
            "tests/test_lock_postgres.py::test_write_in_timing_out_leaves_the_transaction_usable",
        ),
        within="_WAIT_ENDED",
    ),
    Mutant(
        "pg-failed-acquire-undone",
        "an acquire statement that fails after the grant is followed by an unlock: no hold "
        "stays in a session uncounted",
        "cacheguard/locks/postgres/core.py",
        "                # session lock outlives its statement's error): let it go again.\n"
        "                yield from _unlock_quietly(lock, session, mode)\n",
        "                # session lock outlives its statement's error): let it go again.\n",
        ("tests/test_lock_postgres.py::test_a_failed_acquire_leaves_no_hold_behind",),
        within="_lock_call",
    ),
    Mutant(
        "pg-missing-fence-sequence-made",
        "a missing fencing sequence is made on first use, then the token drawn from it",
        "cacheguard/locks/postgres/core.py",
        "        if token is None and fenced:  # granted, but the fencing sequence is missing\n",
        "        if False:\n",
        ("tests/test_lock_postgres.py::test_a_missing_fence_sequence_is_made_on_first_use",),
        within="_lock_call",
    ),
    Mutant(
        "pg-interrupt-while-making-the-sequence-unlocks",
        "an acquire interrupted (or cancelled) while it makes the missing fencing sequence "
        "lets the just-granted lock go again",
        "cacheguard/locks/postgres/core.py",
        "        # lock is not counted yet, so it may not stay held.\n"
        "        yield from _unlock_quietly(lock, session, mode)\n",
        "        # lock is not counted yet, so it may not stay held.\n",
        (
            "tests/test_lock_postgres.py::"
            "test_an_interrupt_while_making_the_fence_sequence_leaves_no_lock_behind",
            "tests/test_lock_postgres.py::"
            "test_a_cancel_while_making_the_fence_sequence_leaves_no_lock_behind",
        ),
        within="_token_after_making_the_sequence",
    ),
    Mutant(
        "pg-unreachable-is-backend-unavailable",
        "a server that cannot be reached raises BackendUnavailable naming the lock, not a raw "
        "driver error",
        "cacheguard/locks/postgres/core.py",
        "            except (DBAPIError, psycopg.Error, OSError) as exc:\n",
        "            except () as exc:\n",
        ("tests/test_lock_postgres.py::test_an_unreachable_server_raises_backend_unavailable",),
        within="_lock_call",
    ),
    Mutant(
        "pg-watch-marks-lost",
        "the session watch marks the handles of a session the server ended lost, unasked",
        "cacheguard/locks/postgres/rwlock.py",
        "            elif not alive(conn):\n",
        "            elif False:\n",
        (
            "tests/test_lock_postgres.py::"
            "test_a_terminated_session_frees_the_lock_and_its_handles_report_it",
        ),
        within="SessionWatch._check",
    ),
    Mutant(
        "pg-release-reports-lost",
        "release of a hold whose session ended raises LockLostError",
        "cacheguard/locks/postgres/core.py",
        "            raise handle._lost_at_release() from exc\n",
        "            pass\n",
        ("tests/test_lock_postgres.py::test_release_reports_a_lost_session_even_unwatched",),
        within="release_flow",
    ),
    Mutant(
        "pg-reentry-checks-the-session",
        "a reentrant acquisition on a session that ended starts a new one instead of counting "
        "a hold nobody has",
        "cacheguard/locks/postgres/core.py",
        "            if plan is not Plan.CALL and session.conn is not None and not "
        "alive(session.conn):\n",
        "            if False:\n",
        ("tests/test_lock_postgres.py::test_a_reentry_on_an_ended_session_starts_afresh",),
        within="_acquiring",
    ),
    Mutant(
        "pg-session-keepalives",
        "a lock session has the server probe its client, so a vanished holder frees its locks "
        "within KEEPALIVE_WITHIN",
        "cacheguard/locks/postgres/core.py",
        '        "tcp_keepalives_idle": "10",\n'
        '        "tcp_keepalives_interval": "5",\n'
        '        "tcp_keepalives_count": "3",\n',
        "",
        (
            "tests/test_lock_postgres.py::"
            "test_a_lock_session_is_never_ended_by_server_timeouts_and_probes_its_client",
        ),
        within="session_settings",
    ),
    Mutant(
        "pg-fork-keeps-off-the-parents-session",
        "a forked child never releases (or touches) its parent's holds",
        "cacheguard/locks/postgres/core.py",
        "    if handle.session.pid != os.getpid():\n",
        "    if False:\n",
        (
            "tests/test_lock_postgres.py::"
            "test_a_forked_child_neither_inherits_nor_breaks_the_parents_hold",
        ),
        within="releasable",
    ),
    Mutant(
        "pg-keys-length-prefixed",
        "lock keys are stable and unambiguous: namespace and name each prefixed by their length",
        "cacheguard/locks/postgres/core.py",
        '        digest.update(len(data).to_bytes(8, "big"))\n',
        "",
        ("tests/test_lock_postgres.py::test_distinct_names_get_distinct_keys",),
        within="advisory_key",
    ),
    Mutant(
        "pg-xact-lock-ends-with-the-transaction",
        "write_in's lock is transaction-scoped: the commit releases it",
        "cacheguard/locks/postgres/core.py",
        "                   ELSE pg_try_advisory_xact_lock(:key) END AS ok FROM mine)",
        "                   ELSE pg_try_advisory_lock(:key) END AS ok FROM mine)",
        (
            "tests/test_lock_postgres.py::"
            "test_write_in_lasts_exactly_as_long_as_the_transaction[commit]",
        ),
        within="_XACT_TRY",
    ),
    Mutant(
        "pg-xact-timeout-keeps-the-transaction",
        "write_in waits in a savepoint: a LockTimeout leaves the caller's transaction usable",
        "cacheguard/locks/postgres/core.py",
        '        yield RunIn(conn, f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}", rows=False)\n'
        '        yield RunIn(conn, f"RELEASE SAVEPOINT {_SAVEPOINT}", rows=False)\n'
        "        if _sqlstate(exc) in",
        "        if _sqlstate(exc) in",
        ("tests/test_lock_postgres.py::test_write_in_timing_out_leaves_the_transaction_usable",),
        within="_wait_in",
    ),
    Mutant(
        "pg-xact-lock-timeout-restored",
        "write_in puts the transaction's lock_timeout back after its wait",
        "cacheguard/locks/postgres/core.py",
        "     granted AS MATERIALIZED (SELECT pg_advisory_xact_lock(:key) FROM deadline),\n"
        "     restored AS MATERIALIZED (\n"
        "       SELECT set_config('lock_timeout', previous.value, true) FROM granted, previous)",
        "     granted AS MATERIALIZED (SELECT pg_advisory_xact_lock(:key) FROM deadline),\n"
        "     restored AS MATERIALIZED (\n"
        "       SELECT current_setting('lock_timeout') FROM granted, previous)",
        ("tests/test_lock_postgres.py::test_write_in_waits_for_a_session_holder_then_gets_in",),
        within="_XACT_WAIT",
    ),
    Mutant(
        "pg-xact-upgrade-refused",
        "a transaction holding only the read lock gets LockUpgradeError for the write lock",
        "cacheguard/locks/postgres/core.py",
        "       SELECT CASE WHEN reads AND NOT writes THEN NULL\n",
        "       SELECT CASE WHEN false THEN NULL\n",
        ("tests/test_lock_postgres.py::test_write_in_refuses_an_upgrade",),
        within="_XACT_TRY",
    ),
    Mutant(
        "pg-async-cancel-undone",
        "an asyncio wait cancelled after the server granted it unlocks before the "
        "cancellation goes on",
        "cacheguard/locks/postgres/core.py",
        "            # wait in the server): granted or not, nothing may stay behind uncounted.\n"
        "            yield from _unlock_quietly(lock, session, mode)\n",
        "            # wait in the server): granted or not, nothing may stay behind uncounted.\n",
        (
            "tests/test_lock_postgres.py::"
            "test_an_async_wait_cancelled_after_its_grant_leaves_nothing_behind",
        ),
        within="_lock_call",
    ),
    Mutant(
        "pg-async-cancelled-release-finishes",
        "an asyncio release cancelled before it began finishes in the background",
        "cacheguard/locks/postgres/async_rwlock.py",
        "            book.spawn(self._release_later(handle))\n",
        "            book.spawn(asyncio.sleep(0))\n",
        ("tests/test_lock_postgres.py::test_a_cancelled_async_release_finishes_in_the_background",),
        within="AsyncPostgresRWLock.release",
    ),
    Mutant(
        "pg-async-watch-marks-lost",
        "the loop watches the sockets of asyncio lock sessions: one the server ended marks "
        "its handles lost",
        "cacheguard/locks/postgres/async_rwlock.py",
        "        elif not alive(conn):\n",
        "        elif False:\n",
        ("tests/test_lock_postgres.py::test_async_terminated_session_marks_its_handles_lost",),
        within="_AsyncBook._readable",
    ),
    Mutant(
        "pg-async-watch-survives-statements",
        "the asyncio watch steps aside while psycopg reads the socket and comes back after",
        "cacheguard/locks/postgres/async_rwlock.py",
        "                self.unwatch(session)  # psycopg reads the socket itself while we "
        "use it\n",
        "",
        ("tests/test_lock_postgres.py::test_async_terminated_session_marks_its_handles_lost",),
        within="_AsyncBook.enter",
    ),
    # -- write locks from another store (cacheguard/cache/write_locks.py, issue #15) ----------
    Mutant(
        "write-locks-from-the-store",
        "guard.write takes its write locks from the write_locks store when given one",
        "cacheguard/cache/write_locks.py",
        "    return None if checked is None else lambda name: StoreWriteLock(checked(name))\n",
        "    return None\n",
        ("tests/test_write_locks.py::test_guard_write_takes_the_stores_lock[redis]",),
        within="store_write_locks",
    ),
    Mutant(
        "write-locks-hooks-use-the-store",
        "tracked sessions take their write locks from the guard's write_locks store",
        "cacheguard/integrations/sqlalchemy/guards.py",
        "        return self.guard.write_lock(name)\n\n    def acquire_write(self, lock: Any, "
        "timeout: float | None, holder: Any) -> Any:\n"
        "        return lock.acquire_write(timeout, holder=holder)\n",
        "        return self.guard.rwlock(name)\n\n    def acquire_write(self, lock: Any, "
        "timeout: float | None, holder: Any) -> Any:\n"
        "        return lock.acquire_write(timeout, holder=holder)\n",
        ("tests/test_write_locks.py::test_tracked_sessions_take_the_stores_lock[redis]",),
        within="_Blocking",
    ),
    Mutant(
        "write-locks-async-from-the-store",
        "an AsyncCacheGuard's write path takes its locks from its asyncio write_locks store",
        "cacheguard/cache/write_locks.py",
        "    return None if checked is None else lambda name: AsyncStoreWriteLock(checked(name))\n",
        "    return None\n",
        ("tests/test_write_locks.py::test_an_asyncio_guard_takes_an_asyncio_stores_lock",),
        within="async_store_write_locks",
    ),
    Mutant(
        "write-locks-async-refuses-a-sync-store",
        "an AsyncCacheGuard refuses a sync store with a clear TypeError and gives its hold back",
        "cacheguard/cache/write_locks.py",
        "        if not inspect.isawaitable(pending):\n",
        "        if False:\n",
        ("tests/test_write_locks.py::test_an_asyncio_guard_refuses_a_sync_store",),
        within="AsyncStoreWriteLock.acquire_write",
    ),
    Mutant(
        "lock-factory-uses-the-store",
        "LockFactory(store=...) puts the store's lock behind the local tier",
        "cacheguard/locks/two_tier.py",
        "        if self._store is not None:\n            # The store's own settings",
        "        if False:\n            # The store's own settings",
        (
            "tests/test_write_locks.py::"
            "test_a_lock_factory_puts_the_stores_lock_behind_its_local_tier[redis]",
        ),
        within="LockFactory._create",
    ),
    # -- the mutation check itself (tools/mutants.py) ------------------------------------------
    Mutant(
        "mutants-jobs-run-at-once",
        "--jobs N checks N mutants at the same time (CI relies on it to stay within its time)",
        "tools/mutants.py",
        "    return check(args.only, args.jobs)\n",
        "    return check(args.only)\n",
        ("tests/test_mutants.py::test_jobs_check_mutants_at_the_same_time",),
        within="main",
    ),
    Mutant(
        "mutants-hypothesis-plugin-where-used",
        "a mutant whose tests use hypothesis runs them with hypothesis's pytest plugin",
        "tools/mutants.py",
        'plugins = [] if uses_hypothesis(tests) else ["-p", "no:hypothesispytest"]',
        'plugins = ["-p", "no:hypothesispytest"]',
        ("tests/test_mutants.py::test_the_hypothesis_plugin_is_loaded_only_for_tests_that_use_it",),
        within="pytest_command",
    ),
    Mutant(
        "mutants-keep-bytecode-caches",
        "a mutant's tests write and reuse bytecode caches even where the environment says not to",
        "tools/mutants.py",
        '    env.pop("PYTHONDONTWRITEBYTECODE", None)\n',
        "",
        ("tests/test_mutants.py::test_a_mutants_tests_keep_bytecode_caches",),
        within="test_environment",
    ),
    Mutant(
        "mutants-kill-what-runs-left",
        "a process a mutant's tests started and left running is killed when they end",
        "tools/mutants.py",
        "            _kill_group(proc.pid)  # what the tests left behind, or everything on a "
        "stop\n",
        "            pass\n",
        ("tests/test_mutants.py::test_a_mutants_run_leaves_nothing_running",),
        within="run_tests",
    ),
    Mutant(
        "mutants-runs-are-sessions",
        "a mutant's tests run in a process group of their own, which takes what they start",
        "tools/mutants.py",
        "        start_new_session=True,\n",
        "        start_new_session=False,\n",
        ("tests/test_mutants.py::test_a_mutants_run_leaves_nothing_running",),
        within="run_tests",
    ),
    Mutant(
        "mutants-hung-run-killed",
        "a mutant's run that outlives RUN_TIMEOUT is killed with everything it started",
        "tools/mutants.py",
        "            _kill_group(proc.pid)\n            proc.communicate()\n",
        "            proc.communicate()\n",
        ("tests/test_mutants.py::test_a_hung_mutants_run_is_killed_with_all_it_started",),
        within="run_tests",
    ),
    Mutant(
        "mutants-stop-kills-runs",
        "a stop signal kills every run under way, with what it started, and the check ends",
        "tools/mutants.py",
        "    for group in groups:\n        _kill_group(group)\n",
        "",
        ("tests/test_mutants.py::test_a_stopped_check_kills_its_runs_and_what_they_started",),
        within="stop_running",
    ),
    Mutant(
        "mutants-no-run-after-a-stop",
        "once the check is stopped, no further mutant's tests start",
        "tools/mutants.py",
        "            if _STOPPING.is_set():\n                return\n",
        "",
        ("tests/test_mutants.py::test_no_mutant_is_checked_after_a_stop",),
        within="check.run",
    ),
    Mutant(
        "mutants-patch-inside-its-anchor",
        "a mutant's patch applies inside its anchor's definition only, not wherever else in "
        "the file its find text occurs",
        "tools/mutants.py",
        "original[: site.start] + inside + original[site.end :]",
        "original.replace(mutant.find, mutant.replace)",
        ("tests/test_mutants.py::test_a_patch_applies_once_inside_its_anchor_only",),
        within="apply",
    ),
    Mutant(
        "mutants-moved-anchor-found",
        "a mutant whose file moved, or whose definition moved to another module, is found "
        "again by its anchor",
        "tools/mutants.py",
        "        found.extend((file, text, d) for d in named(text, mutant.within))\n",
        "",
        (
            "tests/test_mutants.py::test_a_moved_file_is_found_by_its_anchor",
            "tests/test_mutants.py::test_a_function_moved_to_another_module_is_found_by_its_anchor",
        ),
        within="defined_elsewhere",
    ),
    Mutant(
        "mutants-ambiguous-anchor-refused",
        "an anchor defined in several modules, which the find text does not tell apart, is "
        "an error naming them all, never a guess",
        "tools/mutants.py",
        "    if len(fitting) != 1:\n        places",
        "    if not fitting:\n        places",
        ("tests/test_mutants.py::test_an_anchor_defined_in_two_modules_is_ambiguous",),
        within="locate",
    ),
    Mutant(
        "mutants-anchor-twice-in-a-file-refused",
        "an anchor its file defines twice (a property's setter) is an error, never the first",
        "tools/mutants.py",
        "    if len(here) > 1:\n",
        "    if False:\n",
        ("tests/test_mutants.py::test_an_anchor_defined_twice_in_its_file_is_ambiguous",),
        within="locate",
    ),
    Mutant(
        "mutants-drift-shows-closest-lines",
        "a find text no longer in its anchor is reported with the lines now closest to it",
        "tools/mutants.py",
        "        report += closest_lines(text[site.start : site.end], site.first, mutant.find)\n",
        "",
        (
            "tests/test_mutants.py::test_a_drifted_find_text_is_reported_with_the_closest_lines",
            "tests/test_mutants.py::test_the_check_reports_a_patch_that_no_longer_applies",
        ),
        within="_check_find",
    ),
    Mutant(
        "mutants-moved-file-warned",
        "the check warns of each mutant found by its anchor in another file, to update its file=",
        "tools/mutants.py",
        "    moved = warn_moved(mutants, ROOT)\n",
        "    moved = 0\n",
        ("tests/test_mutants.py::test_the_check_patches_a_moved_file_and_warns",),
        within="check",
    ),
    # -- the menu service on FastAPI (examples/menu_service: api, limits, server; #14) ----------
    Mutant(
        "service-body-refused-from-its-header",
        "a body announced over 64 KiB is refused with 413 before a byte of it is read",
        "examples/menu_service/limits.py",
        "        if announced is not None and announced > self.max_bytes:\n",
        "        if False:\n",
        (
            "tests/test_menu_service_http.py::test_every_bad_request_gets_a_json_4xx_and_the_server_goes_on[200-MB-body]",
            "tests/test_menu_service_http.py::test_every_bad_request_gets_a_json_4xx_and_the_server_goes_on[50-MB-name]",
        ),
        within="BodyLimits.__call__",
    ),
    Mutant(
        "service-body-counted-as-it-arrives",
        "a chunked body that grows past 64 KiB is cut off with 413",
        "examples/menu_service/limits.py",
        "                if received > self.max_bytes:\n",
        "                if False:\n",
        (
            "tests/test_menu_service_http.py::test_every_bad_request_gets_a_json_4xx_and_the_server_goes_on[chunked-body-over-64-KiB]",
        ),
        within="BodyLimits._limited.limited",
    ),
    Mutant(
        "service-body-deadline",
        "a client that announces more body than it sends is answered 408, not waited for",
        "examples/menu_service/limits.py",
        "message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0))",
        "message = await receive()",
        (
            "tests/test_menu_service_http.py::test_every_bad_request_gets_a_json_4xx_and_the_server_goes_on[Content-Length-above-the-body]",
        ),
        within="BodyLimits._limited.limited",
    ),
    Mutant(
        "service-head-deadline",
        "a request head that never finishes is answered 408 and the connection closed",
        "examples/menu_service/limits.py",
        "        super().connection_made(transport)\n        self._arm_head_timer()\n",
        "        super().connection_made(transport)\n",
        (
            "tests/test_menu_service_http.py::test_every_bad_request_gets_a_json_4xx_and_the_server_goes_on[request-head-never-finished]",
        ),
        within="GuardedH11Protocol.connection_made",
    ),
    Mutant(
        "service-protocol-errors-are-json",
        "a request that is not HTTP (Content-Length: abc) gets a JSON 400, not plain text",
        "examples/menu_service/limits.py",
        "    def send_400_response(self, msg: str) -> None:\n",
        "    def _plain_400_response(self, msg: str) -> None:\n",
        (
            "tests/test_menu_service_http.py::test_every_bad_request_gets_a_json_4xx_and_the_server_goes_on[Content-Length-abc]",
            "tests/test_menu_service_http.py::test_every_bad_request_gets_a_json_4xx_and_the_server_goes_on[not-HTTP]",
        ),
        within="GuardedH11Protocol.send_400_response",
    ),
    Mutant(
        "service-no-control-characters",
        "a name or URL holding a control character (NUL) is refused with 422",
        "examples/menu_service/api.py",
        "            if unicodedata.category(char) in _REFUSED_CATEGORIES:\n",
        "            if False:\n",
        (
            "tests/test_menu_service_http.py::test_every_bad_request_gets_a_json_4xx_and_the_server_goes_on[NUL-in-a-name]",
        ),
        within="MenuUpdate.storable_text",
    ),
    Mutant(
        "service-errors-do-not-echo-input",
        "a validation error names the field and never echoes the client's input",
        "examples/menu_service/api.py",
        "    @app.exception_handler(RequestValidationError)\n",
        "    @app.exception_handler(LookupError)\n",
        (
            "tests/test_menu_service_http.py::test_every_bad_request_gets_a_json_4xx_and_the_server_goes_on[name-over-100]",
        ),
        within="create_app.invalid",
    ),
    Mutant(
        "service-parent-must-exist",
        "parent_id must name an existing menu",
        "examples/menu_service/repository.py",
        '            raise InvalidParent(f"parent_id {parent_id}: no menu {ancestor}")\n',
        "            break\n",
        (
            "tests/test_menu_service_http.py::test_every_bad_request_gets_a_json_4xx_and_the_server_goes_on[missing-parent]",
        ),
        within="check_parent",
    ),
    Mutant(
        "service-parent-no-cycle",
        "parent_id must not make a menu its own ancestor",
        "examples/menu_service/repository.py",
        "    seen = {menu_id}\n",
        "    seen = set()\n",
        (
            "tests/test_menu_service_http.py::test_every_bad_request_gets_a_json_4xx_and_the_server_goes_on[own-parent]",
            "tests/test_menu_service_http.py::test_every_bad_request_gets_a_json_4xx_and_the_server_goes_on[parent-below]",
        ),
        within="check_parent",
    ),
    Mutant(
        "service-parent-checked-under-the-list-lock",
        "writes take menu:list's write lock before checking parents: no cycle from two writes",
        "examples/menu_service/repository.py",
        "            self.guard.write(LIST_KEY, MENU_KEY.format(menu_id=menu_id)),\n",
        "            self.guard.write(MENU_KEY.format(menu_id=menu_id)),\n",
        ("tests/test_menu_service_http.py::test_writes_check_parents_under_the_list_lock",),
        within="MenuRepository.update_menu_by_id",
    ),
    Mutant(
        "service-stops-gracefully",
        "SIGTERM and SIGINT finish requests in flight, then remove the throwaway Redis and files",
        "examples/menu_service/cli.py",
        "    with stop_signals_raise(), contextlib.suppress(Stopped):\n",
        "    with contextlib.suppress(Stopped):\n",
        (
            "tests/test_menu_service_http.py::test_a_stop_signal_finishes_requests_in_flight_and_leaves_nothing_behind[SIGTERM]",
            "tests/test_menu_service_http.py::test_a_stop_signal_while_starting_leaves_nothing_behind",
        ),
        within="serve",
    ),
    Mutant(
        "service-later-heads-have-a-deadline",
        "every request head of a kept-alive connection has a deadline, not only the first",
        "examples/menu_service/limits.py",
        "        super().on_response_complete()\n        self._arm_head_timer()",
        "        super().on_response_complete()\n        pass",
        (
            "tests/test_menu_service_http.py::test_a_later_request_head_on_a_kept_alive_connection_has_a_deadline_too",
        ),
        within="GuardedH11Protocol.on_response_complete",
    ),
    Mutant(
        "service-body-deadline-is-total",
        "the body deadline bounds the whole body, not each piece (a byte at a time is cut off)",
        "examples/menu_service/limits.py",
        "message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0))",
        "message = await asyncio.wait_for(receive(), self.body_timeout)",
        (
            "tests/test_menu_service_http.py::test_a_body_sent_a_byte_at_a_time_is_cut_off_at_the_deadline",
        ),
        within="BodyLimits._limited.limited",
    ),
    Mutant(
        "service-unread-body-closes",
        "a request answered before its body was read has its connection closed",
        "examples/menu_service/limits.py",
        "        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():\n",
        "        if False:\n",
        ("tests/test_menu_service_http.py::test_a_body_nobody_reads_ends_the_connection",),
        within="GuardedH11Protocol.on_response_complete",
    ),
    Mutant(
        "service-restart-forgets-the-old-cache",
        "serve invalidates its namespace's menu keys at start (the table was seeded anew)",
        "examples/menu_service/api.py",
        '        sync_guard.invalidate_prefix("menu:")\n',
        "",
        (
            "tests/test_menu_service_http.py::test_a_restart_does_not_serve_what_an_earlier_run_cached",
        ),
        within="create_app.lifespan",
    ),
    Mutant(
        "service-negative-id-is-422",
        "an id below 1 is refused with 422, negative ones too (not a 404 for want of a route)",
        "examples/menu_service/api.py",
        '    regex = "-?[0-9]+"\n',
        '    regex = "[0-9]+"\n',
        (
            "tests/test_menu_service_http.py::test_every_bad_request_gets_a_json_4xx_and_the_server_goes_on[negative-id]",
            "tests/test_menu_service_http.py::test_every_bad_request_gets_a_json_4xx_and_the_server_goes_on[PUT-negative-id]",
        ),
        within="_SignedInt",
    ),
    Mutant(
        "service-stats-count-updates",
        "/stats counts every PUT that committed (writes.updates)",
        "examples/menu_service/api.py",
        '        now.write_counts.count("updates")\n',
        "",
        ("tests/test_menu_service_http.py::test_stats_count_the_writes",),
        within="create_app.update_menu",
    ),
    Mutant(
        "service-stats-count-refused-writes",
        "/stats counts every PUT refused for its menu or its parent (writes.not_found, "
        "writes.invalid_parent)",
        "examples/menu_service/api.py",
        '            now.write_counts.count("invalid_parent")\n',
        "",
        ("tests/test_menu_service_http.py::test_stats_count_the_writes",),
        within="create_app.update_menu",
    ),
    Mutant(
        "demo-runs-as-a-module",
        "python -m examples.menu_service runs the demo, as python examples/menu_service does",
        "examples/menu_service/__main__.py",
        "        from .cli import main as run  # noqa: PLC0415\n",
        "        from menu_service.cli import main as run  # noqa: PLC0415\n",
        ("tests/test_menu_service.py::test_the_demo_runs_as_a_folder_and_as_a_module[module]",),
        within="main",
    ),
    Mutant(
        "demo-explains-a-higher-median",
        "the demo says under its table why cacheguard's median read is the slower one",
        "examples/menu_service/demo.py",
        '    if p50.get("cacheguard", 0.0) > p50.get("unprotected", math.inf):\n',
        "    if False:\n",
        (
            "tests/test_menu_service.py::test_a_higher_median_with_cacheguard_is_explained[1.52-True]",
        ),
        within="format_table",
    ),
    Mutant(
        "demo-explains-only-a-higher-median",
        "the demo explains a slower cacheguard median only when it is the slower one",
        "examples/menu_service/demo.py",
        '    if p50.get("cacheguard", 0.0) > p50.get("unprotected", math.inf):\n',
        '    if p50.get("cacheguard", 0.0) >= p50.get("unprotected", math.inf):\n',
        (
            "tests/test_menu_service.py::test_a_higher_median_with_cacheguard_is_explained[1.18-False]",
        ),
        within="format_table",
    ),
    Mutant(
        "demo-accepts-its-own-table",
        "a database holding only the demo's own table (from an earlier run) needs no --reset",
        "examples/menu_service/infra.py",
        "    tables = [t for t in tables if t != Menu.__tablename__]",
        "    tables = list(tables)",
        (
            "tests/test_menu_service.py::"
            "test_a_database_holding_only_the_demos_own_table_is_used_without_reset",
        ),
        within="check_database",
    ),
    # -- prometheus metrics (cacheguard/integrations/prometheus.py, issue #14) ----------------
    Mutant(
        "metrics-label-by-template-not-key",
        "a CacheLoader's events carry its key template, never the key name",
        "cacheguard/cache/loader.py",
        "            template=self._label,\n        )\n        return value\n\n    def refresh(",
        "            template=name,\n        )\n        return value\n\n    def refresh(",
        (
            "tests/test_prometheus.py::test_misses_loads_and_hits_are_labelled_by_template_never_by_key",
        ),
        within="CacheLoader",
    ),
    Mutant(
        "metrics-async-label-by-template-not-key",
        "an AsyncCacheLoader's events carry its key template, never the key name",
        "cacheguard/cache/async_loader.py",
        "            template=self._label,\n        )\n"
        "        return value\n\n    async def refresh(",
        "            template=name,\n        )\n        return value\n\n    async def refresh(",
        (
            "tests/test_prometheus.py::test_misses_loads_and_hits_are_labelled_by_template_never_by_key",
        ),
        within="AsyncCacheLoader",
    ),
    Mutant(
        "metrics-events-carry-template",
        "every event offered to the hooks carries the call's template",
        "cacheguard/cache/stats.py",
        "CacheEvent(kind, key, seconds, error, template)",
        "CacheEvent(kind, key, seconds, error)",
        (
            "tests/test_prometheus.py::test_misses_loads_and_hits_are_labelled_by_template_never_by_key",
            "tests/test_prometheus.py::test_the_sync_loaders_pass_their_template_to_every_call",
        ),
        within="StatsRecorder.count",
    ),
    Mutant(
        "metrics-fill-events-templated",
        "the fill flow's events (lock waits among them) carry the key's template",
        "cacheguard/cache/flows/read.py",
        "count=functools.partial(state.recorder.count, template=template),",
        "count=state.recorder.count,",
        ("tests/test_prometheus.py::test_a_stampede_of_several_guards_counts_lock_waits",),
        within="fill_job",
    ),
    Mutant(
        "metrics-loads-templated",
        "the sync driver's loads carry the key's template",
        "cacheguard/cache/driver.py",
        "value, seconds = self.loads.run(self.name, self.load, self.template)",
        "value, seconds = self.loads.run(self.name, self.load)",
        (
            "tests/test_prometheus.py::test_misses_loads_and_hits_are_labelled_by_template_never_by_key",
        ),
        within="FillDriver.answer",
    ),
    Mutant(
        "metrics-async-loads-templated",
        "the asyncio driver's loads carry the key's template",
        "cacheguard/cache/async_driver.py",
        "value, seconds = await arun_load(self.loads, self.name, self.load, self.template)",
        "value, seconds = await arun_load(self.loads, self.name, self.load)",
        (
            "tests/test_prometheus.py::test_misses_loads_and_hits_are_labelled_by_template_never_by_key",
        ),
        within="AsyncFillDriver.answer",
    ),
    Mutant(
        "metrics-bypass-counted",
        "a call answered by the loader because Redis failed or its circuit is open counts a bypass",
        "cacheguard/cache/flows/state.py",
        '        self.recorder.count("bypasses", name, 0.0, None, template)\n',
        "",
        ("tests/test_prometheus.py::test_a_bypass_with_redis_unreachable_is_counted",),
        within="GuardState.refuse_bypass",
    ),
    Mutant(
        "metrics-bypass-backend-error-templated",
        "the backend error behind a bypass carries the key's template",
        "cacheguard/cache/flows/read.py",
        "            state.backend_failed(name, exc, template=template)\n",
        "            state.backend_failed(name, exc)\n",
        ("tests/test_prometheus.py::test_a_bypass_with_redis_unreachable_is_counted",),
        within="bypass",
    ),
    Mutant(
        "metrics-hits-by-tier",
        "hits are counted by their tier (l1, l2)",
        "cacheguard/integrations/prometheus.py",
        '_TIERS: Final = {"l1_hits": "l1", "l2_hits": "l2"}',
        '_TIERS: Final = {"l1_hits": "l2", "l2_hits": "l2"}',
        (
            "tests/test_prometheus.py::test_l1_hits_are_counted_by_tier",
            "tests/test_prometheus.py::test_every_counter_is_wired",
        ),
        within="_TIERS",
    ),
    Mutant(
        "metrics-every-counter-wired",
        "every event kind reaches its own counter",
        "cacheguard/integrations/prometheus.py",
        "        elif kind in metrics.counters:\n",
        '        elif kind in ("misses", "loads"):\n',
        ("tests/test_prometheus.py::test_every_counter_is_wired",),
        within="_GuardHook._resolve",
    ),
    Mutant(
        "metrics-lock-wait-histogram",
        "each lock wait's seconds go to the lock-wait histogram",
        "cacheguard/integrations/prometheus.py",
        "histogram = metrics.lock_wait_seconds.labels(*labels)",
        "histogram = None",
        ("tests/test_prometheus.py::test_a_stampede_of_several_guards_counts_lock_waits",),
        within="_GuardHook._resolve",
    ),
    Mutant(
        "metrics-load-histogram",
        "each load's seconds go to the load histogram",
        "cacheguard/integrations/prometheus.py",
        "histogram = metrics.load_seconds.labels(*labels)",
        "histogram = None",
        (
            "tests/test_prometheus.py::test_misses_loads_and_hits_are_labelled_by_template_never_by_key",
        ),
        within="_GuardHook._resolve",
    ),
    Mutant(
        "metrics-hook-failure-contained",
        "an event hook that raises never fails the cache call",
        "cacheguard/cache/stats.py",
        "                except Exception:\n                    log.exception(",
        "                except ZeroDivisionError:\n                    log.exception(",
        ("tests/test_prometheus.py::test_a_failing_hook_never_breaks_a_call",),
        within="StatsRecorder.count",
    ),
    Mutant(
        "metrics-hooks-added-once",
        "an event hook added twice is called once per event",
        "cacheguard/cache/stats.py",
        "            if hook not in self._hooks:\n"
        "                self._hooks = (*self._hooks, hook)\n",
        "            self._hooks = (*self._hooks, hook)\n",
        ("tests/test_prometheus.py::test_hooks_are_added_once_and_removed",),
        within="StatsRecorder.add_hook",
    ),
    Mutant(
        "metrics-instrument-once",
        "a guard instrumented twice is counted once",
        "cacheguard/integrations/prometheus.py",
        "            if guard in self._hooks:\n                return guard\n",
        "",
        ("tests/test_prometheus.py::test_hooks_are_added_once_and_removed",),
        within="CacheMetrics.instrument",
    ),
    Mutant(
        "metrics-refusal-registers-nothing",
        "a CacheMetrics refused by a registry leaves none of its metrics registered",
        "cacheguard/integrations/prometheus.py",
        "            for collector in done:\n                self.registry.unregister(collector)\n",
        "            pass\n",
        ("tests/test_prometheus.py::test_one_registry_takes_one_cache_metrics_until_it_is_closed",),
        within="CacheMetrics._register",
    ),
    Mutant(
        "metrics-close-unregisters",
        "a closed CacheMetrics leaves its registry free for a new one",
        "cacheguard/integrations/prometheus.py",
        "        for collector in self._collectors:\n"
        "            self.registry.unregister(collector)\n",
        "",
        ("tests/test_prometheus.py::test_one_registry_takes_one_cache_metrics_until_it_is_closed",),
        within="CacheMetrics.close",
    ),
    Mutant(
        "metrics-multiprocess-aggregates",
        "in multiprocess mode the exposition aggregates every worker's samples",
        "cacheguard/integrations/prometheus.py",
        "        if multiprocess_mode():\n",
        "        if False:\n",
        ("tests/test_prometheus.py::test_multiprocess_mode_aggregates_the_workers",),
        within="CacheMetrics.exposition",
    ),
    # -- OpenTelemetry traces (cacheguard/integrations/opentelemetry.py, issue #26) ------------
    Mutant(
        "otel-sync-call-span",
        "each get_or_load of the sync guard is a span, its load a child span of it",
        "cacheguard/cache/guard.py",
        '        trace = None if tracer is None else tracer.begin("get_or_load", template)\n',
        "        trace = None\n",
        ("tests/test_opentelemetry.py::test_a_load_then_a_hit",),
        within="CacheGuard._get_or_load",
    ),
    Mutant(
        "otel-async-call-span",
        "each get_or_load of the asyncio guard is a span, its load a child span of it",
        "cacheguard/cache/async_guard.py",
        '        trace = None if tracer is None else tracer.begin("get_or_load", template)\n',
        "        trace = None\n",
        ("tests/test_opentelemetry.py::test_a_load_then_a_hit",),
        within="AsyncCacheGuard._get_or_load",
    ),
    Mutant(
        "otel-sync-call-exception",
        "a sync get_or_load that raises records the exception on its span (status ERROR)",
        "cacheguard/cache/guard.py",
        "            if trace is not None:\n                trace.failed(exc)\n",
        "            pass\n",
        ("tests/test_opentelemetry.py::test_the_loaders_exception_is_recorded",),
        within="CacheGuard._get_or_load",
    ),
    Mutant(
        "otel-async-call-exception",
        "an asyncio get_or_load that raises records the exception on its span (status ERROR)",
        "cacheguard/cache/async_guard.py",
        "            if trace is not None:\n                trace.failed(exc)\n",
        "            pass\n",
        ("tests/test_opentelemetry.py::test_the_loaders_exception_is_recorded",),
        within="AsyncCacheGuard._get_or_load",
    ),
    Mutant(
        "otel-sync-calls-traced",
        "refresh, peek, invalidate and invalidate_prefix of the sync guard are spans too",
        "cacheguard/cache/guard.py",
        "        if tracer is None:\n",
        "        if True:\n",
        ("tests/test_opentelemetry.py::test_every_call_is_a_span",),
        within="CacheGuard._traced",
    ),
    Mutant(
        "otel-async-calls-traced",
        "refresh, peek, invalidate and invalidate_prefix of the asyncio guard are spans too",
        "cacheguard/cache/async_guard.py",
        "        if tracer is None:\n",
        "        if True:\n",
        ("tests/test_opentelemetry.py::test_every_call_is_a_span",),
        within="AsyncCacheGuard._traced",
    ),
    Mutant(
        "otel-load-span",
        "each run of the loader in a traced call is a cacheguard.load span",
        "cacheguard/cache/loading.py",
        "        trace = None if self.tracer is None else self.tracer.load(name, template)\n",
        "        trace = None\n",
        (
            "tests/test_opentelemetry.py::test_a_load_then_a_hit",
            "tests/test_opentelemetry.py::test_spans_nest_in_each_callers_current_span",
        ),
        within="Loads.loading",
    ),
    Mutant(
        "otel-load-exception",
        "a loader's exception is recorded on its cacheguard.load span",
        "cacheguard/cache/loading.py",
        "            if trace is not None:\n                trace.failed(exc)\n",
        "",
        ("tests/test_opentelemetry.py::test_the_loaders_exception_is_recorded",),
        within="Loads.loading",
    ),
    Mutant(
        "otel-leader-wait",
        "a caller that waits for the leader of its process is a wait, with a wait span",
        "cacheguard/cache/flows/read.py",
        "            state.waited_for_leader(name, waiting)\n",
        "",
        ("tests/test_opentelemetry.py::test_a_caller_waits_for_the_leader_of_its_process",),
        within="read_flow",
    ),
    Mutant(
        "otel-lock-wait-span",
        "a wait on the key's lock (a filler elsewhere) is a child span of the call",
        "cacheguard/integrations/opentelemetry.py",
        '            self._child(call, "wait", event.seconds, "lock")\n',
        "            pass\n",
        ("tests/test_opentelemetry.py::test_a_caller_waits_on_the_lock_of_a_filler_elsewhere",),
        within="_Tracer.__call__",
    ),
    Mutant(
        "otel-outcome-ranked",
        "a call's outcome is the highest-ranked it went through: a bypass that loads is a bypass",
        "cacheguard/integrations/opentelemetry.py",
        "        if rank >= self.rank:\n",
        "        if True:\n",
        ("tests/test_opentelemetry.py::test_redis_down_is_a_bypass",),
        within="_Call.saw",
    ),
    Mutant(
        "otel-stale-outcome",
        "an expired entry served within the stale window is a stale outcome",
        "cacheguard/integrations/opentelemetry.py",
        '    "stale_served": (STALE, 2),\n',
        '    "stale_served": (HIT, 0),\n',
        ("tests/test_opentelemetry.py::test_an_expired_entry_in_the_stale_window_is_stale",),
        within="_OUTCOMES",
    ),
    Mutant(
        "otel-hit-tier",
        "a hit's span says its tier (l1, l2)",
        "cacheguard/integrations/opentelemetry.py",
        '_TIERS: Final = {"l1_hits": "l1", "l2_hits": "l2"}',
        '_TIERS: Final = {"l1_hits": "l2", "l2_hits": "l2"}',
        ("tests/test_opentelemetry.py::test_an_l1_hit",),
        within="_TIERS",
    ),
    Mutant(
        "otel-template-attribute",
        "a call's span carries its key template",
        "cacheguard/integrations/opentelemetry.py",
        '                attributes["cacheguard.key.template"] = template\n',
        "                pass\n",
        (
            "tests/test_opentelemetry.py::test_a_load_then_a_hit",
            "tests/test_opentelemetry.py::test_every_call_is_a_span",
        ),
        within="_Tracer._start",
    ),
    Mutant(
        "otel-span-is-current",
        "a call's span (and its load's) is current while it runs: the loader's spans nest in it",
        "cacheguard/integrations/opentelemetry.py",
        "        self._context_token = otel_context.attach(trace.set_span_in_context(self.span))\n",
        "        self._context_token = None\n",
        ("tests/test_opentelemetry.py::test_spans_nest_in_each_callers_current_span",),
        within="_Active.enter",
    ),
    Mutant(
        "otel-parent-is-callers-span",
        "a call's span is the child of the span current in the caller's thread or task",
        "cacheguard/integrations/opentelemetry.py",
        '            f"cacheguard.{what}", kind=SpanKind.INTERNAL, attributes=attributes\n',
        '            f"cacheguard.{what}",\n'
        "            context=otel_context.Context(),\n"
        "            kind=SpanKind.INTERNAL,\n"
        "            attributes=attributes,\n",
        (
            "tests/test_opentelemetry.py::test_spans_nest_in_each_callers_current_span",
            "tests/test_opentelemetry.py::test_asyncio_tasks_keep_their_own_spans",
        ),
        within="_Tracer._start",
    ),
    Mutant(
        "otel-caller-span-restored",
        "a call gives the caller its current span back when it ends",
        "cacheguard/integrations/opentelemetry.py",
        "            otel_context.detach(self._context_token)\n",
        "            pass\n",
        ("tests/test_opentelemetry.py::test_asyncio_tasks_keep_their_own_spans",),
        within="_Active.end",
    ),
    Mutant(
        "otel-events-stay-in-their-call",
        "a nested call's events go to its own span, and the outer call's after it to the outer",
        "cacheguard/integrations/opentelemetry.py",
        "            _CALL.reset(self._call_token)\n",
        "            pass\n",
        ("tests/test_opentelemetry.py::test_spans_nest_in_each_callers_current_span",),
        within="_Call.end",
    ),
    Mutant(
        "otel-background-refresh-untraced",
        "a background refresh, part of no call, makes no span",
        "cacheguard/integrations/opentelemetry.py",
        "            return _NOT_TRACED  # a background refresh: part of no call\n",
        "            pass\n",
        ("tests/test_opentelemetry.py::test_an_expired_entry_in_the_stale_window_is_stale",),
        within="_Tracer.load",
    ),
    Mutant(
        "otel-error-type",
        "a call or load that raises carries error.type (the semantic conventions' attribute)",
        "cacheguard/integrations/opentelemetry.py",
        '        self.span.set_attribute("error.type", _qualified(type(error)))\n',
        "",
        ("tests/test_opentelemetry.py::test_the_loaders_exception_is_recorded",),
        within="_Active.failed",
    ),
    Mutant(
        "otel-instrument-once",
        "a guard is traced by one instrumentation at a time: a second is refused",
        "cacheguard/integrations/opentelemetry.py",
        "    if state.tracer is not None:\n",
        "    if False:\n",
        ("tests/test_opentelemetry.py::test_uninstrument_undoes_instrument",),
        within="instrument",
    ),
    Mutant(
        "otel-uninstrument-stops-spans",
        "uninstrument stops the spans",
        "cacheguard/integrations/opentelemetry.py",
        "            state.set_tracer(None)\n",
        "            pass\n",
        ("tests/test_opentelemetry.py::test_uninstrument_undoes_instrument",),
        within="GuardTracing.uninstrument",
    ),
    Mutant(
        "otel-uninstrument-removes-hook",
        "uninstrument removes the event hook it added",
        "cacheguard/integrations/opentelemetry.py",
        "        guard.remove_event_hook(tracer)\n",
        "",
        ("tests/test_opentelemetry.py::test_uninstrument_undoes_instrument",),
        within="GuardTracing.uninstrument",
    ),
    Mutant(
        "otel-global-provider-default",
        "without a tracer_provider the spans go to the global one, even one set later",
        "cacheguard/integrations/opentelemetry.py",
        "trace.get_tracer(SCOPE, __version__, tracer_provider)",
        "trace.get_tracer(SCOPE, __version__, tracer_provider or trace.NoOpTracerProvider())",
        ("tests/test_opentelemetry.py::test_the_global_tracer_provider_is_the_default",),
        within="instrument",
    ),
    Mutant(
        "lean-import-no-opentelemetry",
        "import cacheguard loads no integration's library (opentelemetry, prometheus_client)",
        "cacheguard/__init__.py",
        "from cacheguard._lazy import lazy_exports\n",
        "import opentelemetry.trace  # noqa: F401\nfrom cacheguard._lazy import lazy_exports\n",
        ("tests/test_layout.py::test_import_cacheguard_is_lean",),
    ),
    # -- the dogpile.cache backend (cacheguard/integrations/dogpile.py, issue #14) ------------
    Mutant(
        "dogpile-mutex-not-reentrant",
        "a held dogpile mutex is not re-entered: acquire(False) on its key returns False, from "
        "the holding thread and through the holding mutex too",
        "cacheguard/integrations/dogpile.py",
        "            if self.holder is not None:\n                if not wait:\n",
        "            if self.holder is not None and self.holder is not mutex:\n"
        "                if not wait:\n",
        ("tests/test_dogpile_backend.py::test_mutex_is_not_reentrant_in_one_thread",),
        within="_KeyGate.acquire",
    ),
    Mutant(
        "dogpile-mutex-excludes-processes",
        "a dogpile mutex is the key's own lock in Redis: one holder across every process",
        "cacheguard/integrations/dogpile.py",
        "return _KeyGate(self.guard.rwlock(name), self._client, self._fence_ms)",
        'return _KeyGate(self.guard.rwlock(f"{id(self)}:{name}"), self._client, self._fence_ms)',
        (
            "tests/test_dogpile_backend.py::test_mutex_is_not_reentrant_in_one_thread",
            "tests/test_dogpile_backend.py::"
            "test_a_stampede_of_processes_creates_once_and_wakes_waiters_by_release",
        ),
        within="CacheGuardBackend._new_gate",
    ),
    Mutant(
        "dogpile-waiters-woken-by-release",
        "a region's waiters in other processes are woken by the lock's release message, not a poll",
        "cacheguard/locks/redis/lua.py",
        "if after ~= before then redis.call('SPUBLISH', channel, after or 'free') end",
        "",
        (
            "tests/test_dogpile_backend.py::"
            "test_a_stampede_of_processes_creates_once_and_wakes_waiters_by_release",
        ),
        within="_RELEASE_BODY",
    ),
    Mutant(
        "dogpile-hold-passed-on-one-round",
        "a process passes its hold of a key among its own waiting threads for one round "
        "only, then lets the other processes in",
        "cacheguard/integrations/dogpile.py",
        "                self._passes = self.waiting\n",
        "                self._passes = 1 << 62\n",
        ("tests/test_dogpile_backend.py::test_a_busy_process_still_lets_another_process_in",),
        within="_KeyGate.release",
    ),
    Mutant(
        "lock-holder-id-is-no-thread",
        "a write hold taken for an explicit Holder belongs to it, not to the calling "
        "context: the caller does not re-enter it and any thread releases it (dogpile's "
        "async creation runner)",
        "cacheguard/locks/local.py",
        "        me = enter_holder(holder)\n        dropped = False\n        try:\n"
        "            with self._cond:\n                n = me.number\n"
        "                if self._writer == n:\n",
        "        me = enter_holder()\n        dropped = False\n        try:\n"
        "            with self._cond:\n                n = me.number\n"
        "                if self._writer == n:\n",
        (
            "tests/test_dogpile_backend.py::"
            "test_a_write_hold_for_a_holder_id_is_released_from_another_thread",
            "tests/test_dogpile_backend.py::"
            "test_the_async_creation_runner_releases_from_its_own_thread",
        ),
        within="LocalRWLock.acquire_write",
    ),
    Mutant(
        "dogpile-redis-expiration-time",
        "redis_expiration_time is every stored value's TTL in Redis",
        "cacheguard/integrations/dogpile.py",
        "            self._client.set(self.guard.keys(name).value, _bytes(key, value), "
        "px=self._px)\n",
        "            self._client.set(self.guard.keys(name).value, _bytes(key, value))\n",
        ("tests/test_dogpile_backend.py::test_redis_expiration_time_is_the_values_ttl_in_redis",),
        within="CacheGuardBackend.set_serialized",
    ),
    Mutant(
        "dogpile-fence-counter-expires",
        "a dogpile key's fencing counter expires soon after the release of its hold "
        "(max(lease, redis_expiration_time), not the lock layer's day)",
        "cacheguard/integrations/dogpile.py",
        "    \"redis.call('PEXPIRE', KEYS[#KEYS], ARGV[#ARGV])\\n\"\n",
        "",
        (
            "tests/test_dogpile_backend.py::test_creations_leave_no_key_that_never_expires",
            "tests/test_dogpile_backend.py::"
            "test_without_redis_expiration_time_a_counter_lives_a_lease_past_its_release",
        ),
        within="_RELEASE_EXPIRING_FENCE",
    ),
    Mutant(
        "dogpile-delete-expires-fence-counter",
        "delete / delete_multi give the key's fencing counter its expiry (a holder that "
        "died before its release left it without one)",
        "cacheguard/integrations/dogpile.py",
        "            pipe.pexpire(resource.fence, self._fence_ms)\n",
        "",
        ("tests/test_dogpile_backend.py::test_delete_gives_a_dead_holders_counter_its_lifetime",),
        within="CacheGuardBackend._delete",
    ),
    Mutant(
        "dogpile-port-db-checked-at-configure",
        "dogpile.cache.redis's port and db are checked at configure, not at the first call",
        "cacheguard/integrations/dogpile.py",
        '        "port": _whole(given, "port", 6379, low=1, high=65535),\n'
        '        "db": _whole(given, "db", 0, low=0),\n',
        '        "port": given.get("port", 6379),\n        "db": given.get("db", 0),\n',
        (
            "tests/test_dogpile_backend.py::"
            "test_connection_arguments_fail_configure_not_the_first_call",
        ),
        within="_client_from",
    ),
    Mutant(
        "dogpile-connection-kwargs-checked-at-configure",
        "connection_kwargs redis-py does not take are refused at configure, with the names "
        "it takes",
        "cacheguard/integrations/dogpile.py",
        "    options.update(_connection_kwargs(given))\n",
        '    options.update(given.get("connection_kwargs") or {})\n',
        (
            "tests/test_dogpile_backend.py::"
            "test_connection_arguments_fail_configure_not_the_first_call",
        ),
        within="_client_from",
    ),
    Mutant(
        "dogpile-connection-built-at-configure",
        "a connection argument refused only by the connection class redis-py picks fails "
        "configure (one connection is made, not connected)",
        "cacheguard/integrations/dogpile.py",
        "            pool.connection_class(**pool.connection_kwargs)\n",
        "            pass\n",
        (
            "tests/test_dogpile_backend.py::"
            "test_connection_arguments_that_redis_py_accepts_still_work",
        ),
        within="_connectable",
    ),
    Mutant(
        "dogpile-key-without-utf8-form",
        "a key with no UTF-8 form is a BackendArgumentError naming it, not a raw "
        "UnicodeEncodeError",
        "cacheguard/integrations/dogpile.py",
        "    if not key.isascii():\n",
        "    if False:\n",
        ("tests/test_dogpile_backend.py::test_a_key_without_a_utf8_form_is_a_clear_error",),
        within="_key_name",
    ),
    # -- the guard's state (issue #25's review) ---------------------------------------------
    Mutant(
        "closed-guard-names-its-guard",
        "a call on a closed guard says which guard (CacheGuard, AsyncCacheGuard) is closed",
        "cacheguard/cache/flows/state.py",
        'f"this {self.front} is closed: make a new one "',
        'f"this {type(self).__name__} is closed: make a new one "',
        (
            "tests/test_guard_both_drivers.py::test_a_closed_guard_names_itself[sync]",
            "tests/test_guard_both_drivers.py::test_a_closed_guard_names_itself[async]",
        ),
        within="GuardState.check_open",
    ),
    Mutant(
        "read-checks-none-ttl",
        "get_or_load and refresh refuse a bad none_ttl before anything loads or is stored",
        "cacheguard/cache/flows/read.py",
        '        else check_positive("none_ttl", none_ttl)\n',
        "        else none_ttl\n",
        (
            "tests/test_guard_both_drivers.py::"
            "test_a_bad_none_ttl_is_refused_before_the_loader_runs[sync--1]",
            "tests/test_guard_both_drivers.py::"
            "test_a_bad_none_ttl_is_refused_before_the_loader_runs[async--1]",
        ),
        within="read_call",
    ),
    Mutant(
        "state-keeps-no-guard-alive",
        "a guard's state holds no reference to its guard: a dropped guard is freed at once",
        "cacheguard/cache/guard.py",
        "            run_in_background=weakly(self._start_background),\n",
        "            run_in_background=self._start_background,\n",
        ("tests/test_guard_both_drivers.py::test_a_dropped_guard_is_freed_at_once",),
        within="CacheGuard.__init__",
    ),
    # -- the house: the lean import (tests/test_layout.py, issue #25) --------------------------
    Mutant(
        "lean-import-faces",
        "import cacheguard loads the exceptions only: the public names are imported on first use",
        "cacheguard/__init__.py",
        "if TYPE_CHECKING:\n",
        "if True:\n",
        ("tests/test_layout.py::test_import_cacheguard_is_lean",),
    ),
    Mutant(
        "lean-import-asyncio-face",
        "cacheguard.aio imports its asyncio modules on first use, not on import",
        "cacheguard/aio/__init__.py",
        "if TYPE_CHECKING:\n",
        "if True:\n",
        ("tests/test_layout.py::test_the_asyncio_face_loads_on_first_use",),
    ),
    Mutant(
        "lean-import-decorator-without-asyncio",
        "@cached_with_lock serves both guards without importing the asyncio one: a sync "
        "program never loads it",
        "cacheguard/cache/decorator.py",
        "if TYPE_CHECKING:\n",
        "if True:\n",
        ("tests/test_layout.py::test_the_sync_guard_loads_no_asyncio_twin_store_or_integration",),
    ),
    # -- docs that run (tests/test_docs.py, issue #14) -----------------------------------------
    Mutant(
        "docs-blocks-run",
        "the docs collector really runs every python block of a page",
        "tests/test_docs.py",
        "                    exec(code, namespace)\n",
        "                    pass\n",
        ("tests/test_docs.py::test_blocks_run_in_order_in_one_namespace_set_up_blocks_included",),
        within="run_page",
    ),
    Mutant(
        "docs-blocks-share-one-namespace",
        "a page's blocks share one namespace: a later block uses what an earlier one defined",
        "tests/test_docs.py",
        "                    exec(code, namespace)\n",
        "                    exec(code, dict(namespace))\n",
        ("tests/test_docs.py::test_blocks_run_in_order_in_one_namespace_set_up_blocks_included",),
        within="run_page",
    ),
    Mutant(
        "docs-set-up-blocks-run",
        "set-up blocks (<!-- setup -->) run like the others",
        "tests/test_docs.py",
        "    blocks = [block for block in read_blocks(page) if block.python]\n",
        "    blocks = [block for block in read_blocks(page) if block.python and not block.setup]\n",
        ("tests/test_docs.py::test_blocks_run_in_order_in_one_namespace_set_up_blocks_included",),
        within="run_page",
    ),
    Mutant(
        "docs-block-errors-fail-the-page",
        "a block that raises fails its page's test, naming the page, the block and the line",
        "tests/test_docs.py",
        "                raise BlockFailed(_failure(block, exc)) from exc\n",
        "                pass\n",
        ("tests/test_docs.py::test_a_raising_block_fails_with_the_page_the_block_and_the_line",),
        within="run_page",
    ),
    Mutant(
        "docs-untagged-fences-refused",
        "a fence without a language (which could hide Python that never runs) fails the page",
        "tests/test_docs.py",
        "        if not language:\n",
        "        if False:\n",
        ("tests/test_docs.py::test_fences_that_could_hide_a_block_fail_the_page",),
        within="read_blocks",
    ),
    Mutant(
        "docs-one-event-loop-per-page",
        "blocks with top-level await run on one event loop for the whole page",
        "tests/test_docs.py",
        "                    if loop is None:\n                        loop = _new_loop(tasks)\n",
        "                    loop = _new_loop(tasks)\n",
        ("tests/test_docs.py::test_top_level_await_blocks_share_one_event_loop",),
        within="run_page",
    ),
    Mutant(
        "docs-left-tasks-fail",
        "a page that leaves a task running on its event loop fails",
        "tests/test_docs.py",
        "    if left:\n        names = ",
        "    if False:\n        names = ",
        ("tests/test_docs.py::test_a_task_left_running_fails_the_page",),
        within="_nothing_left_on",
    ),
    Mutant(
        "docs-left-locks-fail",
        "a page that ends with a lock held fails",
        "tests/test_docs.py",
        "        if len(default_watchdog()) > held_before:\n",
        "        if False:\n",
        ("tests/test_docs.py::test_a_lock_left_held_fails_the_page",),
        within="run_page",
    ),
    Mutant(
        "docs-signatures-compared",
        "a documented signature (<!-- signature -->) must match the real one",
        "tests/test_docs.py",
        "        if documented != actual:\n",
        "        if False:\n",
        ("tests/test_docs.py::test_signature_blocks_are_compared_with_the_real_signature",),
        within="check_signatures",
    ),
    Mutant(
        "docs-python-spellings-refused",
        "a fence whose tag names Python in another spelling (Python, py, pycon) fails the page",
        "tests/test_docs.py",
        "        if language != PYTHON and _NAMES_PYTHON.match(language):\n",
        "        if False:\n",
        ("tests/test_docs.py::test_fences_that_could_hide_a_block_fail_the_page",),
        within="read_blocks",
    ),
    Mutant(
        "docs-unretrieved-task-errors-fail",
        "a page whose task ended with an exception nobody retrieved fails, naming the task",
        "tests/test_docs.py",
        "    if unretrieved:\n",
        "    if False:\n",
        ("tests/test_docs.py::test_a_task_that_failed_unobserved_fails_the_page",),
        within="_nothing_left_on",
    ),
    Mutant(
        "docs-site-build-not-quiet",
        "the strict site build fails on a broken link or anchor (no --quiet hiding its warnings)",
        "tests/test_docs.py",
        'BUILD_FLAGS = ("--strict",)\n',
        'BUILD_FLAGS = ("--strict", "--quiet")\n',
        ("tests/test_docs.py::test_a_broken_link_or_anchor_fails_the_strict_build",),
        within="BUILD_FLAGS",
    ),
    # -- clean shutdown, pickling and bad names (issue #23: tests/test_shutdown.py,
    # tests/test_bad_input.py) --
    Mutant(
        "close-closes-its-sync-client",
        "CacheGuard.close() closes the client from_url made, with its pool",
        "cacheguard/cache/guard.py",
        "            close_sync_client(self.client)\n",
        "            pass\n",
        ("tests/test_shutdown.py::test_close_closes_every_connection_from_url_made[no-l1-sync]",),
        within="CacheGuard.close",
    ),
    Mutant(
        "aclose-closes-its-pool",
        "AsyncCacheGuard.aclose() closes the client from_url made and its connection pool",
        "cacheguard/redis/clients.py",
        "        await client.aclose(close_connection_pool=True)\n",
        "        await client.aclose(close_connection_pool=False)\n",
        ("tests/test_shutdown.py::test_close_closes_every_connection_from_url_made[no-l1-async]",),
        within="aclose_async_client",
    ),
    Mutant(
        "aclose-closes-its-client",
        "AsyncCacheGuard.aclose() closes the client from_url made",
        "cacheguard/cache/async_guard.py",
        "            await aclose_async_client(self.client)\n",
        "            pass\n",
        ("tests/test_shutdown.py::test_close_closes_every_connection_from_url_made[no-l1-async]",),
        within="AsyncCacheGuard.aclose",
    ),
    Mutant(
        "aclose-closes-cluster-node-clients",
        "AsyncCacheGuard.aclose() closes the per-node clients its cluster's pipelines made",
        "cacheguard/cache/async_guard.py",
        "            await aclose_node_clients(self.client)  # a cluster's per-node pipelines\n",
        "            pass\n",
        (
            "tests/test_cluster.py::"
            "test_closing_a_from_url_guard_closes_its_connections_on_every_node[async]",
        ),
        within="AsyncCacheGuard.aclose",
    ),
    Mutant(
        "close-closes-its-notifier",
        "closing a guard's own client stops its release-notification listener (its connection)",
        "cacheguard/cache/guard.py",
        "            close_notifier_of(self.client)\n",
        "            pass\n",
        ("tests/test_shutdown.py::test_close_closes_every_connection_from_url_made[l1-sync]",),
        within="CacheGuard.close",
    ),
    Mutant(
        "close-leaves-a-client-passed-in",
        "a guard leaves a client passed in open when it closes",
        "cacheguard/cache/flows/state.py",
        "        self.owns_client = False  # from_url made the client: close() closes it\n",
        "        self.owns_client = True\n",
        ("tests/test_shutdown.py::test_close_leaves_a_client_passed_in_open[sync]",),
        within="GuardState.__init__",
    ),
    Mutant(
        "closed-guard-refuses-calls",
        "a closed guard refuses every call that would talk to Redis with GuardClosed",
        "cacheguard/cache/flows/state.py",
        "        if self.closed:\n            raise GuardClosed(",
        "        if False:\n            raise GuardClosed(",
        ("tests/test_shutdown.py::test_a_closed_guard_refuses_calls_and_opens_nothing[sync]",),
        within="GuardState.check_open",
    ),
    Mutant(
        "notifier-drops-a-connection-made-while-closing",
        "a notifier closed while its listener connects disconnects that connection",
        "cacheguard/redis/notifier.py",
        "            if self._stopped.is_set():  # closed while we connected",
        "            if False:  # closed while we connected",
        (
            "tests/test_shutdown.py::test_a_notifier_closed_while_it_connects_drops_the_new_connection",
        ),
        within="Notifier._reconnect",
    ),
    Mutant(
        "decorated-functions-pickle-by-reference",
        "a decorated function pickles by reference to its module and qualified name "
        "(a decorated method too)",
        "cacheguard/cache/loader.py",
        '    def __reduce__(self) -> tuple[Any, ...]:\n        """Pickled by reference, as the',
        '    def _reduce_off(self) -> tuple[Any, ...]:\n        """Pickled by reference, as the',
        ("tests/test_shutdown.py::test_loaders_pickle_by_reference[method]",),
        within="Decorated.__reduce__",
    ),
    Mutant(
        "loaders-pickle-by-reference",
        "a CacheLoader bound to a module-level name pickles by reference",
        "cacheguard/cache/loader.py",
        '    def __reduce__(self) -> tuple[Any, ...]:\n        """Pickled by reference (see',
        '    def _reduce_off(self) -> tuple[Any, ...]:\n        """Pickled by reference (see',
        ("tests/test_shutdown.py::test_loaders_pickle_by_reference[loader]",),
        within="KeyedLoader.__reduce__",
    ),
    Mutant(
        "sync-guard-refuses-async-def",
        "a sync guard refuses an async def at decoration (it would cache the coroutine)",
        "cacheguard/cache/loader.py",
        "        if not self.takes_async and is_async_callable(load):\n",
        "        if False:\n",
        ("tests/test_shutdown.py::test_a_sync_guard_refuses_an_async_def_at_decoration",),
        within="KeyedLoader.__init__",
    ),
    Mutant(
        "sync-guard-refuses-async-loader",
        "a sync guard's loader that returns an awaitable (an async def passed to get_or_load) "
        "is a TypeError, nothing stored, no coroutine left unawaited",
        "cacheguard/cache/loading.py",
        "            if inspect.isawaitable(value):\n",
        "            if False:\n",
        (
            "tests/test_bad_input.py::"
            "test_a_sync_guard_refuses_an_async_loader_and_caches_nothing[get_or_load]",
        ),
        within="Loads.run",
    ),
    Mutant(
        "bad-key-names-refused-before-redis",
        "a bad key name (None, bytes, empty, a lone surrogate) is refused before Redis is touched",
        "cacheguard/cache/flows/state.py",
        "        return check_name(name, self.max_key_length)\n",
        "        return name  # type: ignore[return-value]\n",
        (
            "tests/test_bad_input.py::test_bad_names_are_refused_before_redis[sync-None-get_or_load]",
        ),
        within="GuardState.checked_name",
    ),
    Mutant(
        "get-or-load-applies-max-key-length",
        "get_or_load shortens a name longer than max_key_length, as every entry point does",
        "cacheguard/cache/guard.py",
        "        name = self._state.key_name(name)\n",
        "",
        ("tests/test_bad_input.py::test_max_key_length_shortens_every_entry_point_alike[sync]",),
        within="CacheGuard._get_or_load",
    ),
    Mutant(
        "aio-get-or-load-applies-max-key-length",
        "the asyncio get_or_load shortens a name longer than max_key_length, as the sync one",
        "cacheguard/cache/async_guard.py",
        "        name = self._state.key_name(name)\n",
        "",
        ("tests/test_bad_input.py::test_max_key_length_shortens_every_entry_point_alike[async]",),
        within="AsyncCacheGuard._get_or_load",
    ),
    Mutant(
        "dogpile-checks-the-database-at-configure",
        "the dogpile backend refuses a database index the server lacks at configure",
        "cacheguard/integrations/dogpile.py",
        "    if not db:\n        return client\n",
        "    if True:\n        return client\n",
        (
            "tests/test_bad_input.py::test_dogpile_backend_refuses_a_database_the_server_lacks_at_configure[db]",
        ),
        within="_check_database",
    ),
    # -- the asyncio lock contract (issue #15) --
    Mutant(
        "aio-writer-marks-its-wait",
        "a waiting AsyncRedisRWLock writer leaves its mark, so new readers queue behind it "
        "(writer preference on asyncio)",
        "cacheguard/locks/redis/async_rwlock.py",
        "        mark_ms = self._mark_ms if queue else 0\n",
        "        mark_ms = 0\n",
        ("tests/test_lock_contract_async.py::test_writer_preference[redis-async]",),
        within="AsyncRedisRWLock._attempt",
    ),
    Mutant(
        "pg-async-connection-parked-only-empty",
        "an asyncio owner's connection goes back for reuse only when it holds no lock",
        "cacheguard/locks/postgres/async_rwlock.py",
        "            if session.holds:\n                self.watch(session)\n",
        "            if False:\n                self.watch(session)\n",
        (
            "tests/test_lock_contract_async.py::"
            "test_a_writer_excludes_readers_and_writers[postgres-async]",
        ),
        within="_AsyncBook.leave",
    ),
    # -- outage mode: outage_ttl, stale_if_error, the gutter (issue #24) --
    Mutant(
        "outage-reuse",
        "while Redis is unreachable a read reuses a value this process saw within "
        "outage_ttl instead of loading: one load per key per process per window",
        "cacheguard/cache/flows/read.py",
        "        seen = state.last_seen\n        if seen is not None:\n",
        "        seen = None\n        if seen is not None:\n",
        (
            "tests/test_outage_settings.py::test_outage_reuse_serves_a_value_seen_within_outage_ttl_then_loads_once_more[sync]",
            "tests/faults/test_outage_modes.py::test_outage_ttl_loads_each_key_once_per_process_per_window[sync-killed]",
        ),
        within="bypass",
    ),
    Mutant(
        "fallback-window",
        "outage reuse and stale_if_error serve only a value seen at most their setting ago",
        "cacheguard/cache/outage/fallback.py",
        "        if seen is None or self._timer() - seen[1] > max_age:\n",
        "        if seen is None:\n",
        (
            "tests/test_outage_settings.py::test_outage_reuse_serves_a_value_seen_within_outage_ttl_then_loads_once_more[sync]",
            "tests/test_outage_settings.py::test_a_failing_loader_is_answered_by_the_last_value_seen_within_stale_if_error[async]",
        ),
        within="LastSeen.within",
    ),
    Mutant(
        "reused-value-keeps-its-age",
        "a value served by outage reuse is not noted again: its age, the staleness bound, "
        "runs from when it was first seen",
        "cacheguard/cache/flows/read.py",
        '                state.recorder.count("outage_reuses", name, 0.0, None, template)\n',
        '                state.recorder.count("outage_reuses", name, 0.0, None, template)\n'
        "                seen.note(name, value, seen.ticket(name))\n",
        (
            "tests/test_outage_settings.py::test_a_value_reused_keeps_the_age_it_was_first_seen_with[sync]",
        ),
        within="bypass",
    ),
    Mutant(
        "redis-hit-is-seen",
        "a value read from Redis is noted as seen (the next outage reuses the newest value)",
        "cacheguard/cache/flows/read.py",
        "            state.last_seen.note(name, entry.value, seen_ticket)\n",
        "            pass\n",
        (
            "tests/test_outage_settings.py::test_after_recovery_values_come_from_redis_not_from_reuse[sync]",
        ),
        within="serve",
    ),
    Mutant(
        "writes-drop-from-reuse",
        "an invalidation or write in this process drops its names from outage reuse and "
        "stale_if_error",
        "cacheguard/cache/flows/state.py",
        "        if self.last_seen is not None:\n            self.last_seen.drop(names)\n",
        "",
        (
            "tests/test_outage_settings.py::test_a_write_or_invalidation_here_drops_the_name_from_reuse[sync]",
        ),
        within="GuardState.forget_here",
    ),
    Mutant(
        "refused-write-drops-from-reuse",
        "a write Redis refuses (down, circuit open) still drops its names from reuse first: "
        "it may reach the database another way",
        "cacheguard/cache/flows/write.py",
        "    state.forget_here(ordered)\n",
        "",
        (
            "tests/test_outage_settings.py::test_a_write_or_invalidation_here_drops_the_name_from_reuse[async]",
        ),
        within="write_flow",
    ),
    Mutant(
        "drop-voids-notes-under-way",
        "a write in this process voids the note of a load of its name already under way "
        "(its value may predate the write)",
        "cacheguard/cache/outage/fallback.py",
        "            if self.ticket(name) != ticket:\n",
        "            if False:\n",
        (
            "tests/test_outage_settings.py::test_a_write_here_during_a_load_keeps_that_loads_value_out_of_reuse[sync]",
        ),
        within="LastSeen.note",
    ),
    Mutant(
        "stale-if-error-answers",
        "stale_if_error answers the loader's error, or BackendUnavailable under "
        "on_backend_error='raise', with the last value seen",
        "cacheguard/cache/flows/read.py",
        "        if value is NOT_SEEN:\n            raise\n",
        "        if True:\n            raise\n",
        (
            "tests/test_outage_settings.py::test_a_failing_loader_is_answered_by_the_last_value_seen_within_stale_if_error[sync]",
            "tests/test_outage_settings.py::test_backend_unavailable_under_raise_is_answered_by_the_last_value_seen[async]",
        ),
        within="stale_if_error",
    ),
    Mutant(
        "stale-if-error-bound",
        "stale_if_error serves a value seen at most stale_if_error s ago, never older",
        "cacheguard/cache/flows/read.py",
        "        value = state.last_seen.within(name, state.settings.stale_if_error)\n",
        "        value = state.last_seen.within(name, 1e9)\n",
        (
            "tests/test_outage_settings.py::test_backend_unavailable_under_raise_is_answered_by_the_last_value_seen[sync]",
            "tests/faults/test_outage_modes.py::test_no_read_is_older_than_a_committed_write_beyond_the_bound"
            "[sync-stale_if_error-killed]",
        ),
        within="stale_if_error",
    ),
    Mutant(
        "stale-value-keeps-its-age",
        "a value served by stale_if_error is not noted again: repeated stale serves never "
        "stretch the bound",
        "cacheguard/cache/flows/read.py",
        '        state.recorder.count("stale_on_error", name, 0.0, exc, template)\n',
        '        state.recorder.count("stale_on_error", name, 0.0, exc, template)\n'
        "        state.last_seen.note(name, value, state.last_seen.ticket(name))\n",
        ("tests/test_outage_settings.py::test_a_value_served_stale_keeps_its_age[sync]",),
        within="stale_if_error",
    ),
    Mutant(
        "gutter-single-flight",
        "while the primary is unreachable a read goes through the gutter's guard: one load "
        "per key across processes per gutter_ttl",
        "cacheguard/cache/flows/read.py",
        "                value = yield Gutter(call, *gutter_lifetimes(state, call.ttl, "
        "call.none_ttl))\n",
        "                value = yield LoadNow(call)\n",
        (
            "tests/test_outage_settings.py::test_the_gutter_serves_one_load_across_guards_with_entries_capped_at_gutter_ttl[sync]",
            "tests/faults/test_outage_modes.py::test_the_gutter_loads_each_key_once_per_window_across_processes[sync]",
        ),
        within="bypass",
    ),
    Mutant(
        "gutter-lifetime-capped",
        "a gutter entry lives at most gutter_ttl, whatever the read's ttl",
        "cacheguard/cache/flows/read.py",
        "    return min(ttl, cap), None if lifetime is None else min(lifetime, cap)\n",
        "    return ttl, None if lifetime is None else min(lifetime, cap)\n",
        (
            "tests/test_outage_settings.py::test_the_gutter_serves_one_load_across_guards_with_entries_capped_at_gutter_ttl[sync]",
        ),
        within="gutter_lifetimes",
    ),
    Mutant(
        "gutter-unjittered",
        "a gutter entry's lifetime is not jittered (a jitter could take it past gutter_ttl)",
        "cacheguard/cache/outage/gutter.py",
        "        ttl_jitter=0.0,  # a jittered lifetime could outlive gutter_ttl\n",
        "",
        (
            "tests/test_outage_settings.py::test_the_gutter_serves_one_load_across_guards_with_entries_capped_at_gutter_ttl[async]",
        ),
        within="gutter_settings",
    ),
    Mutant(
        "gutter-no-stale-window",
        "a gutter entry is not kept past its end for the stale window",
        "cacheguard/cache/outage/gutter.py",
        "        stale_ttl=0.0,\n",
        "",
        (
            "tests/test_outage_settings.py::test_the_gutter_serves_one_load_across_guards_with_entries_capped_at_gutter_ttl[sync]",
        ),
        within="gutter_settings",
    ),
    Mutant(
        "gutter-down-falls-through",
        "a gutter that is unreachable too falls through to on_backend_error (load, or raise)",
        "cacheguard/cache/flows/read.py",
        '                log.info("the gutter is unreachable too for %r: %s", name, gutter_down)\n',
        "                raise\n",
        (
            "tests/test_outage_settings.py::test_a_gutter_down_too_falls_through_to_reuse_then_on_backend_error[sync]",
        ),
        within="bypass",
    ),
    Mutant(
        "gutter-guard-raises-when-down",
        "the gutter's own guard raises when the gutter is down (it never loads on its own): "
        "the primary's read goes on to its fallbacks, counted as its own",
        "cacheguard/cache/outage/gutter.py",
        '        on_backend_error="raise",  # the primary\'s read has fallbacks of its own\n',
        "",
        (
            "tests/test_outage_settings.py::test_a_gutter_down_too_falls_through_to_reuse_then_on_backend_error[async]",
        ),
        within="gutter_settings",
    ),
    Mutant(
        "asyncio-pool-replaces-dead-idle-connections",
        "an asyncio pool replaces a connection the server closed while it was idle (a "
        "restarted Redis): no backend error, breaker failure nor bypass load after recovery",
        "cacheguard/redis/clients.py",
        "            **_idle_connections_checked(),\n",
        "",
        (
            "tests/test_hit_path.py::test_an_asyncio_pooled_connection_the_server_closed_while_idle_is_replaced",
            "tests/faults/test_outage_modes.py::test_recovery_refills_each_key_once_across_processes[async-killed]",
        ),
        within="async_client_from_url",
    ),
    # -- the distribution (issue #26) ----------------------------------------------------------
    Mutant(
        "distribution-name-of-its-own",
        "the distribution is cacheguard-redis, not the index's unrelated cacheguard",
        "pyproject.toml",
        'name = "cacheguard-redis"\n',
        'name = "cacheguard"\n',
        ("tests/test_packaging.py::test_the_distribution_has_a_name_of_its_own",),
    ),
    Mutant(
        "sdist-holds-no-tests",
        "the sdist holds no tests (they need the repository around them)",
        "MANIFEST.in",
        "prune tests\n",
        "",
        ("tests/test_packaging.py::test_the_wheel_and_sdist_hold_the_package_and_no_tests",),
    ),
    # -- the default guard (issue #26) ------------------------------------------------------
    Mutant(
        "default-guard-latest-installed",
        "a function decorated without a guard reads through the guard installed last, in "
        "front of the ones installed before",
        "cacheguard/cache/default.py",
        "    installations.append(installation)\n",
        "    installations.insert(0, installation)\n",
        ("tests/test_default_guard.py::test_use_replaces_and_puts_back",),
        within="use",
    ),
    Mutant(
        "default-guard-restore-ends-only-its-own",
        "ending an installation ends that one only, in whatever order they end: the "
        "default is the newest still in force",
        "cacheguard/cache/default.py",
        "            installations.remove(self)\n",
        "            installations.pop()\n",
        ("tests/test_default_guard.py::test_use_replaces_and_puts_back",),
        within="Installed.restore",
    ),
    Mutant(
        "default-guard-closed-installations-dropped",
        "installations of closed guards are dropped as a new one comes: an app installing "
        "a guard on every start keeps none of the old",
        "cacheguard/cache/default.py",
        "        installations[:] = [i for i in installations if not i.guard._state.closed]\n",
        "",
        ("tests/test_default_guard.py::test_installations_of_closed_guards_do_not_pile_up",),
        within="use",
    ),
    Mutant(
        "default-guard-closed-refused",
        "a closed default guard is refused with NoDefaultGuard, saying to install its replacement",
        "cacheguard/cache/default.py",
        "    if guard._state.closed:\n",
        "    if False:\n",
        ("tests/test_default_guard.py::test_a_closed_default_guard_is_refused_clearly",),
        within="installed",
    ),
    Mutant(
        "default-guard-key-shortened-as-installed",
        "the key of a call decorated without a guard is shortened by the installed "
        "guard's max_key_length, as its calls are",
        "cacheguard/cache/loader.py",
        "        if self._deferred:  # as the installed guard will shorten it\n",
        "        if False:\n",
        (
            "tests/test_default_guard.py::test_methods_and_shortened_keys_follow_the_installed_guard",
        ),
        within="KeyedLoader.key",
    ),
    # -- typed values (issue #26) --------------------------------------------------------------
    Mutant(
        "typed-read-decoded-to-its-type",
        "a read with a type returns a value of that type (a hit decoded to it), not the "
        "plain data stored",
        "cacheguard/cache/typed.py",
        "    try:\n        return fits.load(data)\n",
        "    try:\n        return data\n",
        ("tests/test_typed_values.py::test_get_or_load_refresh_and_peek_read_typed_values[sync]",),
        within="get_or_load",
    ),
    Mutant(
        "aio-typed-read-decoded-to-its-type",
        "an asyncio read with a type returns a value of that type",
        "cacheguard/cache/typed.py",
        "    try:\n        return fits.load(data)\n",
        "    try:\n        return data\n",
        ("tests/test_typed_values.py::test_get_or_load_refresh_and_peek_read_typed_values[async]",),
        within="aget_or_load",
    ),
    Mutant(
        "typed-changed-type-filled-once",
        "stored data that no longer fits its type is a miss inside the read: the key is "
        "filled once across processes, its readers wait for that fill",
        "cacheguard/cache/typed.py",
        "    data = guard._get_or_load(name, dumped, ttl, none_ttl, template, fits)\n",
        "    data = guard._get_or_load(name, dumped, ttl, none_ttl, template, None)\n",
        (
            "tests/test_typed_values.py::test_readers_of_an_entry_stored_before_its_type_changed_load_it_once[sync]",
            "tests/test_typed_values.py::test_an_entry_stored_before_its_type_changed_is_loaded_again[sync]",
        ),
        within="get_or_load",
    ),
    Mutant(
        "aio-typed-changed-type-filled-once",
        "the asyncio guard fills once the keys whose stored data no longer fits its type",
        "cacheguard/cache/typed.py",
        "    data = await guard._get_or_load(name, dumped, ttl, none_ttl, template, fits)\n",
        "    data = await guard._get_or_load(name, dumped, ttl, none_ttl, template, None)\n",
        (
            "tests/test_typed_values.py::test_readers_of_an_entry_stored_before_its_type_changed_load_it_once[async]",
        ),
        within="aget_or_load",
    ),
    Mutant(
        "typed-hit-path-checks-the-type",
        "the hit path does not serve stored data that does not fit the type read",
        "cacheguard/cache/flows/read.py",
        "        if entry is not None and (call.fits is None or call.fits(entry.value)):\n",
        "        if entry is not None:\n",
        (
            "tests/test_typed_values.py::test_an_entry_stored_before_its_type_changed_is_loaded_again[sync]",
        ),
        within="hit",
    ),
    Mutant(
        "typed-peek-of-a-changed-type-missing",
        "peek with a type answers MISSING for data that does not fit it",
        "cacheguard/cache/typed.py",
        "    except ValueError:\n        return MISSING\n",
        "    except ValueError:\n        raise\n",
        (
            "tests/test_typed_values.py::test_an_entry_stored_before_its_type_changed_is_loaded_again[sync]",
        ),
        within="peek",
    ),
    Mutant(
        "typed-decorator-reads-the-return-annotation",
        "@cached_with_lock reads a function's values as its return annotation's type",
        "cacheguard/cache/loader.py",
        "typed.return_value_type(self.load, self.guard.settings.codec)\n",
        "None\n",
        (
            "tests/test_typed_values.py::test_loaders_and_decorators_read_their_annotated_type[sync]",
            "tests/test_typed_values.py::test_loaders_and_decorators_read_their_annotated_type[async]",
        ),
        within="KeyedLoader._value_type",
    ),
    Mutant(
        "typed-pydantic-reads-its-own-json",
        "pydantic values are read back from pydantic's JSON (strict models included)",
        "cacheguard/codecs/values.py",
        "        return self._adapter.validate_json(data)",
        "        return self._adapter.validate_python(data)",
        ("tests/test_typed_values.py::test_pydantic_and_msgspec_use_their_own_json",),
        within="PydanticValues.load",
    ),
    Mutant(
        "typed-pydantic-refuses-another-type",
        "a loader that returned something else than its pydantic type fails, caching nothing",
        "cacheguard/codecs/values.py",
        'dump_json(value, warnings="error")',
        'dump_json(value, warnings="warn")',
        ("tests/test_typed_values.py::test_a_value_not_of_the_type_is_refused_when_stored",),
        within="PydanticValues.dump",
    ),
    Mutant(
        "typed-float-takes-an-int",
        "an int is stored where a float is annotated, and read back as a float",
        "cacheguard/codecs/values.py",
        "        return _float, _float",
        "        return _checked(float), _float",
        ("tests/test_typed_values.py::test_dataclasses_round_trip_as_plain_data",),
        within="_converters",
    ),
    Mutant(
        "typed-dataclass-fields-checked",
        "every field of a dataclass read back is checked against its annotation: data "
        "that does not fit is a miss, never a dataclass holding the wrong types",
        "cacheguard/codecs/values.py",
        "            arguments[name] = item if type(item) is found[1] else found[0](item)\n",
        "            arguments[name] = item\n",
        ("tests/test_typed_values.py::test_data_that_does_not_fit_the_type_is_a_value_error",),
        within="_dataclass",
    ),
    Mutant(
        "typed-none-keeps-none-ttl",
        "a None of a pydantic type stays None in the cache: none_ttl applies to it",
        "cacheguard/codecs/values.py",
        "        if value is None and self._nullable:\n            return None\n        try:\n",
        "        if False:\n            return None\n        try:\n",
        ("tests/test_typed_values.py::test_none_keeps_none_ttl_in_every_family[pydantic]",),
        within="PydanticValues.dump",
    ),
    Mutant(
        "typed-msgspec-none-keeps-none-ttl",
        "a None of a msgspec type stays None in the cache: none_ttl applies to it",
        "cacheguard/codecs/values.py",
        "        if value is None and self._nullable:\n            return None\n        try:\n",
        "        if False:\n            return None\n        try:\n",
        ("tests/test_typed_values.py::test_none_keeps_none_ttl_in_every_family[msgspec]",),
        within="MsgspecValues.dump",
    ),
    Mutant(
        "typed-json-int-keys",
        "int dict keys come back from the JSON codec as ints: such entries are hits",
        "cacheguard/codecs/values.py",
        "    if key in (int, float):",
        "    if False:",
        ("tests/test_typed_values.py::test_int_keys_come_back_from_the_json_codec",),
        within="_dict",
    ),
    Mutant(
        "typed-enum-values-plain",
        "an enum whose values a codec would not keep is refused when given as a type",
        "cacheguard/codecs/values.py",
        "    if not all(isinstance(member.value, (str, int, float, _NONE)) for member in kind):",
        "    if False:",
        (
            "tests/test_typed_values.py::test_types_whose_values_would_not_come_back_are_refused_when_given",
        ),
        within="_enum",
    ),
    Mutant(
        "typed-initvar-refused",
        "a dataclass with an InitVar without default is refused when given as a type",
        "cacheguard/codecs/values.py",
        "            and extra.default is dataclasses.MISSING\n",
        "            and False\n",
        (
            "tests/test_typed_values.py::test_types_whose_values_would_not_come_back_are_refused_when_given",
        ),
        within="_dataclass",
    ),
    Mutant(
        "typed-bool-in-a-union",
        "a bool passes where a union of plain types has bool",
        "cacheguard/codecs/values.py",
        "    bools = kind is bool or (isinstance(kind, tuple) and bool in kind)\n",
        "    bools = kind is bool\n",
        (
            "tests/test_typed_values.py::test_types_whose_values_would_not_come_back_are_refused_when_given",
        ),
        within="_checked",
    ),
    Mutant(
        "typed-inference-skips-a-pickling-guard",
        "a pickling guard's decorated functions keep their values' types as pickle does",
        "cacheguard/cache/typed.py",
        "    if isinstance(codec, PickleCodec):\n        return None\n",
        "",
        (
            "tests/test_typed_values.py::test_decorators_infer_only_what_a_family_handles_and_type_false_opts_out",
        ),
        within="_return_annotation",
    ),
    Mutant(
        "typed-inference-of-an-unhandled-type-falls-back",
        "a return annotation no family handles leaves values as the codec stores them, "
        "as before typed values",
        "cacheguard/cache/typed.py",
        "    except TypeError:  # no family handles it",
        "    except ZeroDivisionError:  # no family handles it",
        (
            "tests/test_typed_values.py::test_decorators_infer_only_what_a_family_handles_and_type_false_opts_out",
        ),
        within="_value_type_of",
    ),
    Mutant(
        "typed-type-false-opts-out",
        "type=False stores a decorated function's values as they are",
        "cacheguard/cache/loader.py",
        "            if type is False or (type is None and not infer_type)",
        "            if (type is None and not infer_type)",
        (
            "tests/test_typed_values.py::test_decorators_infer_only_what_a_family_handles_and_type_false_opts_out",
        ),
        within="KeyedLoader.__init__",
    ),
    Mutant(
        "typed-bool-is-not-an-int",
        "a bool does not pass for an int (nor an int for a bool) when data is checked",
        "cacheguard/codecs/values.py",
        "        if isinstance(value, bool) and not bools:",
        "        if False:",
        ("tests/test_typed_values.py::test_data_that_does_not_fit_the_type_is_a_value_error",),
        within="_checked",
    ),
    Mutant(
        "otel-sync-batch-span",
        "a traced guard's get_or_load_many is one span with its outcome (sync)",
        "cacheguard/cache/guard.py",
        '        trace = None if tracer is None else tracer.begin("get_or_load_many", template)\n',
        "        trace = None\n",
        ("tests/test_opentelemetry.py::test_a_batch_is_one_span_with_the_furthest_outcome[sync]",),
        within="CacheGuard._get_or_load_many",
    ),
    Mutant(
        "otel-async-batch-span",
        "a traced guard's get_or_load_many is one span with its outcome (asyncio)",
        "cacheguard/cache/async_guard.py",
        '        trace = None if tracer is None else tracer.begin("get_or_load_many", template)\n',
        "        trace = None\n",
        ("tests/test_opentelemetry.py::test_a_batch_is_one_span_with_the_furthest_outcome[async]",),
        within="AsyncCacheGuard._get_or_load_many",
    ),
    # -- the hit path and from_url's clients (issue #25) -----------------------------------
    Mutant(
        "asyncio-hit-write-without-a-task",
        "the asyncio hit's GET is written without a task of its own: the write's deadline "
        "is armed only when the socket's buffer did not take the command",
        "cacheguard/redis/clients.py",
        "        if writer.transport.get_write_buffer_size():  # the kernel did not take it all\n",
        "        if True:\n",
        (
            "tests/test_hit_path.py::test_a_direct_asyncio_get_over_a_real_connection_writes_no_task_of_its_own",
        ),
        within="_send",
    ),
    Mutant(
        "asyncio-hit-write-deadline",
        "the asyncio hit's write that the socket does not take within the socket timeout "
        "fails as redis-py's (a redis.TimeoutError)",
        "cacheguard/redis/clients.py",
        "            await asyncio.wait_for(writer.drain(), connection.socket_timeout)\n",
        "            await writer.drain()\n",
        (
            "tests/test_hit_path.py::test_a_direct_asyncio_write_fails_as_redis_py_s_and_drops_the_connection",
        ),
        within="_send",
    ),
    Mutant(
        "asyncio-hit-failed-write-drops-the-connection",
        "a connection whose asyncio hit write timed out is dropped, not pooled half-written",
        "cacheguard/redis/clients.py",
        "    except asyncio.TimeoutError:\n        await connection.disconnect(nowait=True)\n",
        "    except asyncio.TimeoutError:\n        pass\n",
        (
            "tests/test_hit_path.py::test_a_direct_asyncio_write_fails_as_redis_py_s_and_drops_the_connection",
        ),
        within="_send",
    ),
    Mutant(
        "asyncio-hit-health-check",
        "the asyncio hit runs the health check a URL asked for (health_check_interval)",
        "cacheguard/redis/clients.py",
        "    if connection.health_check_interval:  # asked for in the URL: a PING when due\n",
        "    if False:\n",
        (
            "tests/test_hit_path.py::test_a_direct_asyncio_write_fails_as_redis_py_s_and_drops_the_connection",
        ),
        within="_send",
    ),
    Mutant(
        "hit-path-only-when-circuit-closed",
        "a hit path's GET is sent only while the key's circuit is closed (an open circuit "
        "keeps the call off Redis, a half-open one lets the flow take its one probe)",
        "cacheguard/cache/flows/read.py",
        "        or not state.breaker(name).closed\n",
        "        or False\n",
        ("tests/test_hit_path.py::test_an_open_circuit_keeps_a_hit_off_redis",),
        within="hit_lead",
    ),
    Mutant(
        "hit-path-misses-go-to-the-flow",
        "an entry the hit path read past its life (and its stale window) is not served: "
        "the flow loads it",
        "cacheguard/cache/flows/read.py",
        "            if verdict != MISS:\n",
        "            if True:\n",
        ("tests/test_hit_path.py::test_an_entry_read_past_its_life_is_loaded_again",),
        within="hit",
    ),
    Mutant(
        "hit-path-replay-pending-to-the-flow",
        "a value the hit path read while outbox replays are pending is not served: the "
        "flow replays first and reads again",
        "cacheguard/cache/flows/read.py",
        "    if raw.__class__ is not bytes or state.recovery.pending:\n",
        "    if raw.__class__ is not bytes:\n",
        (
            "tests/test_hit_path.py::"
            "test_a_value_read_as_an_outbox_write_happens_is_served_after_the_replay",
        ),
        within="hit_entry",
    ),
    Mutant(
        "hit-lookup-wrongtype-is-a-reply",
        "a hit path's GET of a key of another type is a miss counted as corrupt (the flow "
        "loads and stores over it), not an error raised to the caller",
        "cacheguard/cache/driver.py",
        "        return exc, None\n",
        "        return None, exc\n",
        (
            "tests/test_hit_path.py::"
            "test_a_from_url_hit_of_a_key_of_another_type_is_counted_and_loaded",
            "tests/test_hit_path.py::"
            "test_an_asyncio_from_url_hit_of_a_key_of_another_type_is_counted_and_loaded",
        ),
        within="lookup_failed",
    ),
    Mutant(
        "asyncio-pool-queues-tasks",
        "tasks of an asyncio guard made by from_url wait for a free connection when all "
        "are in use, instead of failing as Redis unavailable",
        "cacheguard/redis/clients.py",
        "                if not _pool_used_up(exc):\n                    raise\n",
        "                raise\n",
        ("tests/test_hit_path.py::test_the_asyncio_pool_makes_tasks_wait_for_a_connection",),
        within="QueueingPool.get_connection",
    ),
    Mutant(
        "asyncio-pool-wait-bounded",
        "a task waits for a pooled connection at most the pool's timeout (socket_timeout), "
        "then gets a ConnectionError",
        "cacheguard/redis/clients.py",
        "            timer = loop.call_later(max(deadline - loop.time(), 0.0), _expire, waiter)\n",
        "            timer = loop.call_later(3600.0, _expire, waiter)\n",
        ("tests/test_hit_path.py::test_a_task_waits_for_a_connection_at_most_the_pool_timeout",),
        within="QueueingPool.get_connection",
    ),
    Mutant(
        "asyncio-pool-cancelled-waiter-passes-wake-up",
        "a task cancelled just as a released connection woke it passes the wake-up to the "
        "next waiting task",
        "cacheguard/redis/clients.py",
        "                if waiter.done() and not waiter.cancelled() and waiter.result():\n",
        "                if False:\n",
        (
            "tests/test_hit_path.py::"
            "test_a_waiter_cancelled_as_it_is_woken_passes_the_connection_on",
        ),
        within="QueueingPool.get_connection",
    ),
    Mutant(
        "pooled-connection-check-past-1024",
        "from_url's connection check works on sockets numbered 1024 or more (poll, not "
        "select, which refuses them)",
        "cacheguard/redis/clients.py",
        "    poller = _poll()\n    poller.register(sock, select.POLLIN)\n"
        "    return bool(poller.poll(0))\n",
        "    return bool(select.select((sock,), (), (), 0)[0])\n",
        (
            "tests/test_hit_path.py::test_a_pooled_connection_numbered_past_1024_is_checked_like_any",
        ),
        within="_readable_now",
    ),
    Mutant(
        "asyncio-pool-used-up-on-older-redis-py",
        "the queueing pool also waits when an older redis-py says its pool is used up with "
        "a plain ConnectionError",
        "cacheguard/redis/clients.py",
        "    return type(error) is redis.ConnectionError and str(error) == "
        '"Too many connections"\n',
        "    return False\n",
        ("tests/test_hit_path.py::test_the_asyncio_pool_knows_it_is_used_up_on_every_redis_py",),
        within="_pool_used_up",
    ),
    Mutant(
        "two-tier-unclaimed-hold-given-back-past-a-plain-writer",
        "a hold kept for a successor that gave up is given back even when a plain local "
        "writer (the local tier alone) took the local lock first",
        "cacheguard/locks/two_tier.py",
        "            if kept is None or self._local.writer_claims_hand_overs:\n",
        "            if kept is None or self._local.writer is not None:\n",
        (
            "tests/test_lock_cohort.py::"
            "test_a_hold_nobody_claims_is_given_back_when_a_plain_local_writer_came_first",
        ),
        within="TwoTierRWLock._drop_unclaimed",
    ),
    Mutant(
        "pooled-connection-check-sees-data",
        "the one-select check of a pooled TCP connection still sees a reply left unread "
        "and a connection the server closed while it sat idle",
        "cacheguard/redis/clients.py",
        "            and not _readable_now(sock)\n",
        "            and True\n",
        (
            "tests/test_hit_path.py::"
            "test_a_pooled_connection_with_a_reply_or_closed_by_the_server_is_seen",
        ),
        within="QuickCheckConnection.can_read",
    ),
    Mutant(
        "stale-if-error-loader",
        "stale_if_error answers a loader's error with the last value seen",
        "cacheguard/cache/flows/read.py",
        "        if not (isinstance(exc, BackendUnavailable) or from_loader(exc)):\n",
        "        if not isinstance(exc, BackendUnavailable):\n",
        (
            "tests/test_fallback.py::test_a_failing_loader_is_answered_by_the_last_value_seen[sync]",
            "tests/test_fallback.py::test_a_failing_loader_is_answered_by_the_last_value_seen[async]",
        ),
        within="stale_if_error",
    ),
    Mutant(
        "stale-if-error-own-errors",
        "stale_if_error does not hide the cache's own errors (a value the codec refuses)",
        "cacheguard/cache/flows/read.py",
        "        if not (isinstance(exc, BackendUnavailable) or from_loader(exc)):\n",
        "        if False:\n",
        (
            "tests/test_fallback.py::test_the_cache_s_own_errors_are_not_answered[sync]",
            "tests/test_fallback.py::test_the_cache_s_own_errors_are_not_answered[async]",
        ),
        within="stale_if_error",
    ),
    Mutant(
        "gutter-none-lifetime-capped",
        "a cached None in the gutter lives at most gutter_ttl too (none_ttl is cut as ttl is)",
        "cacheguard/cache/flows/read.py",
        "    return min(ttl, cap), None if lifetime is None else min(lifetime, cap)\n",
        "    return min(ttl, cap), lifetime\n",
        ("tests/test_fallback.py::test_the_gutter_keeps_none_no_longer_than_gutter_ttl",),
        within="gutter_lifetimes",
    ),
    Mutant(
        "replay-marks-counted",
        "a Redis failure seen while the replays run keeps the guard pending for another run",
        "cacheguard/cache/outage/recovery.py",
        "            self.pending = self._done < self._marks and bool(self._hooks)\n",
        "            self.pending = False\n",
        ("tests/test_fallback.py::test_a_failure_seen_during_a_run_keeps_the_guard_pending",),
        within="Recovery._finished",
    ),
    Mutant(
        "replay-queued-callers-take-the-failure",
        "callers that waited for a replay run that failed take its failure instead of "
        "running it again one after the other",
        "cacheguard/cache/outage/recovery.py",
        "        if self._ended > ended:\n",
        "        if False:\n",
        (
            "tests/test_fallback.py::test_callers_queued_behind_a_failed_run_take_its_failure",
            "tests/test_fallback.py::"
            "test_asyncio_callers_queued_behind_a_failed_run_take_its_failure",
        ),
        within="Recovery._refusal",
    ),
    Mutant(
        "replay-retry-delay",
        "after a failed replay the next attempt waits the retry delay: callers meanwhile fail "
        "at once",
        "cacheguard/cache/outage/recovery.py",
        "            if age >= self.retry_delay:\n",
        "            if True:\n",
        (
            "tests/test_fallback.py::"
            "test_after_a_failed_run_callers_fail_fast_until_the_retry_delay_passed",
            "tests/test_outbox.py::"
            "test_readers_of_a_guard_whose_replay_cannot_reach_the_database_share_one_attempt",
        ),
        within="Recovery._refusal",
    ),
    Mutant(
        "bypass-seals-before-loading",
        "while Redis is down, a caller that joins a load already under way (it may have "
        "started after a write the load did not see) loads again instead of taking its value",
        "cacheguard/cache/flows/read.py",
        "    return (yield from bypass(state, call, exc, fallbacks=fallbacks)), sealed\n",
        "    value = yield from bypass(state, call, exc, fallbacks=fallbacks)\n"
        "    return value, state.flights.seal(flight)\n",
        (
            "tests/test_fallback.py::"
            "test_a_caller_joining_a_bypass_load_under_way_does_not_take_its_value[sync]",
            "tests/test_fallback.py::"
            "test_a_caller_joining_a_bypass_load_under_way_does_not_take_its_value[async]",
        ),
        within="bypassed",
    ),
    Mutant(
        "timeout-loads-shared",
        'under on_timeout="load" the callers of a process whose waits for a key timed out '
        "share one load without the lock at a time, instead of each loading",
        "cacheguard/cache/flows/fill.py",
        "    value = yield from shared_load(job.shared_loads, job.name, began, job.count)\n",
        "    value = yield LOAD_UNLOCKED\n",
        (
            "tests/test_timeout_loads.py::"
            "test_timed_out_callers_share_one_load_and_later_ones_the_next[sync]",
            "tests/test_timeout_loads.py::"
            "test_timed_out_callers_share_one_load_and_later_ones_the_next[async]",
        ),
        within="timed_out_flow",
    ),
    Mutant(
        "timeout-loads-linearizable",
        "a timed-out caller takes a shared load only if the load began after its call "
        "began; later callers share the next load",
        "cacheguard/cache/outage/shared_loads.py",
        "            if loading is not None and loading.began > since:\n",
        "            if loading is not None:\n",
        (
            "tests/test_timeout_loads.py::"
            "test_timed_out_callers_share_one_load_and_later_ones_the_next[sync]",
            "tests/test_timeout_loads.py::"
            "test_timed_out_callers_share_one_load_and_later_ones_the_next[async]",
            "tests/test_shared_loads.py::"
            "test_callers_that_began_before_the_load_take_it_later_ones_share_the_next",
        ),
        within="SharedLoads.enter",
    ),
    Mutant(
        "timeout-leader-load-after-its-followers",
        "a timed-out leader, whose outcome its followers take, shares only a load begun "
        "after the newest of their calls began",
        "cacheguard/cache/singleflight.py",
        "            flight.newest_start = max(flight.newest_start, since)\n",
        "",
        (
            "tests/test_flow_scripted.py::"
            "test_a_timed_out_leader_takes_a_running_load_begun_after_every_call_it_serves"
            "[2.0-False]",
        ),
        within="SingleFlight.join",
    ),
    Mutant(
        "timeout-loads-writer-private",
        "the load of a caller holding the key's write lock (its uncommitted view) is never "
        "shared: timed-out readers neither take it nor wait for it, nor does it wait for theirs",
        "cacheguard/cache/flows/fill.py",
        '        return Outcome((yield LOAD_UNLOCKED), "unlocked", private=True)\n',
        "        value = yield from shared_load(\n"
        "            job.shared_loads, job.name, job.timer(), job.count\n"
        "        )\n"
        '        return Outcome(value, "unlocked", private=True)\n',
        (
            "tests/test_timeout_loads.py::test_readers_never_take_a_sync_writers_private_load",
            "tests/test_timeout_loads.py::test_readers_never_take_an_async_writers_private_load",
            "tests/test_timeout_loads.py::test_a_sync_writers_read_during_a_shared_load_is_its_own",
            "tests/test_timeout_loads.py::"
            "test_an_async_writers_read_during_a_shared_load_is_its_own",
        ),
        within="fill_flow",
    ),
    Mutant(
        "timeout-loads-presumed-hung",
        "no caller waits for a shared load for good: one running max_load_time is presumed "
        "hung (loaders reading each other's keys in a cycle end instead of waiting forever)",
        "cacheguard/cache/flows/state.py",
        "        self.shared_loads = SharedLoads(flight_event, timer, settings.max_load_time)\n",
        "        self.shared_loads = SharedLoads(flight_event, timer)\n",
        (
            "tests/test_timeout_loads.py::"
            "test_loaders_reading_each_others_keys_do_not_wait_forever[sync]",
            "tests/test_timeout_loads.py::"
            "test_loaders_reading_each_others_keys_do_not_wait_forever[async]",
        ),
        within="GuardState.__init__",
    ),
    Mutant(
        "timeout-loads-interrupted-runner",
        "the callers of a shared load whose runner is interrupted (a cancelled task, a "
        "BaseException in its thread) go on without it, one of them loading",
        "cacheguard/cache/outage/shared_loads.py",
        "    except Exception as exc:\n        loads.finish(name, wave, error=exc)\n",
        "    except BaseException as exc:\n        loads.finish(name, wave, error=exc)\n",
        (
            "tests/test_timeout_loads.py::"
            "test_the_callers_of_an_interrupted_load_go_on_without_it[sync]",
            "tests/test_timeout_loads.py::"
            "test_the_callers_of_an_interrupted_load_go_on_without_it[async]",
        ),
        within="shared_load",
    ),
    # -- the outage mode's review (issue #24) ------------------------------------------------
    Mutant(
        "outbox-transaction-holds-local-write",
        "a transaction whose keys went to the outbox holds their local write tier: its own "
        "fills are private (its uncommitted writes are never stored for everyone)",
        "cacheguard/integrations/sqlalchemy/tracker.py",
        "            if name not in state.locks and name not in state.local_holds:\n",
        "            if False:\n",
        (
            "tests/test_outbox_privacy.py::"
            "test_a_fill_in_such_a_transaction_after_redis_returns_stores_nothing",
        ),
        within="ModelTracker._to_outbox",
    ),
    Mutant(
        "bypass-keeps-a-writer-s-load-private",
        "while Redis is down, a caller writing the key loads its own view: not remembered, "
        "not shared, not through the gutter",
        "cacheguard/cache/flows/read.py",
        "    if state.rwlock(call.name).local.is_write_held_by_me():\n",
        "    if False:\n",
        (
            "tests/test_outbox_privacy.py::"
            "test_a_transaction_s_reads_of_its_outboxed_keys_are_its_own",
        ),
        within="bypassed",
    ),
    Mutant(
        "stale-policy-waits-for-replay",
        'under on_timeout="stale" nothing stored in Redis is served while outbox replays '
        "are pending",
        "cacheguard/cache/flows/fill.py",
        '    if policy == "stale" and not job.replay_pending():\n',
        '    if policy == "stale":\n',
        (
            "tests/test_flow_scripted.py::"
            "test_the_stale_policy_serves_nothing_stored_while_replays_are_pending",
        ),
        within="timed_out_flow",
    ),
    Mutant(
        "gutter-ignores-snapshots",
        "the gutter stores loads whose database snapshot the primary could not number "
        "(it is never invalidated)",
        "cacheguard/cache/outage/gutter.py",
        "    guard._state.checks_snapshots = False  # type: ignore[attr-defined]\n",
        "",
        (
            "tests/test_fallback.py::test_the_gutter_stores_loads_whose_snapshot_the_primary_could_not_number[sync]",
            "tests/test_fallback.py::test_the_gutter_stores_loads_whose_snapshot_the_primary_could_not_number[async]",
        ),
        within="gutter_guard_made",
    ),
    Mutant(
        "gutter-namespace-of-its-own",
        "a gutter on the primary's own server never touches the primary's entries",
        "cacheguard/cache/outage/gutter.py",
        '        namespace=f"{settings.namespace}-gutter",\n',
        "",
        (
            "tests/test_fallback.py::test_a_gutter_on_the_primary_s_own_server_keeps_to_keys_of_its_own[sync]",
            "tests/test_fallback.py::test_a_gutter_on_the_primary_s_own_server_keeps_to_keys_of_its_own[async]",
        ),
        within="gutter_settings",
    ),
    Mutant(
        "l1-skipped-while-replay-pending",
        "an L1 copy is not served while outbox replays are pending",
        "cacheguard/cache/flows/read.py",
        "    if l1 is not None and not state.recovery.pending:  # L1 may predate outbox writes\n",
        "    if l1 is not None:\n",
        (
            "tests/test_fallback.py::test_l1_is_not_served_while_a_replay_is_pending[sync]",
            "tests/test_fallback.py::test_l1_is_not_served_while_a_replay_is_pending[async]",
        ),
        within="read_flow",
    ),
    Mutant(
        "loader-errors-not-the-cache-s-own",
        "stale_if_error does not answer the cache's own refusals raised inside a loader "
        "(a recursive load, a closed guard)",
        "cacheguard/cache/loading.py",
        "                not isinstance(exc, CacheGuardError)"
        " or isinstance(exc, BackendUnavailable)\n",
        "                True\n",
        (
            "tests/test_fallback.py::test_stale_if_error_leaves_the_cache_s_own_errors_raised_in_a_loader[sync]",
            "tests/test_fallback.py::test_stale_if_error_leaves_the_cache_s_own_errors_raised_in_a_loader[async]",
        ),
        within="Loads.loading",
    ),
    Mutant(
        "peek-entry-replays",
        "peek_entry replays pending outbox writes before it shows what Redis holds",
        "cacheguard/cache/flows/read.py",
        "    if state.recovery.pending:\n"
        "        raw = yield from replayed_then_reread(state, name, None)\n",
        "    if False:\n        raw = yield from replayed_then_reread(state, name, None)\n",
        ("tests/test_fallback.py::test_peek_entry_replays_before_it_shows_what_redis_holds",),
        within="peek_entry_flow",
    ),
    Mutant(
        "replay-failure-is-no-outage",
        "a read whose replay failed (Redis answers) loads: no remembered value, no gutter",
        "cacheguard/cache/flows/read.py",
        "                        state, call, flight, None, fallbacks=False\n",
        "                        state, call, flight, None\n",
        (
            "tests/test_fallback.py::test_a_replay_failure_answers_with_on_backend_error_only[sync]",
            "tests/test_fallback.py::test_a_replay_failure_answers_with_on_backend_error_only[async]",
        ),
        within="read_flow",
    ),
    Mutant(
        "circuit-closing-marks-replay",
        "a circuit that closes after it was open, whichever call probed it (a write's too), "
        "makes the guard replay its outbox before it serves from Redis again",
        "cacheguard/cache/flows/state.py",
        "            on_close=self.recovery.mark,\n",
        "",
        (
            "tests/test_fallback.py::"
            "test_a_write_that_probes_a_circuit_back_marks_the_replay_pending",
            "tests/test_breaker.py::"
            "test_a_circuit_closing_after_it_was_open_calls_on_close_whoever_probed",
        ),
        within="GuardState.__init__",
    ),
    Mutant(
        "asyncio-local-release-on-its-loop",
        "a local write hold of an asyncio guard released from another thread (a dropped "
        "session's) is released on the guard's loop, waking its waiters at once",
        "cacheguard/integrations/sqlalchemy/guards.py",
        "        if loop is None or running is loop:\n",
        "        if True:\n",
        (
            "tests/test_outbox_privacy.py::"
            "test_a_local_hold_released_from_another_thread_wakes_the_loop_s_waiters",
        ),
        within="_Awaiting.release_local",
    ),
    # -- lock cohorting: write holds handed between the writers of a process (issue #25) --
    Mutant(
        "two-tier-cohort-hand-over",
        "a two-tier writer releasing while local writers wait hands them its distributed "
        "write hold: no round trip, the same handle and token",
        "cacheguard/locks/two_tier.py",
        "                    handed = self._local.hand_over_write(holder=me)\n",
        "                    handed = False\n",
        ("tests/test_lock_cohort.py::test_a_handed_over_write_hold_does_not_touch_redis",),
        within="TwoTierRWLock.release_write",
    ),
    Mutant(
        "two-tier-cohort-limit",
        "a distributed write hold is handed over at most cohort_limit times in a row; then "
        "writers of other processes queued meanwhile come first",
        "cacheguard/locks/two_tier.py",
        "                    and self._handovers < self.cohort_limit\n",
        "",
        (
            "tests/test_lock_cohort.py::"
            "test_the_cohort_limit_lets_another_process_in_after_that_many_hand_overs",
            "tests/test_lock_cohort.py::test_cohort_limit_is_checked",
        ),
        within="TwoTierRWLock.release_write",
    ),
    Mutant(
        "two-tier-cohort-never-hands-a-lost-hold",
        "a hold known lost is not handed over: its release goes to Redis and raises "
        "LockLostError to the holder",
        "cacheguard/locks/two_tier.py",
        "        and not handle.lost\n",
        "",
        (
            "tests/test_lock_cohort.py::"
            "test_a_lost_hold_is_not_handed_over_and_its_loss_is_raised_to_the_holder",
            "tests/test_lock_cohort.py::"
            "test_async_a_lost_hold_is_not_handed_over_and_its_loss_is_raised",
        ),
        within="may_hand_over",
    ),
    Mutant(
        "two-tier-cohort-only-while-sure-to-last",
        "a hold is handed over only while more than a third of its lease is sure to be left: "
        "a holder whose lease may have run out asks Redis, which raises LockLostError",
        "cacheguard/locks/two_tier.py",
        "        and validity > handle.lease / 3\n",
        "",
        (
            "tests/test_lock_cohort.py::"
            "test_a_holder_whose_lease_may_have_run_out_releases_in_redis",
            "tests/test_lock_cohort.py::"
            "test_async_a_holder_whose_lease_may_have_run_out_releases_in_redis",
            "tests/test_dogpile_backend.py::"
            "test_a_hold_whose_lease_may_have_run_out_is_not_passed_on",
        ),
        within="may_hand_over",
    ),
    Mutant(
        "lock-renewal-confirms-the-lease",
        "a renewal by the watchdog confirms the hold for a lease from when it was sent (so "
        "a renewed hold stays sure to last, and is handed over)",
        "cacheguard/locks/redis/lease.py",
        "            handle.confirmed_at = sent\n",
        "            pass\n",
        (
            "tests/test_lock_cohort.py::"
            "test_a_hold_the_watchdog_renews_is_still_handed_over_past_its_first_lease",
            "tests/test_lock_cohort.py::test_async_a_hold_the_watchdog_renews_is_still_handed_over",
        ),
        within="LeaseBook._settle",
    ),
    Mutant(
        "local-hand-over-keeps-a-downgrade-alone",
        "a holder that downgraded (holds the read lock too) does not hand the write lock on: "
        "no writer enters while it reads",
        "cacheguard/locks/local.py",
        "            if self._write_depth != 1 or me.number in self._readers or "
        "not self._successors:",
        "            if self._write_depth != 1 or not self._successors:",
        ("tests/test_lock_cohort.py::test_a_downgraded_holder_does_not_hand_over",),
        within="LocalRWLock.hand_over_write",
    ),
    Mutant(
        "local-interrupted-successor-passes-on",
        "a successor interrupted after it was handed the write lock passes it to the next "
        "successor (or frees it), instead of keeping it for nobody",
        "cacheguard/locks/local.py",
        "                    dropped = self._writer == n and self._pass_on_handover()\n",
        "                    dropped = False\n",
        (
            "tests/test_lock_cohort.py::"
            "test_an_interrupted_successor_passes_the_hold_on_or_gives_it_back",
        ),
        within="LocalRWLock.acquire_write",
    ),
    Mutant(
        "two-tier-unclaimed-hold-given-back",
        "a distributed write hold kept for a successor that gave up, with none behind it, is "
        "given back in Redis, not renewed for nobody",
        "cacheguard/locks/two_tier.py",
        "            on_dropped=self._drop_unclaimed,\n",
        "            on_dropped=None,\n",
        (
            "tests/test_lock_cohort.py::"
            "test_an_interrupted_successor_passes_the_hold_on_or_gives_it_back",
        ),
        within="TwoTierRWLock._reset",
    ),
    Mutant(
        "aio-two-tier-cohort-hand-over",
        "an asyncio two-tier writer releasing while other tasks wait to write hands them its "
        "distributed write hold, with no round trip",
        "cacheguard/locks/async_two_tier.py",
        "                    handed = self._local.hand_over_write(holder=holder)\n",
        "                    handed = False\n",
        ("tests/test_lock_cohort.py::test_async_a_handed_over_write_hold_does_not_touch_redis",),
        within="AsyncTwoTierRWLock.release_write",
    ),
    Mutant(
        "aio-two-tier-cohort-limit",
        "an asyncio two-tier write hold is handed over at most cohort_limit times in a row",
        "cacheguard/locks/async_two_tier.py",
        "                    and self._handovers < self.cohort_limit\n",
        "",
        (
            "tests/test_lock_cohort.py::test_async_the_cohort_limit_lets_another_process_in",
            "tests/test_lock_cohort.py::test_async_cohort_limit_is_checked",
        ),
        within="AsyncTwoTierRWLock.release_write",
    ),
    Mutant(
        "aio-local-hand-over-keeps-a-downgrade-alone",
        "a task that downgraded does not hand the write lock on: no writer enters while it reads",
        "cacheguard/locks/async_local.py",
        "        if self._write_depth != 1 or me in self._readers or not self._successors:",
        "        if self._write_depth != 1 or not self._successors:",
        ("tests/test_lock_cohort.py::test_async_a_downgraded_holder_does_not_hand_over",),
        within="AsyncLocalRWLock.hand_over_write",
    ),
    Mutant(
        "aio-local-cancelled-successor-passes-on",
        "a task cancelled after it was handed the write lock passes it on (or frees it and "
        "gives the distributed hold back)",
        "cacheguard/locks/async_local.py",
        "            if self._writer is me and self._pass_on_handover() and "
        "self._on_dropped is not None:",
        "            if False:",
        (
            "tests/test_lock_cohort.py::"
            "test_async_a_cancelled_successor_passes_the_hold_on_or_gives_it_back",
        ),
        within="AsyncLocalRWLock.acquire_write",
    ),
    Mutant(
        "aio-two-tier-unclaimed-hold-given-back",
        "an asyncio distributed write hold kept for a cancelled successor, with none behind "
        "it, is given back in Redis",
        "cacheguard/locks/async_two_tier.py",
        "on_dropped=self._drop_unclaimed)",
        "on_dropped=None)",
        (
            "tests/test_lock_cohort.py::"
            "test_async_a_cancelled_successor_passes_the_hold_on_or_gives_it_back",
        ),
        within="AsyncTwoTierRWLock.__init__",
    ),
    Mutant(
        "dogpile-waiters-read-without-round-trips",
        "a dogpile waiter's read under the mutex is answered from what its process saw of "
        "the key while it waited: one GET per caller before the mutex, none after it",
        "cacheguard/integrations/dogpile.py",
        "            known = gate.first_read()  # takes this thread's ticket, if any\n",
        "            known = None\n",
        (
            "tests/test_dogpile_backend.py::"
            "test_waiters_read_what_was_created_while_they_waited_without_a_round_trip",
        ),
        within="CacheGuardBackend.get_serialized",
    ),
    Mutant(
        "dogpile-first-read-seen-after-the-wait-began",
        "a waiter's read is never answered with what its process saw before it began to "
        "wait (a write elsewhere meanwhile is seen)",
        "cacheguard/integrations/dogpile.py",
        "                or seen.sent < began  # seen before it began to wait\n",
        "",
        (
            "tests/test_dogpile_backend.py::"
            "test_a_waiters_first_read_never_answers_with_what_was_seen_before_it_waited",
        ),
        within="_KeyGate.first_read",
    ),
    Mutant(
        "dogpile-first-read-under-an-unbroken-hold",
        "a waiter's read is answered from what was seen only under the distributed hold its "
        "process still has (none let go since, when another process may have created)",
        "cacheguard/integrations/dogpile.py",
        "                or seen.hold is not hold  # seen under an earlier hold, since let go\n",
        "",
        (
            "tests/test_dogpile_backend.py::"
            "test_a_waiters_first_read_is_from_redis_once_the_hold_was_let_go",
        ),
        within="_KeyGate.first_read",
    ),
    Mutant(
        "dogpile-first-read-only-first",
        "only a waiter's first call on the key may be answered from its wait: after its own "
        "write, its reads go to Redis",
        "cacheguard/integrations/dogpile.py",
        'any later read is not its first."""\n        self._tickets.first_read = None\n',
        'any later read is not its first."""\n',
        (
            "tests/test_dogpile_backend.py::test_a_waiter_that_wrote_the_key_reads_it_back_from_redis",
        ),
        within="_KeyGate.no_first_read",
    ),
    Mutant(
        "dogpile-passes-only-while-sure-to-last",
        "a dogpile hold is passed to the next waiter only while sure to last; a holder whose "
        "lease may have run out lets it go in Redis",
        "cacheguard/integrations/dogpile.py",
        "            if hold is not None and may_hand_over(hold) and self.waiting and",
        "            if hold is not None and not hold.lost and self.waiting and",
        (
            "tests/test_dogpile_backend.py::test_a_hold_whose_lease_may_have_run_out_is_not_passed_on",
        ),
        within="_KeyGate.release",
    ),
    # -- durations: seconds or a timedelta; guards close what they made (issue #26:
    # tests/test_durations.py, the lock contracts, tests/test_shutdown.py) --
    Mutant(
        "durations-timedelta-taken",
        "every duration takes a timedelta as well as a number of seconds",
        "cacheguard/checks.py",
        "    if isinstance(value, timedelta):\n        return value.total_seconds()\n",
        "",
        (
            "tests/test_durations.py::test_a_timedelta_ttl_lives_as_long_as_its_seconds[sync]",
            "tests/test_durations.py::test_every_duration_setting_takes_a_timedelta[async]",
        ),
        within="_number",
    ),
    Mutant(
        "durations-timedelta-whole-length",
        "a timedelta counts for its whole length: days and microseconds too",
        "cacheguard/checks.py",
        "        return value.total_seconds()\n",
        "        return float(value.seconds)\n",
        ("tests/test_durations.py::test_a_timedelta_ttl_lives_as_long_as_its_seconds[async]",),
        within="_number",
    ),
    Mutant(
        "durations-negative-timedelta-refused",
        "a negative timedelta is refused as its number is",
        "cacheguard/checks.py",
        "        return value.total_seconds()\n",
        "        return abs(value.total_seconds())\n",
        (
            "tests/test_durations.py::"
            "test_a_bad_timedelta_gets_the_error_its_number_gets[sync-negative]",
        ),
        within="_number",
    ),
    Mutant(
        "durations-ttl-converted",
        "a read's timedelta ttl is stored for its seconds (get_or_load, refresh)",
        "cacheguard/cache/flows/state.py",
        '        return check_positive("ttl", ttl)\n',
        '        check_positive("ttl", ttl)\n        return ttl\n',
        ("tests/test_durations.py::test_a_timedelta_ttl_lives_as_long_as_its_seconds[sync]",),
        within="GuardState.checked_ttl",
    ),
    Mutant(
        "durations-none-ttl-converted",
        "a read's timedelta none_ttl keeps a cached None for its seconds",
        "cacheguard/cache/flows/read.py",
        '        else check_positive("none_ttl", none_ttl)\n',
        '        else (check_positive("none_ttl", none_ttl) and none_ttl)\n',
        ("tests/test_durations.py::test_a_timedelta_ttl_lives_as_long_as_its_seconds[async]",),
        within="read_call",
    ),
    Mutant(
        "durations-loader-converts-once",
        "a loader or decorated function turns its timedelta ttl into seconds once, when made",
        "cacheguard/cache/loader.py",
        '        self.ttl = check_positive("ttl", ttl)\n',
        '        self.ttl = check_positive("ttl", ttl) and ttl\n',
        ("tests/test_durations.py::test_loaders_and_the_decorator_take_timedelta_lifetimes[sync]",),
        within="KeyedLoader.__init__",
    ),
    Mutant(
        "durations-write-gives-its-store-seconds",
        "a write's timeout reaches its lock store as seconds (a float), whatever its form",
        "cacheguard/cache/flows/write.py",
        '    limit = None if timeout is None else check_positive("timeout", timeout)\n',
        "    limit = timeout\n",
        (
            "tests/test_durations.py::test_a_write_gives_its_lock_store_seconds[sync]",
            "tests/test_durations.py::test_a_write_gives_its_lock_store_seconds[async]",
        ),
        within="write_flow",
    ),
    Mutant(
        "durations-local-lock-timeout",
        "the local lock waits a timedelta timeout as its seconds",
        "cacheguard/locks/local.py",
        '        limit = None if timeout is None else check_non_negative("timeout", timeout)\n',
        "        limit = timeout\n",
        ("tests/test_durations.py::test_the_local_lock_waits_a_timedelta_timeout_as_its_seconds",),
        within="LocalRWLock._wait_for",
    ),
    Mutant(
        "durations-aio-local-lock-timeout",
        "the asyncio local lock waits a timedelta timeout as its seconds",
        "cacheguard/locks/async_local.py",
        '        limit = None if timeout is None else check_non_negative("timeout", timeout)\n',
        "        limit = timeout\n",
        ("tests/test_durations.py::test_asyncio_locks_take_timedelta_leases_and_timeouts",),
        within="AsyncLocalRWLock._wait_for",
    ),
    Mutant(
        "durations-dogpile-zero-expiry",
        "the dogpile backend's redis_expiration_time of timedelta(0) means no expiry, as 0 does",
        "cacheguard/integrations/dogpile.py",
        "value in (0, _NO_TIME)",
        "value == 0",
        ("tests/test_durations.py::test_the_dogpile_backend_takes_timedelta_arguments",),
        within="_optional_seconds",
    ),
    Mutant(
        "durations-dogpile-aliases-agree",
        "a dogpile argument and its alias agree when they are the same length in two forms",
        "cacheguard/integrations/dogpile.py",
        "    return _seconds(name, one) == _seconds(name, other)\n",
        "    return one == other\n",
        ("tests/test_durations.py::test_the_dogpile_backend_takes_timedelta_arguments",),
        within="_agree",
    ),
    Mutant(
        "durations-tracker-lock-timeout",
        "track_models takes lock_timeout as seconds or a timedelta and checks it when made",
        "cacheguard/integrations/sqlalchemy/tracker.py",
        '            None if lock_timeout is None else check_positive("lock_timeout", lock_timeout)'
        "\n",
        "            lock_timeout\n",
        ("tests/test_sqlalchemy.py::test_lock_timeout_and_outbox_poll_take_a_timedelta[sqlite]",),
        within="ModelTracker.__init__",
    ),
    Mutant(
        "guard-with-block-closes",
        "leaving a CacheGuard's with block closes it, and the client from_url made",
        "cacheguard/cache/guard.py",
        "        self.close()\n",
        "        pass\n",
        ("tests/test_shutdown.py::test_sync_guard_is_a_context_manager",),
        within="CacheGuard.__exit__",
    ),
    Mutant(
        "aio-guard-async-with-closes",
        "leaving an AsyncCacheGuard's async with block closes it, and the client from_url made",
        "cacheguard/cache/async_guard.py",
        "        await self.aclose()\n",
        "        pass\n",
        ("tests/test_shutdown.py::test_asyncio_guard_is_an_async_context_manager",),
        within="AsyncCacheGuard.__aexit__",
    ),
    Mutant(
        "guard-with-block-leaves-a-client-passed-in",
        "leaving a CacheGuard's with block leaves a client passed in open, its pool connected",
        "cacheguard/cache/guard.py",
        "        if self._state.owns_client:\n            close_notifier_of(self.client)\n",
        "        if True:\n            close_notifier_of(self.client)\n",
        ("tests/test_shutdown.py::test_a_with_block_leaves_a_client_passed_in_open[sync]",),
        within="CacheGuard.close",
    ),
    Mutant(
        "aio-guard-async-with-leaves-a-client-passed-in",
        "leaving an AsyncCacheGuard's async with block leaves a client passed in open, its "
        "pool connected",
        "cacheguard/cache/async_guard.py",
        "        if self._state.owns_client:\n            await aclose_notifiers_of(self.client)\n",
        "        if True:\n            await aclose_notifiers_of(self.client)\n",
        ("tests/test_shutdown.py::test_a_with_block_leaves_a_client_passed_in_open[async]",),
        within="AsyncCacheGuard.aclose",
    ),
    # -- batch read-through (cache/flows/batch.py, batch_driver.py, many.py) -----------------
    Mutant(
        "batch-hits-one-round-trip",
        "a batch reads all its names in one pipelined round trip, no GET per name (sync)",
        "cacheguard/cache/batch_driver.py",
        "return get_many_raw(self.client, [value_key(namespace, n) for n in step.names])",
        "return [self.client.get(value_key(namespace, n)) for n in step.names]",
        ("tests/test_batch.py::test_hits_come_in_one_round_trip_and_the_misses_in_one_load",),
        within="BatchDriver.answer",
    ),
    Mutant(
        "batch-hits-one-round-trip-async",
        "a batch reads all its names in one pipelined round trip, no GET per name (asyncio)",
        "cacheguard/cache/async_batch_driver.py",
        "return await aget_many_raw(self.client, [value_key(namespace, n) for n in step.names])",
        "return [await self.client.get(value_key(namespace, n)) for n in step.names]",
        ("tests/test_batch.py::test_hits_come_in_one_round_trip_and_the_misses_in_one_load",),
        within="AsyncBatchDriver.answer",
    ),
    Mutant(
        "batch-judged-as-single-reads",
        "a batch judges each reply as a single read does: a key of another type is a "
        "corrupt entry, counted",
        "cacheguard/cache/flows/batch.py",
        "served, entry = judge_read(state, call, raw, l1_seen, ticket, refresh)",
        "served, entry = judge_read(\n"
        "            state, call, raw if raw.__class__ is bytes else None, l1_seen, ticket,\n"
        "            refresh,\n"
        "        )",
        ("tests/test_batch.py::test_entries_are_judged_as_single_reads_judge_them",),
        within="_read_pending",
    ),
    Mutant(
        "batch-l1-first",
        "a batch serves what L1 keeps without reading Redis, as a single read does",
        "cacheguard/cache/flows/batch.py",
        "    if l1 is not None and not state.recovery.pending:",
        "    if False:",
        ("tests/test_batch.py::test_entries_are_judged_as_single_reads_judge_them",),
        within="batch_read",
    ),
    Mutant(
        "batch-double-checked-under-the-lock",
        "a key filled between the batch's read and its fill's begin is served, not loaded again",
        "cacheguard/cache/flows/batch.py",
        "                refresh=False,\n",
        "                refresh=True,\n",
        (
            "tests/test_batch.py::test_a_key_filled_between_the_batchs_read_and_its_lock_is_not_loaded",
        ),
        within="_fill_many",
    ),
    Mutant(
        "batch-never-waits-holding-its-fills",
        "a batch begins its fills without waiting: keys busy elsewhere (another filler, a "
        "writer) are waited for only once its own fills ended, so overlapping batches never "
        "wait for each other",
        "cacheguard/cache/flows/batch.py",
        "                background=True,  # never waits: busy elsewhere ends it at once\n",
        "                background=False,\n",
        (
            "tests/test_batch.py::test_a_writer_holding_a_key_is_waited_for_while_the_other_keys_load",
            "tests/test_batch.py::test_batches_with_overlapping_reversed_names_do_not_wait_for_each_other",
        ),
        within="_fill_many",
    ),
    Mutant(
        "batch-failed-load-ends-every-fill",
        "a load_many that raises ends every fill the batch began: no hold left, nothing cached",
        "cacheguard/cache/flows/batch.py",
        "                    yield from _end_failed(state, fill, exc)\n",
        "                    pass\n",
        ("tests/test_batch.py::test_a_failing_load_many_releases_every_lock_and_caches_nothing",),
        within="_fill_many",
    ),
    Mutant(
        "batch-left-out-name-not-cached",
        "a name load_many left out is not cached and the call raises IncompleteLoad",
        "cacheguard/cache/flows/batch.py",
        "resume: Callable[[], Step] = functools.partial(flow.throw, incomplete)",
        "resume: Callable[[], Step] = functools.partial(flow.send, (None, seconds, snapshot))",
        ("tests/test_batch.py::test_a_name_left_out_by_load_many_raises_and_is_not_cached",),
        within="_load_parked",
    ),
    Mutant(
        "batch-outage-follows-on-backend-error",
        "with Redis down a batch follows on_backend_error: raise refuses, bypass loads every "
        "name in one load_many",
        "cacheguard/cache/flows/batch.py",
        "        state.refuse_bypass(call.name, exc, call.template, failure_counted=True)\n",
        '        state.recorder.count("bypasses", call.name, 0.0, None, call.template)\n',
        ("tests/test_batch.py::test_redis_down_bypasses_with_one_load_for_every_name",),
        within="_bypassed_calls",
    ),
    Mutant(
        "batch-mid-batch-outage-one-load",
        "Redis failing a fill's begin mid-batch stops the batch's fills: the fills begun and "
        "every remaining miss are loaded by one load_many, the rest bypassed, never tried",
        "cacheguard/cache/flows/batch.py",
        "            if down is not None:  # Redis failed: no more fills begun, no more attempts\n",
        "            if down is not None and not unbegun:\n",
        (
            "tests/test_batch.py::"
            "test_redis_failing_mid_batch_stops_the_fills_and_loads_the_rest_at_once",
        ),
        within="_fill_many",
    ),
    Mutant(
        "batch-stale-if-error",
        "under stale_if_error a batch whose load_many fails is answered by the values this "
        "process saw, as get_or_load is",
        "cacheguard/cache/flows/batch.py",
        "            _stale_if_error(state, pending, values, exc)\n",
        "            raise\n",
        ("tests/test_batch.py::test_stale_if_error_answers_a_failing_batch_with_the_values_seen",),
        within="batch_read",
    ),
    Mutant(
        "batch-decorated-distinct-ids-one-key",
        "a function decorated with cached_many_with_lock refuses, before any load, distinct "
        "ids whose keys are alike (one value cannot answer both)",
        "cacheguard/cache/many.py",
        "            if distinct and known is not item and known != item:\n",
        "            if False:\n",
        ("tests/test_batch.py::test_distinct_ids_with_one_key_are_refused_before_any_load",),
        within="_Many._keys",
    ),
    Mutant(
        "batch-typed-unfit-is-a-miss",
        "a typed batch reads stored data that does not fit the type as a miss, loaded with "
        "the batch's other misses",
        "cacheguard/cache/batch_driver.py",
        "call = read_call(state, checked, load_one(name), ttl, none_ttl, template, fits)",
        "call = read_call(state, checked, load_one(name), ttl, none_ttl, template, None)",
        ("tests/test_batch.py::test_typed_values_are_stored_as_data_and_come_back_typed",),
        within="Batch.__init__",
    ),
    Mutant(
        "batch-typed-stored-as-data",
        "a typed batch stores what load_many returns as the type dumps it, plain data",
        "cacheguard/cache/batch_driver.py",
        "values[name] = value if self.values is None else self.values.dump(value)",
        "values[name] = value",
        ("tests/test_batch.py::test_typed_values_are_stored_as_data_and_come_back_typed",),
        within="Batch.loaded",
    ),
    Mutant(
        "batch-decorated-infers-type",
        "cached_many_with_lock reads the values' type from a return annotation "
        "dict[I, V] and returns typed values",
        "cacheguard/cache/many.py",
        "values = self._values = typed.mapping_value_type(self.func, codec)",
        "values = self._values = None",
        ("tests/test_batch.py::test_a_decorated_function_infers_its_values_type",),
        within="_Many._value_type",
    ),
    Mutant(
        "errors-unpickle-with-context",
        "every cacheguard error unpickles with its message and context (keyword-only "
        "context included), so errors raised in pool workers reach their callers",
        "cacheguard/exceptions.py",
        "    def __reduce__(self) -> tuple[object, ...]:\n"
        "        return _rebuilt, (self.__class__, self.args, self.__dict__.copy())\n",
        "",
        (
            "tests/test_exceptions.py::test_an_error_unpickles_with_its_message_and_context",
            "tests/test_exceptions.py::test_an_error_raised_in_a_worker_process_reaches_the_caller",
        ),
        within="CacheGuardError",
    ),
    Mutant(
        "closed-guard-starts-no-refresh-pool",
        "a background refresh asked for after close() starts no new pool of refresh "
        "threads (close() would never shut it down)",
        "cacheguard/cache/guard.py",
        "            if self._state.closed:\n",
        "            if False:\n",
        ("tests/test_cache.py::test_a_refresh_begun_as_the_guard_closes_starts_no_pool",),
        within="CacheGuard._background",
    ),
    Mutant(
        "fill-begin-keeps-a-replacement",
        "bytes a reader could not use are overwritten by its fill only if the key still "
        "holds them: a value another process stored meanwhile is served, not loaded again",
        "cacheguard/cache/scripts.py",
        "elseif ARGV[5] then\n"
        "  local value = redis.pcall('GET', vkey)\n"
        "  if type(value) == 'string' and value ~= ARGV[5] then return {0, value} end\n",
        "",
        (
            "tests/test_cache.py::"
            "test_unusable_bytes_replaced_by_another_fill_meanwhile_are_not_loaded_again",
        ),
        within="_FILL_BEGIN_BODY",
    ),
    Mutant(
        "fill-flow-names-the-unusable-bytes",
        "a fill forced over unusable bytes names them, so a replacement stored meanwhile "
        "is served instead of loaded again",
        "cacheguard/cache/flows/fill.py",
        "force, replacing = True, begin.raw",
        "force, replacing = True, None",
        (
            "tests/test_cache.py::"
            "test_unusable_bytes_replaced_by_another_fill_meanwhile_are_not_loaded_again",
        ),
        within="fill_flow",
    ),
    Mutant(
        "zookeeper-unknown-create-swept-at-once",
        "a ZooKeeper acquire whose create went unanswered by its deadline has its node "
        "swept at once, not at its session's next acquire (it would block the queue)",
        "cacheguard/locks/zookeeper/rwlock.py",
        "                session.sweep()\n",
        "                pass\n",
        (
            "tests/test_lock_zookeeper.py::"
            "test_a_create_answered_after_its_deadline_leaves_no_node_in_the_queue",
        ),
        within="ZooKeeperRWLock._queue_up",
    ),
    Mutant(
        "zookeeper-sweep-takes-late-orphans",
        "a ZooKeeper sweep also deletes the orphans recorded while it ran (their own "
        "sweep found it running)",
        "cacheguard/locks/zookeeper/rwlock.py",
        "                tried.update(orphans)\n                self._delete_orphans(orphans)\n",
        "                self._delete_orphans(orphans)\n                return\n",
        (
            "tests/test_lock_zookeeper.py::"
            "test_a_create_answered_after_its_deadline_leaves_no_node_in_the_queue",
        ),
        within="_Session._sweep",
    ),
    Mutant(
        "batch-gets-per-node",
        "a batch's GETs go one pipeline per node: a dead node's failure is charged to its "
        "own breaker and bypasses its names only, the other nodes' names are served",
        "cacheguard/cache/flows/batch.py",
        "        groups.setdefault(id(state.breaker(call.name)), []).append(call)\n",
        "        groups.setdefault(0, []).append(call)\n",
        ("tests/test_cluster.py::test_a_batch_with_a_dead_shard_bypasses_only_that_shards_names",),
        within="_get_by_node",
    ),
    Mutant(
        "batch-refreshes-together",
        "the entries a batch served that were due for a refresh (early refresh, the stale "
        "window) are refreshed together in the background, with one load_many",
        "cacheguard/cache/flows/batch.py",
        "        refresh = None if due is None else due.append\n",
        "        refresh = None\n",
        (
            "tests/test_batch.py::"
            "test_entries_due_for_a_refresh_are_refreshed_together_in_the_background",
        ),
        within="_read_pending",
    ),
    Mutant(
        "batch-decorated-invalidate",
        "a function decorated with cached_many_with_lock invalidates the keys of the ids given",
        "cacheguard/cache/many.py",
        "            self.guard.invalidate(*keys, template=self.template)\n",
        "            pass\n",
        ("tests/test_batch.py::test_a_decorated_function_of_a_list_of_ids",),
        within="CachedManyFunction.invalidate",
    ),
    # -- Django: the cache backend (cacheguard/integrations/django/cache.py, issue #27) -----
    Mutant(
        "django-get-or-set-one-load",
        "the Django backend's get_or_set with a callable loads through the guard: one call of "
        "the callable across processes and threads, the others waiting for its value",
        "cacheguard/integrations/django/cache.py",
        "            return self.guard.get_or_load(name, default, ttl=ttl, none_ttl=ttl)\n",
        "            return super().get_or_set(key, default, timeout, version)\n",
        (
            "tests/test_django_cache.py::test_threads_share_one_load",
            "tests/test_django_cache.py::test_a_cold_key_stampede_of_processes_loads_once_woken_by_the_announcement",
        ),
        within="CacheGuardCache.get_or_set",
    ),
    Mutant(
        "django-aget-or-set-one-load",
        "the Django backend's aget_or_set with a callable loads through the asyncio guard: "
        "tasks wait for another process's fill instead of loading",
        "cacheguard/integrations/django/cache.py",
        "            return await self.async_guard().get_or_load(name, default, ttl=ttl, "
        "none_ttl=ttl)\n",
        "            return await super().aget_or_set(key, default, timeout, version)\n",
        ("tests/test_django_cache.py::test_aget_or_set_waits_for_another_processs_fill",),
        within="CacheGuardCache.aget_or_set",
    ),
    Mutant(
        "django-set-fails-fills-in-flight",
        "a Django set (set, set_many, add) wins over a fill under way: its script deletes the "
        "fill's 'fs' field, so the fill stores nothing over the written value",
        "cacheguard/cache/entry_writes.py",
        "redis.call('HDEL', lock, 'fs')\n",
        "",
        (
            "tests/test_django_cache.py::test_a_write_during_a_fill_wins_over_it[set]",
            "tests/test_django_cache.py::test_a_set_during_another_processs_fill_wins",
        ),
        within="ENTRY_PUT",
    ),
    Mutant(
        "django-delete-fails-fills-in-flight",
        "a Django delete (delete, delete_many, a timeout of 0) wins over a fill under way: the "
        "fill does not store the deleted key again",
        "cacheguard/cache/entry_writes.py",
        "redis.call('HDEL', KEYS[2], 'fs')\nreturn redis.call('DEL', KEYS[1])\n",
        "return redis.call('DEL', KEYS[1])\n",
        ("tests/test_django_cache.py::test_a_write_during_a_fill_wins_over_it[delete]",),
        within="ENTRY_DELETE",
    ),
    Mutant(
        "django-set-stamped-by-the-server-clock",
        "an entry a Django set stores is stamped with the Redis server's clock: the guard "
        "judges it fresh, so a set value is a hit for get_or_set",
        "cacheguard/cache/entry_writes.py",
        "entry = string.sub(entry, 1, {_CREATED_AT - 1}) .. created .. "
        "string.sub(entry, {_CREATED_AT + 8})\n",
        "",
        ("tests/test_django_cache.py::test_a_set_value_is_a_hit_for_get_or_set_and_for_the_guard",),
        within="ENTRY_PUT",
    ),
    Mutant(
        "django-add-only-if-free",
        "a Django add (and get_or_set with a plain default) stores nothing over a value "
        "already there",
        "cacheguard/cache/entry_writes.py",
        "if ARGV[3] == '1' and redis.call('EXISTS', vkey) == 1 then return 0 end\n",
        "",
        ("tests/test_django_cache.py::test_a_non_callable_default_is_added_then_read",),
        within="ENTRY_PUT",
    ),
    Mutant(
        "django-touch-restamps-the-entry",
        "a Django touch gives the entry itself its new life (created now, the new ttl), "
        "not only the key: the guard's get_or_set judges it by them",
        "cacheguard/cache/entry_writes.py",
        "entry = string.sub(entry, 1, {_CREATED_AT - 1}) .. stamp .. "
        "string.sub(entry, {_AFTER_TTL})\n",
        "",
        ("tests/test_django_cache.py::test_touch_restarts_the_entrys_life_for_the_guard_too",),
        within="ENTRY_TOUCH",
    ),
    Mutant(
        "django-incr-compare-and-set",
        "a Django incr/decr is a compare-and-set on the entry: increments from several "
        "processes are never lost",
        "cacheguard/cache/entry_writes.py",
        "if type(current) ~= 'string' or current ~= ARGV[1] then return 0 end\n",
        "if type(current) ~= 'string' then return 0 end\n",
        (
            # A write between the read and the swap, every time; the processes alone
            # may not overlap on a quiet machine (a clean-clone CI run saw it survive).
            "tests/test_django_cache.py::test_an_incr_whose_compare_and_set_loses_reads_again",
            "tests/test_django_cache.py::test_incr_is_atomic_across_processes",
        ),
        within="ENTRY_SWAP",
    ),
    Mutant(
        "django-clear-its-key-prefix-only",
        "a Django clear() of a cache with a KEY_PREFIX deletes that prefix's keys only, not "
        "those of the namespace's other caches",
        "cacheguard/integrations/django/cache.py",
        '            return f"{self.key_prefix}:", lambda name: shape.match(name) is not None\n',
        '            return "", lambda name: True\n',
        ("tests/test_django_cache.py::test_clear_with_a_key_prefix_deletes_that_prefix_only",),
        within="CacheGuardCache._cleared",
    ),
    Mutant(
        "django-clear-fails-fills-in-flight",
        "a Django clear() finds the fills under way by their lock hash (no value yet) and "
        "deletes each name as delete does: the fill stores nothing after it",
        "cacheguard/integrations/django/cache.py",
        "            name = self._layout.name_of(key)\n",
        '            name = self._layout.name_of(key) if key.endswith("}:v") else None\n',
        ("tests/test_django_cache.py::test_clear_fails_a_fill_under_way",),
        within="CacheGuardCache._clear_flow",
    ),
    Mutant(
        "django-pickles-signed-by-secret-key",
        "the Django backend's pickles are signed with a key derived from SECRET_KEY: a new "
        "SECRET_KEY makes the old entries misses",
        "cacheguard/integrations/django/cache.py",
        "    return hmac.new(material, _SIGNING_SALT, hashlib.sha256).digest()\n",
        "    return hmac.new(b'fixed', _SIGNING_SALT, hashlib.sha256).digest()\n",
        ("tests/test_django_cache.py::test_a_new_secret_key_makes_the_old_entries_misses",),
        within="_signing_key",
    ),
    Mutant(
        "django-tampered-pickle-refused",
        "a pickle entry whose signature does not match (forged, tampered) is refused before "
        "anything is unpickled: a miss for the Django backend",
        "cacheguard/cache/codec.py",
        '            raise ValueError("pickle payload is unsigned or its signature does not '
        'match")\n',
        "            pass\n",
        ("tests/test_django_cache.py::test_an_unsigned_or_tampered_pickle_is_never_unpickled",),
        within="PickleCodec.verified",
    ),
    Mutant(
        "django-aget-no-thread",
        "the Django backend's aget runs on the asyncio guard, not the sync one in a thread "
        "(Django's default sync_to_async)",
        "cacheguard/integrations/django/cache.py",
        "        name = self.guard_name(key, version)\n        guard = self.async_guard()\n",
        "        return await super().aget(key, default, version)\n",
        ("tests/test_django_cache.py::test_the_async_methods_use_no_thread_and_no_sync_guard",),
        within="CacheGuardCache.aget",
    ),
    Mutant(
        "django-aset-no-thread",
        "the Django backend's aset runs on the asyncio guard, not the sync one in a thread",
        "cacheguard/integrations/django/cache.py",
        '        await self._adrive(_one(call), f"writing {name!r}", (name,))\n',
        "        await super().aset(key, value, timeout, version)\n",
        ("tests/test_django_cache.py::test_the_async_methods_use_no_thread_and_no_sync_guard",),
        within="CacheGuardCache.aset",
    ),
    Mutant(
        "django-loop-guard-closed-with-its-loop",
        "an event loop's asyncio guard in the Django backend is closed as the loop shuts down: "
        "no connection outlives its loop",
        "cacheguard/integrations/django/cache.py",
        "                await guard.aclose()\n",
        "                pass\n",
        ("tests/test_django_cache.py::test_each_event_loop_gets_its_guard_closed_with_the_loop",),
        within="_Connections._closed_with",
    ),
    # -- Django: the ORM hooks and ORM values (integrations/django/orm.py, codecs/django_models.py;
    # issue #27) --
    Mutant(
        "django-save-locks-before-the-sql",
        "a tracked save() write-locks and invalidates its keys before its SQL runs",
        "cacheguard/integrations/django/orm.py",
        "        work.instances([instance])\n        work.lock()\n        with django_block:\n",
        "        work.instances([instance])\n        with django_block:\n",
        (
            "tests/test_django_orm.py::test_each_write_kind_locks_old_and_new_keys[save-atomic]",
            "tests/test_django_orm.py::"
            "test_each_write_kind_locks_old_and_new_keys[save-autocommit]",
        ),
        within="_tracked_save",
    ),
    Mutant(
        "django-locking-invalidates",
        "the keys a tracked write locks are invalidated as they are locked, before its SQL",
        "cacheguard/integrations/django/orm.py",
        "            state.locks[name] = (lock, handle)\n        self.guard.invalidate(*fresh)\n",
        "            state.locks[name] = (lock, handle)\n",
        ("tests/test_django_orm.py::test_each_write_kind_locks_old_and_new_keys[delete-atomic]",),
        within="ModelTracker._lock",
    ),
    Mutant(
        "django-save-old-values",
        "a tracked save() names the keys of the row's old values, read from the database",
        "cacheguard/integrations/django/orm.py",
        "        if instance.pk is not None:  # the row as it is: the old values\n"
        "            work.rows(work.select(pks=[instance.pk], limit=False) or [])\n",
        "",
        ("tests/test_django_orm.py::test_each_write_kind_locks_old_and_new_keys[save-atomic]",),
        within="_tracked_save",
    ),
    Mutant(
        "django-update-hook",
        "QuerySet.update() (and bulk_update(), which runs through it) of a tracked model is "
        "tracked",
        "cacheguard/integrations/django/orm.py",
        '    (QuerySet, "update", _update),\n',
        "",
        (
            "tests/test_django_orm.py::"
            "test_each_write_kind_locks_old_and_new_keys[queryset-update-atomic]",
            "tests/test_django_orm.py::"
            "test_each_write_kind_locks_old_and_new_keys[bulk-update-autocommit]",
        ),
        within="_WRITE_PATCHES",
    ),
    Mutant(
        "django-update-new-values",
        "a tracked QuerySet.update() that changes template fields names the keys of the "
        "new values (the rows selected again after it)",
        "cacheguard/integrations/django/orm.py",
        "        if _changes_template_fields(self.model, kwargs, work.attnames):\n",
        "        if False:\n",
        (
            "tests/test_django_orm.py::"
            "test_each_write_kind_locks_old_and_new_keys[queryset-update-atomic]",
            "tests/test_django_orm.py::"
            "test_each_write_kind_locks_old_and_new_keys[bulk-update-atomic]",
        ),
        within="_update",
    ),
    Mutant(
        "django-update-only-the-locked-rows",
        "a tracked QuerySet.update() changes only the rows it selected and locked (a row "
        "that came to match since is left as it was)",
        "cacheguard/integrations/django/orm.py",
        "        count = original(self.filter(pk__in=pks), **kwargs)\n",
        "        count = original(self, **kwargs)\n",
        ("tests/test_django_orm.py::test_an_update_changes_only_the_rows_it_selected_and_locked",),
        within="_update",
    ),
    Mutant(
        "django-delete-hook",
        "Model.delete() and QuerySet.delete() of a tracked model, and what they cascade to "
        "(fast deletes included), are tracked",
        "cacheguard/integrations/django/orm.py",
        '    (Collector, "delete", _collector_delete),\n',
        "",
        (
            "tests/test_django_orm.py::test_each_write_kind_locks_old_and_new_keys[delete-atomic]",
            "tests/test_django_orm.py::"
            "test_each_write_kind_locks_old_and_new_keys[queryset-delete-autocommit]",
            "tests/test_django_orm.py::test_cascaded_and_fast_deletes_are_tracked",
        ),
        within="_WRITE_PATCHES",
    ),
    Mutant(
        "django-delete-counts-rows",
        "a delete that removed more rows than it selected (a row came to match meanwhile) "
        "invalidates its model's templates by prefix",
        "cacheguard/integrations/django/orm.py",
        "            if label in by_label and label not in prefixed and count > expected[label]:\n",
        "            if False:\n",
        (
            "tests/test_django_orm.py::"
            "test_a_row_that_comes_to_match_a_fast_delete_is_invalidated_by_prefix",
        ),
        within="_collector_delete",
    ),
    Mutant(
        "django-delete-updates-tracked",
        "rows a delete's on_delete handler updates by primary key are tracked (old and new "
        "values; Django's SET_NULL updates by query, tracked as QuerySet.update)",
        "cacheguard/integrations/django/orm.py",
        "            if objs and (plan := _registry.plan(type(objs[0]))):\n",
        "            if False:\n",
        ("tests/test_django_orm.py::test_rows_a_delete_updates_by_primary_key_are_tracked",),
        within="_collector_delete",
    ),
    Mutant(
        "django-bulk-create-hook",
        "QuerySet.bulk_create() of a tracked model is tracked",
        "cacheguard/integrations/django/orm.py",
        '    (QuerySet, "bulk_create", _bulk_create),\n',
        "",
        (
            "tests/test_django_orm.py::"
            "test_each_write_kind_locks_old_and_new_keys[bulk-create-atomic]",
            "tests/test_django_orm.py::"
            "test_each_write_kind_locks_old_and_new_keys[bulk-create-autocommit]",
        ),
        within="_WRITE_PATCHES",
    ),
    Mutant(
        "django-bulk-create-generated-ids",
        "a tracked bulk_create() names the keys of the ids the database generated",
        "cacheguard/integrations/django/orm.py",
        "        pending = work.instances(objs)\n",
        "        pending = []\n",
        (
            "tests/test_django_orm.py::"
            "test_each_write_kind_locks_old_and_new_keys[bulk-create-atomic]",
        ),
        within="_bulk_create",
    ),
    Mutant(
        "django-upsert-old-rows",
        "a tracked upsert (bulk_create(update_conflicts=True)) names the keys of the rows it "
        "overwrites",
        "cacheguard/integrations/django/orm.py",
        "            else:\n                work.rows(rows)\n        work.lock()\n"
        "        result = original(",
        "        work.lock()\n        result = original(",
        ("tests/test_django_orm.py::test_an_upsert_invalidates_the_keys_of_the_row_it_overwrites",),
        within="_bulk_create",
    ),
    Mutant(
        "django-end-invalidates-again",
        "the end of a tracked transaction invalidates its keys again before releasing them",
        "cacheguard/integrations/django/orm.py",
        "            try:\n                self.guard.invalidate(*names)\n",
        "            try:\n                pass\n",
        (
            "tests/test_django_orm.py::test_each_write_kind_locks_old_and_new_keys[save-atomic]",
            "tests/test_django_orm.py::"
            "test_each_write_kind_locks_old_and_new_keys[queryset-update-autocommit]",
            "tests/test_django_orm.py::"
            "test_a_value_stored_while_a_lock_was_gone_is_dropped_at_the_end",
        ),
        within="ModelTracker._end",
    ),
    Mutant(
        "django-end-invalidates-prefixes",
        "a write that fell back to prefix invalidation invalidates the prefixes again when "
        "its transaction ends",
        "cacheguard/integrations/django/orm.py",
        "                state.prefixes.add(prefix)\n",
        "                pass\n",
        (
            "tests/test_django_orm.py::"
            "test_writes_over_max_rows_invalidate_by_prefix_now_and_at_the_end",
        ),
        within="ModelTracker._by_prefix",
    ),
    Mutant(
        "django-holds-until-the-outermost-end",
        "a tracked transaction's locks are held until its outermost atomic block ends, not "
        "released when a savepoint ends",
        "cacheguard/integrations/django/orm.py",
        "    if not tracking or not connection.in_atomic_block or connection.savepoint_ids:\n",
        "    if not tracking or not connection.in_atomic_block:\n",
        (
            "tests/test_django_orm.py::test_a_read_waits_for_the_commit_and_gets_the_new_row",
            "tests/test_django_orm.py::"
            "test_a_rolled_back_savepoint_keeps_its_keys_locked_until_the_outermost_end",
        ),
        within="_atomic_exit",
    ),
    Mutant(
        "django-autocommit-own-transaction",
        "a tracked write in autocommit mode runs in a transaction of its own: locked, "
        "invalidated, SQL, commit, invalidated again, released",
        "cacheguard/integrations/django/orm.py",
        "    with block:\n        yield connection\n",
        "    yield connection\n",
        (
            "tests/test_django_orm.py::"
            "test_each_write_kind_locks_old_and_new_keys[save-autocommit]",
            "tests/test_django_orm.py::"
            "test_each_write_kind_locks_old_and_new_keys[queryset-delete-autocommit]",
        ),
        within="_writing",
    ),
    Mutant(
        "django-manual-transactions-refused",
        "a tracked write with autocommit off outside atomic is refused",
        "cacheguard/integrations/django/orm.py",
        "    if not connection.get_autocommit():\n        raise _manual(alias)\n",
        "",
        ("tests/test_django_orm.py::test_manual_transaction_management_is_refused",),
        within="_writing",
    ),
    Mutant(
        "django-manual-atomic-refused",
        "a tracked write in an atomic block entered with autocommit off is refused",
        "cacheguard/integrations/django/orm.py",
        "        if not connection.commit_on_exit:  # entered with autocommit off\n"
        "            raise _manual(alias)\n",
        "",
        ("tests/test_django_orm.py::test_manual_transaction_management_is_refused",),
        within="_writing",
    ),
    Mutant(
        "django-lost-lock-fails-commit",
        "a tracked transaction whose write lock was lost does not commit (LockLostError)",
        "cacheguard/integrations/django/orm.py",
        '            if getattr(handle, "lost", False):\n',
        "            if False:\n",
        (
            "tests/test_django_orm.py::"
            "test_a_write_lock_lost_before_the_commit_rolls_the_transaction_back",
        ),
        within="_lost_lock",
    ),
    Mutant(
        "django-watermark-at-begin",
        "fills in an atomic block that began before a write do not store that write's old "
        "rows (the watermark read as the block begins)",
        "cacheguard/integrations/django/orm.py",
        "        _registry.activate(state)\n        snapshot_opened(state)\n",
        "        _registry.activate(state)\n",
        (
            "tests/test_django_orm.py::"
            "test_a_fill_in_a_transaction_begun_before_a_write_does_not_store_its_old_row",
            "tests/test_django_orm.py::"
            "test_orm_churn_across_processes_reads_nothing_older_than_a_commit",
        ),
        within="ModelTracker._began",
    ),
    Mutant(
        "django-uncommitted-not-stored",
        "no fill stores in a transaction once it wrote a tracked model (it may read rows not "
        "yet committed), whatever key it fills",
        "cacheguard/integrations/django/orm.py",
        "        if state.snapshot_watermark != -1:\n",
        "        if False:\n",
        ("tests/test_django_orm.py::test_the_writers_own_reads_see_its_rows_and_store_nothing",),
        within="ModelTracker._lock",
    ),
    Mutant(
        "django-subclasses-and-proxies",
        "writes through a tracked model's proxies and multi-table subclasses are tracked",
        "cacheguard/integrations/django/orm.py",
        "            if issubclass(model, tracked._meta.concrete_model)\n",
        "            if model is tracked\n",
        ("tests/test_django_orm.py::test_subclasses_and_proxies_share_the_templates",),
        within="ModelTracker._specs",
    ),
    Mutant(
        "django-tracker-follows-the-backends-guard",
        "tracking through a cache backend keeps working after the backend's shutdown() (its "
        "next guard is used)",
        "cacheguard/integrations/django/orm.py",
        "        current: CacheGuard = self._cache.guard\n",
        "        current = self._guard\n",
        (
            "tests/test_django_orm.py::"
            "test_the_cache_backend_sees_the_writes_before_and_after_its_shutdown",
        ),
        within="ModelTracker.guard",
    ),
    Mutant(
        "django-model-values-family",
        "an annotation naming a Django model (list[Menu], Menu | None) makes a typed value",
        "cacheguard/codecs/values.py",
        "(dataclasses.is_dataclass(part) and isinstance(part, type)) or _is_django_model(part)",
        "(dataclasses.is_dataclass(part) and isinstance(part, type))",
        ("tests/test_django_orm.py::test_model_instances_round_trip_and_a_hit_runs_no_query",),
        within="_family",
    ),
    Mutant(
        "django-model-values-as-from-the-database",
        "a model instance read from the cache is one as a query returns it (not adding, its "
        "database set): it saves as an update",
        "cacheguard/codecs/django_models.py",
        "        return kind.from_db(alias, names, values)\n",
        "        return kind(**dict(zip(names, values, strict=True)))\n",
        ("tests/test_django_orm.py::test_model_instances_round_trip_and_a_hit_runs_no_query",),
        within="model_converters",
    ),
    Mutant(
        "django-model-values-every-field",
        "a stored instance without one of the model's fields is a miss (the model changed)",
        "cacheguard/codecs/django_models.py",
        "        if missing or pk not in stored:\n",
        "        if pk not in stored:\n",
        ("tests/test_django_orm.py::test_stored_data_that_no_longer_fits_the_model_is_a_miss",),
        within="model_converters",
    ),
    Mutant(
        "django-model-values-exact-class",
        "an instance of a subclass is refused where the annotation names its parent (its own "
        "fields and class would be lost)",
        "cacheguard/codecs/django_models.py",
        "        if type(value) is not kind:\n",
        "        if not isinstance(value, kind):\n",
        (
            "tests/test_django_orm.py::"
            "test_a_subclass_instance_is_refused_where_the_annotation_names_its_parent",
        ),
        within="model_converters",
    ),
    # the review of the ORM hooks (issue #27): what a write names, and where its
    # transaction begins and ends
    Mutant(
        "django-save-keys-as-stored",
        "after a tracked save()'s SQL the row is read again: its keys are named from the "
        "values as the database stores them (12.50, UTC, a lower-case UUID), not as the "
        "instance holds them",
        "cacheguard/integrations/django/orm.py",
        "            work.instances([instance])\n"
        "            work.rows(work.select(pks=[instance.pk], limit=False) or [])\n",
        "            work.instances([instance])\n",
        ("tests/test_django_orm.py::test_new_keys_use_the_values_as_the_database_stores_them",),
        within="_tracked_save",
    ),
    Mutant(
        "django-save-signals-outside",
        "pre_save and post_save handlers run outside the hooks' transaction, as without "
        "tracking (a failing post_save keeps the save; atomic(durable=True) works in one)",
        "cacheguard/integrations/django/orm.py",
        "        result = original(self, raw, force_insert, force_update, using, update_fields)\n"
        "    finally:\n",
        "        with _writing(using):\n"
        "            result = original("
        "self, raw, force_insert, force_update, using, update_fields)\n"
        "    finally:\n",
        ("tests/test_django_orm.py::test_save_signals_run_outside_the_hooks_transaction",),
        within="_save_base",
    ),
    Mutant(
        "django-on-commit-after-release",
        "the keys are invalidated and released before Django runs the on_commit callbacks",
        "cacheguard/integrations/django/orm.py",
        "                connection.run_on_commit.insert("
        "0, (set(), lambda: _end_all(connection), True))\n",
        "                pass\n",
        ("tests/test_django_orm.py::test_on_commit_callbacks_run_after_the_keys_are_released",),
        within="_atomic_exit",
    ),
    Mutant(
        "django-rollback-after-sql",
        "an error after a tracked write's SQL (a lock timeout on a key known only then) "
        "marks the transaction for rollback: the write does not commit",
        "cacheguard/integrations/django/orm.py",
        "            transaction.set_rollback(True, using=alias)\n",
        "            pass\n",
        ("tests/test_django_orm.py::test_a_lock_timeout_after_the_sql_rolls_the_write_back",),
        within="_after_sql",
    ),
    Mutant(
        "django-cache-api-keys-unescaped",
        "tracked through a cache backend, the keys of its cache API are the templates' "
        "values as str.format writes them (as a hand-built f-string key has them), not escaped",
        "cacheguard/integrations/django/orm.py",
        "            written = template.format_map(values)\n",
        "            written = render_key(template, values, max_length=1 << 30)\n",
        (
            "tests/test_django_orm.py::test_tracked_through_a_cache_both_kinds_of_key_are_invalidated",
        ),
        within="ModelTracker._keys",
    ),
    Mutant(
        "django-cache-tracks-guard-names",
        "tracked through a cache backend, the guard's own names (@cached_with_lock on "
        "cache.guard) are locked and invalidated too",
        "cacheguard/integrations/django/orm.py",
        "        return (own, str(self._cache.guard_name(written)))\n",
        "        return (str(self._cache.guard_name(written)),)\n",
        (
            "tests/test_django_orm.py::test_tracked_through_a_cache_both_kinds_of_key_are_invalidated",
        ),
        within="ModelTracker._keys",
    ),
    Mutant(
        "django-cache-prefix-both-kinds",
        "tracked through a cache backend, the by-prefix fallback covers the guard's own "
        "names as well as the cache API's",
        "cacheguard/integrations/django/orm.py",
        "        return (prefix, head)\n",
        "        return (head,)\n",
        (
            "tests/test_django_orm.py::test_tracked_through_a_cache_both_kinds_of_key_are_invalidated",
        ),
        within="ModelTracker._template_prefixes",
    ),
    Mutant(
        "django-empty-prefix-refused",
        "a key template starting with a field (no prefix: its fallback would wipe the "
        "namespace) is refused by track_models",
        "cacheguard/integrations/django/orm.py",
        "                    if not literal_prefix(template):\n",
        "                    if False:\n",
        ("tests/test_django_orm.py::test_a_template_starting_with_a_field_is_refused",),
        within="ModelTracker.__init__",
    ),
    Mutant(
        "watermark-same-namespace-only",
        "a fill counts only the open snapshots of its own namespace's sequence (another "
        "namespace's watermark is no bound on its versions)",
        "cacheguard/cache/watermark.py",
        "            elif _same_sequence(namespace, _namespace_of(holder)):\n",
        "            else:\n",
        (
            "tests/test_django_orm.py::"
            "test_a_tracker_of_another_namespace_does_not_stop_fills_from_storing",
        ),
        within="collecting",
    ),
    Mutant(
        "django-snapshot-names-its-namespace",
        "a Django tracker's snapshot names its guard's namespace",
        "cacheguard/integrations/django/orm.py",
        "        state.snapshot_namespace = self.guard.namespace"
        "  # fills of other namespaces ignore it\n",
        "",
        (
            "tests/test_django_orm.py::"
            "test_a_tracker_of_another_namespace_does_not_stop_fills_from_storing",
        ),
        within="ModelTracker._state",
    ),
    Mutant(
        "django-repatched-hooks-kept",
        "tracking again after another library patched over the hooks (without "
        "functools.wraps) reuses ours, still called through its patch: no endless recursion",
        "cacheguard/integrations/django/orm.py",
        "        if (owner, name) in _LEFT_IN_PLACE and original is not "
        "_ORIGINALS[(owner, name)]:\n",
        "        if False:\n",
        (
            "tests/test_django_orm.py::"
            "test_tracking_again_after_another_library_patched_over_the_hooks",
        ),
        within="_install",
    ),
    Mutant(
        "django-model-json-as-text",
        "a model's JSONField data is stored as its JSON text: the codec's own tagged forms "
        "in a user's JSON come back as data, not as the values they tag",
        "cacheguard/codecs/django_models.py",
        "                stored[name] = json.dumps(item, cls=model_field.encoder)\n",
        "                stored[name] = item\n",
        ("tests/test_django_orm.py::test_json_field_data_round_trips_exactly[json]",),
        within="model_converters",
    ),
    Mutant(
        "django-shared-names-locked-once",
        "a name that another tracker of the same namespace locked for the transaction is "
        "not locked again (two guard objects share no write holds: it would wait for itself)",
        "cacheguard/integrations/django/orm.py",
        "        elsewhere = self._held_by_others(connection, state)\n",
        "        elsewhere: set[str] = set()\n",
        (
            "tests/test_django_orm.py::"
            "test_a_guard_and_a_cache_of_one_namespace_track_one_model_together",
        ),
        within="ModelTracker._lock",
    ),
    Mutant(
        "django-select-by-pk-for-update",
        "the rows a save() or a delete names by primary key are selected FOR UPDATE (they cannot "
        "change before the commit)",
        "cacheguard/integrations/django/orm.py",
        "                if features.has_select_for_update:\n                    query = "
        "query.select_for_update()\n                found.extend",
        "                found.extend",
        ("tests/test_django_orm.py::test_the_rows_a_write_names_are_selected_for_update",),
        within="_Work.select",
    ),
    Mutant(
        "django-select-queryset-for-update",
        "the rows an update() or a fast delete names through a queryset are selected FOR UPDATE",
        "cacheguard/integrations/django/orm.py",
        "        if features.has_select_for_update:\n            query = "
        "query.select_for_update()\n        query = query.values",
        "        query = query.values",
        ("tests/test_django_orm.py::test_the_rows_a_write_names_are_selected_for_update",),
        within="_Work.select",
    ),
    Mutant(
        "django-locks-sorted",
        "a write takes its keys' write locks in sorted order (two writers cannot deadlock)",
        "cacheguard/integrations/django/orm.py",
        "        fresh = sorted(name for name in names if name not in state.locks and name not "
        "in elsewhere)\n",
        "        fresh = sorted(\n            (name for name in names if name not in state.locks "
        "and name not in elsewhere),\n            reverse=True,\n        )\n",
        ("tests/test_django_orm.py::test_a_write_locks_its_keys_in_sorted_order",),
        within="ModelTracker._lock",
    ),
    Mutant(
        "django-lock-timeout-honoured",
        "lock_timeout bounds each write-lock wait of a tracked write",
        "cacheguard/integrations/django/orm.py",
        "lock.acquire_write(self.lock_timeout, holder=state.holder)",
        "lock.acquire_write(None, holder=state.holder)",
        (
            "tests/test_django_orm.py::test_lock_timeout_bounds_the_wait_and_every_name_tried_is_invalidated_at_the_end",
        ),
        within="ModelTracker._lock",
    ),
    Mutant(
        "django-end-invalidates-touched",
        "every name a write tried to lock (one it never got too) is invalidated when the "
        "transaction ends",
        "cacheguard/integrations/django/orm.py",
        "names = locked + sorted(state.touched - set(locked))",
        "names = locked",
        (
            "tests/test_django_orm.py::test_lock_timeout_bounds_the_wait_and_every_name_tried_is_invalidated_at_the_end",
        ),
        within="ModelTracker._end",
    ),
    Mutant(
        "django-bulk-create-unreported-ids",
        "a bulk_create() whose ids the database does not report (ignore_conflicts) invalidates "
        "its templates by prefix",
        "cacheguard/integrations/django/orm.py",
        "            if len(known) < len(pending):  # ids the database did not report\n          "
        "      work.by_prefix()",
        "            if len(known) < len(pending):  # ids the database did not report\n          "
        "      pass",
        ("tests/test_django_orm.py::test_bulk_create_ignoring_conflicts_invalidates_by_prefix",),
        within="_bulk_create",
    ),
    Mutant(
        "django-watermark-failure-stores-nothing",
        "a transaction whose watermark could not be read stores no fill",
        "cacheguard/integrations/django/orm.py",
        "            state.snapshot_watermark = -1\n            log.warning",
        "            state.snapshot_watermark = None\n            log.warning",
        (
            "tests/test_django_orm.py::test_a_failed_watermark_read_stores_nothing_from_that_transaction",
        ),
        within="ModelTracker._began",
    ),
    Mutant(
        "django-failed-begin-ends",
        "an atomic block that fails to begin leaves no transaction state open",
        "cacheguard/integrations/django/orm.py",
        "            _end_all(began)  # it never began",
        "            pass  # it never began",
        ("tests/test_django_orm.py::test_the_transaction_hooks_go_once_every_transaction_ended",),
        within="_atomic_enter",
    ),
    Mutant(
        "django-states-deactivated",
        "a transaction's end closes its state: the transaction hooks go with the last tracker",
        "cacheguard/integrations/django/orm.py",
        "        _registry.deactivate(state)\n",
        "",
        ("tests/test_django_orm.py::test_the_transaction_hooks_go_once_every_transaction_ended",),
        within="ModelTracker._end",
    ),
    Mutant(
        "django-update-forgets-its-rows",
        "a tracked update() clears its queryset's result cache, as Django's does (also when no "
        "row matched)",
        "cacheguard/integrations/django/orm.py",
        "        if not rows:\n            self._result_cache = None\n            return 0",
        "        if not rows:\n            return 0",
        ("tests/test_django_orm.py::test_an_update_forgets_the_rows_its_queryset_had_read",),
        within="_update",
    ),
    Mutant(
        "django-update-forgets-updated-rows",
        "a tracked update() that changed rows clears its queryset's result cache",
        "cacheguard/integrations/django/orm.py",
        "        count = original(self.filter(pk__in=pks), **kwargs)\n        self._result_cache "
        "= None\n",
        "        count = original(self.filter(pk__in=pks), **kwargs)\n",
        ("tests/test_django_orm.py::test_an_update_forgets_the_rows_its_queryset_had_read",),
        within="_update",
    ),
    Mutant(
        "django-model-unknown-fields-miss",
        "stored model data with a field the model does not have is refused (a miss)",
        "cacheguard/codecs/django_models.py",
        "        if unknown:\n            raise",
        "        if False:\n            raise",
        (
            "tests/test_django_orm.py::test_the_model_codec_refuses_unknown_fields_and_keeps_the_alias",
        ),
        within="model_converters",
    ),
    Mutant(
        "django-model-keeps-the-alias",
        "a hit's instance has the database alias it was read from",
        "cacheguard/codecs/django_models.py",
        "return kind.from_db(alias, names, values)",
        'return kind.from_db("default", names, values)',
        (
            "tests/test_django_orm.py::test_the_model_codec_refuses_unknown_fields_and_keeps_the_alias",
        ),
        within="model_converters",
    ),
    # -- Django: the menu example (examples/menu_django, issue #27) ------------------------------
    Mutant(
        "menu-django-tracks-the-cache-api-keys",
        "the example tracks its model's writes through the cache, so the keys of Django's "
        "cache API it reads (menu:list) are invalidated too: no stale list after a commit, "
        "one load per stampede",
        "examples/menu_django/menus/apps.py",
        "        track_models(cache, {Menu: MENU_KEYS})\n",
        "        track_models(cache.guard, {Menu: MENU_KEYS})\n",
        (
            "tests/test_menu_django.py::test_demo_one_query_per_stampede_and_no_stale_read",
            "tests/test_menu_django.py::"
            "test_views_read_through_the_cache_and_writes_refresh_every_key",
        ),
        within="MenusConfig.ready",
    ),
    Mutant(
        "menu-django-tracks-the-guard-names",
        "the example tracks its model's writes on the guard's names its decorated reads "
        "use (menu:{id}, menu:owner:{owner})",
        "examples/menu_django/menus/models.py",
        'MENU_KEYS = ("menu:list", "menu:{id}", "menu:owner:{owner}")\n',
        'MENU_KEYS = ("menu:list", "menu:owner:{owner}")\n',
        (
            "tests/test_menu_django.py::"
            "test_views_read_through_the_cache_and_writes_refresh_every_key",
        ),
        within="MENU_KEYS",
    ),
    Mutant(
        "menu-django-owner-lists-tracked",
        "a menu moved to another owner leaves both owners' cached lists fresh",
        "examples/menu_django/menus/models.py",
        'MENU_KEYS = ("menu:list", "menu:{id}", "menu:owner:{owner}")\n',
        'MENU_KEYS = ("menu:list", "menu:{id}")\n',
        (
            "tests/test_menu_django.py::"
            "test_views_read_through_the_cache_and_writes_refresh_every_key",
        ),
        within="MENU_KEYS",
    ),
    Mutant(
        "menu-django-table-of-its-own",
        "the Django demo drops and fills only a table of its own name, never a table of yours "
        "(not even one named as Django would name its model's)",
        "examples/menu_django/menus/models.py",
        '        db_table = "cacheguard_django_menu"\n',
        '        db_table = "menus_menu"\n',
        ("tests/test_menu_django.py::test_demo_one_query_per_stampede_and_no_stale_read",),
        within="Menu.Meta.db_table",
    ),
    Mutant(
        "menu-django-sqlalchemy-database-urls",
        "the Django example takes DATABASE_URL in SQLAlchemy's form too "
        "(postgresql+psycopg://), as the project's other examples and CI give it",
        "examples/menu_django/database.py",
        '"postgresql+psycopg", ',
        "",
        ("tests/test_menu_django.py::test_postgresql_urls_in_either_form",),
        within="_POSTGRES_SCHEMES",
    ),
    # -- Django: the backend's review fixes (writes close flights, signed entries only, ...) --
    Mutant(
        "django-invalidate-closes-open-flights",
        "invalidate (and invalidate_prefix, through it) closes the names' open flights once "
        "sent: a read that starts after it neither waits for nor gets a load begun before",
        "cacheguard/cache/flows/write.py",
        "        state.written(names)\n",
        "        pass\n",
        (
            "tests/test_guard_both_drivers.py::"
            "test_a_read_after_an_invalidation_does_not_share_a_load_begun_before[sync-invalidate]",
            "tests/test_guard_both_drivers.py::"
            "test_a_read_after_an_invalidation_does_not_share_a_load_begun_before[async-invalidate]",
            "tests/test_guard_both_drivers.py::test_a_read_after_an_invalidation_does_not_share_"
            "a_load_begun_before[sync-invalidate_prefix]",
        ),
        within="invalidate_flow",
    ),
    Mutant(
        "django-a-written-flight-takes-no-new-callers",
        "a single flight closed by a write takes no new caller: it begins a flight of its own",
        "cacheguard/cache/singleflight.py",
        "            self._close(self._flights.pop(key, None))\n",
        "            self._close(self._flights.get(key))\n",
        (
            "tests/test_guard_both_drivers.py::"
            "test_a_read_after_an_invalidation_does_not_share_a_load_begun_before[sync-invalidate]",
            "tests/test_django_cache.py::"
            "test_a_get_or_set_after_a_write_does_not_share_a_load_begun_before[set]",
        ),
        within="SingleFlight.written",
    ),
    Mutant(
        "django-writes-close-open-flights",
        "a Django write (set, add, delete, clear ...) closes the open flights of its keys: a "
        "get_or_set that starts after it reads Redis, never a load begun before the write",
        "cacheguard/integrations/django/cache.py",
        "            self._shared.note_written(written, prefix)\n",
        "            pass\n",
        (
            "tests/test_django_cache.py::"
            "test_a_get_or_set_after_a_write_does_not_share_a_load_begun_before[set]",
            "tests/test_django_cache.py::"
            "test_a_get_or_set_after_a_write_does_not_share_a_load_begun_before[delete]",
        ),
        within="CacheGuardCache._drive",
    ),
    Mutant(
        "django-async-writes-close-open-flights",
        "the same for the a* writes: an aget_or_set that starts after aset/adelete/aclear "
        "never gets a load begun before it",
        "cacheguard/integrations/django/cache.py",
        "            self._shared.note_written(written, prefix)\n",
        "            pass\n",
        (
            "tests/test_django_cache.py::"
            "test_an_aget_or_set_after_a_write_does_not_share_a_load_begun_before[aset]",
            "tests/test_django_cache.py::"
            "test_an_aget_or_set_after_a_write_does_not_share_a_load_begun_before[adelete]",
        ),
        within="CacheGuardCache._adrive",
    ),
    Mutant(
        "django-writes-close-every-guards-flights",
        "a Django write tells every guard of its configuration in the process (the sync one "
        "and each loop's): a sync set closes the loads under way in an event loop",
        "cacheguard/integrations/django/cache.py",
        "            guards: list[Any] = [self._sync, "
        "*(made[0] for made in self._loops.values())]\n",
        "            guards: list[Any] = [self._sync]\n",
        (
            "tests/test_django_cache.py::test_an_aget_or_set_after_a_write_does_not_share_a_"
            "load_begun_before[set in another thread]",
        ),
        within="_Connections.note_written",
    ),
    Mutant(
        "django-clear-closes-open-flights",
        "a Django clear() closes the open flights of every name under its prefix (note_written "
        "with a prefix)",
        "cacheguard/cache/flows/state.py",
        "            self.written_under(under)\n",
        "            pass\n",
        (
            "tests/test_django_cache.py::"
            "test_a_get_or_set_after_a_write_does_not_share_a_load_begun_before[clear]",
            "tests/test_django_cache.py::"
            "test_an_aget_or_set_after_a_write_does_not_share_a_load_begun_before[aclear]",
        ),
        within="GuardState.note_written",
    ),
    Mutant(
        "django-signed-codec-reads-its-own-entries-only",
        "a signing codec (PickleCodec, the Django backend's) reads no unsigned msgpack or JSON "
        "entry, on every read path",
        "cacheguard/cache/codec.py",
        "    if signing(codec) is not None:\n        return None\n",
        "",
        (
            "tests/test_codecs.py::test_a_pickle_guard_reads_no_unsigned_entry",
            "tests/test_django_cache.py::test_an_unsigned_entry_is_refused_on_every_read_path",
        ),
        within="reader_for",
    ),
    Mutant(
        "django-signature-checked-before-inflating",
        "a signing codec's compressed entry is authenticated before anything is inflated: "
        "bytes without the signature cost one HMAC, never an inflation",
        "cacheguard/cache/entry.py",
        "        packed = signer.verified(packed)\n",
        "        packed = bytes(packed)[32:]  # unchecked\n",
        (
            "tests/test_compression.py::"
            "test_a_signed_compressed_entry_is_authenticated_before_it_is_inflated",
            "tests/test_django_cache.py::"
            "test_a_compressed_entry_is_authenticated_before_anything_is_inflated",
        ),
        within="_compressed_value",
    ),
    Mutant(
        "django-incrs-take-turns",
        "a process's threads incrementing one key take turns: none of their compare-and-sets "
        "loses to another's",
        "cacheguard/integrations/django/cache.py",
        "            turn = self._turns.get(name)\n",
        "            turn = None\n",
        ("tests/test_django_cache.py::test_concurrent_incrs_of_one_key_take_turns_in_the_process",),
        within="_Connections.incr_turn",
    ),
    Mutant(
        "django-aincrs-take-turns",
        "a loop's tasks incrementing one key take turns: 300 at once neither lose "
        "compare-and-sets nor use up the pool",
        "cacheguard/integrations/django/cache.py",
        "            turn = turns.get(name)\n",
        "            turn = None\n",
        ("tests/test_django_cache.py::test_300_concurrent_aincrs_of_one_key_in_one_loop",),
        within="_Connections.aincr_turn",
    ),
    Mutant(
        "django-pool-exhausted-is-not-redis-down",
        "a pool with no connection free for its whole wait raises PoolExhausted, not "
        "BackendUnavailable",
        "cacheguard/integrations/django/cache.py",
        "        if isinstance(exc, redis.ConnectionError) and pool_exhausted(exc):\n",
        "        if False:\n",
        ("tests/test_django_cache.py::test_a_pool_used_up_is_pool_exhausted_not_redis_down",),
        within="_unavailable",
    ),
    Mutant(
        "django-add-over-undecodable-bytes",
        "a Django add stores over bytes that do not decode (a rotated SECRET_KEY): an "
        "add-based lock can be taken again",
        "cacheguard/integrations/django/cache.py",
        "                if (yield put_call("
        "keys, entry, lifetime, only_new=False, replacing=raw)):\n"
        "                    return True\n",
        "                return False\n",
        (
            "tests/test_django_cache.py::"
            "test_after_a_key_rotation_old_entries_are_absent_for_every_operation",
            "tests/test_django_cache.py::test_an_unsigned_entry_is_refused_on_every_read_path",
        ),
        within="CacheGuardCache._add_flow",
    ),
    Mutant(
        "django-touch-of-undecodable-bytes-is-false",
        "a Django touch of bytes that do not decode says False (nothing there, as get says) "
        "and leaves them be",
        "cacheguard/integrations/django/cache.py",
        "            if not readable:\n                return False\n",
        "",
        (
            "tests/test_django_cache.py::"
            "test_after_a_key_rotation_old_entries_are_absent_for_every_operation",
        ),
        within="CacheGuardCache._touch_flow",
    ),
    Mutant(
        "django-touch-fails-fills-in-flight",
        "a Django touch wins over a fill under way: the fill does not store its value with "
        "the old lifetime over the touched entry",
        "cacheguard/cache/entry_writes.py",
        "redis.call('HDEL', KEYS[2], 'fs')\n",
        "",
        ("tests/test_django_cache.py::test_touch_and_incr_during_a_fill_win_over_it[touch]",),
        within="ENTRY_TOUCH",
    ),
    Mutant(
        "django-incr-fails-fills-in-flight",
        "a Django incr wins over a fill under way: the fill does not store over the sum",
        "cacheguard/cache/entry_writes.py",
        "redis.call('HDEL', KEYS[2], 'fs')\n",
        "",
        ("tests/test_django_cache.py::test_touch_and_incr_during_a_fill_win_over_it[incr]",),
        within="ENTRY_SWAP",
    ),
    Mutant(
        "django-incr-flow-compares-and-sets",
        "incr and aincr write back only the entry they read: a write between their read and "
        "their write makes them read again, no increment is lost",
        "cacheguard/integrations/django/cache.py",
        "            if (yield swap_call(keys, raw, replacement)):\n",
        "            if (yield put_call(keys, replacement, None, only_new=False)):\n",
        (
            "tests/test_django_cache.py::test_an_incr_whose_compare_and_set_loses_reads_again",
            "tests/test_django_cache.py::test_an_aincr_whose_compare_and_set_loses_reads_again",
        ),
        within="CacheGuardCache._incr_flow",
    ),
    Mutant(
        "django-clear-not-a-longer-key-prefix",
        "a Django clear() with KEY_PREFIX 'a' leaves the entries of a cache with KEY_PREFIX "
        "'a:b' (only names 'a:<version>:...')",
        "cacheguard/integrations/django/cache.py",
        "lambda name: shape.match(name) is not None",
        "lambda name: name.startswith(self.key_prefix + ':')",
        ("tests/test_django_cache.py::test_clear_of_a_key_prefix_leaves_a_longer_prefixs_entries",),
        within="CacheGuardCache._cleared",
    ),
    Mutant(
        "django-clear-leaves-nothing-behind",
        "a Django clear() deletes its names as delete does, with no invalidation stamp: no "
        "version key per cleared entry is left for version_ttl",
        "cacheguard/integrations/django/cache.py",
        '        self._drive(self._clear_flow(), "clearing the cache", prefix=prefix)\n',
        "        self.guard.invalidate_prefix(prefix)\n",
        ("tests/test_django_cache.py::test_clear_leaves_no_key_behind",),
        within="CacheGuardCache.clear",
    ),
    Mutant(
        "django-unused-configurations-closed",
        "the Django backend's configurations no instance uses are closed once another "
        "configuration is made: overrides of SECRET_KEY or CACHES keep no sockets open",
        "cacheguard/integrations/django/cache.py",
        "                unused = [c for c in self._entries.values() if c.users == 0]\n",
        "                unused = []\n",
        (
            "tests/test_django_cache.py::"
            "test_a_configuration_no_instance_uses_is_closed_once_another_is_made",
            "tests/test_django_cache.py::"
            "test_an_unused_configurations_loop_guard_is_closed_on_its_loop",
        ),
        within="_Registry.connections_for",
    ),
    Mutant(
        "django-stale-if-error-refused",
        "the Django backend refuses OPTIONS stale_if_error, saying why (it would serve a "
        "value past its timeout or after a delete)",
        "cacheguard/integrations/django/cache.py",
        '    "stale_if_error": "it would answer a failing get_or_set() with a value this process '
        'saw "\n',
        '    "stale_if_error_": "it would answer a failing get_or_set() with a value this process '
        'saw "\n',
        (
            "tests/test_django_cache.py::"
            "test_a_bad_configuration_is_a_clear_error[None-options11-after a delete]",
        ),
        within="_REFUSED_OPTIONS",
    ),
    Mutant(
        "django-aset-many-timeout-zero-deletes",
        "the Django backend's aset_many takes timeouts as set_many does: 0 or less deletes, "
        "never stores forever",
        "cacheguard/integrations/django/cache.py",
        "        lifetime = self.get_backend_timeout(timeout)\n",
        "        lifetime = self.get_backend_timeout(timeout) or None\n",
        ("tests/test_django_cache.py::test_the_async_writes_take_timeouts_as_the_sync_ones",),
        within="CacheGuardCache.aset_many",
    ),
    Mutant(
        "django-aget-or-set-caches-none",
        "the Django backend's aget_or_set caches a None its callable returned, as get_or_set does",
        "cacheguard/integrations/django/cache.py",
        "default, ttl=ttl, none_ttl=ttl)",
        "default, ttl=ttl, none_ttl=None)",
        ("tests/test_django_cache.py::test_aget_or_set_caches_a_none_as_get_or_set_does",),
        within="CacheGuardCache.aget_or_set",
    ),
    Mutant(
        "django-signing-key-salted",
        "the Django backend's signing key is an HMAC of SECRET_KEY with its own salt, never "
        "SECRET_KEY itself",
        "cacheguard/integrations/django/cache.py",
        "    return hmac.new(material, _SIGNING_SALT, hashlib.sha256).digest()\n",
        "    return material\n",
        (
            "tests/test_django_cache.py::"
            "test_the_signing_key_is_derived_from_secret_key_not_secret_key_itself",
        ),
        within="_signing_key",
    ),
    Mutant(
        "django-aget-many-on-a-cluster",
        "the Django backend's aget_many reads keys on several cluster nodes (MGET per node), "
        "as get_many does",
        "cacheguard/integrations/django/cache.py",
        "            if is_cluster(guard.client):\n"
        "                raws = await guard.client.mget_nonatomic(value_keys)  "
        "# type: ignore[union-attr]\n"
        "            else:\n"
        "                raws = await guard.client.mget(value_keys)\n",
        "            raws = await guard.client.mget(value_keys)\n",
        ("tests/test_django_cache.py::test_the_backend_on_a_cluster",),
        within="CacheGuardCache.aget_many",
    ),
)


# -- where a mutant applies: its anchor, found again after a move -----------------------------

# A moved anchor is looked for in the package and in the hinted file's own top folder
# (a mutant of examples/, tests/ or tools/ keeps to it).
PACKAGE = "cacheguard"


class MutantError(Exception):
    """A mutant that cannot be checked: stale snippet, missing anchor, missing tests."""


@dataclass(frozen=True)
class Definition:
    """What an anchor names: a def, class or assignment, its lines (1-based, inclusive)."""

    name: str
    first: int
    last: int


@dataclass(frozen=True)
class Site:
    """Where a mutant's patch applies: ``text[start:end]`` of ``file`` holds ``find`` once."""

    file: str  # relative to the tree, with "/"
    anchor: str  # "" for the whole file
    first: int  # the span's lines, for reports
    last: int
    start: int
    end: int
    moved_from: str = ""  # the mutant's file= when its anchor was found in another file
    note: str = ""  # why this definition of the anchor, when others have its name

    @property
    def where(self) -> str:
        return f"{self.file}::{self.anchor}" if self.anchor else self.file


@functools.lru_cache(maxsize=512)
def definitions(text: str) -> tuple[Definition, ...]:
    """The anchors a module offers: defs and classes (nested ones as ``Outer.inner``) and
    the names assigned at module or class level (a Lua script's string constant). A text
    that does not parse offers none."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return ()
    found: list[Definition] = []

    def visit(nodes: Iterable[ast.AST], prefix: str, in_function: bool) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + node.name
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                found.append(Definition(name, first, node.end_lineno or node.lineno))
                visit(node.body, name + ".", not isinstance(node, ast.ClassDef))
                continue
            if not in_function and isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        last = node.end_lineno or node.lineno
                        found.append(Definition(prefix + target.id, node.lineno, last))
            # defs under if/try/with/for/match keep the name of what encloses the block
            inner = (ast.stmt, ast.excepthandler, ast.match_case)
            visit(
                [c for c in ast.iter_child_nodes(node) if isinstance(c, inner)], prefix, in_function
            )

    visit(tree.body, "", False)
    return tuple(found)


def line_starts(text: str) -> list[int]:
    """The offset of each line's first character, then the text's end."""
    return [0, *(m.end() for m in re.finditer("\n", text) if m.end() < len(text)), len(text)]


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def named(text: str, anchor: str) -> list[Definition]:
    # Python's own qualified names say "<locals>" for a def inside a function.
    anchor = anchor.replace(".<locals>", "")
    return [d for d in definitions(text) if d.name == anchor]


def innermost_anchor(text: str, start: int, end: int) -> str:
    """The innermost definition holding ``text[start:end]`` whose name is unique in
    ``text`` ("" when only the module holds it): the anchor to name for that snippet."""
    first, last = line_of(text, start), line_of(text, max(start, end - 1))
    counts: dict[str, int] = {}
    for d in definitions(text):
        counts[d.name] = counts.get(d.name, 0) + 1
    holding = [
        d for d in definitions(text) if d.first <= first and last <= d.last and counts[d.name] == 1
    ]
    return min(holding, key=lambda d: d.last - d.first).name if holding else ""


def suggested_anchor(text: str, find: str) -> str:
    """The anchor for a snippet found once in ``text`` ("" if none, or not once)."""
    if text.count(find) != 1:
        return ""
    start = text.index(find)
    return innermost_anchor(text, start, start + len(find))


def _read(root: Path, file: str) -> str | None:
    path = root / file
    return path.read_text(encoding="utf-8") if path.is_file() else None


def searched_folders(hint: str) -> list[str]:
    """Where a moved anchor may be: the package, and the hinted file's top folder."""
    parts = Path(hint).parts
    return [PACKAGE, parts[0]] if len(parts) > 1 and parts[0] != PACKAGE else [PACKAGE]


def searched_files(root: Path, hint: str) -> list[str]:
    """The modules of the searched folders."""
    return sorted(
        path.relative_to(root).as_posix()
        for folder in searched_folders(hint)
        if (root / folder).is_dir()
        for path in (root / folder).rglob("*.py")
        if "__pycache__" not in path.parts
    )


def _offsets(text: str, d: Definition) -> tuple[int, int]:
    """The character span of ``d``'s lines (their newlines included)."""
    starts = line_starts(text)
    return starts[d.first - 1], starts[min(d.last, len(starts) - 1)]


def _span(file: str, text: str, anchor: str, d: Definition, moved_from: str = "") -> Site:
    return Site(file, anchor, d.first, d.last, *_offsets(text, d), moved_from)


# A definition in a module: its file, the file's text, the definition.
Candidate = tuple[str, str, Definition]


def defined_elsewhere(mutant: Mutant, root: Path) -> list[Candidate]:
    """The definitions of the mutant's anchor in the searched modules but its file=."""
    found: list[Candidate] = []
    for file in searched_files(root, mutant.file):
        text = _read(root, file)
        if text is None or file == mutant.file:
            continue
        found.extend((file, text, d) for d in named(text, mutant.within))
    return found


def _fits(mutant: Mutant, candidate: Candidate) -> bool:
    _, text, d = candidate
    return text.count(mutant.find, *_offsets(text, d)) == 1


def _imports(text: str, file: str) -> bool:
    """Does a module whose source is ``text`` import the module at path ``file``?"""
    dotted = file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    package, _, leaf = dotted.rpartition(".")
    return (
        f"import {dotted}" in text
        or f"from {dotted} import" in text
        or (f"from {package} import" in text and re.search(rf"\b{leaf}\b", text) is not None)
    )


def _moved(mutant: Mutant, candidate: Candidate, root: Path, note: str = "") -> Site:
    file, text, d = candidate
    site = _span(file, text, mutant.within, d, moved_from=mutant.file)
    site = dataclasses.replace(site, note=note)
    _check_find(mutant, site, text, root)
    return site


def locate(mutant: Mutant, root: Path) -> Site:
    """Where ``mutant`` applies in the tree at ``root``: inside its anchor, in its file or,
    when the anchor is no longer there, in the one module of the package defining it.
    Raises MutantError with a report saying what no longer matches and what is closest."""
    text = _read(root, mutant.file)
    if not mutant.within:
        if text is None:
            raise MutantError(_missing_file_report(mutant, root))
        site = Site(mutant.file, "", 1, len(line_starts(text)) - 1, 0, len(text))
        _check_find(mutant, site, text, root)
        return site
    here = named(text, mutant.within) if text is not None else []
    if len(here) > 1:
        lines = ", ".join(str(d.first) for d in here)
        raise MutantError(
            f"{mutant.id}: its anchor `{mutant.within}` is ambiguous: {mutant.file} "
            f"defines it {len(here)} times (lines {lines}); name the definition around "
            "the find text that is unique (or rename one of them)"
        )
    if text is not None and here:
        site = _span(mutant.file, text, mutant.within, here[0])
        if text.count(mutant.find, site.start, site.end) == 0:
            # The definition lost its find text: did its code move, leaving a shim here
            # that imports the module it went to? (Only such a module: a same-named
            # definition elsewhere, a twin say, is not where this code went.)
            fitting = [
                c
                for c in defined_elsewhere(mutant, root)
                if _fits(mutant, c) and _imports(text, c[0])
            ]
            if len(fitting) == 1:
                shim = f"{mutant.file} still defines it, without the find text"
                return _moved(mutant, fitting[0], root, shim)
        _check_find(mutant, site, text, root)
        return site
    # The anchor is not (or no longer) where the mutant says: look for it elsewhere.
    candidates = defined_elsewhere(mutant, root)
    if not candidates:
        raise MutantError(_missing_anchor_report(mutant, root, text is not None))
    if len(candidates) == 1:
        return _moved(mutant, candidates[0], root)
    # The find text may tell the modules apart (a sync and an asyncio twin).
    fitting = [c for c in candidates if _fits(mutant, c)]
    if len(fitting) != 1:
        places = "\n".join(
            f"    {file} lines {d.first}-{d.last}: the find text occurs "
            f"{times(other.count(mutant.find, *_offsets(other, d)))} in it"
            for file, other, d in candidates
        )
        raise MutantError(
            f"{mutant.id}: its anchor `{mutant.within}` is ambiguous: "
            f"{_not_there(mutant, text is not None)}, and {len(candidates)} definitions "
            f"elsewhere could be it:\n{places}\n"
            "    set file= to the module meant (or name a more qualified anchor)"
        )
    others = ", ".join(sorted({file for file, _, _ in candidates} - {fitting[0][0]}))
    return _moved(mutant, fitting[0], root, f"also defined in {others}")


def _not_there(mutant: Mutant, file_exists: bool) -> str:
    if file_exists:
        return f"{mutant.file} no longer defines it"
    return f"{mutant.file} does not exist"


def _check_find(mutant: Mutant, site: Site, text: str, root: Path) -> None:
    """The find text must occur exactly once in the site's span; else a report (with
    where the find text is now, if it moved out of the anchor)."""
    found = text.count(mutant.find, site.start, site.end)
    if found == 1:
        return
    inside = f"`{site.anchor}` ({site.file}, lines {site.first}-{site.last})"
    if not site.anchor:
        inside = site.file
    if found == 0:
        report = [f"{mutant.id}: its find text is not in {inside}"]
        report += closest_lines(text[site.start : site.end], site.first, mutant.find)
        elsewhere = _elsewhere(mutant, root)
        report += elsewhere
        report.append(
            "    update the mutant's find (and replace) to today's code"
            + (", or its anchor to where the find text is now" if elsewhere else "")
        )
    else:
        at = []
        position = text.find(mutant.find, site.start, site.end)
        while position != -1:
            anchor = innermost_anchor(text, position, position + len(mutant.find))
            at.append(f"{line_of(text, position)}" + (f" (in `{anchor}`)" if anchor else ""))
            position = text.find(mutant.find, position + 1, site.end)
        report = [
            f"{mutant.id}: its find text occurs {times(found)} in {inside}: at lines "
            + ", ".join(at),
            "    lengthen the find text, or name the narrower definition as its anchor",
        ]
    raise MutantError("\n".join(report))


# Lines at least this alike (difflib's ratio) are shown as the closest to a lost find text.
CLOSE_ENOUGH = 0.5


def closest_lines(span: str, first: int, find: str, shown: int = 2) -> list[str]:
    """Report lines: the windows of ``span`` (its first line is line ``first``) most like
    ``find``, as many lines as it, each as a diff from the find text."""
    wanted = find.strip("\n").splitlines() or [find]
    lines = span.splitlines()
    size = len(wanted)
    target = "\n".join(line.strip() for line in wanted)
    scored: list[tuple[float, int]] = []
    for index in range(max(1, len(lines) - size + 1)):
        window = "\n".join(line.strip() for line in lines[index : index + size])
        matcher = difflib.SequenceMatcher(None, target, window, autojunk=False)
        if matcher.real_quick_ratio() >= CLOSE_ENOUGH and matcher.quick_ratio() >= CLOSE_ENOUGH:
            scored.append((matcher.ratio(), index))
    scored.sort(key=lambda pair: (-pair[0], pair[1]))
    report: list[str] = []
    taken: list[int] = []
    for ratio, index in scored:
        if ratio < CLOSE_ENOUGH or len(taken) == shown:
            break
        if any(abs(index - other) < size for other in taken):
            continue  # the same lines again, shifted by one
        taken.append(index)
        now = lines[index : index + size]
        report.append(
            f"    closest lines now, line {first + index} ({ratio:.0%} alike; - find, + now):"
        )
        report += [f"      {line.rstrip()}" for line in difflib.ndiff(wanted, now)]
    if not report:
        report.append("    no lines in it are like the find text any more")
    return report


def times(count: int) -> str:
    return {0: "no times", 1: "once", 2: "twice"}.get(count, f"{count} times")


def _elsewhere(mutant: Mutant, root: Path) -> list[str]:
    """Report lines: where the find text occurs among the searched modules now."""
    lines = []
    for file in searched_files(root, mutant.file):
        text = _read(root, file)
        if text is None or mutant.find not in text:
            continue
        anchor = suggested_anchor(text, mutant.find)
        count = text.count(mutant.find)
        hint = f', within="{anchor}"' if anchor else ""
        lines.append(f"    the find text occurs {times(count)} in {file}{hint}")
    return lines


def _missing_file_report(mutant: Mutant, root: Path) -> str:
    report = [f"{mutant.id}: {mutant.file} does not exist, and the mutant names no anchor"]
    report += _elsewhere(mutant, root) or ["    the find text occurs in no searched module"]
    report.append("    give the mutant its file= now (and a within= anchor, so moves cost nothing)")
    return "\n".join(report)


def _missing_anchor_report(mutant: Mutant, root: Path, file_exists: bool) -> str:
    names: dict[str, list[str]] = {}
    for file in searched_files(root, mutant.file):
        text = _read(root, file)
        for d in definitions(text or ""):
            names.setdefault(d.name, []).append(file)
    wanted = mutant.within.replace(".<locals>", "")
    last = wanted.rsplit(".", 1)[-1]
    alike = difflib.get_close_matches(wanted, list(names), n=4, cutoff=0.6)
    alike += [n for n in names if n.rsplit(".", 1)[-1] == last and n not in alike][:4]
    report = [
        f"{mutant.id}: its anchor `{mutant.within}` is missing: "
        f"{_not_there(mutant, file_exists)}, nor does any module of "
        + ", ".join(f"{folder}/" for folder in searched_folders(mutant.file))
    ]
    report += [f"    a definition named like it: `{n}` in {', '.join(names[n])}" for n in alike]
    report += _elsewhere(mutant, root)
    report.append("    update within= (and file=) to where the code is now")
    return "\n".join(report)


def apply(mutant: Mutant, tree: Path) -> tuple[Path, str]:
    """Patch ``tree`` with ``mutant``; returns the patched file and its original text."""
    site = locate(mutant, tree)
    path = tree / site.file
    original = path.read_text(encoding="utf-8")
    inside = original[site.start : site.end].replace(mutant.find, mutant.replace)
    path.write_text(original[: site.start] + inside + original[site.end :], encoding="utf-8")
    return path, original


def moved_warning(mutant: Mutant, site: Site) -> str:
    note = f"; {site.note}" if site.note else ""
    return (
        f"warning: mutant {mutant.id}: `{mutant.within}` is no longer in {site.moved_from}; "
        f'found it in {site.file}{note}: update its file= to "{site.file}"'
    )


# -- running ---------------------------------------------------------------------------------


def scratch_copy(destination: Path) -> Path:
    """A copy of what the tests need, under ``destination``."""
    tree = destination / "tree"
    tree.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", "*.egg-info")
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=ignore)
        elif source.exists():
            shutil.copy2(source, tree / name)
    return tree


def uses_hypothesis(tests: Iterable[str], root: Path = ROOT) -> bool:
    """Does any of the files of ``tests`` (node ids) mention hypothesis?"""
    files = {root / node_id.partition("::")[0] for node_id in tests}
    return any(
        not path.is_file() or "hypothesis" in path.read_text(encoding="utf-8") for path in files
    )


def pytest_command(tests: Iterable[str], *extra: str) -> list[str]:
    tests = list(tests)
    # hypothesis's pytest plugin costs about 0.3 s of CPU at every start (582 starts):
    # it is loaded only for the tests that use hypothesis (an unreadable file counts).
    plugins = [] if uses_hypothesis(tests) else ["-p", "no:hypothesispytest"]
    return [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "--no-header",
        "-p",
        "no:cacheprovider",
        *plugins,
        "-o",
        "addopts=",
        *extra,
        *tests,
    ]


# A mutant's tests that have not ended by then hang (e.g. waiting on a stuck child
# process): an error, never a wait without end.
RUN_TIMEOUT = 600.0

# The process groups of the test runs under way: each run is a session of its own, so
# the servers its tests start (Redis, a ZooKeeper JVM) are in its group and go with it.
_RUNNING: set[int] = set()
# Reentrant: the stop handler runs in the main thread, which may hold it (--discover
# runs its tests there).
_RUNNING_MUTEX = threading.RLock()
_STOPPING = threading.Event()


class Stopped(Exception):
    """The check was stopped (SIGTERM, SIGINT, SIGHUP) while a mutant's tests ran."""


def test_environment(tree: Path) -> dict[str, str]:
    """The environment of a mutant's pytest: the scratch tree first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(tree), str(tree / "testing"), env.get("PYTHONPATH")])
    )
    # The scratch trees keep their bytecode caches (see _restamp), whatever the
    # caller's environment says: without them each run compiles the tree and rewrites
    # hypothesis's asserts again (about 2.5 s of CPU per mutant).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _kill_group(group: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)


def run_tests(tree: Path, tests: Iterable[str], *extra: str) -> subprocess.CompletedProcess[str]:
    """Run ``tests`` in ``tree``; whatever the run started and left running (a server
    whose fixture a mutant broke, a hung test's children) is killed when it ends."""
    command = pytest_command(tests, *extra)
    with subprocess.Popen(
        command,
        cwd=tree,
        env=test_environment(tree),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        with _RUNNING_MUTEX:
            _RUNNING.add(proc.pid)
            if _STOPPING.is_set():  # started as the stop came: the handler missed it
                _kill_group(proc.pid)
        try:
            stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.communicate()
            return subprocess.CompletedProcess(
                command, 124, "", f"the tests did not end within {RUN_TIMEOUT:g} s"
            )
        finally:
            _kill_group(proc.pid)  # what the tests left behind, or everything on a stop
            with _RUNNING_MUTEX:
                _RUNNING.discard(proc.pid)
    if _STOPPING.is_set():
        raise Stopped(f"stopped while running {command[-1]}")
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """SIGTERM, SIGINT and SIGHUP stop the check (:func:`stop_running`) while the
    block runs; the handlers before are put back after it."""
    _STOPPING.clear()
    stops = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {stop: signal.signal(stop, stop_running) for stop in stops}
    try:
        yield
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)


def stop_running(signum: int, _frame: object = None) -> None:
    """A stop signal's handler: kill every test run's process group (their tests no
    longer get the terminal's SIGINT, being sessions of their own), let no new one
    start, and leave (the scratch trees are removed on the way out)."""
    _STOPPING.set()
    with _RUNNING_MUTEX:
        groups = list(_RUNNING)
    for group in groups:
        _kill_group(group)
    raise SystemExit(128 + signum)


def check_imports_from(tree: Path) -> None:
    """The scratch copy, not an installed cacheguard, must be what the tests import."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    found = subprocess.run(
        [sys.executable, "-c", "import cacheguard; print(cacheguard.__file__)"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(found).resolve().is_relative_to(tree.resolve()):
        raise MutantError(f"the tests would import {found}, not the scratch copy")


# Every text a patched file takes (a mutant, its original again) gets an mtime of its
# own, whole seconds apart: Python's and pytest's bytecode caches tell a source by its
# mtime (in seconds) and size, and a mutant of the original's size written within the
# same second would otherwise run the original's cached code. With that, the trees
# keep their caches from one mutant to the next: each run compiles (and rewrites the
# asserts of) only what changed, not the whole tree (about 2 s of CPU per mutant).
_STAMPS = itertools.count(2_000_000_000)
_STAMPS_MUTEX = threading.Lock()


def _restamp(path: Path) -> None:
    with _STAMPS_MUTEX:
        stamp = next(_STAMPS)
    os.utime(path, (stamp, stamp))


def check_one(mutant: Mutant, tree: Path) -> tuple[str, str]:
    """(verdict, detail): killed, survived or error."""
    path, original = apply(mutant, tree)
    _restamp(path)
    try:
        done = run_tests(tree, mutant.tests, "-x")
    finally:
        path.write_text(original, encoding="utf-8")
        _restamp(path)
    tail = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode == 1:
        return "killed", tail
    if done.returncode == 0:
        return "survived", tail
    return "error", f"pytest exit {done.returncode}: {tail or done.stderr.strip()[-300:]}"


def warn_moved(mutants: Iterable[Mutant], root: Path) -> int:
    """Warn of each mutant whose anchor was found in another file than its file=; how many.
    (One that does not apply is reported where it is checked.)"""
    moved = 0
    for mutant in mutants:
        try:
            site = locate(mutant, root)
        except MutantError:
            continue
        if site.moved_from:
            moved += 1
            print(moved_warning(mutant, site), file=sys.stderr, flush=True)
    return moved


def select(only: Sequence[str]) -> list[Mutant]:
    chosen = [m for m in MUTANTS if not only or any(part in m.id for part in only)]
    if not chosen:
        raise SystemExit(f"no mutant id contains any of {list(only)}")
    return chosen


def check(only: Sequence[str], jobs: int = 1) -> int:
    """Check the chosen mutants, ``jobs`` at a time (each job in a scratch copy of its own:
    most tests wait on Redis, timeouts and child processes, so two jobs nearly halve the
    time on two cores)."""
    mutants = select(only)
    moved = warn_moved(mutants, ROOT)
    jobs = max(1, min(jobs, len(mutants)))
    bad = 0
    done = 0
    output = threading.Lock()
    with tempfile.TemporaryDirectory(prefix="cacheguard-mutants-") as scratch:
        trees: queue.SimpleQueue[Path] = queue.SimpleQueue()
        for job in range(jobs):
            tree = scratch_copy(Path(scratch) / f"job{job}")
            check_imports_from(tree)
            trees.put(tree)

        def run(mutant: Mutant) -> None:
            nonlocal bad, done
            if _STOPPING.is_set():
                return
            tree = trees.get()  # a tree no other job is patching
            started = time.monotonic()
            try:
                verdict, detail = check_one(mutant, tree)
            except MutantError as exc:
                verdict, detail = "error", str(exc)
            except Stopped:
                return
            finally:
                trees.put(tree)
            took = time.monotonic() - started
            with output:
                done += 1
                bad += verdict != "killed"
                print(
                    f"[{done:2d}/{len(mutants)}] {verdict:8s} {mutant.id:40s} {took:5.1f}s  "
                    f"{detail}",
                    flush=True,
                )

        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            for future in [pool.submit(run, mutant) for mutant in mutants]:
                future.result()
    print(f"{len(mutants) - bad} of {len(mutants)} mutants killed", flush=True)
    if moved:
        print(
            f"{moved} found their code by its anchor in another file: update their file= "
            "(see the warnings)",
            flush=True,
        )
    return 1 if bad else 0


def discover(mutant_id: str, test_paths: Sequence[str]) -> int:
    """Run ``test_paths`` under one mutant and print the tests it makes fail."""
    matching = [m for m in MUTANTS if m.id == mutant_id]
    if not matching:
        raise SystemExit(f"no mutant {mutant_id!r}")
    mutant = matching[0]
    warn_moved([mutant], ROOT)
    with tempfile.TemporaryDirectory(prefix="cacheguard-mutants-") as scratch:
        tree = scratch_copy(Path(scratch))
        apply(mutant, tree)
        done = run_tests(tree, test_paths, "-rf")
    failed = re.findall(r"^FAILED (\S+)", done.stdout, flags=re.MULTILINE)
    print("\n".join(failed) if failed else f"nothing failed (pytest exit {done.returncode})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=[], help="mutant ids containing these")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument(
        "--markdown", action="store_true", help="the list as docs/testing.md's table"
    )
    parser.add_argument("--discover", nargs="+", metavar=("ID", "TESTS"))
    parser.add_argument(
        "--jobs", type=int, default=1, help="mutants checked at once, each in its own copy"
    )
    args = parser.parse_args(argv)
    if args.markdown:
        print("| mutant | guarantee it removes | tests that must fail |\n|---|---|---|")
        for mutant in select(args.only):
            tests = "<br>".join(f"`{t}`" for t in mutant.tests)
            print(f"| `{mutant.id}` | {mutant.guarantee} | {tests} |")
        return 0
    if args.list:
        for mutant in select(args.only):
            print(f"{mutant.id}: {mutant.guarantee}")
            try:
                site = locate(mutant, ROOT)
            except MutantError as exc:
                print(f"    DOES NOT APPLY: {exc}")
            else:
                moved = f"  (moved: its file= says {site.moved_from})" if site.moved_from else ""
                print(f"    at {site.where}, lines {site.first}-{site.last}{moved}")
                if site.moved_from:
                    print(moved_warning(mutant, site), file=sys.stderr)
            print(f"    {' '.join(mutant.tests)}")
        return 0
    with stop_signals():
        if args.discover:
            return discover(args.discover[0], args.discover[1:])
        return check(args.only, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
