"""Cache key names from function arguments.

**Templates.** ``key="menu:{menu_id}"`` names the function's parameters (``{m.id}``
reads an attribute). Every template is unambiguous: no two argument tuples give
one name. Substituted values are percent-encoded for ``%``, ``:``, ``#`` and the
first character of every separator between two fields, so ``"{a}-{b}"`` keeps
``("1-2", "3")`` and ``("1", "2-3")`` apart; templates with two fields and
nothing between them (``"{a}{b}"``), format specs (``{a:>5}``, which pad) and
conversions (``{a!r}``) are refused with :class:`KeyTemplateError`.

**Default keys** (no template): the function's module and qualified name plus a
canonical rendering of its arguments. That needs a name that is stable across
processes and unique to the function, so closures, lambdas, ``functools.partial``
and callable objects are refused (give a template). ``self`` is left out only for
methods (a decorated function placed in a class); a classmethod's key names the
class it was called on.

Names longer than ``max_length`` keep a readable prefix and end in a SHA-256
digest of the whole name, so Redis keys stay short and distinct.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

from cacheguard.exceptions import KeyTemplateError
from cacheguard.redis.keys import shorten

__all__ = [
    "CACHE_KEYS_ATTRIBUTE",
    "Binding",
    "KeyBuilder",
    "literal_prefix",
    "model_templates",
    "render_key",
    "template_fields",
]

# A model class may name its own keys' templates here, for the ORM trackers
# (SQLAlchemy's and Django's ``track_models``) given a list of models.
CACHE_KEYS_ATTRIBUTE = "__cache_keys__"


# '#' too: it marks shortened names, which arguments must not be able to spell.
_ALWAYS_ESCAPED = "%:#"
_VALUE_ESCAPES = str.maketrans({c: f"%{ord(c):02X}" for c in _ALWAYS_ESCAPED})
_PLAIN = (str, int, float, bool, type(None))

Binding = Literal["function", "method", "classmethod"]

_BUILT_NAMES = 1024  # names remembered per function (calls by position, ints and strs)


def _percent(char: str) -> str:
    return "".join(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))


class _Template:
    """A parsed, checked template: literal parts, fields, and its escape table."""

    __slots__ = ("escapes", "fields", "parts", "roots", "text")

    def __init__(self, text: str) -> None:
        if not isinstance(text, str) or not text:
            raise KeyTemplateError("a key template must be a non-empty string")
        try:
            parsed = list(string.Formatter().parse(text))
        except ValueError as exc:
            raise KeyTemplateError(f"bad key template {text!r}: {exc}") from exc
        self.text = text
        parts: list[tuple[str, str | None]] = []
        separators: list[str] = []
        previous_was_field = False
        for literal, field, spec, conversion in parsed:
            if previous_was_field:
                if not literal:
                    raise KeyTemplateError(
                        f"key template {text!r} has two fields with nothing between them: "
                        "('1', '23') and ('12', '3') would share a key; put a separator "
                        "between them, e.g. '{a}:{b}'"
                    )
                separators.append(literal)
            if field is None:
                parts.append((literal, None))
                previous_was_field = False
                continue
            if spec or conversion:
                raise KeyTemplateError(
                    f"key template {text!r}: format specs and conversions ({{{field}"
                    f"{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}})"
                    " can make two values render alike; format the value in the function"
                )
            root = field.split(".", 1)[0].split("[", 1)[0]
            if not root or root.isdigit():
                raise KeyTemplateError(f"key template {text!r} must name fields, not positions")
            parts.append((literal, field))
            previous_was_field = True
        self.parts = tuple(parts)
        self.fields = tuple(f for _, f in parts if f is not None)
        self.roots = tuple(f.split(".", 1)[0].split("[", 1)[0] for f in self.fields)
        # A value must not contain the first character of the separator after it, or
        # where it ends would be ambiguous.
        escaped = set(_ALWAYS_ESCAPED) | {sep[0] for sep in separators}
        self.escapes = str.maketrans({c: _percent(c) for c in sorted(escaped)})

    def render(self, values: Mapping[str, Any], max_length: int) -> str:
        pieces: list[str] = []
        escapes = self.escapes
        try:
            for literal, field in self.parts:
                pieces.append(literal)
                if field is None:
                    continue
                if field in values:  # a plain parameter name: the common case
                    value = values[field]
                else:
                    value, _ = _FIELDS.get_field(field, (), values)
                pieces.append(format(value, "").translate(escapes))
        except (AttributeError, KeyError, IndexError, TypeError, ValueError) as exc:
            raise KeyTemplateError(f"cannot fill key template {self.text!r}: {exc}") from exc
        return shorten("".join(pieces), max_length)


_FIELDS = string.Formatter()


@functools.lru_cache(maxsize=1024)
def _template(text: str) -> _Template:
    return _Template(text)


def literal_prefix(template: str) -> str:
    """The text of ``template`` before its first field (every name it renders starts
    with it: the ORM trackers invalidate by it when they cannot name each key)."""
    prefix = []
    for literal, field_name, _, _ in string.Formatter().parse(template):
        prefix.append(literal)
        if field_name is not None:
            break
    return "".join(prefix)


def model_templates(
    models: Mapping[type[Any], Sequence[str]] | Iterable[type[Any]],
) -> list[tuple[type[Any], Sequence[str]]]:
    """The ``(model, templates)`` pairs an ORM tracker is given: a mapping, or models
    that name their templates in ``__cache_keys__``. Checking each pair is the
    tracker's own (what a model is differs per ORM)."""
    if isinstance(models, Mapping):
        pairs = list(models.items())
    else:
        pairs = []
        for model in models:
            templates = getattr(model, CACHE_KEYS_ATTRIBUTE, None)
            if templates is None:
                raise KeyTemplateError(
                    f"{getattr(model, '__name__', model)!r} has no {CACHE_KEYS_ATTRIBUTE} "
                    "attribute; pass {Model: (templates...)} instead"
                )
            pairs.append((model, templates))
    if not pairs:
        raise ValueError("track_models needs at least one model")
    return pairs


def template_fields(template: str) -> list[str]:
    """The root names a key template substitutes (``"menu:{m.id}"`` -> ``["m"]``);
    :class:`KeyTemplateError` for a template that is malformed or ambiguous."""
    if not isinstance(template, str):
        raise KeyTemplateError("a key template must be a non-empty string")
    return list(_template(template).roots)


def render_key(template: str, values: Mapping[str, Any], *, max_length: int = 200) -> str:
    """The key name ``template`` gives for ``values``: substituted values escaped,
    long names shortened. Decorators and the SQLAlchemy hooks both build names
    here, so ``"menu:{menu_id}"`` with ``menu_id=3`` and ``"menu:{id}"`` with a
    row whose ``id`` is 3 name the same key."""
    if not isinstance(template, str):
        raise KeyTemplateError("a key template must be a non-empty string")
    return _template(template).render(values, max_length)


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


def describe(func: Callable[..., Any]) -> str:
    """A readable name of ``func`` for messages (any callable)."""
    name = getattr(func, "__qualname__", None)
    if isinstance(name, str):
        return f"{getattr(func, '__module__', '?')}.{name}"
    if isinstance(func, functools.partial):
        return f"functools.partial({describe(func.func)})"
    return repr(func)


def stable_name(func: Callable[..., Any]) -> str:
    """The name a default key uses: module plus qualified name, the same in every
    process and different for every function; :class:`KeyTemplateError` where no
    such name exists."""
    target: Any = func
    suffix = ""
    if inspect.ismethod(func):
        target = func.__func__
        owner = func.__self__
        if isinstance(owner, type):  # a classmethod bound to its class: key by the class
            suffix = f"[{stable_type_name(owner)}]"
    why = ""
    if isinstance(target, functools.partial):
        why = "a functools.partial"
    elif not inspect.isfunction(target):
        why = f"a {type(target).__name__} object, not a function"
    elif target.__name__ == "<lambda>":
        why = "a lambda"
    elif "<locals>" in target.__qualname__:
        why = "defined inside a function (a closure: two made by one factory share a name)"
    if why:
        raise KeyTemplateError(
            f"{describe(func)} is {why}, so it has no name that is stable across processes "
            "and unique to it; give a key template (key='name:{param}')"
        )
    return f"{target.__module__}.{target.__qualname__}{suffix}"


def stable_type_name(cls: type) -> str:
    if "<locals>" in cls.__qualname__:
        raise KeyTemplateError(
            f"class {cls.__qualname__} is defined inside a function, so a default key "
            "cannot name it; give a key template"
        )
    return f"{cls.__module__}.{cls.__qualname__}"


class KeyBuilder:
    """Builds the cache key name of one call of ``func``.

    ``binding`` says how the first argument counts in a default key: ``"function"``
    (like any other), ``"method"`` (the instance: left out), ``"classmethod"`` (the
    class: by its qualified name). Decorators set it once Python places them in a
    class (:meth:`bind_as`).
    """

    def __init__(
        self,
        func: Callable[..., Any],
        template: str | None,
        *,
        max_length: int = 200,
    ) -> None:
        try:
            self._signature = inspect.signature(func)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"cannot read the signature of {describe(func)}: {exc}") from exc
        self.template = template
        self.max_length = max_length
        self.binding: Binding = "function"
        self._describe = describe(func)
        params = list(self._signature.parameters.values())
        self._names = tuple(p.name for p in params)
        if template is not None:
            self._template: _Template | None = _template(template)
            for root in self._template.roots:
                if root not in self._names:
                    raise KeyTemplateError(
                        f"key template {template!r} names {root!r}, which is not a parameter "
                        f"(parameters: {', '.join(sorted(self._names)) or 'none'})"
                    )
            self._prefix = self._describe
        else:
            self._template = None
            self._prefix = stable_name(func)
        # What the events of these keys are labelled by (metrics): the template, or
        # the function's stable name. Bounded, unlike the names built from arguments.
        self.label = template if template is not None else self._prefix
        # The hit path's shortcut: a template of plain parameter names, called with
        # every parameter by position (or every one by keyword), renders straight
        # from the arguments, with no dict and no binding.
        self._plan: tuple[tuple[str, int], ...] | None = None
        self._built: dict[tuple[Any, ...], str] = {}
        if self._template is not None and all(f in self._names for f in self._template.fields):
            self._plan = tuple(
                (literal, -1 if field is None else self._names.index(field))
                for literal, field in self._template.parts
            )
        # The fast binder covers plain parameters (no *args, **kwargs, positional-only);
        # anything else, and every call it cannot bind, goes to Signature.bind.
        kinds = {p.kind for p in params}
        self._simple = kinds <= {
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        }
        self._positional = sum(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
        self._defaults = tuple(
            (p.name, p.default) for p in params if p.default is not inspect.Parameter.empty
        )

    def bind_as(self, binding: Binding) -> None:
        self.binding = binding
        self._built.clear()

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by parameter name, defaults applied."""
        if self._simple and len(args) <= self._positional:
            values = dict(zip(self._names, args, strict=False))
            if kwargs:
                for name, value in kwargs.items():
                    if name in values or name not in self._names:
                        return self._bind_slowly(args, kwargs)  # raises the right TypeError
                    values[name] = value
            if len(values) < len(self._names):
                for name, default in self._defaults:
                    if name not in values:
                        values[name] = default
                if len(values) < len(self._names):
                    return self._bind_slowly(args, kwargs)  # a required one is missing
            return values
        return self._bind_slowly(args, kwargs)

    def _bind_slowly(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self._describe}: {exc}") from None
        bound.apply_defaults()
        return dict(bound.arguments)

    def build(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if not kwargs:
            # The hit path: a call by position with ints and strs (exact types: a
            # bool equals an int as a dict key, a str subclass may render otherwise)
            # names the same key every time, so its name is remembered.
            for arg in args:
                if arg.__class__ is not int and arg.__class__ is not str:
                    break
            else:
                name = self._built.get(args)
                if name is None:
                    name = self._build(args, kwargs)
                    if len(self._built) >= _BUILT_NAMES:
                        self._built.clear()  # bounded: a new batch of hot keys refills it
                    self._built[args] = name
                return name
        return self._build(args, kwargs)

    def _build(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        plan = self._plan
        if plan is not None and self._simple:
            ordered: Any = None
            if not kwargs:
                if len(args) == len(self._names):
                    ordered = args
            elif not args and len(kwargs) == len(self._names):
                # An unknown keyword: the slow path below raises the right TypeError.
                with contextlib.suppress(KeyError):
                    ordered = [kwargs[n] for n in self._names]
            if ordered is not None:
                escapes = self._template.escapes  # type: ignore[union-attr]
                try:
                    name = "".join(
                        [
                            literal
                            if index < 0
                            else literal + format(ordered[index], "").translate(escapes)
                            for literal, index in plan
                        ]
                    )
                except (TypeError, ValueError) as exc:
                    raise KeyTemplateError(
                        f"cannot fill key template {self.template!r}: {exc}"
                    ) from exc
                return name if len(name) <= self.max_length else shorten(name, self.max_length)
        values = self.arguments(args, kwargs)
        if self._template is not None:
            return self._template.render(values, self.max_length)
        names = self._names
        prefix = self._prefix
        if self.binding != "function" and names:
            first = values[names[0]]
            names = names[1:]
            if self.binding == "classmethod":
                prefix = f"{prefix}[{stable_type_name(first)}]"
        rendered = ",".join(
            f"{name}={_canonical(values[name], name).translate(_VALUE_ESCAPES)}" for name in names
        )
        return shorten(f"{prefix}({rendered})", self.max_length)
