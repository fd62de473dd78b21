"""Lua scripts of the read-through cache: begin a fill, end it, invalidate.

A fill's read hold is an ordinary read hold on the key's lock hash (the same
Lua helpers as the lock), plus the ``fill`` field naming the one owner that
loads; so fills and writes exclude each other in the same script call that
decides who loads. The store is a compare-and-set against the key's
invalidation version, and only succeeds while the filler still holds its lease.

Eviction: a version key that an evicting ``maxmemory-policy`` dropped reads as
"never invalidated", so the version compare alone cannot fail a fill in flight.
The fill's fate therefore also lives in its own lock hash: fill_begin writes the
``fs`` ("fill may store") field next to the fill's hold, every invalidate deletes
it (HDEL, which Redis runs even when out of memory), and fill_end stores only
while it is still there. An evicted lock hash takes the hold with it: no store.
"""

from __future__ import annotations

from cacheguard.locks.redis.lua import LOCK_PRELUDE
from cacheguard.redis.scripts import LuaScript

__all__ = [
    "FILL_BEGIN",
    "FILL_END",
    "INVALIDATE",
    "NEXT_STAMP",
    "RAISE_WATERMARK",
    "READ_WATERMARK",
    "TIMED_GET",
]

FILL_BEGIN_CONTRACT = """\
-- fill_begin: return the value, or make the caller the key's one filler, or say who is busy.
-- KEYS[1]  value key         <ns>:{<name>}:v
-- KEYS[2]  lock hash         <ns>:{<name>}:rw
-- KEYS[3]  version key       <ns>:{<name>}:ver
-- ARGV[1]  owner id
-- ARGV[2]  lease in ms
-- ARGV[3]  '1': fill even if a value exists (a refresh), '0': return an existing value
-- ARGV[4]  version key lifetime in ms (refreshed here)
-- ARGV[5]  optional, with ARGV[3] '1': the bytes the caller found unusable (they do
--          not decode, or are past their expiry); if the key now holds other bytes,
--          another caller replaced them meanwhile: they are returned as {0, value}
--          instead of filling again
-- Returns {0, value}                             a value exists
--         {1, version, epoch, server ms, server µs}  the caller holds read + fill: load now
--         {2, ms until worth retrying, 'fill', µs, version}   a fill is under way (any
--                                  owner), begun at µs when the key's version was version
--         {2, ms until worth retrying, 'write', µs, version}  a writer holds or waits for
--                                  the lock; µs and version are now's
-- A waiter takes an announced entry only from a fill begun at or after that µs, of a
-- version at least that one: an older fill's announcement (delivered late) may
-- predate an invalidation the waiter saw. (Two checks: the clock may step back.)
"""

_FILL_BEGIN_BODY = """
local vkey, key, verkey = KEYS[1], KEYS[2], KEYS[3]
local owner, lease, refresh, verttl = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
if refresh ~= '1' then
  -- pcall: a key of another type (not ours) is no value; the fill overwrites it.
  local value = redis.pcall('GET', vkey)
  if type(value) == 'string' then return {0, value} end
elseif ARGV[5] then
  local value = redis.pcall('GET', vkey)
  if type(value) == 'string' and value ~= ARGV[5] then return {0, value} end
end
local now = now_ms()
local s = load(key, now)
local mode = current_mode(s)
if s.fill then
  -- One fill at a time, also within one owner (a process): a second one would
  -- take a second read hold that only the first fill's end could drop.
  local ends = s.e[s.fill] - now
  settle(key, s, now)
  return {2, ends, 'fill', s.fb or '0', s.fv or '0'}
end
if not may_read(s, owner, mode) then
  local wait = soonest_end(s, now, owner)
  settle(key, s, now)
  return {2, wait, 'write', time_epoch(), redis.call('GET', verkey) or '0'}
end
local epoch = grant(nil, s, owner, 'r', lease, now)
local version = redis.call('GET', verkey)
if version then redis.call('PEXPIRE', verkey, verttl) else version = '0' end
local begun = time_epoch()
s.fill, s.fb, s.fv = owner, begun, version
put(s, 'fill', owner)
put(s, 'fb', begun)
put(s, 'fv', version)
-- Until an invalidation deletes it (it does even when the version key is evicted).
put(s, 'fs', '1')
settle(key, s, now)
return {1, version, epoch, now, begun}
"""

FILL_END_CONTRACT = """\
-- fill_end: store the loaded entry if nothing invalidated it meanwhile, release the fill.
-- KEYS[1]  value key         <ns>:{<name>}:v
-- KEYS[2]  lock hash         <ns>:{<name>}:rw
-- KEYS[3]  version key       <ns>:{<name>}:ver
-- ARGV[1]  owner id
-- ARGV[2]  epoch of the fill's read hold
-- ARGV[3]  version seen by fill_begin
-- ARGV[4]  server ms at fill_begin
-- ARGV[5]  version key lifetime in ms (an older fill cannot prove its version)
-- ARGV[6]  entry bytes, or '' to store nothing (load failed, value not cacheable)
-- ARGV[7]  value TTL in ms
-- ARGV[8]  channel announcing fills and releases, sharded (SPUBLISH, the key's slot)
-- ARGV[9]  largest entry sent along with the announcement, in bytes
-- ARGV[10] '1' when the load failed
-- ARGV[11] watermark of the oldest database snapshot the load read, or '' if unknown:
--          a version above it means the snapshot predates the last invalidation
-- ARGV[12] when the fill began (server µs, from fill_begin)
-- Stores only while the lock hash still holds the fill's hold and its 'fs' field: an
-- invalidate since fill_begin deleted 'fs', even if the version key was evicted since.
-- Publishes 'V' .. begun µs .. ':' .. entry (stored, small), 'S' (stored, read it),
-- 'N' (loaded but not stored: not cacheable or invalidated) or 'A' (the load failed).
-- Returns 1 when stored; 0 when not (lease lost, version moved, nothing to store).
"""

_FILL_END_BODY = """
local vkey, key, verkey = KEYS[1], KEYS[2], KEYS[3]
local owner, epoch, seen, begun = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local verttl, entry, px, channel = tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7]), ARGV[8]
local limit, failed, watermark = tonumber(ARGV[9]), ARGV[10] == '1', tonumber(ARGV[11])
local begun_us = ARGV[12]
local now = now_ms()
local may_store = redis.call('HEXISTS', key, 'fs') == 1
local s = load(key, now)
local ours = s.fill == owner and s.g[owner] == epoch and (s.r[owner] or 0) > 0
local stored = 0
if ours and may_store and entry ~= '' and now - begun < verttl then
  local fresh = watermark == nil or tonumber(seen) <= watermark
  if fresh and (redis.call('GET', verkey) or '0') == seen then
    redis.call('SET', vkey, entry, 'PX', px)
    stored = 1
  end
end
if ours then
  end_fill(s)
  forget(s, 'fs')
  drop(s, owner, 'r')
end
settle(key, s, now)
if stored == 1 and #entry <= limit then
  redis.call('SPUBLISH', channel, 'V' .. begun_us .. ':' .. entry)
elseif stored == 1 then
  redis.call('SPUBLISH', channel, 'S')
elseif failed then
  redis.call('SPUBLISH', channel, 'A')
else
  redis.call('SPUBLISH', channel, 'N')
end
return stored
"""

INVALIDATE = LuaScript("""\
-- invalidate: stamp the key's version with an invalidation number (failing every
-- fill in flight and every fill from an older snapshot), drop the value.
-- KEYS[1]  value key         <ns>:{<name>}:v
-- KEYS[2]  version key       <ns>:{<name>}:ver
-- KEYS[3]  lock hash         <ns>:{<name>}:rw: its 'fs' field (a fill in flight may
--          store) is deleted, so that fill fails even if the version key is evicted
-- ARGV[1]  version key lifetime in ms
-- ARGV[2]  L1 invalidation channel ('' for none): namespace-wide, so a plain PUBLISH,
--          which a cluster broadcasts to every node
-- ARGV[3]  the resource name, announced on that channel
-- ARGV[4]  this invalidation's number (NEXT_STAMP, sent just before), or '' when the
--          sequence's node is unreachable: the version is then *poisoned*, set to
--          ARGV[6] + the real version it replaces + 1, above every snapshot watermark:
--          fills that read a known snapshot refuse to store
-- ARGV[5]  '' or a poisoned version this caller wrote a moment ago: if the version
--          still is that one, it is *healed*: set to a real version again, the number
--          in ARGV[4] (taken after the poison was written) or, if higher, the real
--          version the poison carries + 1
-- ARGV[6]  the poison floor, far above any number the sequence hands out
-- Returns the key's new version. Versions only move up, counting a poisoned one as
-- the real version it carries: the stamp, or the old version + 1 when the stamp is
-- not above it (two invalidations that arrived out of order, a counter that lost
-- increments in a failover, or a poisoned version, which only a heal brings back
-- to a real one); the caller then lifts the counter to a real version that ran
-- ahead of it (see RAISE_WATERMARK), or heals a poisoned one.
-- The deletes come first: out of memory (noeviction) Redis refuses a script's first
-- write if it may grow memory (the SET below), never a delete, and does not stop a
-- script that has written; so the value and the fill in flight go even then.
redis.call('DEL', KEYS[1])
redis.call('HDEL', KEYS[3], 'fs')
local raw = redis.call('GET', KEYS[2])
local version = tonumber(raw or '0')
local stamp, floor = tonumber(ARGV[4]), tonumber(ARGV[6])
if stamp == nil then
  if version < floor then version = floor + version + 1 else version = version + 1 end
elseif ARGV[5] ~= '' and raw == ARGV[5] then
  version = math.max(stamp, version - floor + 1)
elseif stamp > version then
  version = stamp
else
  version = version + 1
end
redis.call('SET', KEYS[2], string.format('%d', version), 'PX', ARGV[1])
if ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[2], ARGV[3]) end
return version
""")

NEXT_STAMP = LuaScript("""\
-- next_stamp: the next number of the namespace's invalidation sequence (a script, so
-- that it runs in a batch with a WAIT: a number a failover could hand out twice is
-- never used).
-- KEYS[1]  the namespace's sequence   <ns>:wm
-- Returns the number.
return redis.call('INCR', KEYS[1])
""")

READ_WATERMARK = LuaScript("""\
-- read_watermark: the namespace's invalidation sequence now, as a write (INCRBY 0), so
-- that a WAIT after it confirms that replicas hold every number up to it.
-- KEYS[1]  the namespace's sequence   <ns>:wm
-- Returns the sequence's value.
return redis.call('INCRBY', KEYS[1], 0)
""")

RAISE_WATERMARK = LuaScript("""\
-- raise_watermark: lift the invalidation sequence to at least a version in use.
-- KEYS[1]  the namespace's sequence   <ns>:wm
-- ARGV[1]  the highest (unpoisoned) version an invalidation just wrote
-- Returns the sequence's value afterwards.
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local wanted = tonumber(ARGV[1])
if wanted > current then
  redis.call('SET', KEYS[1], string.format('%d', wanted))
  return wanted
end
return current
""")

FILL_BEGIN = LuaScript(FILL_BEGIN_CONTRACT + LOCK_PRELUDE + _FILL_BEGIN_BODY)
FILL_END = LuaScript(FILL_END_CONTRACT + LOCK_PRELUDE + _FILL_END_BODY)

TIMED_GET = LuaScript("""\
-- timed_get: the value and the server's clock in one round trip (a process judges
-- entries' ages by the server's clock, see cache/server_clock.py).
-- KEYS[1]  value key         <ns>:{<name>}:v
-- Returns {value (nil if none; the error if the key is of another type), seconds, µs}
local value = redis.pcall('GET', KEYS[1])
local now = redis.call('TIME')
return {value, now[1], now[2]}
""")
