"""Key names: distinct functions and distinct arguments never share an entry.

Default keys (no template) need a name stable across processes and unique to the
function; templates must be unambiguous. Most checks need only ``.key()`` (no
Redis); the decorated classes live at module level, as in an application, on a
guard that never connects."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from cacheguard import CacheGuard, CacheLoader, KeyTemplateError, cached_with_lock
from cacheguard.cache.templates import KeyBuilder, render_key
from tests.helpers import make_guard

# Decorating needs a guard; building key names never touches Redis.
OFFLINE = CacheGuard(redis.Redis(port=1), namespace="names")


def price(cls: str, tier: int) -> str:
    """A plain function whose first parameter happens to be named ``cls``."""
    return f"{cls}:{tier}"


def rate(self: str, amount: int) -> str:
    return f"{self}:{amount}"


@cached_with_lock(OFFLINE, ttl=60)
def cached_price(cls: str, tier: int) -> str:
    return f"{cls}:{tier}"


class Repo:
    @cached_with_lock(OFFLINE, ttl=60)
    def get(self, menu_id: int) -> str:
        return f"menu {menu_id}"

    @cached_with_lock(OFFLINE, ttl=60)
    @classmethod
    def by_class(cls, menu_id: int) -> str:
        return f"{cls.__name__} {menu_id}"

    @cached_with_lock(OFFLINE, ttl=60)
    @staticmethod
    def static(self: int) -> int:  # noqa: PLW0211 (a static method's first parameter is an argument)
        return self


class SubRepo(Repo):
    pass


def make_loader(kind: str) -> Any:
    def load(user_id: int) -> str:
        return f"{kind} {user_id}"

    return load


module_lambda = lambda x: x  # noqa: E731 (a lambda with no <locals> in its name)


class Plain:
    @classmethod
    def make(cls, x: int) -> str:
        return f"{cls.__name__}{x}"

    def fetch(self, x: int) -> int:
        return x


class SubPlain(Plain):
    pass


class Pricer:
    def __call__(self, tier: int) -> int:
        return tier


# -- default keys ------------------------------------------------------------------------


def test_functions_made_by_one_factory_are_refused_without_a_template() -> None:
    users, orders = make_loader("users"), make_loader("orders")
    with pytest.raises(KeyTemplateError, match="key template"):
        CacheLoader(OFFLINE, key=None, load=users, ttl=60)
    with pytest.raises(KeyTemplateError, match="inside a function"):
        cached_with_lock(OFFLINE, ttl=60)(orders)
    # With templates they are fine, and apart.
    users_loader = CacheLoader(OFFLINE, key="users:{user_id}", load=users, ttl=60)
    orders_loader = CacheLoader(OFFLINE, key="orders:{user_id}", load=orders, ttl=60)
    assert users_loader.key(1) != orders_loader.key(1)


def test_lambdas_partials_and_callable_objects_need_a_template() -> None:
    for load in (module_lambda, lambda x: x, functools.partial(price, "gold"), Pricer()):
        with pytest.raises(KeyTemplateError, match="key template"):
            CacheLoader(OFFLINE, key=None, load=load, ttl=60)


@pytest.mark.parametrize(
    "load", [functools.partial(price, "gold"), Pricer()], ids=["partial", "callable object"]
)
def test_partials_and_callable_objects_work_with_a_template(
    client: redis.Redis, namespace: str, load: Any
) -> None:
    guard = make_guard(client, namespace)
    loader = CacheLoader(guard, key="tier:{tier}", load=load, ttl=60)
    assert loader.key(3) == "tier:3"
    assert loader.get(3) == load(3)
    assert loader.peek(3) == load(3)


def test_a_plain_function_keeps_a_first_argument_named_cls_or_self(
    client: redis.Redis, namespace: str
) -> None:
    assert cached_price.key("gold", 1) != cached_price.key("silver", 1)
    guard = make_guard(client, namespace)
    prices = CacheLoader(guard, key=None, load=price, ttl=60)
    rates = CacheLoader(guard, key=None, load=rate, ttl=60)
    assert prices.get("gold", 1) == "gold:1"
    assert prices.get("silver", 1) == "silver:1"  # not the gold entry
    assert rates.get("a", 1) == "a:1"
    assert rates.get("b", 1) == "b:1"
    assert prices.key("gold", 1) == f"{__name__}.price(cls='gold',tier=1)"


def test_a_method_leaves_the_instance_out() -> None:
    one, two = Repo(), Repo()
    assert one.get.key(1) == two.get.key(1) == f"{__name__}.Repo.get(menu_id=1)"
    assert Repo.get.key(one, 1) == one.get.key(1)  # called through the class
    assert one.get.key(1) != one.get.key(2)
    assert Repo.static.key(1) != Repo.static.key(2)  # a static method has no instance


def test_a_classmethod_is_keyed_by_the_class_it_is_called_on() -> None:
    assert Repo.by_class.key(1) != SubRepo.by_class.key(1)
    assert SubRepo().by_class.key(1) == SubRepo.by_class.key(1)
    assert SubRepo.by_class.key(1).endswith(f"[{__name__}.SubRepo](menu_id=1)")


def test_bound_methods_as_loaders() -> None:
    by_base = CacheLoader(OFFLINE, key=None, load=Plain.make, ttl=60)
    by_sub = CacheLoader(OFFLINE, key=None, load=SubPlain.make, ttl=60)
    assert by_base.key(1) != by_sub.key(1)  # a bound classmethod: keyed by its class
    fetch = CacheLoader(OFFLINE, key=None, load=Plain().fetch, ttl=60)
    assert fetch.key(1) == f"{__name__}.Plain.fetch(x=1)"  # like a decorated method


def test_arguments_without_a_stable_form_are_refused() -> None:
    loader = CacheLoader(OFFLINE, key=None, load=price, ttl=60)
    with pytest.raises(KeyTemplateError, match="stable key form"):
        loader.key(object(), 1)


# -- templates ---------------------------------------------------------------------------


@pytest.mark.parametrize("template", ["{a}{b}", "x:{a}{b}:y", "{a.id}{b}"])
def test_adjacent_fields_are_refused(template: str) -> None:
    with pytest.raises(KeyTemplateError, match="nothing between them"):
        CacheLoader(OFFLINE, key=template, load=lambda a, b: 1, ttl=60)


@pytest.mark.parametrize("template", ["{a:>5}:{b}", "{a!r}:{b}", "{a!s}"])
def test_format_specs_and_conversions_are_refused(template: str) -> None:
    with pytest.raises(KeyTemplateError, match="format specs"):
        CacheLoader(OFFLINE, key=template, load=lambda a, b=0: 1, ttl=60)


def test_any_separator_keeps_fields_apart() -> None:
    pair = CacheLoader(OFFLINE, key="p:{a}-{b}", load=lambda a, b: 1, ttl=60)
    assert pair.key("1-2", "3") != pair.key("1", "2-3")
    assert pair.key("1", "2") == "p:1-2"  # plain values read as they are


TEMPLATES = ["p:{a}-{b}", "{a}.{b}x{c}", "{a}, {b}:{c}", "{a}é{b}"]
VALUES = st.text(alphabet="ab-.x, :é%#", max_size=6)


@given(
    st.sampled_from(TEMPLATES),
    st.tuples(VALUES, VALUES, VALUES),
    st.tuples(VALUES, VALUES, VALUES),
)
def test_distinct_arguments_never_share_a_name(
    template: str, first: tuple[str, str, str], second: tuple[str, str, str]
) -> None:
    names = ("a", "b", "c")
    one = render_key(template, dict(zip(names, first, strict=True)))
    two = render_key(template, dict(zip(names, second, strict=True)))
    used = [n for n in names if "{" + n + "}" in template]
    if [first[names.index(n)] for n in used] != [second[names.index(n)] for n in used]:
        assert one != two


def test_templates_with_one_field_keep_their_names() -> None:
    # Keys written before this release still match: nothing new is escaped.
    assert render_key("menu:{menu_id}", {"menu_id": 7}) == "menu:7"
    assert render_key("menu:{menu_id}", {"menu_id": "a:b"}) == "menu:a%3Ab"


# -- the fast binder agrees with inspect.Signature.bind ------------------------------------


def signature_sample(a: int, b: str = "x", *, c: float = 1.5, d: Any = None) -> None: ...


CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((1,), {}),
    ((1, "y"), {}),
    ((), {"a": 1}),
    ((1,), {"c": 2.0}),
    ((1, "y"), {"d": [1], "c": 0.5}),
    ((), {"b": "z", "a": 2}),
]


@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_fast_binding_matches_signature_bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    builder = KeyBuilder(signature_sample, None)
    bound = inspect.signature(signature_sample).bind(*args, **kwargs)
    bound.apply_defaults()
    assert builder.arguments(args, kwargs) == dict(bound.arguments)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((), {}), ((1, "y", 3.0), {}), ((1,), {"a": 2}), ((1,), {"nope": 1})],
)
def test_fast_binding_refuses_what_signature_bind_refuses(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    builder = KeyBuilder(signature_sample, None)
    with pytest.raises(TypeError, match="signature_sample"):
        builder.arguments(args, kwargs)


@given(VALUES, st.one_of(VALUES, st.integers()))
def test_the_shortcut_names_keys_like_the_template(a: str, b: Any) -> None:
    def pair(a: str, b: Any) -> None: ...

    builder = KeyBuilder(pair, "p:{a}-{b}", max_length=40)
    expected = render_key("p:{a}-{b}", {"a": a, "b": b}, max_length=40)
    assert builder.build((a, b), {}) == expected  # every argument by position
    assert builder.build((), {"b": b, "a": a}) == expected  # every argument by keyword
    assert builder.build((a,), {"b": b}) == expected  # mixed: the general path


def module_level_price(tier: Any, qty: Any) -> None: ...


def test_remembered_names_keep_equal_arguments_of_other_types_apart() -> None:
    for template in ("price:{tier}:{qty}", None):
        builder = KeyBuilder(module_level_price, template)
        # Equal as dict keys (1 == True == 1.0), but not always named alike.
        calls = [(1, 2), (True, 2), (1.0, 2), ("1", 2), (1, "2"), (1, 2), (True, 2)]
        for args in calls:
            assert builder.build(args, {}) == builder._build(args, {}), (template, args)
        assert builder.build((True, 2), {}) != builder.build((1, 2), {})


def test_remembered_names_stay_bounded() -> None:
    def one(n: int) -> None: ...

    builder = KeyBuilder(one, "n:{n}")
    for n in range(5000):
        assert builder.build((n,), {}) == f"n:{n}"
    assert len(builder._built) <= 1024
