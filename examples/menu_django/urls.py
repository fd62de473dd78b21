"""``/menus/``, ``/menus/?owner=NAME``, ``/menus/<id>/`` (GET; POST, PUT or PATCH a
JSON object of the fields to change)."""

from __future__ import annotations

from django.urls import path

from .menus import views

urlpatterns = [
    path("menus/", views.menu_list_view),
    path("menus/<int:menu_id>/", views.menu_view),
]
