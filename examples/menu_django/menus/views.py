"""JSON views: reads through the cache, writes through the ORM (tracked: no cache call).

| request | answer |
|---|---|
| ``GET /menus/`` | every menu (cached as ``menu:list``) |
| ``GET /menus/?owner=NAME`` | the owner's menus (``menu:owner:NAME``) |
| ``GET /menus/<id>/`` | one menu (``menu:<id>``), 404 if none |
| ``POST``/``PUT``/``PATCH /menus/<id>/`` | a JSON object of some of ``name``, |
| | ``price``, ``owner``: the menu, changed |

A bad body answers 400 with ``{"detail": ...}``; another method 405.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse

from .models import EDITABLE, Menu
from .reads import menu_detail, menu_list, menus_of

_LIMITS = {"name": 100, "owner": 50}


def _error(status: int, detail: str) -> JsonResponse:
    return JsonResponse({"detail": detail}, status=status)


def _not_allowed(allowed: str) -> HttpResponse:
    response = _error(405, f"method not allowed (allowed: {allowed})")
    response["Allow"] = allowed
    return response


def menu_list_view(request: HttpRequest) -> HttpResponse:
    if request.method != "GET":
        return _not_allowed("GET")
    owner = request.GET.get("owner")
    if owner is not None:
        return JsonResponse({"menus": [menu.to_dict() for menu in menus_of(owner)]})
    return JsonResponse({"menus": menu_list()})


def menu_view(request: HttpRequest, menu_id: int) -> HttpResponse:
    if request.method == "GET":
        menu = menu_detail(menu_id)
        if menu is None:
            return _error(404, f"no menu {menu_id}")
        return JsonResponse(menu.to_dict())
    if request.method in ("POST", "PUT", "PATCH"):
        return _update(request, menu_id)
    return _not_allowed("GET, POST, PUT, PATCH")


def _update(request: HttpRequest, menu_id: int) -> HttpResponse:
    try:
        changes = _changes(request.body)
    except ValueError as exc:
        return _error(400, str(exc))
    # A plain ORM write: the hooks of track_models lock and invalidate the row's keys
    # (its owner's list under the old owner and the new) around the commit.
    with transaction.atomic():
        menu = Menu.objects.select_for_update().filter(pk=menu_id).first()
        if menu is None:
            return _error(404, f"no menu {menu_id}")
        for field, value in changes.items():
            setattr(menu, field, value)
        menu.save()
    return JsonResponse(menu.to_dict())


def _changes(body: bytes) -> dict[str, Any]:
    """The fields to change, checked: a JSON object of ``name``, ``price``, ``owner``."""
    try:
        data = json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError):
        raise ValueError("the body is not JSON") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"expected a JSON object of some of {', '.join(EDITABLE)}")
    unknown = sorted(set(data) - set(EDITABLE))
    if unknown:
        raise ValueError(f"unknown field(s): {', '.join(unknown)}")
    for field in ("name", "owner"):
        if field in data:
            value = data[field]
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{field} must be a non-blank string")
            if len(value) > _LIMITS[field]:
                raise ValueError(f"{field} is longer than {_LIMITS[field]} characters")
    if "price" in data:
        price = data["price"]
        if isinstance(price, bool) or not isinstance(price, int) or not 0 <= price < 2**31:
            raise ValueError("price must be a whole number of cents, 0 or more")
    return dict(data)
