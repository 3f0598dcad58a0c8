"""Plain, immutable views of stored rows handed from the store to the engine."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..policy.runs import NewRun

__all__ = ["DueRetry", "NewRun", "OpenRun", "RoutineRecord", "RunRecord"]


@dataclass(frozen=True)
class RoutineRecord:
    id: int
    name: str
    task: str
    cron: str | None
    interval_seconds: float | None
    timezone: str | None
    enabled: bool
    args: str
    kwargs: str
    options: str
    catch_up: str
    catch_up_cap: int
    max_lateness: float | None
    overlap: str
    max_retries: int
    retry_base_seconds: float
    ceiling: str | None
    next_run_at: datetime | None
    paused: bool
    suspended_until: datetime | None
    suspended_reason: str | None
    last_error: str | None
    locked_by: str | None
    locked_until: datetime | None
    source: str | None = None
    owner: str | None = None
    retired_at: datetime | None = None
    schedule_fingerprint: str | None = None
    # True when cron, interval_seconds, timezone or enabled changed since
    # next_run_at was computed (compared by the database, see store/routines.py).
    schedule_changed: bool = False
    run_timeout: float | None = None
    at: datetime | None = None
    solar: str | None = None
    rrule: str | None = None
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    jitter_seconds: int | None = None
    # Calendars (issue 34): a JSON list of specs, a JSON list of exclusions, a shift.
    schedules: str | None = None
    exclude: str | None = None
    shift: str | None = None
    pause_after_failures: int | None = None
    paused_reason: str | None = None
    notify_url: str | None = None


ROUTINE_RECORD_FIELDS = tuple(RoutineRecord.__dataclass_fields__)


@dataclass(frozen=True)
class RunRecord:
    id: str
    routine_id: int
    idempotency_key: str
    attempt: int
    scheduled_for: datetime
    state: str
    reason: str | None
    error: str | None
    retry_at: datetime | None
    created_at: datetime
    sent_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    worker: str | None
    spend: str | None
    skipped_count: int | None
    skipped_first: datetime | None
    skipped_last: datetime | None
    deadline_at: datetime | None = None
    duplicates: int = 0
    celery_retries: int = 0


RUN_RECORD_FIELDS = tuple(RunRecord.__dataclass_fields__)


@dataclass(frozen=True)
class DueRetry:
    """A ``retrying`` attempt whose ``retry_at`` has come, with what beat needs
    to send the next attempt (the routine's call and its pause state)."""

    run: RunRecord
    routine: RoutineRecord


@dataclass(frozen=True)
class OpenRun:
    """A run of a routine that has been sent and has not finished."""

    id: str
    routine_id: int
    idempotency_key: str
    state: str
    deadline_at: datetime | None
