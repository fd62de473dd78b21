"""Entry writes outside a fill: store, add, swap, touch and delete one entry directly.

A key-value front end on a guard's keys (the Django cache backend,
:mod:`cacheguard.integrations.django.cache`) writes entries itself: ``set``, ``add``,
``incr``, ``touch``, ``delete``. Each write here is one script on the key's own slot
that also deletes the ``fs`` field of the key's lock hash (see
:mod:`cacheguard.cache.scripts`): a fill that began before the write then stores
nothing (a touch's too: it would store a value with the old lifetime), so a
write always wins over a load already under way, and the fill's waiters, told
"not stored", read the key again and find the write's value.

The entries are the guard's own (:mod:`cacheguard.cache.entry`), so a value written
here is a hit for ``get_or_load`` and a filled one is read back here. A stored
entry's ``created`` is stamped by the script with the Redis server's clock, the
clock every guard judges ages by (:mod:`cacheguard.cache.server_clock`), so a host
whose clock is off stores entries that live as long as they should.

Only call builders and the scripts: no I/O (the caller sends the calls, sync or
asyncio, one by one or pipelined with :func:`cacheguard.redis.scripts.run_pipelined`).
"""

from __future__ import annotations

from typing import Any, Final

from cacheguard.cache.entry import HEADER_SIZE, pack_entry
from cacheguard.cache.settings import GuardSettings
from cacheguard.checks import MAX_SECONDS
from cacheguard.redis.keys import ResourceKeys
from cacheguard.redis.scripts import LuaScript, ScriptCall

__all__ = [
    "ENTRY_DELETE",
    "ENTRY_PUT",
    "ENTRY_SWAP",
    "ENTRY_TOUCH",
    "FOREVER",
    "delete_call",
    "new_entry",
    "put_call",
    "swap_call",
    "touch_call",
]

# An entry's lifetime when it has none (the key persists): the longest a guard takes.
FOREVER: Final = MAX_SECONDS

# Where the header keeps created and ttl (two float64s after the 2-byte magic and the
# codec byte; cache/entry.py), as 1-based Lua string positions.
_CREATED_AT: Final = 4
_AFTER_TTL: Final = 20

ENTRY_PUT = LuaScript(f"""\
-- entry_put: store an entry outside a fill (a set, an add), failing every fill in flight.
-- KEYS[1]  value key   <ns>:{{<name>}}:v
-- KEYS[2]  lock hash   <ns>:{{<name>}}:rw: its 'fs' field (a fill in flight may store)
--          is deleted, so a fill begun before this write stores nothing
-- ARGV[1]  the entry (cache/entry.py); its created field is stamped here with the
--          server's clock
-- ARGV[2]  the key's lifetime in ms, or '' for none (the key persists)
-- ARGV[3]  '1': only if the key holds nothing (add), '0': whatever it holds (set),
--          '2': only if it still holds ARGV[4] (an add replacing bytes that do not
--          decode: signed with an old key, corrupt)
-- ARGV[4]  with '2': the bytes the caller read
-- Returns 1 when stored, 0 when not (an add that found the key taken, or changed).
local vkey, lock, entry, px = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
if ARGV[3] == '1' and redis.call('EXISTS', vkey) == 1 then return 0 end
if ARGV[3] == '2' then
  local current = redis.pcall('GET', vkey)
  if type(current) ~= 'string' or current ~= ARGV[4] then return 0 end
end
-- The delete first: out of memory (noeviction) Redis refuses the SET, never the HDEL.
redis.call('HDEL', lock, 'fs')
local now = redis.call('TIME')
local created = struct.pack('<d', tonumber(now[1]) + tonumber(now[2]) / 1000000)
entry = string.sub(entry, 1, {_CREATED_AT - 1}) .. created .. string.sub(entry, {_CREATED_AT + 8})
if px == '' then
  redis.call('SET', vkey, entry)
else
  redis.call('SET', vkey, entry, 'PX', px)
end
return 1
""")

ENTRY_SWAP = LuaScript("""\
-- entry_swap: replace an entry only while it is still the one the caller read
-- (compare-and-set: an incr that lost a race reads again), failing fills in flight.
-- KEYS[1]  value key   <ns>:{<name>}:v
-- KEYS[2]  lock hash   <ns>:{<name>}:rw: its 'fs' field is deleted
-- ARGV[1]  the entry as read
-- ARGV[2]  its replacement; the key keeps its time to live
-- Returns 1 when replaced, 0 when the key holds anything else now (or nothing).
local current = redis.pcall('GET', KEYS[1])
if type(current) ~= 'string' or current ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[2], 'fs')
redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
return 1
""")

ENTRY_TOUCH = LuaScript(f"""\
-- entry_touch: give an entry a new lifetime, counted from now, failing every fill in
-- flight (it would store its value with the old lifetime over the touched entry).
-- KEYS[1]  value key   <ns>:{{<name>}}:v
-- KEYS[2]  lock hash   <ns>:{{<name>}}:rw: its 'fs' field is deleted
-- ARGV[1]  the entry's new lifetime in seconds (its header's ttl; created becomes now)
-- ARGV[2]  the key's new lifetime in ms, or '' for none (the key persists)
-- ARGV[3]  the entry as the caller read it (and found it decodes): touched only if the
--          key still holds it
-- Returns 1 when touched, 0 when the key holds anything else now (or nothing).
local vkey, px = KEYS[1], ARGV[2]
local entry = redis.pcall('GET', vkey)
if type(entry) ~= 'string' or entry ~= ARGV[3] or #entry < {HEADER_SIZE} then return 0 end
redis.call('HDEL', KEYS[2], 'fs')
local now = redis.call('TIME')
local stamp = struct.pack('<dd', tonumber(now[1]) + tonumber(now[2]) / 1000000, tonumber(ARGV[1]))
entry = string.sub(entry, 1, {_CREATED_AT - 1}) .. stamp .. string.sub(entry, {_AFTER_TTL})
if px == '' then
  redis.call('SET', vkey, entry)
else
  redis.call('SET', vkey, entry, 'PX', px)
end
return 1
""")

ENTRY_DELETE = LuaScript("""\
-- entry_delete: delete an entry, failing every fill in flight (it would store it again).
-- KEYS[1]  value key   <ns>:{<name>}:v
-- KEYS[2]  lock hash   <ns>:{<name>}:rw: its 'fs' field is deleted
-- Returns 1 when the key held a value, else 0.
redis.call('HDEL', KEYS[2], 'fs')
return redis.call('DEL', KEYS[1])
""")


def _px(lifetime: float | None) -> int | str:
    """A key's lifetime in ms for the scripts ('' for none)."""
    return "" if lifetime is None else max(1, round(lifetime * 1000))


def new_entry(settings: GuardSettings, value: Any, lifetime: float | None) -> bytes:
    """The entry of ``value`` for :func:`put_call` (``lifetime``: seconds, None for
    none), with the guard's codec and compression; its ``created`` is stamped by the
    script. :class:`~cacheguard.exceptions.SerializationError` if the codec refuses."""
    return pack_entry(
        settings.codec,
        value,
        created=0.0,
        ttl=FOREVER if lifetime is None else lifetime,
        version=0,
        load_duration=0.0,
        compress=settings.compress,
        compress_min_size=settings.compress_min_size,
    )


def put_call(
    keys: ResourceKeys,
    entry: bytes,
    lifetime: float | None,
    *,
    only_new: bool,
    replacing: bytes | None = None,
) -> ScriptCall:
    """Store ``entry`` for ``lifetime`` s (None: no expiry); ``only_new``: only if the key
    holds nothing (an add); ``replacing``: only if the key still holds these bytes (an
    add over bytes that do not decode). Reply: 1 stored, 0 not."""
    if replacing is not None:
        return ENTRY_PUT, [keys.value, keys.lock], [entry, _px(lifetime), "2", replacing]
    return ENTRY_PUT, [keys.value, keys.lock], [entry, _px(lifetime), "1" if only_new else "0"]


def swap_call(keys: ResourceKeys, seen: bytes, replacement: bytes) -> ScriptCall:
    """Replace the entry ``seen`` (the bytes read) with ``replacement``, keeping the key's
    time to live. Reply: 1 replaced, 0 the key holds something else now."""
    return ENTRY_SWAP, [keys.value, keys.lock], [seen, replacement]


def touch_call(keys: ResourceKeys, lifetime: float | None, seen: bytes) -> ScriptCall:
    """A new lifetime from now for the key's entry ``seen`` (the bytes read, found to
    decode; None: no expiry), failing fills in flight. Reply: 1 touched, 0 the key holds
    something else now (or nothing)."""
    ttl = FOREVER if lifetime is None else lifetime
    return ENTRY_TOUCH, [keys.value, keys.lock], [repr(float(ttl)), _px(lifetime), seen]


def delete_call(keys: ResourceKeys) -> ScriptCall:
    """Delete the key's entry, failing fills in flight. Reply: 1 deleted, 0 none there."""
    return ENTRY_DELETE, [keys.value, keys.lock], []
