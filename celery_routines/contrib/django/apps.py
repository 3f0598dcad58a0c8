"""The optional Django app: ``"celery_routines.contrib.django"`` in ``INSTALLED_APPS``."""

from __future__ import annotations

from django.apps import AppConfig


class RoutinesConfig(AppConfig):
    name = "celery_routines.contrib.django"
    label = "celery_routines"
    verbose_name = "Routines"
    default_auto_field = "django.db.models.BigAutoField"
