"""``cacheguard.locks.notifier``, kept so that code written for it keeps working:
the release notifier now lives in :mod:`cacheguard.redis.notifier`."""

from __future__ import annotations

from cacheguard.redis.notifier import (
    ClusterNotifier,
    Notifier,
    Subscription,
    close_notifier_of,
    notifier_for,
)

__all__ = [
    "ClusterNotifier",
    "Notifier",
    "Subscription",
    "close_notifier_of",
    "notifier_for",
]
