"""The read-through cache.

* ``guard`` / ``async_guard``     -- :class:`CacheGuard` and its asyncio twin: the fronts
* ``loader`` / ``async_loader``   -- :class:`CacheLoader`, :class:`CachedFunction`
* ``decorator``                   -- ``@cached_with_lock``, for both guards
* ``driver`` / ``async_driver``   -- run the flows' steps with blocking calls / awaits
* ``flows/``                      -- every decision, sans I/O: the fill, read and write flows
  and ``GuardState``, the one state they run over (a guard holds one)
* ``outage/``                     -- what a guard does while Redis is down: breaker,
  last-seen values, gutter, outbox recovery, shared timed-out loads
* ``settings``, ``stats``         -- one validated settings record; counters and the hook
* ``tracing``                     -- the seam a tracer plugs into (calls, loads, waits)
* ``entry``, ``codec``            -- the stored envelope; msgpack / JSON / signed pickle
* ``scripts``, ``wire``           -- the cache's Lua and its calls and reply parsers
* ``templates``, ``singleflight``, ``loading``, ``l1``, ``invalidation``,
  ``server_clock``, ``watermark``, ``write_locks`` -- one job each (see their docstrings)

Names are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cacheguard._lazy import lazy_exports

if TYPE_CHECKING:
    from cacheguard.cache.codec import Codec, JsonCodec, MsgpackCodec, PickleCodec
    from cacheguard.cache.guard import MISSING, CacheGuard
    from cacheguard.cache.loader import CachedFunction, CacheLoader
    from cacheguard.cache.stats import CacheEvent, Stats

__all__ = [
    "MISSING",
    "CacheEvent",
    "CacheGuard",
    "CacheLoader",
    "CachedFunction",
    "Codec",
    "JsonCodec",
    "MsgpackCodec",
    "PickleCodec",
    "Stats",
]

__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "Codec": "cacheguard.cache.codec",
        "JsonCodec": "cacheguard.cache.codec",
        "MsgpackCodec": "cacheguard.cache.codec",
        "PickleCodec": "cacheguard.cache.codec",
        "CacheGuard": "cacheguard.cache.guard",
        "MISSING": "cacheguard.cache.guard",
        "CacheLoader": "cacheguard.cache.loader",
        "CachedFunction": "cacheguard.cache.loader",
        "CacheEvent": "cacheguard.cache.stats",
        "Stats": "cacheguard.cache.stats",
    },
)
