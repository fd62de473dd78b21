"""What a guard does while Redis is down or the database slow (docs/outage.md).

* ``breaker``      -- a circuit breaker, so a dead Redis costs one connect timeout
* ``fallback``     -- the last values seen: ``outage_ttl`` reuse, ``stale_if_error``
* ``gutter``       -- fills through a second, small Redis while the primary is down
* ``recovery``     -- outbox replays before a guard serves from Redis again
* ``shared_loads`` -- callers whose wait timed out share one unlocked load per key
"""
