"""Package faces that import what they name on first use (PEP 562).

``import cacheguard`` should cost a few modules, not the whole tree: a face lists
which module defines each name it offers, and :func:`lazy_exports` gives it the
``__getattr__`` and ``__dir__`` that import that module when the name is first
asked for. Type checkers read the face's ``if TYPE_CHECKING:`` imports instead.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    namespace: dict[str, Any], exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the module whose ``globals()`` is ``namespace``;
    ``exports`` maps each name it offers to the module that defines it."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # the next lookup is a plain global, not this hook
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
