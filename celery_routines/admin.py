"""The operator's API: what ``celery routines ...`` does, callable from Python.

``Routines(app)`` reads, pauses, resumes and sends routines; every answer is a
plain frozen dataclass. Errors are celery-routines exceptions whose message
names the routine or the bad value (``UnknownRoutine``, ``InvalidRoutine``,
``ValueError`` subclasses). This module decides; the store holds the SQL,
:mod:`celery_routines.dispatch` carries out sends in the tick's order,
:mod:`celery_routines.admin_views` holds the answers and
:mod:`celery_routines.admin_windows` the pure time and window helpers.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from celery import Celery
from sqlalchemy.engine import make_url

from .admin_views import (
    BackfillResult,
    CeilingUsage,
    MigrateResult,
    PauseResult,
    RoutineDetail,
    RoutineSummary,
    RunView,
    SendResult,
    SyncResult,
    WindowView,
    definition_of,
    describe_schedule,
    iso_utc,
    routine_state,
    run_view,
    send_result,
    window_view,
)
from .admin_windows import (
    MAX_PREVIEW,
    check_count,
    count_windows,
    last_window,
    parse_instant,
    preview,
    range_windows,
    take_windows,
    to_instant,
)
from .ceilings import Ceiling, decide_before_send, parse_ceilings, period_bounds
from .clock import Clock, utc_now
from .config import Settings, settings_from
from .dispatch import SENT, Dispatched, dispatch
from .errors import InvalidRoutine, RoutinesError, ScheduleError, UnknownRoutine
from .events import RoutineEvents
from .overlap import in_progress
from .publish import CeleryPublisher, Publisher
from .registry import definitions_for
from .schedules.base import Schedule
from .schedules.keys import window_key
from .schedules.parse import schedule_from_columns
from .schedules.zones import load_zone
from .store import NewRun, RoutineRecord, RunRecord, Store, migrate
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
    "SyncResult",
    "UnknownRun",
    "WindowView",
    "parse_instant",
    "preview",
]

# A backfill larger than this is almost always a typo in --from; the caller
# can raise it explicitly.
MAX_BACKFILL = 1000
MAX_LIMIT = 10_000
REPLAYABLE_STATES = ("failed", "skipped", "lost")
# Overlap policies under which a manual send must not start next to an open run.
EXCLUSIVE_OVERLAP = ("skip", "queue")


class UnknownRun(RoutinesError, LookupError):
    """No run with this id is stored."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run with id {run_id!r} is stored")


class OperationRefused(RoutinesError, ValueError):
    """A send would break the routine's overlap policy or ceiling."""


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
        retries = self.store.admin.next_retries()
        return [
            self._summary(r, latest.get(r.id), now, retries.get(r.id))
            for r in self.store.routines.all()
        ]

    def show(self, name: str, windows: int = 5) -> RoutineDetail:
        check_count("windows", windows, MAX_PREVIEW)
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
                rest = take_windows(schedule, record.next_run_at, windows - 1)
            else:
                first, rest = [], take_windows(schedule, now, windows)
            next_windows = [
                window_view(schedule, w, window_key(record.name, w, timezone))
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
        # A retrying run is not finished: its next attempt is only waiting for
        # retry_at, so it counts as open here (the overlap rule does not wait
        # for it, which is why _open_runs leaves it out).
        retrying = sorted(
            (
                run_view(row)
                for row in self.store.admin.runs(
                    routine_id=record.id, states=["retrying"], limit=MAX_LIMIT
                )
            ),
            key=lambda run: (run.retry_at is None, run.retry_at or now),
        )
        next_retry = retrying[0] if retrying and retrying[0].retry_at is not None else None
        return RoutineDetail(
            summary=self._summary(record, latest, now, next_retry),
            definition=definition_of(record),
            next_windows=next_windows,
            ceilings=ceilings,
            open_runs=len(self._open_runs(record, now)) + len(retrying),
            retrying=retrying,
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
        check_count("limit", limit, MAX_LIMIT)
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
        return [run_view(row) for row in rows]

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
                skip, next_run_at = self._paused_windows(record, record.next_run_at, now)
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

    def _paused_windows(
        self, record: RoutineRecord, due: datetime, now: datetime
    ) -> tuple[NewRun, datetime]:
        """The skip row for the windows in ``[due, now]`` and the next window."""
        schedule = self._schedule(record)
        count = 1 + count_windows(schedule, due, now)
        last = (last_window(schedule, due, now) or [due])[-1]
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
        return send_result(record, self._dispatch(record, [run], "trigger")[0])

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
                f"{iso_utc(run.skipped_first)} to {iso_utc(run.skipped_last)}; send them with "
                f"backfill --from {iso_utc(run.skipped_first)} --to {iso_utc(run.skipped_last)}",
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
        return send_result(record, self._dispatch(record, [new], "replay")[0])

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
        check_count("max_windows", max_windows, 1_000_000)
        record = self._record(name)
        now = self.clock()
        timezone = self._zone_of(record)
        first = to_instant(start, timezone, now, "--from")
        last = to_instant(end, timezone, now, "--to")
        if last < first:
            raise ValueError(f"--to {iso_utc(last)} is before --from {iso_utc(first)}")
        if last > now:
            raise ValueError(
                f"--to {iso_utc(last)} is in the future (now is {iso_utc(now)}); backfill sends "
                "past windows only, beat sends the rest"
            )
        try:
            schedule = self._schedule(record)
            windows = range_windows(schedule, record, first, last, max_windows)
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
        return BackfillResult(record.name, first, last, [send_result(record, d) for d in results])

    # -- schema ------------------------------------------------------------

    def migrate(self) -> MigrateResult:
        before = migrate.current_revision(self.store.engine)
        self.store.migrate()
        return MigrateResult(
            database=_safe_url(self.settings.database_url),
            before=before,
            after=migrate.head_revision(),
        )

    def sync(self) -> SyncResult:
        """Write the routines declared in code (``routine()``, ``register()``,
        ``beat_schedule``) to the store, exactly as beat does when it starts,
        so they can be listed and operated before any beat has run."""
        if self.app is None:
            raise RoutinesError(
                "sync needs the Celery app that declares the routines: build Routines(app)"
            )
        # Modules listed in `imports`/`include` declare routines when imported.
        self.app.loader.import_default_modules()
        definitions = definitions_for(self.app)
        self.store.migrate()
        self.store.routines.upsert_definitions([d.columns() for d in definitions], self.clock())
        return SyncResult(_safe_url(self.settings.database_url), [d.name for d in definitions])

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
        return to_instant(since, "UTC", self.clock(), "--since")

    def _summary(
        self,
        record: RoutineRecord,
        latest: RunRecord | None,
        now: datetime,
        next_retry: RunRecord | RunView | None = None,
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
            schedule=describe_schedule(record),
            timezone=timezone,
            next_run_utc=record.next_run_at,
            next_run_local=local,
            state=routine_state(record, now),
            last_outcome=outcome,
            last_run_at=latest.created_at if latest is not None else None,
            next_retry_at=next_retry.retry_at if next_retry is not None else None,
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
        """Runs in progress, by beat's own overlap rule."""
        found = self.store.runs.open_runs([record.id]).get(record.id, [])
        return in_progress(found, set(), now)

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
                f"(until {iso_utc(u.period_end)})"
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


def _safe_url(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable url>"
