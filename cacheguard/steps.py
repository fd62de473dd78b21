"""The waiting steps every sans-I/O flow yields (the lock's acquire, the cache's fill).

A flow asks its driver for I/O by yielding a step and gets the answer sent
back in; I/O errors are thrown in. Waiting is one idea with one name in every
flow, so the sync and asyncio drivers answer it one way:

* :class:`Subscribe`: register on the resource's release channel and wait up to
  ``timeout`` for Redis to confirm. Answer: ``True`` once confirmed (no message
  published after that point can be missed), ``False`` if not in time (the
  flow's timers then stand in for the messages).
* :class:`Wait`: sleep until a message arrives on that channel or ``seconds``
  pass. Answer: the raw payloads received since the last wait (a list of
  ``bytes``, empty after a timeout); each flow's wire module parses them.

The driver closes the subscription when the flow ends, however it ends.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Subscribe", "Wait"]


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Step: subscribe to the release channel, confirmed within ``timeout`` s."""

    timeout: float


@dataclass(frozen=True, slots=True)
class Wait:
    """Step: wait for messages or ``seconds``; answer ``list[bytes]``."""

    seconds: float
