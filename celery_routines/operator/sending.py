"""The operator's sends: trigger, replay and backfill.

Each refuses a send the routine's overlap policy or ceiling forbids (unless
forced) and hands the rows to :func:`celery_routines.sending.dispatch.dispatch`,
which writes, publishes and marks them in the tick's order.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery import Celery

from celery_routines.clock import Clock
from celery_routines.config import Settings
from celery_routines.errors import InvalidRoutine, RoutinesError, ScheduleError
from celery_routines.observe.events import RoutineEvents
from celery_routines.operator.views import (
    BackfillResult,
    CeilingUsage,
    SendResult,
    iso_utc,
    send_result,
)
from celery_routines.operator.windows import check_count, range_windows, to_instant
from celery_routines.policy.ceilings import Ceiling, decide_before_send
from celery_routines.policy.states import EXCLUSIVE_OVERLAP, RunState
from celery_routines.schedules.base import Schedule
from celery_routines.schedules.keys import window_key
from celery_routines.sending.direct import publisher_for
from celery_routines.sending.dispatch import SENT, Dispatched, dispatch
from celery_routines.sending.offload import monitored
from celery_routines.sending.publish import Publisher
from celery_routines.store import NewRun, RoutineRecord, Store
from celery_routines.store.records import OpenRun
from celery_routines.tick.declarations import who


@dataclass(frozen=True)
class BackfillPlan:
    """What a backfill of a range would send, before it is confirmed."""

    routine: str
    start: datetime
    end: datetime
    windows: int
    """Windows in the range."""
    stored: int
    """Of those, windows that already have a run row: not sent again."""

    @property
    def to_send(self) -> int:
        return self.windows - self.stored


# A backfill larger than this is almost always a typo in --from; the caller
# can raise it explicitly.
MAX_BACKFILL = 1000
REPLAYABLE_STATES = (RunState.FAILED, RunState.SKIPPED, RunState.LOST)


class UnknownRun(RoutinesError, LookupError):
    """No run with this id is stored."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run with id {run_id!r} is stored")


class OperationRefused(RoutinesError, ValueError):
    """A send would break the routine's overlap policy or ceiling."""


class Sending:
    """The sends of :class:`celery_routines.operator.admin.Routines`, which
    provides the store, the clock and the routine look-ups used here."""

    app: Celery | None
    settings: Settings
    clock: Clock
    store: Store
    events: RoutineEvents | None
    _publisher: Publisher | None

    def _record(self, name: str) -> RoutineRecord:
        raise NotImplementedError

    def _zone_of(self, record: RoutineRecord) -> str:
        raise NotImplementedError

    def _schedule(self, record: RoutineRecord) -> Schedule:
        raise NotImplementedError

    def _ceilings(self, record: RoutineRecord) -> tuple[Ceiling, ...]:
        raise NotImplementedError

    def _usage(self, record: RoutineRecord, now: datetime) -> list[CeilingUsage]:
        raise NotImplementedError

    def _open_runs(self, record: RoutineRecord, now: datetime) -> list[OpenRun]:
        raise NotImplementedError

    def trigger(self, name: str, *, force: bool = False, by: str | None = None) -> SendResult:
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
        result = send_result(record, self._dispatch(record, [run], "trigger")[0])
        self._log_change(record.name, "triggered", by, {"run_id": result.run_id, "force": force})
        return result

    def replay(self, run_id: str, *, force: bool = False, by: str | None = None) -> SendResult:
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
        result = send_result(record, self._dispatch(record, [new], "replay")[0])
        detail = {"run_id": run_id, "new_run_id": result.run_id, "force": force}
        self._log_change(record.name, "replayed", by, detail)
        return result

    def backfill(
        self,
        name: str,
        start: datetime | str,
        end: datetime | str,
        *,
        max_windows: int = MAX_BACKFILL,
        force: bool = False,
        by: str | None = None,
    ) -> BackfillResult:
        """Send the windows in ``[start, end]``, oldest first, each under its
        own window key: a window that already has a run row (sent by beat,
        skipped, or sent by an earlier backfill) is not sent again.

        Naive and string bounds are read in the routine's zone. ``end`` may
        not be in the future: beat sends those windows.
        """
        record = self._record(name)
        now = self.clock()
        first, last, runs = self._backfill_runs(record, start, end, max_windows, now)
        if not force and runs:
            new_count = len(runs) - self._stored(runs)
            if new_count:
                self._check_may_send(record, new_count, now)
        results = self._dispatch(record, runs, "backfill") if runs else []
        detail = {"from": first, "to": last, "windows": len(runs), "force": force}
        self._log_change(record.name, "backfilled", by, detail)
        return BackfillResult(record.name, first, last, [send_result(record, d) for d in results])

    def backfill_plan(
        self,
        name: str,
        start: datetime | str,
        end: datetime | str,
        *,
        max_windows: int = MAX_BACKFILL,
    ) -> BackfillPlan:
        """What :meth:`backfill` with the same range would do, sending
        nothing: how many windows it covers and how many are already stored
        (those are not sent again). The same checks and messages."""
        record = self._record(name)
        first, last, runs = self._backfill_runs(record, start, end, max_windows, self.clock())
        return BackfillPlan(record.name, first, last, len(runs), self._stored(runs))

    def _stored(self, runs: list[NewRun]) -> int:
        """How many of these windows already have a run row."""
        if not runs:
            return 0
        keys = [(r.routine_id, r.idempotency_key, r.attempt) for r in runs]
        return len(self.store.runs.find_windows(keys))

    def _backfill_runs(
        self,
        record: RoutineRecord,
        start: datetime | str,
        end: datetime | str,
        max_windows: int,
        now: datetime,
    ) -> tuple[datetime, datetime, list[NewRun]]:
        check_count("max_windows", max_windows, 1_000_000)
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
        return first, last, runs

    # -- internals ---------------------------------------------------------

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

    def _log_change(self, name: str, action: str, by: str | None, detail: dict[str, Any]) -> None:
        self.store.changes.record(name, action, by or who(), self.clock(), detail)

    def _dispatch(self, record: RoutineRecord, runs: list[NewRun], how: str) -> list[Dispatched]:
        results = dispatch(
            self.store,
            self._get_publisher(),
            record,
            runs,
            self.clock,
            self.settings.run_timeout,
            kind=how,
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
            self._publisher = monitored(publisher_for(self.app, self.settings), self.settings)
        return self._publisher
