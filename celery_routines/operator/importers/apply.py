"""Writing an import plan: upsert by name, in one transaction.

The rules, for every planned routine:

- not stored: added (``source = 'import'``, the plan's owner), paused if
  asked; its first window is the next one after the source's ``last_run_at``
  (so nothing the old scheduler already sent fires again), or, when the
  source never ran it, the first one after beat adopts it;
- stored by the same import: the definition columns that differ are updated.
  While the routine has no run of ours yet (the switch-over has not
  happened), its next window follows the source's ``last_run_at`` again, so
  re-running the import just before stopping the old beat hands over exactly
  where it stopped. After that our run history owns the next window, unless
  the schedule itself changed;
- declared in code, or (for a database or Redis source) stored under
  another owner: not touched, listed with the reason.

A dry run does all of it and rolls back, so the plan it prints is the one a
real run would write. On a store with no tables yet (no SQLite file at all)
it plans against an empty store and writes nothing, not even the schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery_routines.declare import process_user
from celery_routines.errors import ScheduleError
from celery_routines.operator.definitions import same_value, shown_value
from celery_routines.operator.importers.plan import (
    ImportLine,
    ImportPlan,
    ImportResult,
    Planned,
)
from celery_routines.operator.listing import owner_of
from celery_routines.policy.notify_hosts import door_refusal
from celery_routines.registry import definitions_for
from celery_routines.schedules.base import NEVER, first_window, is_never
from celery_routines.schedules.interval import whole_second_after
from celery_routines.schedules.jitter import send_instant
from celery_routines.schedules.parse import schedule_of
from celery_routines.store import RoutineRecord, migrate
from celery_routines.store.declarations import CODE, IMPORT_PAUSE_REASON, SCHEDULE_COLUMNS
from celery_routines.store.imports import ImportQueries

if TYPE_CHECKING:
    from celery_routines.operator.admin import Routines

SOURCE = "import"
NO_TABLES = (
    "the store has no tables yet: this plan is against an empty store, and the import "
    "creates them (as `celery routines migrate` does)"
)


class _RollBack(Exception):
    """Raised inside the transaction of a dry run to undo it."""


@dataclass
class _Batch:
    """What one import writes in bulk at its end (in its transaction)."""

    new: list[dict[str, Any]] = field(default_factory=list)
    changes: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    # Routines whose next window the import computed (to fingerprint).
    scheduled: list[str] = field(default_factory=list)


class Importer:
    """Carries out import plans through the admin API's store and clock."""

    def __init__(self, admin: Routines) -> None:
        self.admin = admin
        self.queries = ImportQueries(admin.store.engine)
        # The names the app's code declares (read by apply()): beat takes
        # those routines over from the import when it starts.
        self.declared: frozenset[str] = frozenset()

    def apply(
        self,
        plan: ImportPlan,
        *,
        paused: bool = False,
        dry_run: bool = False,
        prune: bool = False,
        by: str | None = None,
    ) -> ImportResult:
        by = by or process_user()
        lines: list[ImportLine] = [
            ImportLine(u.name, "not imported", reason=u.reason) for u in plan.unmappable
        ]
        lines += [ImportLine(u.name, "left alone", reason=u.reason) for u in plan.left]
        notes: list[str] = []
        self.declared = self._declared_in_code(notes)
        store = self.admin.store
        if dry_run and not migrate.has_schema(store.engine):
            # Nothing is stored yet, so every entry would be added: the plan
            # needs no table, and a dry run creates none (nor a SQLite file).
            lines += self._plan(plan, paused, prune, {}, set(), self.admin.clock())[0]
            notes.append(NO_TABLES)
            return ImportResult(plan.source, dry_run, lines, by, plan.behaviour, notes)
        if not dry_run:
            store.migrate()  # like `sync`: moving in may be the store's first use
        try:
            with store.connections.transaction():
                lines += self._write(plan, paused, prune, by)
                if dry_run:
                    raise _RollBack
        except _RollBack:
            pass
        return ImportResult(plan.source, dry_run, lines, by, plan.behaviour, notes)

    def _declared_in_code(self, notes: list[str]) -> frozenset[str]:
        """The names the app declares in code (what its beat writes at start)."""
        app = self.admin.app
        if app is None:
            return frozenset()
        try:
            # As `sync` does: modules in `imports`/`include` declare routines.
            app.loader.import_default_modules()
        except ImportError as exc:
            # The plan itself does not need them: say what it cannot tell.
            notes.append(
                f"the app's modules did not import ({type(exc).__name__}: {exc}): "
                "routines its code declares are not marked"
            )
        return frozenset(d.name for d in definitions_for(app, []))

    def _write(self, plan: ImportPlan, paused: bool, prune: bool, by: str) -> list[ImportLine]:
        now = self.admin.clock()
        stored = {r.name: r for r in self.admin.store.routines.all()}
        planned_names = {p.definition.name for p in plan.routines}
        with_runs = self.queries.with_runs(
            r.id for name, r in stored.items() if name in planned_names
        )
        lines, batch = self._plan(plan, paused, prune, stored, with_runs, now)
        self.queries.insert_many(batch.new)
        self.queries.record_changes(batch.changes, by, now)
        self.queries.fingerprint(batch.scheduled)
        return lines

    def _plan(
        self,
        plan: ImportPlan,
        paused: bool,
        prune: bool,
        stored: Mapping[str, RoutineRecord],
        with_runs: set[int],
        now: datetime,
    ) -> tuple[list[ImportLine], _Batch]:
        """The lines of ``plan`` against the ``stored`` routines; the updates
        of stored routines are written here, the additions left in the batch."""
        planned_names = {p.definition.name for p in plan.routines}
        lines, batch = [], _Batch()
        for planned in plan.routines:
            record = stored.get(planned.definition.name)
            line = self._one(
                plan,
                planned,
                record,
                batch,
                routine_id_has_runs=with_runs,
                paused=paused,
                now=now,
            )
            lines.append(_code_note(line, record, paused, self.declared))
        if prune:
            # An entry the file has but that does not read is not "no longer
            # in the file": its routine stays as stored.
            kept = planned_names | {u.name for u in plan.unmappable}
            for record in stored.values():
                if record.name in kept or not _prunable(record):
                    continue
                self.queries.update(
                    record.id,
                    {
                        "retired_at": now,
                        "next_run_at": None,
                        "schedule_fingerprint": None,
                        "updated_at": now,
                    },
                )
                batch.changes.append((record.name, "retired", {"by_import": plan.source}))
                lines.append(ImportLine(record.name, "retired", reason="not in the file"))
        return lines, batch

    def _one(
        self,
        plan: ImportPlan,
        planned: Planned,
        record: RoutineRecord | None,
        batch: _Batch,
        *,
        routine_id_has_runs: set[int],
        paused: bool,
        now: datetime,
    ) -> ImportLine:
        """Write one routine (or add it to ``batch``); the line saying what happened."""
        definition = planned.definition
        name = definition.name
        columns = {k: v for k, v in definition.columns().items() if k != "name"}
        host_refused = door_refusal(definition.notify_url, self.admin.settings.notify_allowed_hosts)
        if host_refused is not None:
            return ImportLine(name, "not imported", reason=host_refused)
        try:
            next_run_at = self._next_window(planned, now)
        except ScheduleError as exc:
            return ImportLine(name, "not imported", reason=str(exc))
        detail: dict[str, Any] = {"from": plan.source}
        if planned.description:
            detail["description"] = planned.description
        if planned.last_run_at is not None:
            detail["last_run_at"] = planned.last_run_at.isoformat()
        if record is None:
            batch.new.append(
                {
                    "name": name,
                    **columns,
                    "source": SOURCE,
                    "owner": plan.owner,
                    "created_at": now,
                    "updated_at": now,
                    "next_run_at": next_run_at,
                    "paused": paused,
                    "paused_reason": IMPORT_PAUSE_REASON if paused else None,
                }
            )
            fields = {k: shown_value(k, v) for k, v in columns.items() if v is not None}
            batch.changes.append((name, "imported", {**detail, **fields}))
            if next_run_at is not None:
                batch.scheduled.append(name)
            return ImportLine(name, "added", fields, next_run_at)
        refused = self._refusal(plan, record, columns)
        if refused is not None:
            return refused
        changed = {k: v for k, v in columns.items() if not same_value(k, getattr(record, k), v)}
        values: dict[str, Any] = dict(changed)
        reschedule = any(k in changed for k in SCHEDULE_COLUMNS) or record.retired_at is not None
        fresh = record.id not in routine_id_has_runs and planned.last_run_at is not None
        if reschedule or (fresh and next_run_at != record.next_run_at):
            values.update(next_run_at=next_run_at, schedule_fingerprint=None, last_error=None)
        if record.retired_at is not None:
            values["retired_at"] = None
        if paused and not record.paused:
            values.update(paused=True, paused_reason=IMPORT_PAUSE_REASON)
        if not values:
            return ImportLine(name, "unchanged", {}, record.next_run_at)
        self.queries.update(record.id, {**values, "updated_at": now})
        fields = {
            k: shown_value(k, v)
            for k, v in values.items()
            if k not in ("schedule_fingerprint", "last_error", "paused_reason")
        }
        batch.changes.append((name, "reimported", {**detail, **fields}))
        if "next_run_at" in values and next_run_at is not None:
            batch.scheduled.append(name)
        return ImportLine(name, "updated", fields, values.get("next_run_at", record.next_run_at))

    def _refusal(
        self, plan: ImportPlan, record: RoutineRecord, columns: Mapping[str, Any]
    ) -> ImportLine | None:
        name = record.name
        if record.source == "code" and record.retired_at is None:
            if all(same_value(k, getattr(record, k), v) for k, v in columns.items()):
                return ImportLine(name, "unchanged", {}, record.next_run_at)
            return ImportLine(
                name,
                "not imported",
                reason=f"declared in the code of app {record.owner!r}: change it there",
            )
        if plan.exclusive and record.owner != plan.owner:
            return ImportLine(
                name,
                "not imported",
                reason=f"a routine of this name is already stored ({owner_of(record)}, "
                f"owner {record.owner or '-'}): rename or delete one of them",
            )
        return None

    def _next_window(self, planned: Planned, now: datetime) -> datetime | None:
        """The first window after the source's last run. When the source
        never ran it: None (beat starts it from its adoption, as a routine
        added by hand), unless it has no window left (an expired task),
        which is ``done`` at once."""
        definition = planned.definition
        zone = definition.timezone or self.admin.settings.timezone
        schedule = schedule_of(definition, zone)
        if planned.last_run_at is None:
            return NEVER if is_never(first_window(schedule, now)) else None
        window = schedule.next_after(planned.last_run_at)
        if definition.interval_seconds is not None:
            # The source's last run carries microseconds; the grid does not.
            window = whole_second_after(window)
        return send_instant(window, definition.name, definition.jitter)


def _code_note(
    line: ImportLine, record: RoutineRecord | None, paused: bool, declared: frozenset[str]
) -> ImportLine:
    """``line`` with what beat will do to it when the code declares it too:
    take it over at its start, with the code's definition, and end a pause
    that only the import made."""
    if line.name not in declared or line.action not in ("added", "updated", "unchanged"):
        return line
    if record is not None and record.source == CODE and record.retired_at is None:
        return line  # the code's already
    note = "declared in code too: beat takes it over when it starts, with the code's definition"
    if record is None or not record.paused:
        import_paused = paused
    else:
        import_paused = record.paused_reason == IMPORT_PAUSE_REASON
    if import_paused:
        note += ", and resumes it"
    elif record is not None and record.paused:
        note += "; it stays paused (not paused by an import)"
    return replace(line, note=note)


def _prunable(record: RoutineRecord) -> bool:
    """What ``import file --prune`` may retire: routines not declared in
    code (those are retired by their own app), not already retired."""
    return record.source != "code" and record.retired_at is None
