"""The pub/sub wire of the notifiers, sans I/O: what subscribes a channel, and
what a reply pushed on a subscriber connection means.

Two kinds of channel:

* **sharded** (``SSUBSCRIBE`` / ``SPUBLISH``, Redis 7): a resource's release
  channel. Its messages stay within the shard that owns the channel's slot (the
  same slot as the resource's keys), so a Redis Cluster does not broadcast every
  wake-up to every node, and a subscriber must talk to that shard. A cluster
  refuses one ``SSUBSCRIBE`` for channels of several slots, so each is sent alone.
  When the slot leaves the node (a failover demoted it, or the slot migrated),
  the server *revokes* the subscription with an ``sunsubscribe`` nobody asked for.
* **broadcast** (``SUBSCRIBE`` / ``PUBLISH``): the namespace-wide L1 channel,
  which a cluster forwards to every node, so any node will do.

Both notifiers (:mod:`cacheguard.redis.notifier`, :mod:`cacheguard.redis.async_notifier`)
send what :func:`subscribe_commands` builds and feed every reply to
:func:`parse_push` and :class:`Confirmations`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, TypeVar

__all__ = [
    "Confirmations",
    "Push",
    "parse_push",
    "subscribe_commands",
    "unsubscribe_commands",
]

_SUBSCRIBE: Final = {False: "SUBSCRIBE", True: "SSUBSCRIBE"}
_UNSUBSCRIBE: Final = {False: "UNSUBSCRIBE", True: "SUNSUBSCRIBE"}
# The reply each command is confirmed by.
_CONFIRMED_BY: Final = {
    "SUBSCRIBE": "subscribe",
    "SSUBSCRIBE": "ssubscribe",
    "UNSUBSCRIBE": "unsubscribe",
    "SUNSUBSCRIBE": "sunsubscribe",
}


def subscribe_commands(channels: Iterable[tuple[str, bool]]) -> list[tuple[str, ...]]:
    """The commands that subscribe ``(name, sharded)`` channels: broadcast ones in
    one command, sharded ones one command each."""
    return _commands(channels, _SUBSCRIBE)


def unsubscribe_commands(channels: Iterable[tuple[str, bool]]) -> list[tuple[str, ...]]:
    """The commands that unsubscribe ``(name, sharded)`` channels."""
    return _commands(channels, _UNSUBSCRIBE)


def _commands(
    channels: Iterable[tuple[str, bool]], verbs: dict[bool, str]
) -> list[tuple[str, ...]]:
    listed = list(channels)
    broadcast = [name for name, sharded in listed if not sharded]
    sharded = [name for name, is_sharded in listed if is_sharded]
    commands = [(verbs[False], *broadcast)] if broadcast else []
    commands.extend((verbs[True], name) for name in sharded)
    return commands


PushKind = Literal["message", "subscribed", "unsubscribed"]


@dataclass(frozen=True, slots=True)
class Push:
    """A reply on a subscriber connection: a message on ``channel`` (``payload``),
    or the server's confirmation of a (un)subscription as ``reply``."""

    kind: PushKind
    channel: str
    reply: str
    payload: bytes


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def parse_push(message: Any) -> Push | None:
    """What a reply read from a subscriber connection is; None for anything else
    (a PONG, a pattern message we never asked for)."""
    if not isinstance(message, list) or len(message) < 3:
        return None
    reply = _text(message[0])
    if reply in ("message", "smessage"):
        payload = message[2]
        if isinstance(payload, str):
            payload = payload.encode()
        if not isinstance(payload, bytes):
            return None
        return Push("message", _text(message[1]), reply, payload)
    if reply in ("subscribe", "ssubscribe"):
        return Push("subscribed", _text(message[1]), reply, b"")
    if reply in ("unsubscribe", "sunsubscribe"):
        return Push("unsubscribed", _text(message[1]), reply, b"")
    return None


C = TypeVar("C")


class Confirmations(Generic[C]):
    """The confirmations a connection owes, in the order the commands were sent.

    :meth:`sent` records a command; :meth:`settle` matches a confirmation pushed
    by the server. A confirmation that matches the oldest one owed settles it and
    hands back what was recorded with it (the channel object to mark confirmed).
    An ``sunsubscribe`` owed to nobody is the server revoking a sharded channel
    whose slot left the node: :meth:`settle` says ``"revoked"``.
    """

    __slots__ = ("_owed",)

    def __init__(self) -> None:
        self._owed: deque[tuple[str, str, C | None]] = deque()

    def sent(self, command: tuple[str, ...], channels: dict[str, C] | None = None) -> None:
        """Record ``command`` (as built above); ``channels`` maps its channel names to
        what :meth:`settle` should hand back for them."""
        reply = _CONFIRMED_BY[command[0]]
        for name in command[1:]:
            self._owed.append((reply, name, None if channels is None else channels.get(name)))

    def settle(self, push: Push) -> tuple[Literal["settled", "revoked", "unexpected"], C | None]:
        owed = self._owed
        if owed and owed[0][0] == push.reply and owed[0][1] == push.channel:
            return "settled", owed.popleft()[2]
        if push.reply == "sunsubscribe":
            return "revoked", None
        return "unexpected", None

    def clear(self) -> None:
        self._owed.clear()

    def __len__(self) -> int:
        return len(self._owed)
