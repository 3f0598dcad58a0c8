"""The operator's API: what ``celery routines ...`` does, callable from Python.

``Routines(app)`` reads, pauses, resumes and sends routines; every answer is a
plain frozen dataclass. Errors are celery-routines exceptions whose message
names the routine or the bad value (``UnknownRoutine``, ``InvalidRoutine``,
``ValueError`` subclasses). This module decides; the store holds the SQL,
:mod:`celery_routines.dispatch` carries out sends in the tick's order,
:mod:`celery_routines.admin_views` holds the answers and
:mod:`celery_routines.operator.windows` the pure time and window helpers.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from datetime import datetime

from celery import Celery

from celery_routines.clock import Clock, utc_now
from celery_routines.config import Settings, settings_from
from celery_routines.declare import declare, process_user
from celery_routines.errors import InvalidRoutine, RoutinesError, ScheduleError
from celery_routines.observe.events import RoutineEvents
from celery_routines.operator.bulk import BulkActions, pause_reason
from celery_routines.operator.lifecycle_views import (
    ChangeResult,
    ChangeView,
    DeleteResult,
    PruneResult,
)
from celery_routines.operator.listing import RoutineListing
from celery_routines.operator.lookup import RoutineLookup
from celery_routines.operator.manage import RoutineEditor
from celery_routines.operator.previews import preview, routine_windows
from celery_routines.operator.routine_stats import RoutineRecords
from celery_routines.operator.sending import (
    MAX_BACKFILL,
    OperationRefused,
    OperatorSends,
    UnknownRun,
)
from celery_routines.operator.views import (
    BackfillResult,
    CeilingUsage,
    MigrateResult,
    PauseResult,
    RoutineDetail,
    RoutinePreview,
    RoutineSummary,
    RunView,
    SendResult,
    SyncResult,
    WindowView,
    definition_of,
    describe_schedule,
    next_excluded_text,
    routine_state,
    run_view,
)
from celery_routines.operator.windows import (
    MAX_PREVIEW,
    check_count,
    parse_instant,
)
from celery_routines.policy.states import RUN_STATES, Reason, RunState
from celery_routines.registry import InvalidEntry, definitions_for
from celery_routines.sending.publish import Publisher
from celery_routines.store import NewRun, Store, migrate
from celery_routines.store.engine import safe_url

__all__ = [
    "MAX_BACKFILL",
    "BackfillResult",
    "CeilingUsage",
    "ChangeResult",
    "ChangeView",
    "DeleteResult",
    "MigrateResult",
    "OperationRefused",
    "PauseResult",
    "PruneResult",
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

MAX_LIMIT = 10_000


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
        self.store = store or Store.from_settings(self.settings)
        self._owns_store = store is None
        # Skips an operator causes (a resume) and manual sends go out as
        # Celery events like beat's own; without an app there is no broker.
        self.events = events or (
            RoutineEvents(self.app, store=self.store) if self.app is not None else None
        )
        # The parts: what they all look up, then the sends, the changes and
        # the panel's reads. Their operations are this object's own.
        self.lookup = RoutineLookup(self.store, self.settings, clock)
        self.sends = OperatorSends(
            self.lookup, self.store, self.settings, clock, self.events, self.app, publisher
        )
        self.editor = RoutineEditor(self.lookup, self.store, self.settings, clock, self.events)
        self.listing = RoutineListing(self.lookup, self.store, self.settings, clock)
        self.trigger = self.sends.trigger
        self.replay = self.sends.replay
        self.backfill = self.sends.backfill
        self.backfill_plan = self.sends.backfill_plan
        self.add = self.editor.add
        self.edit = self.editor.edit
        self.check_editable = self.editor.check_editable
        self.enable = self.editor.enable
        self.disable = self.editor.disable
        self.delete = self.editor.delete
        self.history = self.editor.history
        self.prune = self.editor.prune
        self.page = self.listing.page
        self.owner = self.listing.owner
        self.lateness = self.listing.lateness
        # One action on many routines, each through the operations below.
        self.bulk = BulkActions(self)
        # Each routine's record: counts, rates, percentiles, a 30-day strip.
        self.stats = RoutineRecords(self)

    def close(self) -> None:
        self.sends.close()
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
            self.lookup.summary(r, latest.get(r.id), now, retries.get(r.id))
            for r in self.store.routines.all()
        ]

    def show(self, name: str, windows: int = 5) -> RoutineDetail:
        check_count("windows", windows, MAX_PREVIEW)
        record = self.lookup.record(name)
        now = self.clock()
        # This routine's newest run only (latest_runs() reads every routine's).
        newest = self.store.panel.recent_runs([record.id], 1)[record.id]
        latest = newest[0] if newest else None
        timezone = self.lookup.zone_of(record)
        next_windows: builtins.list[WindowView] = []
        schedule_error = next_excluded = None
        try:
            schedule = self.lookup.schedule(record)
            next_excluded = next_excluded_text(schedule, now, timezone)
            # The stored next window is the first one; an unscheduled routine
            # (beat has not adopted it yet) starts where beat would adopt it
            # from now, as list says (previews.routine_windows).
            next_windows = routine_windows(record, schedule, timezone, None, windows, now)
        except ScheduleError as exc:
            schedule_error = str(exc)
        ceiling_error = None
        try:
            ceilings = self.lookup.usage(record, now)
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
            summary=self.lookup.summary(record, latest, now, next_retry),
            definition=definition_of(record),
            next_windows=next_windows,
            ceilings=ceilings,
            open_runs=len(self.lookup.open_runs(record, now)) + len(retrying),
            retrying=retrying,
            last_error=record.last_error,
            suspended_until=record.suspended_until,
            suspended_reason=record.suspended_reason,
            schedule_error=schedule_error,
            ceiling_error=ceiling_error,
            next_excluded=next_excluded,
        )

    def preview(
        self, name: str, start: datetime | str | None = None, n: int = 10
    ) -> RoutinePreview:
        """The next ``n`` windows of the stored routine ``name`` (from
        ``start``, inclusive, read in its zone): its schedule, zone,
        exclusions, shift and bounds, on its own grid, as beat fires them."""
        record = self.lookup.record(name)
        timezone = self.lookup.zone_of(record)
        now = self.clock()
        try:
            schedule = self.lookup.schedule(record)
        except ScheduleError as exc:
            raise InvalidRoutine(name, str(exc)) from None
        windows = routine_windows(record, schedule, timezone, start, n, now)
        state = routine_state(record, now)
        return RoutinePreview(name, describe_schedule(record), timezone, windows, state)

    def runs(
        self,
        name: str | None = None,
        *,
        state: str | Sequence[str] | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        limit: int = 50,
    ) -> builtins.list[RunView]:
        """Run rows, newest first; ``since`` and ``until`` (UTC unless they
        say otherwise) filter on when the row was written."""
        check_count("limit", limit, MAX_LIMIT)
        states = [state] if isinstance(state, str) else list(state or [])
        for value in states:
            if value not in RUN_STATES:
                raise ValueError(f"state {value!r} is unknown; use one of {', '.join(RUN_STATES)}")
        routine_id = self.lookup.record(name).id if name is not None else None
        rows = self.store.admin.runs(
            routine_id=routine_id,
            states=states,
            since=self.lookup.since(since),
            until=self.lookup.since(until, "--until"),
            limit=limit,
        )
        return [run_view(row) for row in rows]

    def skips(
        self, since: datetime | str | None = None, limit: int = 1000
    ) -> builtins.list[RunView]:
        """Every decision not to fire: skipped run rows with reason and count."""
        return self.runs(state=RunState.SKIPPED, since=since, limit=limit)

    # -- pause and resume --------------------------------------------------

    def pause(self, name: str, *, reason: str | None = None, by: str | None = None) -> PauseResult:
        """Stop firing; ``reason`` (a short text) shows wherever it shows as paused."""
        text = pause_reason(reason, required=False)
        record = self.lookup.record(name)
        now = self.clock()
        changed = self.store.admin.pause(record.id, now, text)
        if changed:
            detail = {"reason": text} if text else None
            self.store.changes.record(record.name, "paused", by or process_user(), now, detail)
        return PauseResult(record.name, True, changed, record.next_run_at)

    def resume(self, name: str, *, catch_up: bool = False, by: str | None = None) -> PauseResult:
        """Unpause. By default the windows that fell due while paused are
        recorded as one ``skipped`` row (reason ``paused``) and the routine
        continues with its first window after now: a pause is a decision, not
        an outage, so it never comes back as a burst. With ``catch_up=True``
        the next window is left as it was and beat treats the paused windows
        like downtime, under the routine's ``catch_up`` policy and cap.
        """
        record = self.lookup.record(name)
        now = self.clock()
        skip: NewRun | None = None
        next_run_at = record.next_run_at
        if not catch_up and record.next_run_at is not None and record.next_run_at <= now:
            try:
                skip, next_run_at = self.lookup.missed(
                    record, record.next_run_at, now, Reason.PAUSED
                )
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
                    reason=Reason.PAUSED,
                    count=skipped,
                    first=skip.skipped_first or skip.scheduled_for,
                    last=skip.scheduled_for,
                    run_id=skip.id,
                )
        if not changed:
            next_run_at = record.next_run_at
        else:
            detail = {"catch_up": catch_up, "skipped_windows": skipped}
            self.store.changes.record(record.name, "resumed", by or process_user(), now, detail)
        return PauseResult(record.name, False, changed, next_run_at, skipped)

    # -- schema ------------------------------------------------------------

    def migrate(self) -> MigrateResult:
        before = migrate.current_revision(self.store.engine)
        self.store.migrate()
        return MigrateResult(
            database=safe_url(self.settings.database_url),
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
        invalid: builtins.list[InvalidEntry] = []
        definitions = definitions_for(self.app, invalid)
        self.store.migrate()
        declared = declare(
            self.store,
            definitions,
            self.clock(),
            owner=self.settings.owner,
            stamp=self.settings.code_version or self.clock().isoformat(),
            default_zone=self.settings.timezone,
            events=self.events,
            invalid=invalid,
        )
        return SyncResult(
            safe_url(self.settings.database_url),
            [d.name for d in definitions],
            retired=declared.retired,
            revived=[r.name for r in declared.revived],
            resumed=declared.resumed,
            newer_stamp=declared.newer_stamp,
        )
