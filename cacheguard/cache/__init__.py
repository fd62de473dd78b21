"""The read-through cache: CacheGuard, CacheLoader, @cached_with_lock.

Layout:

* ``guard``        -- :class:`CacheGuard`: read path, write path, fill-flow driver
* ``flow``         -- the fill algorithm, sans I/O
* ``scripts``      -- fill_begin / fill_end / invalidate Lua scripts
* ``loader``       -- :class:`CacheLoader`, :func:`cached_with_lock`
* ``entry``        -- the stored envelope
* ``codec``        -- msgpack (default), JSON, signed pickle
* ``templates``    -- key names from templates and arguments
* ``singleflight`` -- one thread per key per process
* ``breaker``      -- circuit breaker for a dead Redis
* ``stats``        -- counters and the event hook
"""

from cacheguard.cache.codec import Codec, JsonCodec, MsgpackCodec, PickleCodec
from cacheguard.cache.guard import MISSING, CacheGuard
from cacheguard.cache.loader import CachedFunction, CacheLoader, cached_with_lock
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
    "cached_with_lock",
]
