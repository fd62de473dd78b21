"""The Redis plumbing every part of cacheguard shares.

* ``clients``        -- the deployments (one server, Sentinel, Cluster), URL forms, client checks
* ``errors``         -- which redis-py errors mean "Redis is down" (``REDIS_DOWN``)
* ``keys``           -- the key layout: every key of one resource in one hash slot
* ``scripts`` / ``async_scripts`` -- running Lua: EVALSHA, reload on NOSCRIPT, per node
* ``pubsub``         -- the notifiers' pub/sub wire, sans I/O
* ``notifier`` / ``async_notifier`` -- one pub/sub listener per server (per loop)
"""
