"""The settings of a guard: one frozen, self-validating record shared by
:class:`~cacheguard.CacheGuard` and :class:`~cacheguard.aio.AsyncCacheGuard`.

Every number is checked against what Redis accepts when the record is made, so
a bad setting fails at construction with a clear ``ValueError``/``TypeError``,
never later inside a script call. A duration may be given as a ``timedelta``; the
record keeps seconds (floats), so nothing that reads it converts again.
``docs/guide.md`` explains each one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

from redis.backoff import NoBackoff
from redis.retry import Retry

from cacheguard.cache.codec import Codec, MsgpackCodec, check_codec
from cacheguard.cache.compression import Compress, check_compress
from cacheguard.checks import (
    Seconds,
    check_choice,
    check_int,
    check_non_negative,
    check_positive,
    check_ratio,
)
from cacheguard.redis.keys import check_namespace

__all__ = ["BackendPolicy", "GuardSettings", "TimeoutPolicy", "client_options"]

TimeoutPolicy = Literal["load", "raise", "stale"]
BackendPolicy = Literal["bypass", "raise"]

_TIMEOUT_POLICIES: Final = ("load", "raise", "stale")
_BACKEND_POLICIES: Final = ("bypass", "raise")


@dataclass(frozen=True, slots=True)
class GuardSettings:
    """Validated settings; the defaults suit most services. Durations are seconds
    (a ``timedelta`` given is kept as its seconds).

    ``compress`` (``"zlib"``, or ``"zstd"`` with the ``zstd`` extra; default None:
    off) stores a codec's payload of ``compress_min_size`` bytes (default 1 KiB)
    or more compressed, when that makes it smaller; every guard reads entries
    compressed either way or not at all (see ``docs/compression.md``).
    """

    namespace: str = "cg"
    lease: float = 30.0
    wait_timeout: float = 10.0
    on_timeout: TimeoutPolicy = "load"
    on_backend_error: BackendPolicy = "bypass"
    codec: Codec = field(default_factory=MsgpackCodec)
    compress: Compress | None = None
    compress_min_size: int = 1024
    ttl_jitter: float = 0.1
    none_ttl: float | None = 30.0
    stale_ttl: float = 0.0
    early_refresh_beta: float = 1.0
    l1_maxsize: int = 0
    l1_ttl: float = 5.0
    max_value_bytes: int = 8 * 1024 * 1024
    announce_value_bytes: int = 64 * 1024
    version_ttl: float = 7 * 24 * 3600.0
    max_key_length: int = 200
    max_fill_retries: int = 3
    max_load_time: float = 60.0
    breaker_failures: int = 3
    breaker_cooldown: float = 2.0
    # Hand-overs of a key's write lock between this process's writers before it
    # goes back to Redis (see docs/locks.md, "Lock cohorting"); 0: none.
    cohort_limit: int = 16
    # Replicas that must acknowledge each invalidation (WAIT) before it counts as done;
    # None: one on a Sentinel master or a cluster with replicas, none on one server.
    confirm_replicas: int | None = None
    confirm_timeout: float = 1.0
    # While Redis is unreachable (see docs/outage.md): reuse a value this process saw
    # for up to outage_ttl s; serve one seen up to stale_if_error s ago instead of an
    # error; how many names that memory keeps; how long a gutter keeps its entries.
    outage_ttl: float = 0.0
    stale_if_error: float = 0.0
    fallback_maxsize: int = 10_000
    gutter_ttl: float = 5.0

    def __post_init__(self) -> None:
        checked: dict[str, Any] = {
            "namespace": check_namespace(self.namespace),
            "lease": check_positive("lease", self.lease),
            "wait_timeout": check_positive("wait_timeout", self.wait_timeout),
            "on_timeout": check_choice("on_timeout", self.on_timeout, _TIMEOUT_POLICIES),
            "on_backend_error": check_choice(
                "on_backend_error", self.on_backend_error, _BACKEND_POLICIES
            ),
            "codec": check_codec(self.codec if self.codec is not None else MsgpackCodec()),
            "compress": check_compress(self.compress),
            "compress_min_size": check_int("compress_min_size", self.compress_min_size, minimum=0),
            "ttl_jitter": check_ratio("ttl_jitter", self.ttl_jitter),
            "none_ttl": None
            if self.none_ttl is None
            else check_positive("none_ttl", self.none_ttl),
            "stale_ttl": check_non_negative("stale_ttl", self.stale_ttl),
            "early_refresh_beta": check_non_negative("early_refresh_beta", self.early_refresh_beta),
            "l1_maxsize": check_int("l1_maxsize (0 turns L1 off)", self.l1_maxsize, minimum=0),
            "l1_ttl": check_positive("l1_ttl", self.l1_ttl),
            "max_value_bytes": check_int("max_value_bytes", self.max_value_bytes, minimum=1),
            "announce_value_bytes": check_int(
                "announce_value_bytes", self.announce_value_bytes, minimum=1
            ),
            "version_ttl": check_positive("version_ttl", self.version_ttl),
            # Long enough for a shortened name: its digest and a readable head.
            "max_key_length": check_int("max_key_length", self.max_key_length, minimum=80),
            "max_fill_retries": check_int("max_fill_retries", self.max_fill_retries, minimum=0),
            "max_load_time": check_positive("max_load_time", self.max_load_time),
            "breaker_failures": check_int("breaker_failures", self.breaker_failures, minimum=1),
            "breaker_cooldown": check_positive("breaker_cooldown", self.breaker_cooldown),
            "cohort_limit": check_int(
                "cohort_limit (0 turns hand-overs off)", self.cohort_limit, minimum=0
            ),
            "confirm_replicas": None
            if self.confirm_replicas is None
            else check_int("confirm_replicas", self.confirm_replicas, minimum=0),
            "confirm_timeout": check_positive("confirm_timeout", self.confirm_timeout),
            "outage_ttl": check_non_negative("outage_ttl", self.outage_ttl),
            "stale_if_error": check_non_negative("stale_if_error", self.stale_if_error),
            "fallback_maxsize": check_int("fallback_maxsize", self.fallback_maxsize, minimum=1),
            "gutter_ttl": check_positive("gutter_ttl", self.gutter_ttl),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @property
    def lease_ms(self) -> int:
        return max(1, int(self.lease * 1000))

    @property
    def version_ttl_ms(self) -> int:
        return int(self.version_ttl * 1000)

    def kept_for(self, lifetime: float) -> float:
        """How long Redis keeps an entry of ``lifetime``: its life, the stale window,
        and for ``on_timeout="stale"`` one more lifetime, served only to readers
        whose wait for a fresh value timed out."""
        return lifetime + self.stale_ttl + (lifetime if self.on_timeout == "stale" else 0.0)


def client_options(connect_timeout: Seconds, socket_timeout: Seconds) -> dict[str, Any]:
    """redis-py client options of ``from_url`` (sync and asyncio alike): fail fast
    when Redis is down, and no retries of the client's own. A script whose reply was
    lost may have run, and running it again is not safe (a second hold, a false
    "lock lost"); connections broken while idle are replaced when taken from the pool.
    """
    return {
        "socket_connect_timeout": check_positive("connect_timeout", connect_timeout),
        "socket_timeout": check_positive("socket_timeout", socket_timeout),
        "retry": Retry(NoBackoff(), 0),
    }
