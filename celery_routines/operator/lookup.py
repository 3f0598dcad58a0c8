"""What every operator operation looks up about a routine: its stored row
(or ``UnknownRoutine``), its zone and schedule, its ceilings and their use,
its runs in progress, and its summary line."""

from __future__ import annotations

from datetime import datetime

from celery_routines.clock import Clock
from celery_routines.config import Settings
from celery_routines.errors import InvalidRoutine, ScheduleError, UnknownRoutine
from celery_routines.operator.schedule_words import schedule_words
from celery_routines.operator.views import (
    CeilingUsage,
    RoutineSummary,
    RunView,
    describe_schedule,
    routine_state,
)
from celery_routines.operator.windows import to_instant
from celery_routines.policy.catch_up import SkippedWindows
from celery_routines.policy.ceilings import Ceiling, parse_ceilings, period_bounds
from celery_routines.policy.decide import skip_row
from celery_routines.policy.runs import in_progress
from celery_routines.policy.states import Reason
from celery_routines.schedules.base import (
    Schedule,
    count_windows,
    first_window,
    is_never,
    last_windows,
)
from celery_routines.schedules.jitter import jitter_offset, send_instant, window_of
from celery_routines.schedules.parse import schedule_of
from celery_routines.schedules.zones import load_zone
from celery_routines.store import NewRun, RoutineRecord, RunRecord, Store
from celery_routines.store.panel_queries import RecentRun
from celery_routines.store.records import OpenRun


class RoutineLookup:
    """The look-ups the operator's reads, changes and sends share."""

    def __init__(self, store: Store, settings: Settings, clock: Clock) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock

    def record(self, name: str) -> RoutineRecord:
        record = self.store.routines.by_name(name)
        if record is None:
            raise UnknownRoutine(name)
        return record

    def zone_of(self, record: RoutineRecord) -> str:
        return record.timezone or self.settings.timezone

    def schedule(self, record: RoutineRecord) -> Schedule:
        return schedule_of(record, self.zone_of(record))

    def since(self, since: datetime | str | None, label: str = "--since") -> datetime | None:
        if since is None:
            return None
        return to_instant(since, "UTC", self.clock(), label)

    def summary(
        self,
        record: RoutineRecord,
        latest: RunRecord | RecentRun | None,
        now: datetime,
        next_retry: RunRecord | RunView | None = None,
    ) -> RoutineSummary:
        timezone = self.zone_of(record)
        local = None
        next_run_at = None if is_never(record.next_run_at) else record.next_run_at
        if record.next_run_at is None:
            next_run_at = self._first_send(record, now)
        if next_run_at is not None:
            try:
                local = next_run_at.astimezone(load_zone(timezone))
            except ScheduleError:
                local = None
        outcome = None
        if latest is not None:
            outcome = latest.state
            if latest.reason:
                outcome += f" ({latest.reason})"
        return RoutineSummary(
            name=record.name,
            task=record.task,
            schedule=describe_schedule(record),
            timezone=timezone,
            next_run_utc=next_run_at,
            next_run_local=local,
            state=routine_state(record, now),
            last_outcome=outcome,
            last_run_at=latest.created_at if latest is not None else None,
            next_retry_at=next_retry.retry_at if next_retry is not None else None,
            retired_at=record.retired_at,
            source=record.source or "sql",
            schedule_words=schedule_words(record, timezone),
            paused_reason=record.paused_reason if record.paused else None,
        )

    def _first_send(self, record: RoutineRecord, now: datetime) -> datetime | None:
        """When a routine beat has not scheduled yet (added or imported
        paused, disabled, or just now) would go out: the first window beat
        adopts from ``now`` (as ``show`` lists it), so ``list`` says when it
        would fire instead of nothing. None for a routine that never fires
        again (retired, invalid, no window left)."""
        if record.retired_at is not None or record.last_error is not None:
            return None
        try:
            # From the whole second, as beat adopts it (tick/engine.py).
            first = first_window(self.schedule(record), now.replace(microsecond=0))
            jitter = record.jitter_seconds
            return None if is_never(first) else send_instant(first, record.name, jitter)
        except (ScheduleError, ValueError, OverflowError):
            return None  # beat marks it invalid with the reason when it adopts it

    def ceilings(self, record: RoutineRecord) -> tuple[Ceiling, ...]:
        try:
            return parse_ceilings(record.ceiling)
        except ScheduleError as exc:
            raise InvalidRoutine(record.name, str(exc)) from None

    def usage(self, record: RoutineRecord, now: datetime) -> list[CeilingUsage]:
        ceilings = self.ceilings(record)
        if not ceilings:
            return []
        timezone = self.zone_of(record)
        # Beat's own accounting: a run counts in the period of its created_at;
        # skips and runs whose message never went out are free.
        used = self.store.spend.used_by_ceiling(record.id, ceilings, now, timezone)
        usage = []
        for ceiling in ceilings:
            start, end = period_bounds(now, ceiling.per, timezone)
            spent = used.get(ceiling.unit, 0.0)
            usage.append(CeilingUsage(ceiling.unit, ceiling.per, ceiling.limit, spent, start, end))
        return usage

    def open_runs(self, record: RoutineRecord, now: datetime) -> list[OpenRun]:
        """Runs in progress, by beat's own overlap rule."""
        found = self.store.runs.open_runs([record.id]).get(record.id, [])
        return in_progress(found, set(), now)

    def missed(
        self, record: RoutineRecord, due: datetime, now: datetime, reason: Reason
    ) -> tuple[NewRun, datetime]:
        """The skip row for the windows sent by ``now`` from the one due at
        ``due`` (a send instant: a jittered window goes out its offset after
        it), and the send instant of the next window."""
        schedule, jitter = self.schedule(record), record.jitter_seconds
        offset = jitter_offset(record.name, jitter)
        window = window_of(due, record.name, jitter)
        count = 1 + count_windows(schedule, window, now - offset)
        last = (last_windows(schedule, window, now - offset, 1) or [window])[-1]
        summary = SkippedWindows(reason, count, window, last)
        skip = skip_row(record.id, record.name, self.zone_of(record), summary)
        return skip, send_instant(schedule.next_after(last), record.name, jitter)
