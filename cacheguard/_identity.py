"""Who is asking: a per-process id that changes across ``fork()``.

Lock owners are ``"<process id>:<thread ident>"``. The process id is random
rather than the pid, so two hosts (or a recycled pid) never share an owner, and
it is regenerated in a forked child, which must not inherit its parent's locks.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable

_process_id = uuid.uuid4().hex[:16]
_after_fork_hooks: list[Callable[[], None]] = []


def process_id() -> str:
    """The random id of this process (new in every forked child)."""
    return _process_id


def thread_owner() -> str:
    """The default lock owner: this process and the calling thread."""
    return f"{_process_id}:{threading.get_ident()}"


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
