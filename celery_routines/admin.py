"""The operator's API: what ``celery routines ...`` does, callable from Python.

``Routines(app)`` reads, pauses, resumes and sends routines; every answer is a
plain frozen dataclass. Errors are celery-routines exceptions whose message
names the routine or the bad value (``UnknownRoutine``, ``InvalidRoutine``,
``ValueError`` subclasses). This module decides; the store holds the SQL and
:mod:`celery_routines.dispatch` carries out sends in the tick's order.
"""

from __future__ import annotations

import json
import re
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import Celery
from sqlalchemy.engine import make_url

from .ceilings import Ceiling, decide_before_send, parse_ceilings, period_bounds
from .clock import Clock, utc_now
from .config import Settings, settings_from
from .dispatch import EXISTS, SEND_FAILED, SENT, Dispatched, dispatch
from .errors import InvalidRoutine, RoutinesError, ScheduleError, UnknownRoutine
from .events import RoutineEvents
from .publish import CeleryPublisher, Publisher
from .schedules.base import Schedule
from .schedules.cron import CronSchedule
from .schedules.interval import IntervalSchedule
from .schedules.keys import window_key
from .schedules.marks import dst_note
from .schedules.parse import schedule_from_columns
from .schedules.zones import load_zone, local_to_utc_first
from .store import NewRun, RoutineRecord, RunRecord, Store, migrate
from .store.admin_queries import NamedRun
from .store.models import RUN_STATES
from .store.records import OpenRun
from .store.spend_queries import SpendQueries

__all__ = [
    "BackfillResult",
    "CeilingUsage",
    "MigrateResult",
    "OperationRefused",
    "PauseResult",
    "RoutineDetail",
    "RoutineSummary",
    "Routines",
    "RunView",
    "SendResult",
    "UnknownRun",
    "WindowView",
    "parse_instant",
    "preview",
]

# A backfill larger than this is almost always a typo in --from; the caller
# can raise it explicitly.
MAX_BACKFILL = 1000
MAX_LIMIT = 10_000
MAX_PREVIEW = 1000
REPLAYABLE_STATES = ("failed", "skipped", "lost")
# Overlap policies under which a manual send must not start next to an open run.
EXCLUSIVE_OVERLAP = ("skip", "queue")
_ONE_MICROSECOND = timedelta(microseconds=1)
_AGE = re.compile(r"^(\d+)\s*(s|m|h|d|w)$")
_AGE_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


class UnknownRun(RoutinesError, LookupError):
    """No run with this id is stored."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run with id {run_id!r} is stored")


class OperationRefused(RoutinesError, ValueError):
    """A send would break the routine's overlap policy or ceiling."""


# -- answers -------------------------------------------------------------------


@dataclass(frozen=True)
class RoutineSummary:
    name: str
    task: str
    schedule: str
    timezone: str
    next_run_utc: datetime | None
    next_run_local: datetime | None
    state: str
    """``enabled``, ``paused``, ``suspended``, ``disabled`` or ``invalid``."""
    last_outcome: str | None
    """State of the newest run row (with its reason for skips), if any."""
    last_run_at: datetime | None


@dataclass(frozen=True)
class WindowView:
    utc: datetime
    local: datetime
    note: str | None
    """A DST note, e.g. ``shifted: 02:30 does not exist``."""
    idempotency_key: str | None = None


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
    last_error: str | None
    suspended_until: datetime | None
    suspended_reason: str | None
    schedule_error: str | None = None
    ceiling_error: str | None = None


@dataclass(frozen=True)
class RunView:
    id: str
    routine: str
    idempotency_key: str
    attempt: int
    state: str
    reason: str | None
    error: str | None
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


@dataclass(frozen=True)
class BackfillResult:
    routine: str
    start: datetime
    end: datetime
    windows: list[SendResult] = field(default_factory=list)

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


# -- parsing what operators type ------------------------------------------------


def parse_instant(text: str, timezone: str, now: datetime, *, label: str = "date") -> datetime:
    """An instant from what an operator types, as aware UTC.

    ``2026-11-30`` (midnight) and ``2026-11-30T08:00`` are wall times in
    ``timezone``; an explicit offset (``+01:00``, ``Z``) wins; ``now``; an age
    such as ``90m``, ``2h``, ``7d`` or ``1w`` means that long before ``now``.
    """
    raw = text.strip()
    if raw.lower() == "now":
        return now.astimezone(UTC)
    age = _AGE.match(raw.lower())
    if age:
        return now.astimezone(UTC) - timedelta(**{_AGE_UNITS[age.group(2)]: int(age.group(1))})
    try:
        parsed = datetime.fromisoformat(raw.replace(" ", "T", 1))
    except ValueError:
        raise ValueError(
            f"{label} {text!r} is not a date: use ISO 8601 such as 2026-11-30, "
            "2026-11-30T08:00 or 2026-11-30T08:00+01:00, 'now', or an age such as 2h or 7d"
        ) from None
    if parsed.tzinfo is None:
        return local_to_utc_first(parsed, load_zone(timezone))
    return parsed.astimezone(UTC)


def preview(
    cron: str,
    timezone: str = "UTC",
    start: datetime | str | None = None,
    n: int = 10,
    *,
    clock: Clock = utc_now,
) -> list[WindowView]:
    """The next ``n`` windows of ``cron`` in ``timezone`` from ``start`` (inclusive).

    Needs no database. A naive or string ``start`` is read in ``timezone``.
    """
    _check_count("n", n, MAX_PREVIEW)
    schedule = CronSchedule(cron, timezone)
    after = _instant(start, timezone, clock(), "--from") - _ONE_MICROSECOND
    return [_window_view(schedule, w) for w in _take(schedule, after, n)]


# -- the API ---------------------------------------------------------------------


class Routines:
    """Operations on the routines stored for a Celery app (or for ``Settings``).

    Sending (trigger, replay, backfill) needs the app, to publish; everything
    else works from settings alone. ``clock`` is the seam tests use.
    """

    def __init__(
        self,
        app_or_settings: Celery | Settings | None = None,
        *,
        clock: Clock = utc_now,
        store: Store | None = None,
        publisher: Publisher | None = None,
        events: RoutineEvents | None = None,
    ) -> None:
        if isinstance(app_or_settings, Settings):
            self.app: Celery | None = None
            self.settings = app_or_settings
        else:
            self.app = app_or_settings
            self.settings = settings_from(app_or_settings)
        self.clock = clock
        # Building an engine opens no connection; the first query does.
        self.store = store or Store.from_url(self.settings.database_url)
        self._owns_store = store is None
        self._spend = SpendQueries(self.store.engine)
        self._publisher = publisher
        self._owns_publisher = publisher is None
        # Skips an operator causes (a resume) and manual sends go out as
        # Celery events like beat's own; without an app there is no broker.
        self.events = events or (RoutineEvents(self.app) if self.app is not None else None)

    def close(self) -> None:
        if self._publisher is not None and self._owns_publisher:
            self._publisher.close()
            self._publisher = None
        if self.events is not None:
            self.events.close()
        if self._owns_store:
            self.store.dispose()

    def __enter__(self) -> Routines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -----------------------------------------------------------

    def list(self) -> list[RoutineSummary]:
        now = self.clock()
        latest = self.store.admin.latest_runs()
        return [self._summary(r, latest.get(r.id), now) for r in self.store.routines.all()]

    def show(self, name: str, windows: int = 5) -> RoutineDetail:
        _check_count("windows", windows, MAX_PREVIEW)
        record = self._record(name)
        now = self.clock()
        latest = self.store.admin.latest_runs().get(record.id)
        timezone = self._zone_of(record)
        next_windows: list[WindowView] = []
        schedule_error = None
        try:
            schedule = self._schedule(record)
            # The stored next window is the first one; an unscheduled routine
            # (beat has not adopted it yet) starts from now.
            if record.next_run_at is not None and record.last_error is None:
                first = [record.next_run_at]
                rest = _take(schedule, record.next_run_at, windows - 1)
            else:
                first, rest = [], _take(schedule, now, windows)
            next_windows = [
                _window_view(schedule, w, window_key(record.name, w, timezone))
                for w in [*first, *rest][:windows]
            ]
        except ScheduleError as exc:
            schedule_error = str(exc)
        ceiling_error = None
        try:
            ceilings = self._usage(record, now)
        except InvalidRoutine as exc:
            # Show what can be shown; the bad column is named in the error.
            ceilings, ceiling_error = [], exc.problem
        return RoutineDetail(
            summary=self._summary(record, latest, now),
            definition=_definition(record),
            next_windows=next_windows,
            ceilings=ceilings,
            open_runs=len(self._open_runs(record, now)),
            last_error=record.last_error,
            suspended_until=record.suspended_until,
            suspended_reason=record.suspended_reason,
            schedule_error=schedule_error,
            ceiling_error=ceiling_error,
        )

    def runs(
        self,
        name: str | None = None,
        *,
        state: str | Sequence[str] | None = None,
        since: datetime | str | None = None,
        limit: int = 50,
    ) -> list[RunView]:
        """Run rows, newest first; ``since`` (UTC unless it says otherwise)
        filters on when the row was written."""
        _check_count("limit", limit, MAX_LIMIT)
        states = [state] if isinstance(state, str) else list(state or [])
        for value in states:
            if value not in RUN_STATES:
                raise ValueError(f"state {value!r} is unknown; use one of {', '.join(RUN_STATES)}")
        routine_id = self._record(name).id if name is not None else None
        rows = self.store.admin.runs(
            routine_id=routine_id,
            states=states,
            since=self._since(since),
            limit=limit,
        )
        return [_run_view(row) for row in rows]

    def skips(self, since: datetime | str | None = None, limit: int = 1000) -> list[RunView]:
        """Every decision not to fire: skipped run rows with reason and count."""
        return self.runs(state="skipped", since=since, limit=limit)

    # -- pause and resume --------------------------------------------------

    def pause(self, name: str) -> PauseResult:
        record = self._record(name)
        changed = self.store.admin.pause(record.id, self.clock())
        return PauseResult(record.name, True, changed, record.next_run_at)

    def resume(self, name: str, *, catch_up: bool = False) -> PauseResult:
        """Unpause. By default the windows that fell due while paused are
        recorded as one ``skipped`` row (reason ``paused``) and the routine
        continues with its first window after now: a pause is a decision, not
        an outage, so it never comes back as a burst. With ``catch_up=True``
        the next window is left as it was and beat treats the paused windows
        like downtime, under the routine's ``catch_up`` policy and cap.
        """
        record = self._record(name)
        now = self.clock()
        skip: NewRun | None = None
        next_run_at = record.next_run_at
        if not catch_up and record.next_run_at is not None and record.next_run_at <= now:
            try:
                skip, next_run_at = self._paused_windows(record, now)
            except ScheduleError:
                # Invalid schedule: beat's invalid-retry path deals with it.
                skip, next_run_at = None, record.next_run_at
        changed = self.store.admin.resume(
            record.id, next_run_at, now, keep_next=catch_up or skip is None
        )
        skipped = 0
        if changed and skip is not None and self.store.runs.insert_new([skip], now):
            skipped = skip.skipped_count or 0
            if self.events is not None:
                self.events.skipped(
                    record.name,
                    reason="paused",
                    count=skipped,
                    first=skip.skipped_first or skip.scheduled_for,
                    last=skip.scheduled_for,
                    run_id=skip.id,
                )
        if not changed:
            next_run_at = record.next_run_at
        return PauseResult(record.name, False, changed, next_run_at, skipped)

    def _paused_windows(self, record: RoutineRecord, now: datetime) -> tuple[NewRun, datetime]:
        assert record.next_run_at is not None
        schedule = self._schedule(record)
        due = record.next_run_at
        count = 1 + _count(schedule, due, now)
        last = (_last(schedule, due, now) or [due])[-1]
        timezone = self._zone_of(record)
        key = window_key(record.name, due, timezone)
        if count > 1:
            key += ".." + window_key(record.name, last, timezone).split("@", 1)[1]
        skip = NewRun(
            id=str(uuid.uuid4()),
            routine_id=record.id,
            idempotency_key=key,
            attempt=1,
            scheduled_for=last,
            state="skipped",
            reason="paused",
            skipped_count=count,
            skipped_first=due,
            skipped_last=last,
        )
        return skip, schedule.next_after(last)

    # -- sending -----------------------------------------------------------

    def trigger(self, name: str, *, force: bool = False) -> SendResult:
        """Send the routine now, outside its schedule, under a manual key
        (``name@manual:<uuid>``) that can never collide with a window."""
        record = self._record(name)
        now = self.clock()
        if not force:
            self._check_may_send(record, 1, now)
        run = NewRun(
            id=str(uuid.uuid4()),
            routine_id=record.id,
            idempotency_key=f"{record.name}@manual:{uuid.uuid4()}",
            attempt=1,
            scheduled_for=now,
        )
        return _send_result(record, self._dispatch(record, [run], "trigger")[0])

    def replay(self, run_id: str, *, force: bool = False) -> SendResult:
        """Send a failed, skipped or lost window again, as the next attempt of
        its idempotency key."""
        run = self.store.runs.get(run_id)
        if run is None:
            raise UnknownRun(run_id)
        record = self.store.routines.by_id(run.routine_id)
        if record is None:  # pragma: no cover - the foreign key cascades
            raise UnknownRun(run_id)
        if run.state not in REPLAYABLE_STATES:
            raise InvalidRoutine(
                record.name,
                f"run {run_id} is {run.state}; only {', '.join(REPLAYABLE_STATES)} runs "
                "can be replayed",
            )
        if (run.skipped_count or 1) > 1:
            raise InvalidRoutine(
                record.name,
                f"run {run_id} stands for {run.skipped_count} skipped windows from "
                f"{_iso(run.skipped_first)} to {_iso(run.skipped_last)}; send them with "
                f"backfill --from {_iso(run.skipped_first)} --to {_iso(run.skipped_last)}",
            )
        latest = self.store.admin.attempts(record.id, run.idempotency_key)[-1]
        if latest.state not in REPLAYABLE_STATES:
            raise InvalidRoutine(
                record.name,
                f"window {run.idempotency_key} already has attempt {latest.attempt} "
                f"(run {latest.id}, {latest.state}); replay that one if it fails",
            )
        now = self.clock()
        if not force:
            self._check_may_send(record, 1, now)
        new = NewRun(
            id=str(uuid.uuid4()),
            routine_id=record.id,
            idempotency_key=run.idempotency_key,
            attempt=latest.attempt + 1,
            scheduled_for=run.scheduled_for,
        )
        return _send_result(record, self._dispatch(record, [new], "replay")[0])

    def backfill(
        self,
        name: str,
        start: datetime | str,
        end: datetime | str,
        *,
        max_windows: int = MAX_BACKFILL,
        force: bool = False,
    ) -> BackfillResult:
        """Send the windows in ``[start, end]``, oldest first, each under its
        own window key: a window that already has a run row (sent by beat,
        skipped, or sent by an earlier backfill) is not sent again.

        Naive and string bounds are read in the routine's zone. ``end`` may
        not be in the future: beat sends those windows.
        """
        _check_count("max_windows", max_windows, 1_000_000)
        record = self._record(name)
        now = self.clock()
        timezone = self._zone_of(record)
        first = _instant(start, timezone, now, "--from")
        last = _instant(end, timezone, now, "--to")
        if last < first:
            raise ValueError(f"--to {_iso(last)} is before --from {_iso(first)}")
        if last > now:
            raise ValueError(
                f"--to {_iso(last)} is in the future (now is {_iso(now)}); backfill sends "
                "past windows only, beat sends the rest"
            )
        try:
            schedule = self._schedule(record)
            windows = _range_windows(schedule, record, first, last, max_windows)
        except ScheduleError as exc:
            raise InvalidRoutine(record.name, str(exc)) from None
        runs = [
            NewRun(
                id=str(uuid.uuid4()),
                routine_id=record.id,
                idempotency_key=window_key(record.name, w, timezone),
                attempt=1,
                scheduled_for=w,
            )
            for w in windows
        ]
        if not force and runs:
            stored = self.store.runs.find_windows(
                [(r.routine_id, r.idempotency_key, r.attempt) for r in runs]
            )
            new_count = len(runs) - len(stored)
            if new_count:
                self._check_may_send(record, new_count, now)
        results = self._dispatch(record, runs, "backfill") if runs else []
        return BackfillResult(record.name, first, last, [_send_result(record, d) for d in results])

    # -- schema ------------------------------------------------------------

    def migrate(self) -> MigrateResult:
        before = migrate.current_revision(self.store.engine)
        self.store.migrate()
        return MigrateResult(
            database=_safe_url(self.settings.database_url),
            before=before,
            after=migrate.head_revision(),
        )

    # -- internals ---------------------------------------------------------

    def _record(self, name: str) -> RoutineRecord:
        record = self.store.routines.by_name(name)
        if record is None:
            raise UnknownRoutine(name)
        return record

    def _zone_of(self, record: RoutineRecord) -> str:
        return record.timezone or self.settings.timezone

    def _schedule(self, record: RoutineRecord) -> Schedule:
        return schedule_from_columns(record.cron, record.interval_seconds, self._zone_of(record))

    def _since(self, since: datetime | str | None) -> datetime | None:
        if since is None:
            return None
        return _instant(since, "UTC", self.clock(), "--since")

    def _summary(
        self, record: RoutineRecord, latest: RunRecord | None, now: datetime
    ) -> RoutineSummary:
        timezone = self._zone_of(record)
        local = None
        if record.next_run_at is not None:
            try:
                local = record.next_run_at.astimezone(load_zone(timezone))
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
            schedule=_describe(record),
            timezone=timezone,
            next_run_utc=record.next_run_at,
            next_run_local=local,
            state=_state(record, now),
            last_outcome=outcome,
            last_run_at=latest.created_at if latest is not None else None,
        )

    def _ceilings(self, record: RoutineRecord) -> tuple[Ceiling, ...]:
        try:
            return parse_ceilings(record.ceiling)
        except ScheduleError as exc:
            raise InvalidRoutine(record.name, str(exc)) from None

    def _usage(self, record: RoutineRecord, now: datetime) -> list[CeilingUsage]:
        ceilings = self._ceilings(record)
        if not ceilings:
            return []
        timezone = self._zone_of(record)
        # Beat's own accounting: a run counts in the period of its created_at;
        # skips and runs whose message never went out are free.
        used = self._spend.used_by_ceiling(record.id, ceilings, now, timezone)
        usage = []
        for ceiling in ceilings:
            start, end = period_bounds(now, ceiling.per, timezone)
            spent = used.get(ceiling.unit, 0.0)
            usage.append(CeilingUsage(ceiling.unit, ceiling.per, ceiling.limit, spent, start, end))
        return usage

    def _open_runs(self, record: RoutineRecord, now: datetime) -> list[OpenRun]:
        """Runs in progress, counted as beat counts them for its overlap
        policy: a pending row is not yet a run, and a run past its deadline is
        lost whether or not the sweep has said so yet."""
        return [
            run
            for run in self.store.runs.open_runs([record.id]).get(record.id, [])
            if run.state != "pending" and (run.deadline_at is None or run.deadline_at > now)
        ]

    def _check_may_send(self, record: RoutineRecord, fires: int, now: datetime) -> None:
        """Refuse a manual send that the overlap policy or a ceiling forbids."""
        if record.overlap in EXCLUSIVE_OVERLAP:
            open_runs = self._open_runs(record, now)
            if open_runs:
                raise OperationRefused(
                    f"routine {record.name!r} has {len(open_runs)} open run(s) "
                    f"(oldest {open_runs[0].id}, {open_runs[0].state}) and overlap="
                    f"{record.overlap!r}; wait for it to finish or pass --force"
                )
        usage = self._usage(record, now)
        if not usage:
            return
        decision = decide_before_send(
            self._ceilings(record),
            {u.unit: u.spent for u in usage},
            now,
            self._zone_of(record),
            wanted=fires,
        )
        if decision.send < fires:
            spent = "; ".join(
                f"{u.spent:g} of {u.limit:g} {u.unit} used this {u.per} "
                f"(until {_iso(u.period_end)})"
                for u in usage
            )
            raise OperationRefused(
                f"routine {record.name!r}: sending {fires} run(s) would pass its ceiling "
                f"({spent}); pass --force to send anyway"
            )

    def _dispatch(self, record: RoutineRecord, runs: list[NewRun], how: str) -> list[Dispatched]:
        results = dispatch(
            self.store,
            self._get_publisher(),
            record,
            runs,
            self.clock,
            self.settings.run_timeout,
        )
        if self.events is not None:
            for done in results:
                if done.outcome == SENT:
                    self.events.triggered(
                        record.name,
                        run_id=done.run.id,
                        idempotency_key=done.run.idempotency_key,
                        how=how,
                    )
        return results

    def _get_publisher(self) -> Publisher:
        if self._publisher is None:
            if self.app is None:
                raise RoutinesError(
                    "sending needs the Celery app: build Routines(app), not Routines(settings)"
                )
            self._publisher = CeleryPublisher(self.app)
        return self._publisher


# -- helpers ----------------------------------------------------------------------


def _check_count(label: str, value: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ValueError(f"{label} must be a whole number from 1 to {high}, got {value!r}")


def _instant(value: datetime | str | None, timezone: str, now: datetime, label: str) -> datetime:
    if value is None:
        return now.astimezone(UTC)
    if isinstance(value, str):
        return parse_instant(value, timezone, now, label=label)
    if value.tzinfo is None:
        return local_to_utc_first(value, load_zone(timezone))
    return value.astimezone(UTC)


def _take(schedule: Schedule, after: datetime, n: int) -> list[datetime]:
    found: list[datetime] = []
    current = after
    while len(found) < n:
        current = schedule.next_after(current)
        found.append(current)
    return found


def _count(schedule: Schedule, after: datetime, until: datetime) -> int:
    count = getattr(schedule, "count_windows", None)
    if count is not None:
        return int(count(after, until))
    return sum(1 for _ in schedule.windows(after, until))


def _last(schedule: Schedule, after: datetime, until: datetime) -> list[datetime]:
    last = getattr(schedule, "last_windows", None)
    if last is not None:
        return list(last(after, until, 1))
    return list(deque(schedule.windows(after, until), maxlen=1))


def _range_windows(
    schedule: Schedule, record: RoutineRecord, first: datetime, last: datetime, cap: int
) -> list[datetime]:
    """The windows in ``[first, last]``, refusing more than ``cap``."""
    if isinstance(schedule, IntervalSchedule):
        # Interval windows are anchored on the routine's own chain of windows,
        # so the backfilled keys are the ones beat used (or would have used).
        anchor = record.next_run_at
        if anchor is None:
            raise ScheduleError(
                "it has no window yet (beat has not adopted it); start beat once, then backfill"
            )
        step = schedule.step
        k_first = -((anchor - first) // step)  # ceil((first - anchor) / step)
        k_last = (last - anchor) // step
        count = max(0, k_last - k_first + 1)
        _check_backfill_size(record.name, count, first, last, cap)
        return [anchor + k * step for k in range(k_first, k_last + 1)]
    count = _count(schedule, first - _ONE_MICROSECOND, last)
    _check_backfill_size(record.name, count, first, last, cap)
    return list(schedule.windows(first - _ONE_MICROSECOND, last))


def _check_backfill_size(name: str, count: int, first: datetime, last: datetime, cap: int) -> None:
    if count > cap:
        raise ValueError(
            f"backfill of {name!r} from {_iso(first)} to {_iso(last)} covers {count} windows; "
            f"at most {cap} are sent at once: split the range or raise --max"
        )


def _window_view(schedule: Schedule, window: datetime, key: str | None = None) -> WindowView:
    zone = getattr(schedule, "timezone", "UTC")
    return WindowView(
        utc=window,
        local=window.astimezone(load_zone(zone)),
        note=dst_note(schedule, window),
        idempotency_key=key,
    )


def _state(record: RoutineRecord, now: datetime) -> str:
    if record.last_error is not None:
        return "invalid"
    if not record.enabled:
        return "disabled"
    if record.paused:
        return "paused"
    if record.suspended_until is not None and record.suspended_until > now:
        return "suspended"
    return "enabled"


def _describe(record: RoutineRecord) -> str:
    if record.cron is not None:
        return record.cron
    if record.interval_seconds is not None:
        seconds = record.interval_seconds
        return f"every {int(seconds) if float(seconds).is_integer() else seconds}s"
    return "(none)"


def _definition(record: RoutineRecord) -> dict[str, Any]:
    def loads(raw: str | None) -> Any:
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return raw

    return {
        "task": record.task,
        "cron": record.cron,
        "interval_seconds": record.interval_seconds,
        "timezone": record.timezone,
        "enabled": record.enabled,
        "paused": record.paused,
        "args": loads(record.args),
        "kwargs": loads(record.kwargs),
        "options": loads(record.options),
        "catch_up": record.catch_up,
        "catch_up_cap": record.catch_up_cap,
        "max_lateness": record.max_lateness,
        "overlap": record.overlap,
        "max_retries": record.max_retries,
        "retry_base_seconds": record.retry_base_seconds,
        "ceiling": loads(record.ceiling),
    }


def _run_view(named: NamedRun) -> RunView:
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
        state=run.state,
        reason=run.reason,
        error=run.error,
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


def _send_result(record: RoutineRecord, done: Dispatched) -> SendResult:
    return SendResult(
        routine=record.name,
        run_id=done.existing_id or done.run.id,
        idempotency_key=done.run.idempotency_key,
        attempt=done.run.attempt,
        scheduled_for=done.run.scheduled_for,
        outcome=done.outcome,
        existing_state=done.existing_state,
        error=done.error,
    )


def _iso(instant: datetime | None) -> str:
    return instant.astimezone(UTC).isoformat() if instant is not None else "?"


def _safe_url(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable url>"
