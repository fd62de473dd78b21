"""Which redis-py errors mean "Redis is down" for cacheguard, and how they are told apart.

Every policy (bypass, outage reuse, the breaker, the outbox) asks the same question,
so the answer lives in one place: :data:`REDIS_DOWN`.
"""

from __future__ import annotations

from typing import Final

import redis
from redis.exceptions import (
    ClusterError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    SlotNotCoveredError,
    TryAgainError,
)

from cacheguard.exceptions import BackendUnavailable

__all__ = [
    "REDIS_DOWN",
    "REDIS_REFUSING",
    "REDIS_UNREACHABLE",
    "NoReplicasError",
    "backend_down",
    "classify",
]

# The one home of "Redis is down" (the sync and asyncio clients raise the same
# classes; a socket timeout is an OSError too). Unreachable: no answer at all.
REDIS_UNREACHABLE: Final = (redis.ConnectionError, redis.TimeoutError, OSError)


class NoReplicasError(redis.ResponseError):
    """NOREPLICAS: a master under ``min-replicas-to-write`` refusing a write while too
    few replicas are connected (redis-py raises a plain ResponseError for it;
    :func:`classify` gives it this class, so it counts as Redis refusing for now)."""


def classify(error: BaseException) -> BaseException:
    """``error``, or the :class:`NoReplicasError` a plain NOREPLICAS reply means."""
    if type(error) is redis.ResponseError and str(error).startswith("NOREPLICAS"):
        return NoReplicasError(str(error))
    return error


# Refusing for now: a deployment in transition. A cluster slot without a master
# (CLUSTERDOWN, and MASTERDOWN: both ClusterError, as is redirects running out),
# a slot that is moving (TRYAGAIN), no node known for a slot, a master demoted to
# replica while we still talk to it (READONLY), a master cut off from its replicas
# (NOREPLICAS, see classify). They pass once a failover ends. And a master out of
# memory under ``maxmemory-policy noeviction`` (OOM): it refuses writes until memory
# is freed (docs/design.md#eviction).
REDIS_REFUSING: Final = (
    ClusterError,
    TryAgainError,
    SlotNotCoveredError,
    ReadOnlyError,
    NoReplicasError,
    OutOfMemoryError,
)


# Down for us: unreachable, refusing for now, or refusing our keys (an ACL user
# without the namespace's key pattern). Every cacheguard policy treats them alike:
# never a corrupt entry, never a raw redis-py error past on_backend_error.
REDIS_DOWN: Final = (*REDIS_UNREACHABLE, *REDIS_REFUSING, NoPermissionError)


def backend_down(name: str, exc: BaseException) -> BackendUnavailable:
    """What a driver throws into a flow when Redis is down (the client's error is
    its ``__cause__``)."""
    error = BackendUnavailable(f"Redis unreachable for {name!r}: {exc}")
    error.__cause__ = exc
    return error
