"""Managing routines without code: add, edit, enable, disable, delete, their
history, and pruning the run history (the lifecycle half of
:class:`celery_routines.operator.admin.Routines`).

Every definition goes through :func:`celery_routines.policy.routine.define`,
the door code declarations use, so a bad value gets the same message from
``celery routines add`` as from ``@routine``. A routine declared in code is
refused here (its definition lives in the code, which would overwrite the
edit at the next start), with the message naming where it is declared.
Every change is written to ``routine_changes`` with who made it.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.exc import IntegrityError

from celery_routines.clock import Clock
from celery_routines.config import Settings
from celery_routines.declare import process_user
from celery_routines.errors import InvalidRoutine, ScheduleError, UnknownRoutine
from celery_routines.observe.events import RoutineEvents
from celery_routines.operator.definitions import (
    current_options,
    given_options,
    instants,
    same_value,
    shown_value,
)
from celery_routines.operator.lifecycle_views import (
    ChangeResult,
    ChangeView,
    DeleteResult,
    PruneResult,
)
from celery_routines.operator.lookup import RoutineLookup
from celery_routines.operator.texts import duration
from celery_routines.operator.windows import check_count
from celery_routines.policy.notify_hosts import door_refusal
from celery_routines.policy.routine import Routine, define
from celery_routines.policy.states import Reason
from celery_routines.schedules.base import first_window
from celery_routines.schedules.parse import schedule_of
from celery_routines.schedules.rrule import looks_like_rrule
from celery_routines.schedules.solar import SolarSchedule
from celery_routines.schedules.union import spec_list
from celery_routines.store import RoutineRecord, Store
from celery_routines.store.declarations import SCHEDULE_COLUMNS
from celery_routines.tick.prune import prune_once

SOURCE = "cli"
# Columns that decide when a routine fires: changing one reschedules it.
SCHEDULE_FIELDS = SCHEDULE_COLUMNS
# The most rows one `prune` call deletes before it returns (it works in batches).
PRUNE_CALL_LIMIT = 10_000_000


class RoutineEditor:
    """Adds, changes, enables, disables and deletes routines, and prunes
    their run history (``Routines.editor``)."""

    def __init__(
        self,
        lookup: RoutineLookup,
        store: Store,
        settings: Settings,
        clock: Clock,
        events: RoutineEvents | None,
    ) -> None:
        self.lookup = lookup
        self.store = store
        self.settings = settings
        self.clock = clock
        self.events = events

    # -- definitions -----------------------------------------------------------

    def add(
        self,
        name: str,
        task: str,
        *,
        by: str | None = None,
        cron: str | list[str] | None = None,
        every: Any = None,
        rrule: str | None = None,
        solar: str | None = None,
        at: Any = None,
        **values: Any,
    ) -> ChangeResult:
        """Store a new routine (``source = 'cli'``); beat adopts it within
        ``routines_refresh_seconds``. ``values``: its options by their
        ``Routine`` field names (``timezone``, ``ceilings``, ``max_lateness``
        ...; :data:`celery_routines.policy.routine.OPTIONS`), as the CLI types them."""
        definition = new_definition(
            name, task, self.settings.timezone,
            cron=cron, every=every, rrule=rrule, solar=solar, at=at, **values,
        )  # fmt: skip
        self._check_notify_host(name, definition.notify_url)
        by = by or process_user()
        now = self.clock()
        fires_within_bound(definition, self.settings.timezone, now)
        columns = definition.columns()
        if self.store.routines.by_name(name) is not None:
            raise _exists(name)
        try:
            self.store.changes.insert_routine(columns, SOURCE, now)
        except IntegrityError:
            raise _exists(name) from None
        written = {k: shown_value(k, v) for k, v in columns.items() if k != "name"}
        self.store.changes.record(name, "added", by, now, written)
        return ChangeResult(name, "added", True, written, None, 0, by)

    def edit(
        self,
        name: str,
        *,
        by: str | None = None,
        cron: str | list[str] | None = None,
        every: Any = None,
        rrule: str | None = None,
        solar: str | None = None,
        at: Any = None,
        **values: Any,
    ) -> ChangeResult:
        """Change a routine added outside the code. A new schedule or zone
        takes effect from now (the stale next window never fires); any other
        change applies to the next window."""
        record = self.lookup.record(name)
        _refuse_code(record, "edit")
        new_schedule = any(kind is not None for kind in (cron, every, rrule, solar))
        if new_schedule:
            _schedule_of(name, cron, every, rrule, solar)  # one kind only, before anything
        zone = values.get("timezone") or self.lookup.zone_of(record)
        bounds = {bound: values.pop(bound, None) for bound in ("starts_at", "ends_at")}
        at, starts_at, ends_at = instants(name, zone, at=at, **bounds)
        current = current_options(record)
        if new_schedule:
            current.pop("at", None)  # a new repeating schedule replaces a one-off
        current.update(given_options(at=at, starts_at=starts_at, ends_at=ends_at, **values))
        if new_schedule:
            schedule: Any = _schedule_of(name, cron, every, rrule, solar)
        elif "at" in current:
            schedule = None  # a one-off (given now, or stored)
        elif record.solar is not None:
            schedule = SolarSchedule.from_spec(record.solar)
        elif record.rrule is not None:
            schedule = record.rrule
        elif record.schedules is not None:
            schedule = spec_list(record.schedules)
        elif record.cron is not None:
            schedule = record.cron
        else:
            schedule = timedelta(seconds=record.interval_seconds or 0)
        definition = define(record.task, schedule, name=name, **current)
        fires_within_bound(definition, self.settings.timezone, self.clock())
        columns = definition.columns()
        changed = {
            k: v
            for k, v in columns.items()
            if k != "name" and not same_value(k, getattr(record, k), v)
        }
        if "notify_url" in changed:
            self._check_notify_host(name, changed["notify_url"])
        by = by or process_user()
        if not changed:
            return ChangeResult(name, "edited", False, {}, record.next_run_at, 0, by)
        reschedule = any(k in changed for k in SCHEDULE_FIELDS)
        now = self.clock()
        self.store.changes.update_routine(record.id, changed, now, reschedule=reschedule)
        shown = {k: shown_value(k, v) for k, v in changed.items()}
        self.store.changes.record(name, "edited", by, now, shown)
        next_run_at = None if reschedule else record.next_run_at
        return ChangeResult(name, "edited", True, shown, next_run_at, 0, by)

    def _check_notify_host(self, name: str, url: str | None) -> None:
        """A notify_url whose host is itself an address notifications may not
        reach is refused here, where the settings are known (the sender
        checks every resolved address again before it posts)."""
        refused = door_refusal(url, self.settings.notify_allowed_hosts)
        if refused is not None:
            raise InvalidRoutine(name, refused)

    def check_editable(self, name: str) -> None:
        """Raise :class:`OwnedByCode` (naming where) for a live code routine,
        :class:`UnknownRoutine` for none: what ``edit`` refuses first."""
        _refuse_code(self.lookup.record(name), "edit")

    def enable(self, name: str, *, by: str | None = None) -> ChangeResult:
        """Enable a disabled routine, like ``resume``: the windows that fell
        due while it was disabled are one ``skipped`` row (reason
        ``disabled``), and it continues with its first window after now."""
        record = self.lookup.record(name)
        _refuse_code(record, "enable")
        by = by or process_user()
        if record.enabled:
            return ChangeResult(name, "enabled", False, {}, record.next_run_at, 0, by)
        now = self.clock()
        skip, next_run_at = None, record.next_run_at
        if next_run_at is not None and next_run_at <= now and record.last_error is None:
            try:
                skip, next_run_at = self.lookup.missed(record, next_run_at, now, Reason.DISABLED)
            except ScheduleError:
                skip, next_run_at = None, None  # beat's invalid path says why
        self.store.changes.update_routine(
            record.id, {"enabled": True, "next_run_at": next_run_at}, now, reschedule=False
        )
        self.store.changes.refingerprint(record.id)
        skipped = 0
        if skip is not None and self.store.runs.insert_new([skip], now):
            skipped = skip.skipped_count or 0
            if self.events is not None:
                self.events.skipped(
                    name,
                    reason=Reason.DISABLED,
                    count=skipped,
                    first=skip.skipped_first or skip.scheduled_for,
                    last=skip.scheduled_for,
                    run_id=skip.id,
                )
        self.store.changes.record(name, "enabled", by, now, {"skipped_windows": skipped})
        return ChangeResult(name, "enabled", True, {"enabled": True}, next_run_at, skipped, by)

    def disable(self, name: str, *, by: str | None = None) -> ChangeResult:
        """Stop firing a routine until it is enabled again (its history stays)."""
        record = self.lookup.record(name)
        _refuse_code(record, "disable")
        by = by or process_user()
        if not record.enabled:
            return ChangeResult(name, "disabled", False, {}, record.next_run_at, 0, by)
        now = self.clock()
        self.store.changes.update_routine(record.id, {"enabled": False}, now, reschedule=False)
        self.store.changes.refingerprint(record.id)
        self.store.changes.record(name, "disabled", by, now)
        return ChangeResult(name, "disabled", True, {"enabled": False}, record.next_run_at, 0, by)

    def delete(self, name: str, *, by: str | None = None, dry_run: bool = False) -> DeleteResult:
        """Delete a retired or SQL/CLI routine and its runs (its change
        history stays); a routine still declared in code is refused.
        ``dry_run`` changes nothing and says what would go."""
        record = self.lookup.record(name)
        _refuse_code(record, "delete")
        by = by or process_user()
        if dry_run:
            counts = self.store.changes.runs_by_state(record.id)
            return DeleteResult(name, sum(counts.values()), by, True, counts)
        deleted = self.store.changes.delete_routine(record.id)
        self.store.changes.record(name, "deleted", by, self.clock(), {"runs_deleted": deleted})
        return DeleteResult(name, deleted, by)

    def history(self, name: str, limit: int = 100) -> list[ChangeView]:
        """Who changed the routine and when, newest first (also after a delete)."""
        check_count("limit", limit, 10_000)
        rows = self.store.changes.history(name, limit)
        if not rows and self.store.routines.by_name(name) is None:
            raise UnknownRoutine(name)
        return [
            ChangeView(r.id, r.routine, r.action, r.changed_by, r.changed_at, r.detail)
            for r in rows
        ]

    def prune(self, older_than: Any = None, dry_run: bool = False) -> PruneResult:
        """Delete finished runs older than ``older_than`` (default
        ``routines_keep_runs_days``), in batches of ``routines_prune_batch``,
        never an open run, a routine's newest run, or a run a ceiling still
        counts; ``dry_run`` only counts them."""
        keep = (
            timedelta(days=self.settings.keep_runs_days)
            if older_than is None
            else duration(older_than, "--older-than")
        )
        now = self.clock()
        batch, zone = self.settings.prune_batch, self.settings.timezone
        cutoff, cutoffs, deleted = prune_once(self.store, now, keep, batch, zone, dry_run=dry_run)
        total: Counter[str] = Counter(deleted)
        done = sum(deleted.values())
        while (
            not dry_run and deleted and sum(deleted.values()) >= batch and done < PRUNE_CALL_LIMIT
        ):
            _, _, deleted = prune_once(self.store, now, keep, batch, zone)
            total.update(deleted)
            done += sum(deleted.values())
        return PruneResult(cutoff, dry_run, dict(total), len(cutoffs))

    # -- internals ---------------------------------------------------------------


def fires_within_bound(definition: Routine, default_zone: str, now: datetime) -> None:
    """Refuse a definition whose schedule has no window within the schedules'
    search bound from ``now`` (exclusions that remove every window, an rrule
    that never fires again): stored, beat would only mark it invalid."""
    try:
        first_window(schedule_of(definition, definition.timezone or default_zone), now)
    except ScheduleError as exc:
        raise InvalidRoutine(definition.name, str(exc)) from None


def new_definition(
    name: str,
    task: str,
    default_zone: str,
    *,
    cron: str | list[str] | None = None,
    every: Any = None,
    rrule: str | None = None,
    solar: str | None = None,
    at: Any = None,
    starts_at: Any = None,
    ends_at: Any = None,
    **values: Any,
) -> Routine:
    """A new routine's definition from ``add``'s options, through ``define``
    (no I/O): what ``add`` stores, and what the panel's form checks as the
    user types, so both give the same messages."""
    if cron is None and every is None and at is None and rrule is None and solar is None:
        raise InvalidRoutine(
            name, "give its schedule: --cron EXPR, --every DURATION or --at INSTANT"
        )
    zone = values.get("timezone") or default_zone
    at, starts_at, ends_at = instants(name, zone, at=at, starts_at=starts_at, ends_at=ends_at)
    given = given_options(at=at, starts_at=starts_at, ends_at=ends_at, **values)
    repeating = (cron, every, rrule, solar)
    schedule = (
        None
        if all(kind is None for kind in repeating)
        else _schedule_of(name, cron, every, rrule, solar)
    )
    return define(task, schedule, name=name, **given)


def _schedule_of(
    name: str,
    cron: str | list[str] | None,
    every: Any,
    rrule: str | None = None,
    solar: str | None = None,
) -> Any:
    if cron is not None and every is not None:
        raise InvalidRoutine(name, "give either --cron or --every, not both")
    kinds = {"cron": cron, "every": every, "rrule": rrule, "solar": solar}
    given = [kind for kind, value in kinds.items() if value is not None]
    if len(given) > 1:
        raise InvalidRoutine(name, f"give one schedule, not {' and '.join(given)}")
    if cron is not None:
        return cron  # several: their union
    if rrule is not None:
        if not isinstance(rrule, str) or not looks_like_rrule(rrule):
            raise InvalidRoutine(name, f"rrule must be an RFC 5545 rule with FREQ=, got {rrule!r}")
        return rrule
    if solar is not None:
        try:
            return SolarSchedule.from_spec(solar)
        except ScheduleError as exc:
            raise InvalidRoutine(name, str(exc)) from None
    return duration(every, "--every")


class OwnedByCode(InvalidRoutine):
    """The routine is declared in the code: it is changed there (the
    panel's API answers 409 Conflict)."""


def _exists(name: str) -> InvalidRoutine:
    return InvalidRoutine(
        name, "a routine with this name is already stored; change it with `celery routines edit`"
    )


def _refuse_code(record: RoutineRecord, what: str) -> None:
    """A live code routine's definition lives in the code: refuse, naming where."""
    if record.source != "code" or record.retired_at is not None:
        return
    owner = f" of app {record.owner!r}" if record.owner else ""
    hint = (
        "; to stop it for a while use `celery routines pause`"
        if what in ("disable", "delete")
        else ""
    )
    raise OwnedByCode(
        record.name,
        f"cannot {what} it here: it is declared in the code{owner} (routine()/register()/"
        f"beat_schedule, task {record.task}); change it there, and beat applies it at its next "
        f"start (a routine removed from the code is retired, then it can be deleted){hint}",
    )
