"""This process's Redlock rounds in flight and live holdings, per (lock key, owner).

A tidy-up after a lost reply releases a master's holding only when nothing in this
process counts on it; every Redlock of the process, sync or asyncio, records its
rounds and handles here. One record per process, emptied in a fork's child.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from cacheguard.redis.keys import ResourceKeys

__all__ = ["HeldOnMasters", "Holdings", "process_holdings", "reset_holdings_after_fork"]


class HeldOnMasters(Protocol):
    """What the record needs of a Redlock handle (sync or asyncio): whose holding,
    of which lock, and the epoch it has on each master that granted it."""

    owner: str

    @property
    def keys(self) -> ResourceKeys: ...

    @property
    def granted(self) -> Sequence[tuple[str, int]]: ...


class Holdings:
    """Per (lock key, owner): the rounds in flight and the per-master epochs of live
    handles in this process (sync and asyncio alike). A tidy-up must not release a
    holding that one of them counts on (an owner's holds on one master share its
    epoch)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._rounds: Counter[tuple[str, str]] = Counter()
        self._epochs: Counter[tuple[str, str, str, int]] = Counter()

    @contextmanager
    def round(self, lock_key: str, owner: str) -> Iterator[None]:
        with self._mutex:
            self._rounds[lock_key, owner] += 1
        try:
            yield
        finally:
            with self._mutex:
                self._rounds[lock_key, owner] -= 1
                if not self._rounds[lock_key, owner]:
                    del self._rounds[lock_key, owner]

    def add(self, handle: HeldOnMasters) -> None:
        with self._mutex:
            for address, epoch in handle.granted:
                self._epochs[handle.keys.lock, handle.owner, address, epoch] += 1

    def remove(self, handle: HeldOnMasters) -> None:
        with self._mutex:
            for address, epoch in handle.granted:
                entry = (handle.keys.lock, handle.owner, address, epoch)
                self._epochs[entry] -= 1
                if self._epochs[entry] <= 0:
                    del self._epochs[entry]

    def acquiring(self, lock_key: str, owner: str) -> bool:
        """Is an acquisition round of ``owner`` on this lock under way?"""
        with self._mutex:
            return (lock_key, owner) in self._rounds

    def counts_on(self, lock_key: str, owner: str, address: str, epoch: int) -> bool:
        """Does a live handle of ``owner`` hold this lock on that master with ``epoch``?"""
        with self._mutex:
            return (lock_key, owner, address, epoch) in self._epochs


_holdings = Holdings()


def process_holdings() -> Holdings:
    """This process's holdings (a fork's child starts with none)."""
    return _holdings


def reset_holdings_after_fork() -> None:
    global _holdings
    _holdings = Holdings()  # the child holds nothing
