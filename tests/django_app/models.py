"""The menus of the docs, as Django models: owners, menus (one subclassed by
multi-table inheritance, one proxy) and dishes (deleted with their menu)."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import models
from django.utils import timezone


class Owner(models.Model):
    name = models.CharField(max_length=100)


def clear_deputy(collector: Any, field: Any, sub_objs: Any, using: str) -> None:
    """``on_delete`` as SET_NULL, but on the menus themselves (Django's own SET_NULL
    updates by query): the collector updates them by primary key."""
    collector.add_field_update(field, None, list(sub_objs))


class Menu(models.Model):
    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=100, unique=True, null=True, blank=True)
    owner = models.ForeignKey(
        Owner, null=True, blank=True, on_delete=models.SET_NULL, related_name="menus"
    )
    deputy = models.ForeignKey(
        Owner, null=True, blank=True, on_delete=clear_deputy, related_name="deputy_menus"
    )
    version = models.IntegerField(default=0)
    price = models.DecimalField(max_digits=8, decimal_places=2, default=0)
    created = models.DateTimeField(default=timezone.now)
    opens = models.TimeField(null=True, blank=True)  # no codec stores a time as it is
    tags = models.JSONField(default=list, blank=True)
    uid = models.UUIDField(default=uuid.uuid4)

    def __str__(self) -> str:
        return self.name


class SpecialMenu(Menu):
    """Multi-table inheritance: a row here and one in Menu's table."""

    chef = models.CharField(max_length=100, default="")


class MenuProxy(Menu):
    class Meta:
        proxy = True


class Dish(models.Model):
    menu = models.ForeignKey(Menu, on_delete=models.CASCADE, related_name="dishes")
    name = models.CharField(max_length=100)
