"""The read-through cache: CacheGuard, CacheLoader (``@cached_with_lock`` is in
:mod:`cacheguard.decorator`, for both guards).

Layout:

* ``flow``         -- the fill algorithm and the hit's verdict, sans I/O
* ``wire``         -- script calls and reply / message parsers, sans I/O
* ``scripts``      -- fill_begin / fill_end / invalidate Lua scripts
* ``core``         -- GuardCore: the parts and decisions both guards share
* ``settings``     -- GuardSettings, validated once for both guards
* ``guard``        -- :class:`CacheGuard`: the sync front
* ``driver``       -- the sync driver of the fill flow
* ``loader``       -- :class:`CacheLoader`, :class:`CachedFunction`
* ``entry``        -- the stored envelope
* ``codec``        -- msgpack (default), JSON, signed pickle
* ``templates``    -- key names from templates and arguments
* ``singleflight`` -- one caller per key per process (threads or tasks)
* ``invalidation`` -- invalidation calls, prefix stamps (bounded bookkeeping)
* ``server_clock`` -- the Redis server's clock, by which entries' ages are judged
* ``loading``      -- loaders counted, timed, recursion refused
* ``l1``           -- the in-process tier and its invalidation feed
* ``breaker``      -- circuit breaker for a dead Redis
* ``stats``        -- counters and the event hook
* ``watermark``    -- which database snapshots a load read
"""

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
