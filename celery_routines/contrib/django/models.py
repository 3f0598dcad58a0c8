"""Unmanaged Django models over celery-routines' tables, for the admin to read.

Django never creates, migrates or writes these tables (``managed = False``,
and the admin writes nothing: every action goes through
:class:`celery_routines.operator.admin.Routines`). Our instants are stored
as naive UTC on every database; :class:`UTCDateTimeField` reads them back
as aware UTC, as Django expects with ``USE_TZ``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db import models


class UTCDateTimeField(models.DateTimeField):
    """A ``DateTimeField`` over a column holding naive UTC."""

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class Routine(models.Model):
    name = models.CharField(max_length=200, unique=True)
    task = models.CharField(max_length=255)
    cron = models.CharField(max_length=255, null=True)
    interval_seconds = models.FloatField(null=True)
    timezone = models.CharField(max_length=64, null=True)
    enabled = models.BooleanField()
    paused = models.BooleanField()
    next_run_at = UTCDateTimeField(null=True)
    suspended_until = UTCDateTimeField(null=True)
    suspended_reason = models.TextField(null=True)
    last_error = models.TextField(null=True)
    source = models.CharField(max_length=16, null=True)
    owner = models.CharField(max_length=200, null=True)
    retired_at = UTCDateTimeField(null=True)
    at = UTCDateTimeField(null=True)
    solar = models.CharField(max_length=100, null=True)
    rrule = models.TextField(null=True)
    starts_at = UTCDateTimeField(null=True)
    ends_at = UTCDateTimeField(null=True)
    args = models.TextField()
    kwargs = models.TextField()
    options = models.TextField()
    catch_up = models.CharField(max_length=16)
    overlap = models.CharField(max_length=16)

    class Meta:
        managed = False
        db_table = "routines"
        ordering = ("name",)

    def __str__(self) -> str:
        return self.name


class RoutineRun(models.Model):
    id = models.CharField(max_length=64, primary_key=True)
    routine = models.ForeignKey(
        Routine, on_delete=models.DO_NOTHING, db_constraint=False, related_name="runs"
    )
    idempotency_key = models.CharField(max_length=500)
    attempt = models.IntegerField()
    scheduled_for = UTCDateTimeField()
    state = models.CharField(max_length=16)
    reason = models.TextField(null=True)
    error = models.TextField(null=True)
    created_at = UTCDateTimeField()
    started_at = UTCDateTimeField(null=True)
    finished_at = UTCDateTimeField(null=True)
    skipped_count = models.IntegerField(null=True)

    class Meta:
        managed = False
        db_table = "routine_runs"
        ordering = ("-created_at",)
        verbose_name = "run"

    def __str__(self) -> str:
        return f"{self.idempotency_key} (attempt {self.attempt})"
