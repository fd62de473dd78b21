"""Lua scripts of the distributed read-write lock: acquire, release, renew.

Each is one atomic round trip. Time comes from the Redis server (``TIME``), so
the clocks of client hosts never matter. Scripts are sent with EVALSHA and
loaded on NOSCRIPT (see :class:`LuaScript`), by the sync and the asyncio clients
alike. :mod:`cacheguard.locks.redis.wire` builds every call of these scripts (KEYS and
ARGV in the order of each contract) and parses their replies.

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
``fb``, ``fv``     when that fill began (server µs) and the key's version then;
                   waiters check announcements against both
``fs``             present while that fill may store: every cache invalidation
                   deletes it (see cacheguard/cache/scripts.py)
``q:<owner>``      a waiting writer's mark, valid until this server ms
``n:<owner>``      that writer's ticket; the lowest ticket goes in first
``seq``            ticket counter
=================  ==========================================================

Every script first sweeps out owners and marks whose time ran out, so a
crashed reader stops counting when its own lease ends even while other readers
keep the hash alive. The hash's own TTL is the latest lease or mark in it.

The fencing counter ``<ns>:{<name>}:fence`` expires :data:`FENCE_TTL_MS` after the
last write holding took a token from it. A missing counter starts again from the
server's clock in microseconds (``TIME``), which is above every token handed out
before it expired: a counter is seeded from the clock and then grows by one per
write holding, one script run each, and no Redis runs a script per microsecond, so
a counter never passes the clock; it expired a whole ``FENCE_TTL_MS`` after its
last token. The assumption is the server's clock: it does not go back by more
than that (a clock stepped back a day, or a failover to a server whose clock is a
day behind, could hand out a token again).
"""

from __future__ import annotations

from typing import Final

from cacheguard.redis.scripts import LuaScript

__all__ = [
    "ACQUIRE",
    "FENCE_TTL_MS",
    "LOCK_PRELUDE",
    "RELEASE",
    "RENEW",
    "WITHDRAW",
]

#: How long a lock's fencing counter outlives the last token taken from it (ms): a
#: day, far longer than the clock steps the restart from the clock must survive.
FENCE_TTL_MS: Final = 24 * 3600 * 1000

# Shared helpers, pasted after each script's contract comment. A script reads
# the hash once (load), changes the state in memory (grant, drop, put, forget)
# and writes it back once (settle): at most one HDEL, one HSET and one PEXPIRE,
# or a single DEL when nothing in the hash is alive any more.
LOCK_PRELUDE = (
    f"\nlocal FENCE_TTL_MS = {FENCE_TTL_MS}  -- the fencing counter's lifetime after use"
    + """
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

-- A fresh write holding's fencing token, as an exact decimal string: the counter's
-- next value, or, when the counter expired (or never existed), the server time in
-- microseconds, above every token the expired counter gave. Either way the counter
-- lives FENCE_TTL_MS more.
local function next_token(fence)
  if redis.call('EXISTS', fence) == 1 then
    redis.call('INCR', fence)
    redis.call('PEXPIRE', fence, FENCE_TTL_MS)
    return redis.call('GET', fence)
  end
  local token = time_epoch()
  redis.call('SET', fence, token, 'PX', FENCE_TTL_MS)
  return token
end

local function put(s, field, value)
  s.put[field] = value
  s.gone[field] = nil
end

local function forget(s, field)
  s.gone[field] = true
  s.put[field] = nil
end

-- A cache fill is over: forget its owner and its start time.
local function end_fill(s)
  s.fill, s.fb, s.fv = false, false, false
  forget(s, 'fill'); forget(s, 'fb'); forget(s, 'fv')
end

-- Read the lock hash; drop (in memory) holders and waiting marks whose time ran out.
local function load(key, now)
  local raw = redis.call('HGETALL', key)
  local s = {r = {}, w = {}, e = {}, g = {}, q = {}, n = {}, mode = false, token = false,
             fill = false, fb = false, fv = false, seq = 0, existed = #raw > 0, put = {}, gone = {}}
  for i = 1, #raw, 2 do
    local f, v = raw[i], raw[i + 1]
    if f == 'mode' then
      s.mode = v
    elseif f == 'token' then
      s.token = true
    elseif f == 'fill' then
      s.fill = v
    elseif f == 'fb' then
      s.fb = v
    elseif f == 'fv' then
      s.fv = v
    elseif f == 'seq' then
      s.seq = tonumber(v)
    elseif string.sub(f, 1, 2) == 'g:' then
      s.g[string.sub(f, 3)] = v  -- epochs stay exact strings
    elseif string.sub(f, 2, 2) == ':' then
      local bucket = s[string.sub(f, 1, 1)]
      if type(bucket) == 'table' then bucket[string.sub(f, 3)] = tonumber(v) end
    end
  end
  for who, ends in pairs(s.e) do
    if ends <= now then
      s.r[who], s.w[who], s.e[who], s.g[who] = nil, nil, nil, nil
      forget(s, 'r:' .. who); forget(s, 'w:' .. who)
      forget(s, 'e:' .. who); forget(s, 'g:' .. who)
    end
  end
  for who, ends in pairs(s.q) do
    if ends <= now then
      s.q[who], s.n[who] = nil, nil
      forget(s, 'q:' .. who); forget(s, 'n:' .. who)
    end
  end
  if s.fill and not s.e[s.fill] then
    -- The filling owner's lease ended: its fill is abandoned.
    end_fill(s)
  end
  return s
end

local function current_mode(s)
  for _, c in pairs(s.w) do if c > 0 then return 'write' end end
  for _, c in pairs(s.r) do if c > 0 then return 'read' end end
  return false
end

-- Add one hold of kind 'r' or 'w' for owner; returns the holding's epoch.
-- A fresh write holding takes the next fencing token; a fresh read holding an
-- epoch from the server clock (so read-only resources create no counter key).
local function grant(fence, s, owner, kind, lease, now)
  if not s.g[owner] then
    if kind == 'w' then
      s.g[owner] = next_token(fence)
    else
      s.g[owner] = time_epoch()
    end
    put(s, 'g:' .. owner, s.g[owner])
  end
  s[kind][owner] = (s[kind][owner] or 0) + 1
  put(s, kind .. ':' .. owner, s[kind][owner])
  s.e[owner] = now + lease
  put(s, 'e:' .. owner, s.e[owner])
  if kind == 'w' then
    if s.q[owner] then
      s.q[owner], s.n[owner] = nil, nil
      forget(s, 'q:' .. owner); forget(s, 'n:' .. owner)
    end
    if s.w[owner] == 1 then
      put(s, 'token', s.g[owner])
      s.token = true
    end
  end
  return s.g[owner]
end

-- Drop one hold of kind 'r' or 'w'; forget the owner when it holds nothing.
local function drop(s, owner, kind)
  local held = s[kind][owner]
  if held == 1 then
    s[kind][owner] = nil
    forget(s, kind .. ':' .. owner)
    if not s.r[owner] and not s.w[owner] then
      s.e[owner], s.g[owner] = nil, nil
      forget(s, 'e:' .. owner); forget(s, 'g:' .. owner)
      if s.fill == owner then
        end_fill(s)
      end
    end
  else
    s[kind][owner] = held - 1
    put(s, kind .. ':' .. owner, held - 1)
  end
end

-- Write the state back: delete the hash when nothing in it is alive, else store
-- the changed fields and give it the TTL of its longest-lived entry. Returns the mode.
local function settle(key, s, now)
  local mode = current_mode(s)
  local horizon = 0
  for _, ends in pairs(s.e) do if ends > horizon then horizon = ends end end
  for _, ends in pairs(s.q) do if ends > horizon then horizon = ends end end
  if horizon <= now then
    if s.existed then redis.call('DEL', key) end
    s.existed = false
    return false
  end
  if mode ~= s.mode then
    if mode then put(s, 'mode', mode) else forget(s, 'mode') end
    s.mode = mode
  end
  if mode ~= 'write' and s.token then
    forget(s, 'token')
    s.token = false
  end
  local dels, puts = {}, {}
  for f in pairs(s.gone) do dels[#dels + 1] = f end
  for f, v in pairs(s.put) do
    puts[#puts + 1] = f
    puts[#puts + 1] = v
  end
  if #dels > 0 then redis.call('HDEL', key, unpack(dels)) end
  if #puts > 0 then redis.call('HSET', key, unpack(puts)) end
  if #dels > 0 or #puts > 0 then redis.call('PEXPIRE', key, horizon - now) end
  s.put, s.gone, s.existed = {}, {}, true
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

-- May owner take a read hold? Holders re-enter even past waiting writers
-- (refusing would deadlock them); others wait for writers, held or queued.
local function may_read(s, owner, mode)
  if (s.r[owner] or 0) > 0 or (s.w[owner] or 0) > 0 then return true end
  if mode == 'write' then return false end
  for who in pairs(s.q) do
    if who ~= owner then return false end
  end
  return true
end
"""
)

_ACQUIRE_BODY = """
local key, fence, owner, want = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local lease, mark, channel = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local now = now_ms()
local s = load(key, now)
local mode = current_mode(s)
if s.mode and mode ~= s.mode then
  -- A dead holder was swept out: others waiting on it may go too.
  redis.call('SPUBLISH', channel, mode or 'free')
end

if want == 'read' then
  if may_read(s, owner, mode) then
    local epoch = grant(fence, s, owner, 'r', lease, now)
    settle(key, s, now)
    return {1, epoch}
  end
else
  if (s.w[owner] or 0) == 0 and (s.r[owner] or 0) > 0 then
    settle(key, s, now)
    return {-1, 0}
  end
  local first = true
  if (s.w[owner] or 0) == 0 then
    first = not mode
    local ticket = s.n[owner]
    for who, other in pairs(s.n) do
      if who ~= owner and (not ticket or other < ticket) then first = false end
    end
  end
  if first then
    local epoch = grant(fence, s, owner, 'w', lease, now)
    settle(key, s, now)
    return {1, epoch}
  end
  if mark > 0 then
    -- Stay queued: the mark holds off new readers until we get in or give up.
    if not s.n[owner] then
      s.seq = s.seq + 1
      put(s, 'seq', s.seq)
      s.n[owner] = s.seq
      put(s, 'n:' .. owner, s.seq)
    end
    s.q[owner] = now + mark
    put(s, 'q:' .. owner, s.q[owner])
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
if (s[kind][owner] or 0) == 0 or s.g[owner] ~= epoch then
  settle(key, s, now)
  return 0
end
drop(s, owner, kind)
local after = settle(key, s, now)
if after ~= before then redis.call('SPUBLISH', channel, after or 'free') end
return 1
"""

_WITHDRAW_BODY = """
local key, owner, channel = KEYS[1], ARGV[1], ARGV[2]
local now = now_ms()
local s = load(key, now)
if not s.q[owner] then
  settle(key, s, now)
  return 0
end
s.q[owner], s.n[owner] = nil, nil
forget(s, 'q:' .. owner); forget(s, 'n:' .. owner)
settle(key, s, now)
-- Readers held off by this writer may go now, if it was the last one waiting.
if next(s.q) == nil then redis.call('SPUBLISH', channel, 'withdrawn') end
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
put(s, 'e:' .. owner, s.e[owner])
settle(key, s, now)
for who in pairs(s.q) do
  if who ~= owner then return 2 end
end
return 1
"""

ACQUIRE_CONTRACT = """\
-- acquire: take the read or write lock for an owner, or queue a waiting writer.
-- KEYS[1]  lock hash         <ns>:{<name>}:rw
-- KEYS[2]  fencing counter   <ns>:{<name>}:fence (a write grant gives it FENCE_TTL_MS
--          more; missing, it starts again from the server clock in µs: see next_token)
-- ARGV[1]  owner id
-- ARGV[2]  'read' or 'write'
-- ARGV[3]  lease in ms
-- ARGV[4]  lifetime of a waiting writer's mark in ms (0: a one-shot try, do not queue)
-- ARGV[5]  release channel, sharded (a sweep of a dead holder is announced on it)
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
-- ARGV[4]  release channel, sharded (SPUBLISH: the key's slot, its shard only)
-- Returns 1 when released; 0 when the owner holds no such lock of that epoch
-- (its lease ran out or the key was removed); nothing is changed then.
"""

RENEW_CONTRACT = """\
-- renew: extend the lease of an owner that still holds the lock.
-- KEYS[1]  lock hash         <ns>:{<name>}:rw
-- ARGV[1]  owner id
-- ARGV[2]  epoch the handle was granted
-- ARGV[3]  lease in ms
-- Returns 1 when extended, 2 when extended and a writer of another owner waits,
-- 0 when the holding is gone (never re-creates it).
"""


WITHDRAW_CONTRACT = """\
-- withdraw: a waiting writer gives up; drop its mark so readers need not wait it out.
-- KEYS[1]  lock hash         <ns>:{<name>}:rw
-- ARGV[1]  owner id
-- ARGV[2]  release channel, sharded (announced when no writer waits any more)
-- Returns 1 when a mark was removed, 0 when there was none.
"""


# -- on a cluster: a plain pipeline per node (a cluster pipeline refuses scripts, and a
# WAIT must follow the writes on their own connection) -----------------------------------


ACQUIRE = LuaScript(ACQUIRE_CONTRACT + LOCK_PRELUDE + _ACQUIRE_BODY)
RELEASE = LuaScript(RELEASE_CONTRACT + LOCK_PRELUDE + _RELEASE_BODY)
RENEW = LuaScript(RENEW_CONTRACT + LOCK_PRELUDE + _RENEW_BODY)
WITHDRAW = LuaScript(WITHDRAW_CONTRACT + LOCK_PRELUDE + _WITHDRAW_BODY)
