"""Redlock's own Lua: the one script beyond the Redis lock's (``locks/redis/lua.py``),
which every master runs the same way."""

from __future__ import annotations

from cacheguard.locks.redis.lua import FENCE_TTL_MS
from cacheguard.redis.scripts import LuaScript

__all__ = ["RAISE_FENCE"]

RAISE_FENCE_CONTRACT = """\
-- raise_fence: lift a lock's fencing counter to at least a token; never lowers it.
-- (Redlock: a write holding's token is written back to the masters that granted it,
-- so a later writer's INCR on any of them passes it.) The counter lives FENCE_TTL_MS
-- more either way, as after a grant (see next_token in cacheguard/locks/redis/lua.py).
-- KEYS[1]  fencing counter   <ns>:{<name>}:fence
-- ARGV[1]  the token (a decimal integer)
-- Returns the counter afterwards (a decimal string).
"""


_RAISE_FENCE_BODY = f"""
local FENCE_TTL_MS = {FENCE_TTL_MS}
local raw = redis.call('GET', KEYS[1])
if not raw or tonumber(raw) < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', FENCE_TTL_MS)
  return ARGV[1]
end
redis.call('PEXPIRE', KEYS[1], FENCE_TTL_MS)
return raw
"""


RAISE_FENCE = LuaScript(RAISE_FENCE_CONTRACT + _RAISE_FENCE_BODY)
