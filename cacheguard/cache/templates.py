"""Cache key names from function arguments.

``key="menu:{menu_id}"`` names the function's parameters. Each substituted value
is escaped (``%``, ``:`` and ``#`` percent-encoded), so arguments can never forge a key:
``a="1:2", b="3"`` and ``a="1", b="2:3"`` give different names for
``"{a}:{b}"``. Without a template the name is the function's qualified name plus
a canonical rendering of its arguments (``self``/``cls`` left out).

Names longer than ``max_length`` keep a readable prefix and end in a SHA-256
digest of the whole name, so Redis keys stay short and distinct.
"""

from __future__ import annotations

import hashlib
import inspect
import string
from collections.abc import Callable, Mapping
from typing import Any

from cacheguard.exceptions import KeyTemplateError

__all__ = ["KeyBuilder", "render_key", "shorten", "template_fields"]

# '#' too: it marks shortened names, which arguments must not be able to spell.
_VALUE_ESCAPES = str.maketrans({"%": "%25", ":": "%3A", "#": "%23"})
_PLAIN = (str, int, float, bool, type(None))


def shorten(name: str, max_length: int) -> str:
    """``name`` itself, or a prefix plus a digest when longer than ``max_length``."""
    if len(name) <= max_length:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    keep = max(max_length - len(digest) - 1, 0)
    return f"{name[:keep]}#{digest}"


class _EscapingFormatter(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        return str(super().format_field(value, format_spec)).translate(_VALUE_ESCAPES)


_FORMATTER = _EscapingFormatter()


def template_fields(template: str) -> list[str]:
    """The root names a key template substitutes (``"menu:{m.id}"`` -> ``["m"]``)."""
    if not isinstance(template, str) or not template:
        raise KeyTemplateError("a key template must be a non-empty string")
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise KeyTemplateError(f"bad key template {template!r}: {exc}") from exc
    roots = []
    for field in fields:
        root = field.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise KeyTemplateError(f"key template {template!r} must name fields, not positions")
        roots.append(root)
    return roots


def render_key(template: str, values: Mapping[str, Any], *, max_length: int = 200) -> str:
    """The key name ``template`` gives for ``values``: substituted values escaped,
    long names shortened. Decorators and the SQLAlchemy hooks both build names
    here, so ``"menu:{menu_id}"`` with ``menu_id=3`` and ``"menu:{id}"`` with a
    row whose ``id`` is 3 name the same key."""
    try:
        name = _FORMATTER.vformat(template, (), values)
    except (AttributeError, KeyError, IndexError, ValueError) as exc:
        raise KeyTemplateError(f"cannot fill key template {template!r}: {exc}") from exc
    return shorten(name, max_length)


def _canonical(value: Any, where: str) -> str:
    if isinstance(value, _PLAIN):
        return repr(value)
    if isinstance(value, (list, tuple)):
        inner = ",".join(_canonical(v, where) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, Mapping):
        items = sorted((_canonical(k, where), _canonical(v, where)) for k, v in value.items())
        return "{" + ",".join(f"{k}:{v}" for k, v in items) + "}"
    raise KeyTemplateError(
        f"argument {where} of type {type(value).__name__} has no stable key form; "
        "name the key with a template (key='...{param}...')"
    )


class KeyBuilder:
    """Builds the cache key name of one call of ``func``."""

    def __init__(
        self,
        func: Callable[..., Any],
        template: str | None,
        *,
        max_length: int = 200,
    ) -> None:
        self._signature = inspect.signature(func)
        self.template = template
        self.max_length = max_length
        params = list(self._signature.parameters)
        self._skip_first = bool(params) and params[0] in ("self", "cls")
        self._prefix = f"{func.__module__}.{func.__qualname__}"
        if template is not None:
            self._check_template(template, set(params))

    @staticmethod
    def _check_template(template: str, params: set[str]) -> None:
        for root in template_fields(template):
            if root not in params:
                raise KeyTemplateError(
                    f"key template {template!r} names {root!r}, which is not a parameter "
                    f"(parameters: {', '.join(sorted(params)) or 'none'})"
                )

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self._prefix}: {exc}") from None
        bound.apply_defaults()
        return dict(bound.arguments)

    def build(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        arguments = self.arguments(args, kwargs)
        if self.template is not None:
            return render_key(self.template, arguments, max_length=self.max_length)
        items = list(arguments.items())
        if self._skip_first:
            items = items[1:]
        rendered = ",".join(f"{k}={_canonical(v, k).translate(_VALUE_ESCAPES)}" for k, v in items)
        return shorten(f"{self._prefix}({rendered})", self.max_length)
