from __future__ import annotations

from django.apps import AppConfig


class DjangoAppConfig(AppConfig):
    name = "tests.django_app"
    label = "django_app"
    default_auto_field = "django.db.models.BigAutoField"
