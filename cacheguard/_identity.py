"""Who is asking: a per-process id that changes across ``fork()``, and lock holders.

Holds belong to *holders*, not to threads. A :class:`Holder` is numbered and
never reused, so a pool's next call (in a context of its own), a thread that got
a dead thread's ident, or a forked child can neither share nor inherit a hold.

Re-entry is expressed through the context (:mod:`contextvars`): a ``with`` block
or an acquisition that makes a new holder makes it the context's *ambient*
holder until its holds end, and a nested acquisition in the same context (or in
a copy of it: ``asyncio.to_thread``, AnyIO's worker threads, tasks created inside
the block) is that holder's again, so it re-enters. A new thread starts with an
empty context and so with no holder; a pool that copies the caller's context
into each call (AnyIO, ``asyncio.to_thread``) gives each call its own. A pool that
does not (``ThreadPoolExecutor.submit``, ``loop.run_in_executor``) runs all of a
worker's tasks in one context: a hold entered by one of its tasks and exited by
another is re-entered by a task on the entering thread in between; hand such holds
over by name (``holder=``, ``owner=``). The
process id is random rather than the pid, so two hosts (or a recycled pid) never
share an owner, and it is regenerated in a forked child.
"""

from __future__ import annotations

import itertools
import os
import threading
import uuid
from collections.abc import Callable
from contextvars import ContextVar

__all__ = [
    "Holder",
    "ambient_holder",
    "enter_holder",
    "leave_holder",
    "on_fork_in_child",
    "process_id",
    "thread_owner",
]

_process_id = uuid.uuid4().hex[:16]
_after_fork_hooks: list[Callable[[], None]] = []
_holder_numbers = itertools.count(1)
_uses_mutex = threading.Lock()


class Holder:
    """One holder of locks: numbered, never reused in this process.

    ``uses`` counts the holds (and ``with`` blocks) in progress for it; a holder
    with none is no context's ambient holder any more. Locks keep holders only
    weakly: a holder that nothing references (its thread ended, its ``with``
    block's frame is gone) has abandoned its holds."""

    __slots__ = ("__weakref__", "number", "uses")

    def __init__(self) -> None:
        self.number = next(_holder_numbers)
        self.uses = 0

    @property
    def owner(self) -> str:
        """This holder's owner id in a distributed lock."""
        return f"{_process_id}:h{self.number}"

    def __repr__(self) -> str:
        return f"<Holder {self.number} uses={self.uses}>"


_ambient: ContextVar[Holder | None] = ContextVar("cacheguard_holder", default=None)


def process_id() -> str:
    """The random id of this process (new in every forked child)."""
    return _process_id


def ambient_holder() -> Holder | None:
    """The holder whose holds this context is inside of, if any."""
    holder = _ambient.get()
    return holder if holder is not None and holder.uses > 0 else None


def enter_holder(holder: Holder | None = None) -> Holder:
    """The holder for a hold about to be taken, its use counted: ``holder`` if
    given, else the context's ambient holder, else a new one made ambient here."""
    if holder is not None and not isinstance(holder, Holder):
        raise TypeError(f"holder must be a cacheguard Holder, not {type(holder).__name__}")
    if holder is None:
        holder = ambient_holder()
        if holder is None:
            holder = Holder()
            _ambient.set(holder)
    with _uses_mutex:
        holder.uses += 1
    return holder


def leave_holder(holder: Holder) -> None:
    """One use of ``holder`` ended (from any thread or context)."""
    with _uses_mutex:
        holder.uses -= 1
        done = holder.uses <= 0
    if done and _ambient.get() is holder:
        _ambient.set(None)


def thread_owner() -> str:
    """The default owner of a store's lock taken without ``owner=``: the ambient
    holder's (re-entry within a context), else a new one, never reused."""
    holder = ambient_holder()
    return (holder or Holder()).owner


def on_fork_in_child(hook: Callable[[], None]) -> None:
    """Run ``hook`` in a forked child, after its process id was renewed."""
    _after_fork_hooks.append(hook)


def _renew_after_fork() -> None:
    global _process_id
    _process_id = uuid.uuid4().hex[:16]
    for hook in _after_fork_hooks:
        hook()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_after_fork)
