"""The answers of the admin API: plain frozen dataclasses, and how stored rows
become them. No I/O here."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from celery_routines.policy.option_values import json_bounds_problem, not_json
from celery_routines.policy.routine import JSON_COLUMNS, OPTIONS
from celery_routines.schedules.base import Schedule, is_never
from celery_routines.schedules.bounds import BoundedSchedule
from celery_routines.schedules.calendar import CalendarSchedule
from celery_routines.schedules.exclusions import exclusion_entries
from celery_routines.schedules.marks import dst_note
from celery_routines.schedules.zones import load_zone
from celery_routines.sending.dispatch import EXISTS, SEND_FAILED, SENT, Dispatched
from celery_routines.store import RoutineRecord
from celery_routines.store.admin_queries import NamedRun


@dataclass(frozen=True)
class RoutineSummary:
    name: str
    task: str
    schedule: str
    timezone: str
    next_run_utc: datetime | None
    next_run_local: datetime | None
    state: str
    """``enabled``, ``paused``, ``suspended``, ``disabled``, ``invalid``,
    ``retired`` or ``done`` (a one-off that fired, a schedule past its ``ends_at``)."""
    last_outcome: str | None
    """State of the newest run row (with its reason for skips), if any."""
    last_run_at: datetime | None
    next_retry_at: datetime | None = None
    """When the first pending retry of this routine goes out, if one is pending."""
    retired_at: datetime | None = None
    """Since when a code routine is no longer declared by its owner (never fired)."""
    source: str | None = None
    """``code``, ``cli``, or ``sql``."""
    schedule_words: str | None = None
    """The schedule in words, beside the expression in ``schedule``: "At 02:30,
    Monday through Friday (Europe/Rome)"."""
    paused_reason: str | None = None
    """Why it is paused: the operator's reason, or the automatic pause's."""


@dataclass(frozen=True)
class WindowView:
    utc: datetime
    local: datetime
    note: str | None
    """A DST note, e.g. ``shifted: 02:30 does not exist``."""
    idempotency_key: str | None = None


@dataclass(frozen=True)
class RoutinePreview:
    """``preview NAME``: a stored routine's next windows, as beat computes them."""

    routine: str
    schedule: str
    """As ``list`` shows it (``describe_schedule``)."""
    timezone: str
    windows: list[WindowView]
    state: str


@dataclass(frozen=True)
class CeilingUsage:
    unit: str
    per: str
    limit: float
    spent: float
    period_start: datetime
    period_end: datetime


@dataclass(frozen=True)
class RoutineDetail:
    summary: RoutineSummary
    definition: dict[str, Any]
    next_windows: list[WindowView]
    ceilings: list[CeilingUsage]
    open_runs: int
    """Runs not finished: in flight (pending, sent, running) or retrying."""
    last_error: str | None
    suspended_until: datetime | None
    suspended_reason: str | None
    schedule_error: str | None = None
    ceiling_error: str | None = None
    retrying: list[RunView] = field(default_factory=list)
    """The routine's failed attempts waiting for their retry, soonest first."""
    next_excluded: str | None = None
    """The next window its calendar removes or moves, and why (issue 34):
    ``2026-12-25, Christmas Day``."""


@dataclass(frozen=True)
class RunView:
    id: str
    routine: str
    idempotency_key: str
    attempt: int
    max_attempts: int | None
    """``1 + max_retries`` of the routine: attempt 2 of 5."""
    state: str
    reason: str | None
    error: str | None
    retry_at: datetime | None
    """When a ``retrying`` run's next attempt goes out."""
    scheduled_for: datetime
    created_at: datetime
    sent_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    worker: str | None
    spend: dict[str, float] | None
    skipped_count: int | None
    skipped_first: datetime | None
    skipped_last: datetime | None


@dataclass(frozen=True)
class SendResult:
    routine: str
    run_id: str
    idempotency_key: str
    attempt: int
    scheduled_for: datetime
    outcome: str
    """``sent``, ``exists`` (already stored, not sent again) or ``send_failed``."""
    existing_state: str | None = None
    error: str | None = None
    max_attempts: int | None = None


@dataclass(frozen=True)
class BackfillResult:
    routine: str
    start: datetime
    end: datetime
    windows: list[SendResult] = field(default_factory=list)
    overlap: str = "overlap"
    """The overlap policy the backfill followed (``--overlap``, else the routine's)."""
    left: int = 0
    """New windows not sent: under ``skip``/``queue`` all but the oldest,
    under ``replace`` all but the newest (see ``OperatorSends.backfill``)."""
    window_count: int = 0
    """Every window in the range: those sent, already stored, failed and left
    (``windows`` lists only those it sent or found stored)."""

    @property
    def sent(self) -> int:
        return sum(1 for w in self.windows if w.outcome == SENT)

    @property
    def existing(self) -> int:
        return sum(1 for w in self.windows if w.outcome == EXISTS)

    @property
    def failed(self) -> int:
        return sum(1 for w in self.windows if w.outcome == SEND_FAILED)


@dataclass(frozen=True)
class PauseResult:
    routine: str
    paused: bool
    changed: bool
    """False when the routine already was in the asked state."""
    next_run_at: datetime | None
    skipped_windows: int = 0
    """Windows that fell due while paused and were recorded as skipped."""


@dataclass(frozen=True)
class MigrateResult:
    database: str
    before: str | None
    after: str


@dataclass(frozen=True)
class SyncResult:
    database: str
    routines: list[str]
    """Names of the routines written (declared in code or in beat_schedule)."""
    retired: list[str] = field(default_factory=list)
    """Code routines of this app no longer declared: retired by this sync."""
    revived: list[str] = field(default_factory=list)
    """Retired routines declared again: back in service from now."""
    resumed: list[str] = field(default_factory=list)
    """Routines an import paused (``--disabled``) that the code took over: resumed."""
    newer_stamp: str | None = None
    """Set when newer code had written the routines: this sync wrote nothing."""


def window_view(
    schedule: Schedule, window: datetime, key: str | None = None, timezone: str | None = None
) -> WindowView:
    if isinstance(schedule, BoundedSchedule):  # starts_at/ends_at: the bounded schedule
        schedule = schedule.inner
    zone = str(timezone or getattr(schedule, "timezone", "UTC"))
    note = None
    if isinstance(schedule, CalendarSchedule):  # exclude/shift: say where a window moved from
        moved = schedule.moved_from(window)
        if moved is not None:
            local = moved[0].astimezone(load_zone(zone))
            note = f"moved from {local:%a %Y-%m-%d}, {moved[1]}"
        schedule = schedule.inner
    return WindowView(
        utc=window,
        local=window.astimezone(load_zone(zone)),
        note=note or dst_note(schedule, window),
        idempotency_key=key,
    )


def routine_state(record: RoutineRecord, now: datetime) -> str:
    if record.retired_at is not None:
        return "retired"
    if record.last_error is not None:
        return "invalid"
    if not record.enabled:
        return "disabled"
    if is_never(record.next_run_at):
        return "done"
    if record.paused:
        return "paused"
    if record.suspended_until is not None and record.suspended_until > now:
        return "suspended"
    return "enabled"


def describe_schedule(record: RoutineRecord) -> str:
    text = _describe_kind(record)
    if record.starts_at is not None:
        text += f" from {iso_utc(record.starts_at)}"
    if record.ends_at is not None:
        text += f" until {iso_utc(record.ends_at)}"
    if record.jitter_seconds:
        text += f" (jitter {record.jitter_seconds}s)"
    if record.exclude:
        text += " except " + ", ".join(_entries(record.exclude))
    if record.shift:
        text += f", {record.shift}"
    return text


def _entries(raw: str) -> list[str]:
    try:
        return list(exclusion_entries(raw))
    except ValueError:
        return [raw]


def next_excluded_text(schedule: Schedule, after: datetime, timezone: str) -> str | None:
    """``2026-12-25, Christmas Day`` (and where a shift moves it): the next
    window of the routine's calendar that does not fire as scheduled."""
    if isinstance(schedule, BoundedSchedule):
        schedule = schedule.inner
    if not isinstance(schedule, CalendarSchedule):
        return None
    found = schedule.next_excluded(after)
    if found is None:
        return None
    window, reason = found
    text = f"{window.astimezone(load_zone(timezone)):%Y-%m-%d}, {reason}"
    if schedule.shift is not None and schedule.cron_removes(window) is None:
        text += f" (moved to the {schedule.shift.value.replace('_', ' ')})"
    return text


def _describe_kind(record: RoutineRecord) -> str:
    if record.cron is not None:
        return record.cron
    if record.interval_seconds is not None:
        return _every(record.interval_seconds)
    if record.at is not None:
        return f"once at {iso_utc(record.at)}"
    if record.solar is not None:
        return f"solar {record.solar}"
    if record.rrule is not None:
        return "rrule " + " ".join(record.rrule.split())
    if record.schedules is not None:
        try:
            return " + ".join(_union_part(spec) for spec in json.loads(record.schedules))
        except (ValueError, TypeError):
            return record.schedules
    return "(none)"


def _every(seconds: float) -> str:
    return f"every {int(seconds) if float(seconds).is_integer() else seconds}s"


def _union_part(spec: object) -> str:
    """One spec of a union as the single schedule of its kind is shown (an
    interval ``every 90s``, a rule on one line), so ``preview`` reads the
    whole line back."""
    if isinstance(spec, int | float) and not isinstance(spec, bool):
        return _every(spec)
    return " ".join(str(spec).split())


def definition_of(record: RoutineRecord) -> dict[str, Any]:
    """The stored definition as ``show --json`` and the API return it: each
    option by its keyword (``jitter``, ``ceiling``; a schedule's fields by
    their column), JSON columns read, instants in ISO 8601 UTC, and each
    value as its declaration shows it (a notify_url's secret masked)."""

    def loads(raw: str | None) -> Any:
        # Text that is not JSON (NaN and Infinity included) is shown as the
        # text stored: the routine is invalid, and says why.
        # So is a value over the limits of args, kwargs and options (nested
        # hundreds deep, it would break the JSON answer itself).
        try:
            value = json.loads(raw, parse_constant=not_json) if raw else None
        except (ValueError, RecursionError):
            return raw
        return raw if json_bounds_problem("value", value) else value

    shown: dict[str, Any] = {"task": record.task}
    for declared in OPTIONS:
        value = getattr(record, declared.column_name)
        if declared.column_name in JSON_COLUMNS:
            value = loads(value)
        elif declared.stored.kind == "instant" and value is not None:
            value = iso_utc(value)
        shown[declared.keyword_name or declared.name] = declared.shown(value)
    shown["paused"] = record.paused
    shown["paused_reason"] = record.paused_reason
    return shown


def run_view(named: NamedRun) -> RunView:
    run = named.run
    spend = None
    if run.spend:
        try:
            spend = json.loads(run.spend)
        except ValueError:
            spend = None
    return RunView(
        id=run.id,
        routine=named.routine_name,
        idempotency_key=run.idempotency_key,
        attempt=run.attempt,
        max_attempts=named.max_attempts,
        state=run.state,
        reason=run.reason,
        error=run.error,
        retry_at=run.retry_at,
        scheduled_for=run.scheduled_for,
        created_at=run.created_at,
        sent_at=run.sent_at,
        started_at=run.started_at,
        finished_at=run.finished_at,
        worker=run.worker,
        spend=spend,
        skipped_count=run.skipped_count,
        skipped_first=run.skipped_first,
        skipped_last=run.skipped_last,
    )


def send_result(record: RoutineRecord, done: Dispatched) -> SendResult:
    return SendResult(
        routine=record.name,
        run_id=done.existing_id or done.run.id,
        idempotency_key=done.run.idempotency_key,
        attempt=done.run.attempt,
        scheduled_for=done.run.scheduled_for,
        outcome=done.outcome,
        existing_state=done.existing_state,
        error=done.error,
        max_attempts=record.max_retries + 1,
    )


def attempt_text(attempt: int, max_attempts: int | None) -> str:
    """``2 of 5``; a manual replay past the retry budget is just its number."""
    if max_attempts is None or attempt > max_attempts:
        return str(attempt)
    return f"{attempt} of {max_attempts}"


def iso_utc(instant: datetime | None) -> str:
    return instant.astimezone(UTC).isoformat() if instant is not None else "?"
