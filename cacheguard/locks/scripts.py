"""Lua scripts of the distributed read-write lock: acquire, release, renew.

Each is one atomic round trip. Time comes from the Redis server (``TIME``), so
the clocks of client hosts never matter. Scripts are sent with EVALSHA and
loaded on NOSCRIPT (see :class:`LuaScript`).

Layout of the lock hash ``<ns>:{<name>}:rw`` (one hash per lock):

=================  ==========================================================
field              meaning
=================  ==========================================================
``mode``           ``read`` or ``write``; absent when nobody holds the lock
``token``          fencing token of the current write hold
``r:<owner>``      reentrant read hold count of ``owner``
``w:<owner>``      reentrant write hold count of ``owner``
``e:<owner>``      lease end of ``owner`` (server ms); past it the holds vanish
``g:<owner>``      epoch of the owner's holding: the next fencing token for a
                   write holding, the server time in µs for a read holding
``fill``           the owner filling the cached value (cache fills only); it
                   ends with that owner's lease
``q:<owner>``      a waiting writer's mark, valid until this server ms
``n:<owner>``      that writer's ticket; the lowest ticket goes in first
``seq``            ticket counter
=================  ==========================================================

Every script first sweeps out owners and marks whose time ran out, so a
crashed reader stops counting when its own lease ends even while other readers
keep the hash alive. The hash's own TTL is the latest lease or mark in it.
"""

from __future__ import annotations

import hashlib
from typing import Any

import redis
from redis.exceptions import NoScriptError

__all__ = ["ACQUIRE", "RELEASE", "RENEW", "WITHDRAW", "LuaScript"]

# Shared helpers, pasted after each script's contract comment.
_PRELUDE = """
local unpack = unpack or table.unpack  -- Lua 5.1 (Redis) or 5.4 (fakeredis)
local clock = redis.call('TIME')
local function now_ms()
  return tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
end
-- A fresh read holding's epoch: the server time in microseconds, as an exact
-- decimal string (a Lua number would print it rounded).
local function time_epoch()
  return clock[1] .. string.format('%06d', tonumber(clock[2]))
end

-- Read the lock hash, drop holders and waiting marks whose time ran out.
local function load(key, now)
  local raw = redis.call('HGETALL', key)
  local s = {r = {}, w = {}, e = {}, g = {}, q = {}, n = {}, mode = false}
  for i = 1, #raw, 2 do
    local f, v = raw[i], raw[i + 1]
    if f == 'mode' then
      s.mode = v
    elseif f == 'token' then
      s.token = true
    elseif f == 'fill' then
      s.fill = v
    elseif string.sub(f, 1, 2) == 'g:' then
      s.g[string.sub(f, 3)] = v  -- epochs stay exact strings
    elseif string.sub(f, 2, 2) == ':' then
      local bucket = s[string.sub(f, 1, 1)]
      if type(bucket) == 'table' then bucket[string.sub(f, 3)] = tonumber(v) end
    end
  end
  local expired = {}
  for who, ends in pairs(s.e) do
    if ends <= now then expired[#expired + 1] = who end
  end
  for _, who in ipairs(expired) do
    s.r[who], s.w[who], s.e[who], s.g[who] = nil, nil, nil, nil
    redis.call('HDEL', key, 'r:' .. who, 'w:' .. who, 'e:' .. who, 'g:' .. who)
  end
  local gave_up = {}
  for who, ends in pairs(s.q) do
    if ends <= now then gave_up[#gave_up + 1] = who end
  end
  for _, who in ipairs(gave_up) do
    s.q[who], s.n[who] = nil, nil
    redis.call('HDEL', key, 'q:' .. who, 'n:' .. who)
  end
  if s.fill and not s.e[s.fill] then
    -- The filling owner's lease ended: its fill is abandoned.
    s.fill = nil
    redis.call('HDEL', key, 'fill')
  end
  return s
end

-- Add one hold of kind 'r' or 'w' for owner; returns the holding's epoch.
-- A fresh write holding takes the next fencing token; a fresh read holding an
-- epoch from the server clock (so read-only resources create no counter key).
local function grant(key, fence, s, owner, kind, lease, now)
  local fields = {}
  if not s.g[owner] then
    if kind == 'w' then
      s.g[owner] = tostring(redis.call('INCR', fence))
    else
      s.g[owner] = time_epoch()
    end
    fields[#fields + 1] = 'g:' .. owner
    fields[#fields + 1] = s.g[owner]
  end
  s[kind][owner] = (s[kind][owner] or 0) + 1
  s.e[owner] = now + lease
  fields[#fields + 1] = kind .. ':' .. owner
  fields[#fields + 1] = s[kind][owner]
  fields[#fields + 1] = 'e:' .. owner
  fields[#fields + 1] = s.e[owner]
  if kind == 'w' then
    if s.q[owner] then
      s.q[owner], s.n[owner] = nil, nil
      redis.call('HDEL', key, 'q:' .. owner, 'n:' .. owner)
    end
    if s.w[owner] == 1 then
      fields[#fields + 1] = 'token'
      fields[#fields + 1] = s.g[owner]
      s.token = true
    end
  end
  redis.call('HSET', key, unpack(fields))
  return s.g[owner]
end

-- Drop one hold of kind 'r' or 'w'; forget the owner when it holds nothing.
local function drop(key, s, owner, kind)
  local held = s[kind][owner]
  if held == 1 then
    s[kind][owner] = nil
    if not s.r[owner] and not s.w[owner] then
      s.e[owner], s.g[owner] = nil, nil
      redis.call('HDEL', key, kind .. ':' .. owner, 'e:' .. owner, 'g:' .. owner)
      if s.fill == owner then
        s.fill = nil
        redis.call('HDEL', key, 'fill')
      end
    else
      redis.call('HDEL', key, kind .. ':' .. owner)
    end
  else
    s[kind][owner] = held - 1
    redis.call('HSET', key, kind .. ':' .. owner, held - 1)
  end
end

local function current_mode(s)
  for _, c in pairs(s.w) do if c > 0 then return 'write' end end
  for _, c in pairs(s.r) do if c > 0 then return 'read' end end
  return false
end

-- Write the mode back and give the hash the TTL of its longest-lived entry,
-- or delete it when nothing in it is alive. Returns the mode.
local function settle(key, s, now)
  local mode = current_mode(s)
  local horizon = 0
  for _, ends in pairs(s.e) do if ends > horizon then horizon = ends end end
  for _, ends in pairs(s.q) do if ends > horizon then horizon = ends end end
  if horizon <= now then
    redis.call('DEL', key)
    return false
  end
  if mode then
    if mode ~= s.mode then redis.call('HSET', key, 'mode', mode) end
  else
    redis.call('HDEL', key, 'mode')
  end
  if mode ~= 'write' and s.token then redis.call('HDEL', key, 'token') end
  redis.call('PEXPIRE', key, horizon - now)
  return mode
end

-- Milliseconds until the soonest lease or mark of someone else ends.
local function soonest_end(s, now, me)
  local soonest = false
  for who, ends in pairs(s.e) do
    if who ~= me and (not soonest or ends < soonest) then soonest = ends end
  end
  for who, ends in pairs(s.q) do
    if who ~= me and (not soonest or ends < soonest) then soonest = ends end
  end
  if soonest then return soonest - now end
  return 0
end
"""

_ACQUIRE_BODY = """
local key, fence, owner, want = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local lease, mark, channel = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local now = now_ms()
local s = load(key, now)
local swept_mode = current_mode(s)
if s.mode and swept_mode ~= s.mode then
  -- A dead holder was swept out: others waiting on it may go too.
  redis.call('PUBLISH', channel, swept_mode or 'free')
end

local function grant_and_settle(kind)
  local epoch = grant(key, fence, s, owner, kind, lease, now)
  settle(key, s, now)
  return {1, epoch}
end

local mine_r, mine_w = s.r[owner] or 0, s.w[owner] or 0
if want == 'read' then
  -- Holders re-enter even past waiting writers (refusing would deadlock them).
  if mine_r > 0 or mine_w > 0 then return grant_and_settle('r') end
  local writer_waits = false
  for who in pairs(s.q) do
    if who ~= owner then writer_waits = true end
  end
  if swept_mode ~= 'write' and not writer_waits then return grant_and_settle('r') end
else
  if mine_w > 0 then return grant_and_settle('w') end
  if mine_r > 0 then return {-1, 0} end
  if not swept_mode then
    local ticket, first = s.n[owner], true
    for who, other in pairs(s.n) do
      if who ~= owner and (not ticket or other < ticket) then first = false end
    end
    if first then return grant_and_settle('w') end
  end
  if mark > 0 then
    -- Stay queued: the mark holds off new readers until we get in or give up.
    if not s.n[owner] then
      s.n[owner] = redis.call('HINCRBY', key, 'seq', 1)
    end
    s.q[owner] = now + mark
    redis.call('HSET', key, 'q:' .. owner, s.q[owner], 'n:' .. owner, s.n[owner])
  end
end
local wait = soonest_end(s, now, owner)
settle(key, s, now)
return {0, wait}
"""

_RELEASE_BODY = """
local key, owner, want, epoch, channel = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now = now_ms()
local s = load(key, now)
local before = current_mode(s)
local kind = 'r'
if want == 'write' then kind = 'w' end
local held = s[kind][owner] or 0
if held == 0 or s.g[owner] ~= epoch then
  settle(key, s, now)
  return 0
end
drop(key, s, owner, kind)
local after = settle(key, s, now)
if after ~= before then redis.call('PUBLISH', channel, after or 'free') end
return 1
"""

_WITHDRAW_BODY = """
local key, owner, channel = KEYS[1], ARGV[1], ARGV[2]
local now = now_ms()
local s = load(key, now)
if not s.q[owner] then return 0 end
s.q[owner], s.n[owner] = nil, nil
redis.call('HDEL', key, 'q:' .. owner, 'n:' .. owner)
settle(key, s, now)
-- Readers held off by this writer may go now, if it was the last one waiting.
if next(s.q) == nil then redis.call('PUBLISH', channel, 'withdrawn') end
return 1
"""

_RENEW_BODY = """
local key, owner, epoch, lease = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local s = load(key, now)
if s.g[owner] ~= epoch or (not s.r[owner] and not s.w[owner]) then
  settle(key, s, now)
  return 0
end
s.e[owner] = now + lease
redis.call('HSET', key, 'e:' .. owner, s.e[owner])
settle(key, s, now)
return 1
"""

ACQUIRE_CONTRACT = """\
-- acquire: take the read or write lock for an owner, or queue a waiting writer.
-- KEYS[1]  lock hash         <ns>:{<name>}:rw
-- KEYS[2]  fencing counter   <ns>:{<name>}:fence (never expires)
-- ARGV[1]  owner id
-- ARGV[2]  'read' or 'write'
-- ARGV[3]  lease in ms
-- ARGV[4]  lifetime of a waiting writer's mark in ms (0: a one-shot try, do not queue)
-- ARGV[5]  release channel (a sweep of a dead holder is announced on it)
-- Returns {1, epoch} when granted (epoch = fencing token for writes, a string),
--         {0, ms until the soonest other lease or mark ends} when busy,
--         {-1, 0} when a read holder asks for the write lock.
"""

RELEASE_CONTRACT = """\
-- release: drop one hold of an owner, announcing when the lock frees or downgrades.
-- KEYS[1]  lock hash         <ns>:{<name>}:rw
-- ARGV[1]  owner id
-- ARGV[2]  'read' or 'write'
-- ARGV[3]  epoch the handle was granted
-- ARGV[4]  release channel
-- Returns 1 when released; 0 when the owner holds no such lock of that epoch
-- (its lease ran out or the key was removed); nothing is changed then.
"""

RENEW_CONTRACT = """\
-- renew: extend the lease of an owner that still holds the lock.
-- KEYS[1]  lock hash         <ns>:{<name>}:rw
-- ARGV[1]  owner id
-- ARGV[2]  epoch the handle was granted
-- ARGV[3]  lease in ms
-- Returns 1 when extended; 0 when the holding is gone (never re-creates it).
"""


WITHDRAW_CONTRACT = """\
-- withdraw: a waiting writer gives up; drop its mark so readers need not wait it out.
-- KEYS[1]  lock hash         <ns>:{<name>}:rw
-- ARGV[1]  owner id
-- ARGV[2]  release channel (announced when no writer waits any more)
-- Returns 1 when a mark was removed, 0 when there was none.
"""


class LuaScript:
    """A script sent by EVALSHA, loaded on NOSCRIPT; no per-client state."""

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, client: redis.Redis, keys: list[str], args: list[Any]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            # First use on this server, or after a restart / SCRIPT FLUSH.
            client.script_load(self.source)
            return client.evalsha(self.sha, len(keys), *keys, *args)

    def queue(self, pipe: Any, keys: list[str], args: list[Any]) -> None:
        """Add the call to a pipeline (see :func:`run_pipeline`)."""
        pipe.evalsha(self.sha, len(keys), *keys, *args)


ACQUIRE = LuaScript(ACQUIRE_CONTRACT + _PRELUDE + _ACQUIRE_BODY)
RELEASE = LuaScript(RELEASE_CONTRACT + _PRELUDE + _RELEASE_BODY)
RENEW = LuaScript(RENEW_CONTRACT + _PRELUDE + _RENEW_BODY)
WITHDRAW = LuaScript(WITHDRAW_CONTRACT + _PRELUDE + _WITHDRAW_BODY)
