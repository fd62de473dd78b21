"""Per-name objects that live only while someone uses them.

``registry.get("menu:7")`` returns the same object to every caller as long as
one of them still holds a reference; once none does, the object is collected
and the entry disappears. A million distinct keys touched once therefore leave
no million lock objects behind.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["WeakRegistry"]

T = TypeVar("T")


class WeakRegistry(Generic[T]):
    """Map a name to a shared object, holding it only weakly."""

    def __init__(self, create: Callable[[str], T]) -> None:
        self._create = create
        self._objects: weakref.WeakValueDictionary[str, T] = weakref.WeakValueDictionary()
        self._mutex = threading.Lock()

    def get(self, name: str) -> T:
        # Fast path without the mutex; a miss re-checks under it so two
        # threads never create two objects for one name.
        obj = self._objects.get(name)
        if obj is not None:
            return obj
        with self._mutex:
            obj = self._objects.get(name)
            if obj is None:
                obj = self._create(name)
                self._objects[name] = obj
            return obj

    def peek(self, name: str) -> T | None:
        """The object for ``name`` if someone uses it now; never creates one."""
        return self._objects.get(name)

    def __len__(self) -> int:
        return len(self._objects)

    def __contains__(self, name: object) -> bool:
        return name in self._objects
