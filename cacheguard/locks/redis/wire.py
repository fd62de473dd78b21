"""The lock scripts on the wire: every call's KEYS and ARGV, every reply's meaning.

Pure functions, no I/O. A builder returns a :data:`ScriptCall` (script, KEYS,
ARGV) in the order the script's contract comment in :mod:`cacheguard.locks.redis.lua`
states; a parser turns a reply into a value. The sync driver, the asyncio driver
and both watchdogs build and read every lock call here, so no ARGV list is
spelled out twice.

==============  ====================================  ===========================
builder         KEYS                                  ARGV
==============  ====================================  ===========================
acquire_call    lock hash, fence                      owner, mode, lease ms,
                                                      mark ms, release channel
release_call    lock hash                             owner, mode, epoch,
                                                      release channel
renew_call      lock hash                             owner, epoch, lease ms
withdraw_call   lock hash                             owner, release channel
==============  ====================================  ===========================
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

from cacheguard.locks.protocol import Attempt, Mode
from cacheguard.locks.redis.lua import ACQUIRE, RELEASE, RENEW, WITHDRAW
from cacheguard.redis.keys import ResourceKeys
from cacheguard.redis.scripts import ScriptCall

__all__ = [
    "Renewal",
    "acquire_call",
    "parse_attempt",
    "parse_release",
    "parse_renewal",
    "release_call",
    "renew_call",
    "undo_attempt_call",
    "withdraw_call",
]


def acquire_call(
    keys: ResourceKeys, owner: str, mode: Mode, *, lease_ms: int, mark_ms: int
) -> ScriptCall:
    """Take ``mode`` for ``owner``; a busy writer leaves a mark for ``mark_ms`` (0: a
    one-shot try that leaves none). See ``ACQUIRE_CONTRACT``."""
    return (
        ACQUIRE,
        [keys.lock, keys.fence],
        [owner, mode, lease_ms, mark_ms, keys.released_channel],
    )


def release_call(keys: ResourceKeys, owner: str, mode: Mode, epoch: int) -> ScriptCall:
    """Drop one ``mode`` hold of ``owner`` granted at ``epoch``. See ``RELEASE_CONTRACT``."""
    return (RELEASE, [keys.lock], [owner, mode, epoch, keys.released_channel])


def renew_call(keys: ResourceKeys, owner: str, epoch: int, lease_ms: int) -> ScriptCall:
    """Extend the lease of ``owner``'s holding of ``epoch``. See ``RENEW_CONTRACT``."""
    return (RENEW, [keys.lock], [owner, epoch, lease_ms])


def withdraw_call(keys: ResourceKeys, owner: str) -> ScriptCall:
    """Remove ``owner``'s waiting writer's mark. See ``WITHDRAW_CONTRACT``."""
    return (WITHDRAW, [keys.lock], [owner, keys.released_channel])


def undo_attempt_call(
    keys: ResourceKeys, owner: str, mode: Mode, attempt: Attempt, *, queued: bool
) -> ScriptCall | None:
    """The call that takes back what an acquire attempt did, for a caller that gave up
    during its round trip: release a granted hold, or withdraw the mark a refused
    queued writer left; ``None`` when the attempt left nothing behind."""
    if attempt.granted:
        return release_call(keys, owner, mode, attempt.epoch)
    if mode == "write" and queued and not attempt.upgrade:
        return withdraw_call(keys, owner)
    return None


def parse_attempt(reply: Sequence[Any]) -> Attempt:
    """The acquire script's ``{status, value}`` reply as an :class:`Attempt`:
    ``{1, epoch}`` granted (the epoch a decimal string), ``{0, ms}`` busy for about
    ``ms`` more, ``{-1, 0}`` an upgrade refused."""
    try:
        status, value = (int(part) for part in reply)
    except (TypeError, ValueError):
        raise ValueError(f"unexpected acquire reply {reply!r}") from None
    if status == 1:
        return Attempt(granted=True, epoch=value)
    if status == -1:
        return Attempt(granted=False, upgrade=True)
    if status == 0:
        return Attempt(granted=False, retry_in=max(value, 0) / 1000.0)
    raise ValueError(f"unexpected acquire reply {reply!r}")


class Renewal(enum.IntEnum):
    """What the renew script answered."""

    GONE = 0  # the holding is gone (never re-created)
    RENEWED = 1
    RENEWED_WRITER_WAITS = 2  # renewed, and a writer of another owner waits


def parse_renewal(reply: Any) -> Renewal:
    """The renew script's integer reply as a :class:`Renewal`."""
    try:
        return Renewal(int(reply))
    except (TypeError, ValueError):
        raise ValueError(f"unexpected renew reply {reply!r}") from None


def parse_release(reply: Any) -> bool:
    """The release script's reply: ``True`` released, ``False`` the holding was gone."""
    if isinstance(reply, bool) or reply not in (0, 1):
        raise ValueError(f"unexpected release reply {reply!r}")
    return bool(reply == 1)
