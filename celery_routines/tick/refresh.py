"""Routines changed outside beat: edits take effect exactly once.

A routine's schedule fingerprint (cron, interval, zone, enabled) is stored
with the ``next_run_at`` computed from it. A row whose columns no longer match
was changed by SQL or another tool, and is seen by the tick that claims it
(before anything fires) or by the refresh probe, which asks every
``routines_refresh_seconds`` (the beat sleeps no longer than that):

- a new cron, interval or zone: the next window is recomputed from now; the
  stale ``next_run_at`` never fires;
- disabled: noted (the window is kept for the enable);
- enabled again: like ``resume``, the windows missed while disabled are one
  ``skipped`` row (reason ``disabled``), then the first window after now.

Every other column (args, kwargs, options, policies) is read at each claim
and applies to the next window with nothing to do here.
"""

from __future__ import annotations

import logging
from datetime import datetime

from celery_routines.config import Settings
from celery_routines.errors import ScheduleError
from celery_routines.observe.events import Events
from celery_routines.policy.catch_up import SkippedWindows
from celery_routines.policy.decide import skip_row
from celery_routines.policy.states import Reason
from celery_routines.schedules.base import Schedule, count_windows, first_window, last_windows
from celery_routines.schedules.jitter import jitter_offset, send_instant, window_of
from celery_routines.schedules.parse import schedule_of
from celery_routines.store import RoutineRecord, Store
from celery_routines.tick.report import TickReport
from celery_routines.tick.write import INVALID_RETRY

logger = logging.getLogger("celery_routines.beat")

OFF = "|off"
# Rows without a fingerprint baselined per tick: a million of them in one
# UPDATE held a fresh beat 20 s before its first send; a slice of this many
# costs a tick about a quarter of a second, and the ticks follow each other
# at once until the pass is over.
BASELINE_SLICE = 10_000


class Refresher:
    def __init__(self, store: Store, settings: Settings, holder: str, events: Events) -> None:
        self.store = store
        self.settings = settings
        self.holder = holder
        self.events = events
        self.last: datetime | None = None
        # Where the baseline pass under way has got to (None: none under way).
        self._baselined_to: int | None = None

    @property
    def baselining(self) -> bool:
        """A baseline pass is under way: the next tick carries it on."""
        return self._baselined_to is not None

    def due(self, now: datetime) -> bool:
        """Whether this tick's probe asks for changed rows (and note that it does)."""
        last = self.last
        if last is not None and 0 <= (now - last).total_seconds() < self.settings.refresh_seconds:
            return False
        self.last = now
        return True

    def refresh(self, now: datetime, arbitration: datetime, report: TickReport) -> None:
        """One slice of the baseline; once it has covered the table, the
        changed routines rescheduled. Until then they wait (the claim still
        checks each routine it takes, so no stale window fires meanwhile):
        listing them would list the rows not yet baselined."""
        if not self._baseline_slice(now, arbitration):
            report.more_due = True
            return
        for record in self.store.refresh.changed(self.settings.batch_size):
            self.apply(record, now, arbitration, report)

    def _baseline_slice(self, now: datetime, arbitration: datetime) -> bool:
        """Fingerprint the next slice of rows that have none; True once the
        pass has reached the end of the table."""
        slice_ = self.store.refresh.baseline(
            now, self.holder, arbitration, after=self._baselined_to or 0, limit=BASELINE_SLICE
        )
        self._baselined_to = slice_.last_id
        return slice_.last_id is None

    def take_changed(
        self,
        claimed: list[RoutineRecord],
        now: datetime,
        arbitration: datetime,
        report: TickReport,
    ) -> list[RoutineRecord]:
        """The claimed routines whose schedule did not change; the others are
        rescheduled (their claims released) and do not fire this tick."""
        unchanged = []
        for record in claimed:
            if record.schedule_changed:
                self.apply(record, now, arbitration, report)
            else:
                unchanged.append(record)
        return unchanged

    def apply(
        self, record: RoutineRecord, now: datetime, arbitration: datetime, report: TickReport
    ) -> None:
        stored = record.schedule_fingerprint
        if stored is None or not record.enabled or record.retired_at is not None:
            if stored is not None and not stored.endswith(OFF) and not record.enabled:
                logger.info("%s was disabled: it fires no more until it is enabled", record.name)
            self.store.refresh.reschedule(record.id, None, now, self.holder, arbitration)
            return
        zone = record.timezone or self.settings.timezone
        try:
            schedule = schedule_of(record, zone)
        except ScheduleError as exc:
            error = f"routine {record.name!r}: {exc}"
            logger.error("%s; marked invalid, looking again in a minute", error)
            retry = now + INVALID_RETRY
            self.store.refresh.reschedule(
                record.id, retry, now, self.holder, arbitration, error=error
            )
            return
        if stored.endswith(OFF):
            next_run_at = self._enabled(record, schedule, zone, now, report)
        else:
            first = first_window(schedule, now.replace(microsecond=0))
            next_run_at = send_instant(first, record.name, record.jitter_seconds)
            logger.info(
                "%s: schedule changed outside beat (now %s); next window recomputed from now: "
                "%s (the stored %s does not fire)",
                record.name,
                schedule.describe(),
                next_run_at.isoformat(),
                record.next_run_at.isoformat() if record.next_run_at else "none",
            )
        self.store.refresh.reschedule(record.id, next_run_at, now, self.holder, arbitration)
        report.rescheduled += 1

    def _enabled(
        self,
        record: RoutineRecord,
        schedule: Schedule,
        zone: str,
        now: datetime,
        report: TickReport,
    ) -> datetime:
        """A routine enabled again by SQL: resume, do not catch up."""
        name, jitter = record.name, record.jitter_seconds
        if record.next_run_at is None or record.next_run_at > now:
            logger.info("%s was enabled again", record.name)
            first = first_window(schedule, now.replace(microsecond=0))
            return record.next_run_at or send_instant(first, name, jitter)
        # next_run_at is a send instant: a jittered window goes out its offset after it.
        due, until = window_of(record.next_run_at, name, jitter), now - jitter_offset(name, jitter)
        count = 1 + count_windows(schedule, due, until)
        last = (last_windows(schedule, due, until, 1) or [due])[-1]
        skip = skip_row(
            record.id, record.name, zone, SkippedWindows(Reason.DISABLED, count, due, last)
        )
        if self.store.runs.insert_new([skip], now):
            report.skipped_windows += count
            by_reason = report.skipped_by_reason
            by_reason[Reason.DISABLED] = by_reason.get(Reason.DISABLED, 0) + count
            self.events.skipped(
                record.name, reason=Reason.DISABLED, count=count, first=due, last=last,
                run_id=skip.id,
            )  # fmt: skip
        logger.info(
            "%s was enabled again: %d window(s) missed while disabled recorded as skipped",
            record.name,
            count,
        )
        return send_instant(schedule.next_after(last), name, jitter)
