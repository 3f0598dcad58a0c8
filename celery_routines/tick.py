"""One beat tick: adopt, sweep runs, claim, plan, apply overlap, gate, write,
send, advance.

The engine decides nothing about schedules or run outcomes itself: the pure
planner in ``schedules.plan`` says which windows go out and which are skipped,
``lifecycle`` what an open run means for a due window; the engine carries the
decisions out against the store, the gate and the publisher. Lost runs and
retries are swept by :mod:`celery_routines.sweeps`.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from .budget import suspended_plan, within_budget
from .ceilings import parse_ceilings
from .clock import Clock
from .config import Settings
from .control import CeleryRevoker, NoRevoker, Revoker
from .delivery import Call, decode_call, outgoing_run, publish_runs, record_send_failure
from .errors import ScheduleError
from .events import Events, NoEvents
from .gate import Gate
from .ledger import Unrecorded
from .lifecycle import check_overlap, check_retry_policy, lost_deadline
from .overlap import apply_overlap, replace_open_runs
from .publish import OutgoingRun, Publisher
from .runrows import skip_row
from .schedules.base import Schedule
from .schedules.keys import window_key
from .schedules.parse import schedule_from_columns
from .schedules.plan import FirePlan, check_options, plan_due
from .store import Advance, NewRun, Probe, RoutineRecord, Store
from .sweeps import Sweeps
from .takeover import resume_after_written_due_windows

logger = logging.getLogger("celery_routines.beat")

# A routine whose schedule cannot be computed is looked at again this often.
INVALID_RETRY = timedelta(minutes=1)
# Messages go out on claims taken or renewed less than this share of
# routines_lock_ttl ago; older claims are renewed in the database first (the
# rest of the TTL is the margin for a chunk of messages and its bookkeeping).
CLAIM_TRUSTED_SHARE = 0.25
# Messages published between two looks at the claims (kombu's Redis batch).
PUBLISH_CHUNK = 500
# A slow beat's claims shrink to no fewer routines than this per tick.
MIN_CLAIM_LIMIT = 10


@dataclass
class TickReport:
    """What one tick did, for logs, metrics and tests."""

    adopted: int = 0
    claimed: int = 0
    sent: int = 0
    skipped_windows: int = 0
    # The same windows by the skip's reason (the run row's), for metrics.
    skipped_by_reason: dict[str, int] = field(default_factory=dict)
    send_failures: int = 0
    invalid: int = 0
    # Windows whose run row already existed: another beat got there first.
    conflicts: int = 0
    # Routines left due because the gate holds a window with no row yet.
    deferred: int = 0
    # Routines left due because their previous run is still open (overlap="queue").
    queued: int = 0
    # Open runs revoked for a newer window (overlap="replace").
    replaced: int = 0
    lost: int = 0
    retries_sent: int = 0
    retries_cancelled: int = 0
    more_due: bool = False
    duration: float = 0.0
    next_wakeup: datetime | None = None


@dataclass
class _Prepared:
    """One claimed routine, planned and ready to carry out."""

    record: RoutineRecord
    plan: FirePlan
    timezone: str
    call: Call
    sends: list[NewRun] = field(default_factory=list)
    skips: list[NewRun] = field(default_factory=list)
    # Where the routine's due time moves; the plan's, unless overlap="queue"
    # holds back all but the first window.
    next_run_at: datetime | None = None
    # Open runs to revoke before sending (overlap="replace").
    replace: list[str] = field(default_factory=list)
    schedule: Schedule | None = None
    # Why a skip row was written, beyond its reason, by run id (for its one
    # log line: the open run an overlap skip waited on).
    skip_notes: dict[str, str] = field(default_factory=dict)


@dataclass
class _Outgoing:
    """What a tick wrote: the routines it moves on, the runs to send."""

    ready: list[_Prepared]
    sends: list[tuple[_Prepared, NewRun, str]] = field(default_factory=list)


class TickEngine:
    def __init__(
        self,
        store: Store,
        publisher: Publisher,
        gate: Gate,
        settings: Settings,
        holder: str,
        clock: Clock,
        revoker: Revoker | None = None,
        events: Events | None = None,
    ) -> None:
        self.store = store
        self.publisher = publisher
        self.gate = gate
        self.settings = settings
        self.holder = holder
        self.clock = clock
        if revoker is None:
            app = getattr(publisher, "app", None)
            revoker = CeleryRevoker(app) if app is not None else NoRevoker()
        self.revoker = revoker
        # Skips, suspensions and lost runs also go out as `routine-*` events.
        self.events: Events = events or NoEvents()
        self.sweeps = Sweeps(store, publisher, settings, self.events)
        # What this beat published and has not yet written down.
        self.ledger = Unrecorded()
        # The most routines one tick claims: routines_batch_size, less while
        # ticks take too much of routines_lock_ttl (see _fit_claims_to_ttl).
        self.claim_limit = settings.batch_size

    def tick(self) -> TickReport:
        """One tick on one database connection.

        A probe (one SELECT) says what there is to do; an idle tick ends
        there. Otherwise everything up to writing the run rows is one
        transaction (claims and rows commit together, before any message goes
        out), then the messages, then marking them sent, advancing the
        routines and probing for the next wake-up in a second.
        """
        started = time.monotonic()
        report = TickReport()
        now = self.clock()
        with self.store.session():
            if self.ledger:
                logger.info("writing down %s before anything else", self.ledger.describe())
                self._record_published(now)
            probe = self.store.probe(now, self.holder)
            if self._work(probe, now):
                self._act(probe, now, report)
                probe = self.store.probe(self.clock(), self.holder)
            report.next_wakeup = self._next_wakeup(probe, self.clock())
        report.duration = time.monotonic() - started
        return report

    def _work(self, probe: Probe, now: datetime) -> bool:
        return (
            probe.unscheduled
            or probe.held_due
            or _due(probe.window, now)
            or _due(probe.retry_at, now)
            or (_due(probe.deadline, now) and self.sweeps.lost_sweep_due(now))
        )

    def _act(self, probe: Probe, now: datetime, report: TickReport) -> None:
        # Lost runs first: a run declared lost now no longer holds back its
        # routine's due window (overlap) and its retry is scheduled. Each is
        # one conditional UPDATE of a run, outside the transaction below, so
        # that transaction locks routines before runs, like every other.
        if _due(probe.deadline, now):
            self.sweeps.sweep_lost(now, report)
        started = time.monotonic()
        with self.store.transaction():
            if probe.unscheduled:
                report.adopted = self._adopt(now)
            retries = self.sweeps.retries_due(now, report) if _due(probe.retry_at, now) else []
            claimed = self.store.routines.claim_due(
                now, self.holder, self.settings.lock_ttl, self.claim_limit
            )
            report.claimed = len(claimed)
            self._lift_ended_suspensions(claimed, now)
            if len(claimed) >= self.claim_limit:
                report.more_due = True
            prepared = []
            for record in claimed:
                item = self._prepare(record, now, report)
                if item is not None:
                    prepared.append(item)
            outgoing = self._write(prepared, now, report) if prepared else None
        self.sweeps.send_retries(retries, now, report, self.ledger)
        if outgoing is not None:
            held = self._send(outgoing, now, report)
            self.ledger.advanced(
                [
                    Advance(item.record.id, item.next_run_at or item.plan.next_run_at)
                    for item in outgoing.ready
                    if item.record.id in held
                ]
            )
        self._record_published(now)
        if report.claimed:
            self._fit_claims_to_ttl(time.monotonic() - started, report.claimed)

    def _fit_claims_to_ttl(self, took: float, claimed: int) -> None:
        """Claim no more routines than this beat carries out well within
        their claims: a tick that outlives them has its routines taken over
        mid-tick, and beats that keep doing so to each other thrash instead of
        sending. Halved after a slow tick, doubled back after fast ones."""
        budget = self.settings.lock_ttl * CLAIM_TRUSTED_SHARE
        limit = self.claim_limit
        if took > budget and claimed >= limit / 2:
            self.claim_limit = max(MIN_CLAIM_LIMIT, limit // 2)
        elif took < budget / 4 and claimed >= limit:
            self.claim_limit = min(self.settings.batch_size, limit * 2)
        if self.claim_limit != limit:
            logger.info(
                "a tick of %d routine(s) took %.2f s of %.0f s claims: claiming at most %d next",
                claimed,
                took,
                self.settings.lock_ttl,
                self.claim_limit,
            )

    def _renew_claims(self, ready: list[_Prepared], held: set[int], checked: datetime) -> set[int]:
        """The routines of ``held`` whose claims this beat still has, renewed
        from ``checked`` for the messages still to go out and their bookkeeping.

        A claim lets another beat take the routine over once it expires, and
        that beat sends the routine's ``pending`` rows itself; a routine taken
        over meanwhile is left to its new holder, its rows unpublished here.
        """
        ttl = timedelta(seconds=self.settings.lock_ttl)
        still = self.store.routines.renew_claims(sorted(held), self.holder, checked + ttl)
        taken = [item for item in ready if item.record.id in held - still]
        if taken:
            logger.warning(
                "claims of %d routine(s) were taken over before this beat sent their runs "
                "(%s): their %d pending run(s) are left to the new holder (raise "
                "routines_lock_ttl or lower routines_batch_size if ticks are this slow)",
                len(taken),
                ", ".join(item.record.name for item in taken[:5])
                + (", ..." if len(taken) > 5 else ""),
                sum(len(item.sends) for item in taken),
            )
        return still

    def _mark_published(self) -> None:
        """The ledger's published runs -> ``sent``, oldest batch first."""
        while self.ledger.sent:
            run_ids, sent_at = self.ledger.sent[0]
            self.store.runs.mark_sent(
                run_ids, sent_at, deadline_at=lost_deadline(sent_at, self.settings.run_timeout)
            )
            self.ledger.marked()

    def _record_published(self, now: datetime) -> None:
        """Write down what went out: runs marked sent, then routines moved on.

        Each is one statement of its own, after the messages: a failure of
        one (a deadlock, a dropped connection, a failover) undoes neither the
        other nor the publishing. What failed stays in the ledger; the next
        tick writes it before doing anything else, and never publishes it again.
        """
        ledger = self.ledger
        self._mark_published()
        if ledger.advances:
            advances = sorted(ledger.advances.values(), key=lambda a: a.routine_id)
            advanced = self.store.routines.advance(advances, self.holder, now)
            ledger.advances.clear()
            if advanced < len(advances):
                logger.warning(
                    "%d routine claim(s) expired before this beat advanced them; "
                    "another beat took over (raise routines_lock_ttl if ticks are slow)",
                    len(advances) - advanced,
                )

    def _next_wakeup(self, probe: Probe, now: datetime) -> datetime | None:
        """The earliest of: a routine's window or claim expiry, a retry's
        ``retry_at``, an open run's deadline (not before the lost sweep may
        run again, so an overdue run never makes the tick spin); now if
        routines still wait for adoption."""
        if probe.unscheduled:
            return now
        candidates = [probe.routine, probe.retry_at]
        if probe.deadline is not None:
            next_sweep = self.sweeps.next_lost_sweep()
            candidates.append(
                max(probe.deadline, next_sweep) if next_sweep is not None else probe.deadline
            )
        present = [instant for instant in candidates if instant is not None]
        return min(present) if present else None

    def _lift_ended_suspensions(self, claimed: list[RoutineRecord], now: datetime) -> None:
        ended = [
            r.id for r in claimed if r.suspended_until is not None and r.suspended_until <= now
        ]
        for routine_id in self.store.spend.lift_expired(ended, now):
            name = next(r.name for r in claimed if r.id == routine_id)
            logger.info("resumed %s: its ceiling period turned", name)

    # -- adoption ------------------------------------------------------------

    def _adopt(self, now: datetime) -> int:
        """Give routines without a next window (new, changed, or inserted by
        plain SQL) their first one."""
        first_windows = []
        for record in self.store.routines.unscheduled(self.settings.batch_size):
            try:
                schedule = self._schedule(record)
            except ScheduleError as exc:
                self._invalid(record, exc, now, holder=None)
                continue
            # From the whole second, so interval windows (and their keys) do
            # not carry the adoption instant's microseconds forever.
            first = schedule.next_after(now.replace(microsecond=0))
            first_windows.append(Advance(record.id, first))
            logger.info("adopted %s: %s, first window %s", record.name, schedule.describe(), first)
        return self.store.routines.adopt(first_windows, now)

    # -- planning ------------------------------------------------------------

    def _schedule(self, record: RoutineRecord) -> Schedule:
        return schedule_from_columns(
            record.cron, record.interval_seconds, record.timezone or self.settings.timezone
        )

    def _prepare(
        self, record: RoutineRecord, now: datetime, report: TickReport
    ) -> _Prepared | None:
        try:
            schedule = self._schedule(record)
            call = decode_call(record)
            check_retry_policy(record.max_retries, record.retry_base_seconds)
            check_overlap(record.overlap)
            if record.last_error is not None:
                # Every stored option must read, not only the schedule, before
                # the row counts as valid again: else it flips each minute.
                check_options(record.catch_up, record.catch_up_cap, record.max_lateness)
                parse_ceilings(record.ceiling)
                # It was invalid and is valid again: resume from now, do not
                # treat the retry instant as a missed window.
                self.store.routines.advance(
                    [Advance(record.id, schedule.next_after(now))], self.holder, now
                )
                logger.info("%s is valid again; resuming its schedule", record.name)
                return None
            assert record.next_run_at is not None  # claim_due only returns scheduled rows
            timezone = record.timezone or self.settings.timezone
            plan = suspended_plan(record, schedule, now)
            if plan is None:
                plan = plan_due(
                    schedule,
                    record.next_run_at,
                    now,
                    catch_up=record.catch_up,
                    catch_up_cap=record.catch_up_cap,
                    max_lateness=record.max_lateness,
                )
                plan = within_budget(self.store, record, schedule, plan, now, timezone, self.events)
        except ScheduleError as exc:
            self._invalid(record, exc, now, holder=self.holder)
            report.invalid += 1
            return None
        item = _Prepared(
            record, plan, timezone, call, next_run_at=plan.next_run_at, schedule=schedule
        )
        deadline = lost_deadline(now, self.settings.run_timeout)
        for window in plan.send:
            item.sends.append(
                NewRun(
                    id=str(uuid.uuid4()),
                    routine_id=record.id,
                    idempotency_key=window_key(record.name, window, timezone),
                    attempt=1,
                    scheduled_for=window,
                    deadline_at=deadline,
                )
            )
        item.skips = [skip_row(record.id, record.name, timezone, s) for s in plan.skipped]
        return item

    def _invalid(
        self, record: RoutineRecord, exc: Exception, now: datetime, holder: str | None
    ) -> None:
        message = f"routine {record.name!r}: {exc}"
        retry_at = now + INVALID_RETRY
        logger.error("%s; marked invalid, looking again at %s", message, retry_at.isoformat())
        self.store.routines.mark_invalid(record.id, message, retry_at, holder, now)

    # -- carrying the plan out -----------------------------------------------

    def _write(self, prepared: list[_Prepared], now: datetime, report: TickReport) -> _Outgoing:
        """Apply overlap and the gate, write the run rows; what to send."""
        prepared = apply_overlap(self.store, self.holder, prepared, now, report)
        deferred = self._apply_gate(prepared)
        report.deferred = len(deferred)
        ready = [item for item in prepared if item.record.id not in deferred]
        replace_open_runs(self.store, self.revoker, ready, now, report)

        resume_after_written_due_windows(self.store, ready)
        new_runs = [run for item in ready for run in (*item.sends, *item.skips)]
        inserted = self.store.runs.insert_new(new_runs, now)
        takeovers = self._orphaned_pending(ready, inserted)

        outgoing = _Outgoing(ready)
        for item in ready:
            for run in item.sends:
                run_id = run.id if run.id in inserted else takeovers.get(_window(run))
                if run_id is None:
                    report.conflicts += 1
                    logger.info(
                        "not sending %s: its run row already exists (another beat sent it)",
                        run.idempotency_key,
                    )
                    continue
                outgoing.sends.append((item, run, run_id))
            for run in item.skips:
                if run.id in inserted:
                    count = run.skipped_count or 1
                    report.skipped_windows += count
                    _count(report.skipped_by_reason, run.reason or "skipped", count)
                    self._skip_event(item.record.name, run)
                    logger.warning(
                        "%s",
                        skip_line(
                            item.record.name, run, item.timezone, item.skip_notes.get(run.id)
                        ),
                    )
        return outgoing

    def _send(self, outgoing: _Outgoing, now: datetime, report: TickReport) -> set[int]:
        """Publish the written runs, after their rows are committed (a worker
        claims a run only from its row), in as few broker round trips as the
        transport allows; the ids of the routines whose claims held to the end.

        Messages go out in chunks, each under claims known to be live: a
        chunk that starts later than a quarter of ``routines_lock_ttl`` after
        the claims were taken or last renewed renews them first, so no other
        beat can take a routine over while its messages are going out.
        """
        held = {item.record.id for item in outgoing.ready}
        confirmed = now
        trusted = timedelta(seconds=self.settings.lock_ttl * CLAIM_TRUSTED_SHARE)
        sending = [
            (item, run, run_id)
            for item, run, run_id in self._orphans_still_pending(outgoing.sends, report)
            if not self._too_late(item, run, run_id, report)
        ]
        for start in range(0, len(sending), PUBLISH_CHUNK):
            if self.clock() >= confirmed + trusted:
                confirmed = self.clock()
                held = self._renew_claims(outgoing.ready, held, confirmed)
            chunk = [
                send for send in sending[start : start + PUBLISH_CHUNK] if send[0].record.id in held
            ]
            errors = publish_runs(self.publisher, [_message(send) for send in chunk])
            self._sent(chunk, errors, report)
            # Marked sent before the next chunk, while the claims still hold:
            # a beat that takes a routine over later finds the row sent.
            self._mark_published()
        return held

    def _sent(
        self,
        chunk: list[tuple[_Prepared, NewRun, str]],
        errors: list[str | None],
        report: TickReport,
    ) -> None:
        """Enter what went out in the ledger; record what the broker refused."""
        published = [
            run_id for (_, _, run_id), error in zip(chunk, errors, strict=True) if error is None
        ]
        self.ledger.published(published, self.clock())
        for (item, run, run_id), error in zip(chunk, errors, strict=True):
            if error is None:
                report.sent += 1
            else:
                report.send_failures += 1
                record_send_failure(
                    self.store,
                    item.record,
                    run_id,
                    run.idempotency_key,
                    run.attempt,
                    error,
                    self.clock(),
                )

    def _apply_gate(self, prepared: list[_Prepared]) -> set[int]:
        """Routine ids to leave due this tick: the gate holds one of their
        windows and no run row exists yet, so a beat that set the key may have
        died before writing; the claim and the key expire together."""
        runs = [run for item in prepared for run in item.sends]
        answers = self.gate.acquire([f"{run.idempotency_key}#{run.attempt}" for run in runs])
        refused = [run for run, ok in zip(runs, answers, strict=True) if not ok]
        if not refused:
            return set()
        stored = {_window(r) for r in self.store.runs.find_windows([_window(r) for r in refused])}
        deferred = {run.routine_id for run in refused if _window(run) not in stored}
        for routine_id in deferred:
            logger.info(
                "routine id %s left due: the gate holds its window but no run row exists yet",
                routine_id,
            )
        return deferred

    def _orphaned_pending(
        self, ready: list[_Prepared], inserted: set[str]
    ) -> dict[tuple[int, str, int], str]:
        """Rows left ``pending`` by a beat that died between writing and
        sending, or that was still writing when its claims expired and this
        beat took them over (see :meth:`_renew_claims`).

        We hold the routine's claim now, so the writer's claim expired (or the
        writer is this beat, and it did not publish the row: what it published
        is marked sent before any of its ticks reads again, see ``ledger``).
        Sending an orphan again is safe because the worker claims a run once.
        """
        conflicted = [
            _window(run) for item in ready for run in item.sends if run.id not in inserted
        ]
        if not conflicted:
            return {}
        return {
            (row.routine_id, row.idempotency_key, row.attempt): row.id
            for row in self.store.runs.find_windows(conflicted)
            if row.state == "pending"
        }

    def _orphans_still_pending(
        self, sends: list[tuple[_Prepared, NewRun, str]], report: TickReport
    ) -> list[tuple[_Prepared, NewRun, str]]:
        """Look again, just before publishing, at the rows taken over from
        another beat: if that beat was only slow, not gone, it may have
        published and marked them sent since this tick read them."""
        orphans = [run_id for _, run, run_id in sends if run_id != run.id]
        if not orphans:
            return sends
        pending = self.store.runs.still_pending(orphans)
        kept = []
        for send in sends:
            _, run, run_id = send
            if run_id != run.id and run_id not in pending:
                report.conflicts += 1
                logger.info(
                    "not sending %s: the beat that wrote it sent it meanwhile", run.idempotency_key
                )
                continue
            kept.append(send)
        return kept

    def _too_late(self, item: _Prepared, run: NewRun, run_id: str, report: TickReport) -> bool:
        """``max_lateness`` judged now, at the moment of sending, not when the
        row was read: a long drain behind a backlog cannot send a stale window."""
        limit = item.record.max_lateness
        if limit is None:
            return False
        lateness = (self.clock() - run.scheduled_for).total_seconds()
        if lateness <= limit or not self.store.runs.skip_late(run_id, self.clock()):
            return False
        report.skipped_windows += 1
        _count(report.skipped_by_reason, "late", 1)
        self.events.skipped(
            item.record.name,
            reason="late",
            count=1,
            first=run.scheduled_for,
            last=run.scheduled_for,
            run_id=run_id,
        )
        logger.warning(
            "skipped %s: late (%.1f s late at send time, max_lateness is %s s)",
            run.idempotency_key,
            lateness,
            limit,
        )
        return True

    def _skip_event(self, routine: str, run: NewRun) -> None:
        assert run.skipped_first is not None and run.skipped_last is not None
        self.events.skipped(
            routine,
            reason=run.reason or "",
            count=run.skipped_count or 1,
            first=run.skipped_first,
            last=run.skipped_last,
            run_id=run.id,
        )


def skip_line(routine: str, run: NewRun, timezone: str, note: str | None = None) -> str:
    """The one log line of a skip row, its windows written like window keys
    (in the routine's zone, with the offset)."""
    count = run.skipped_count or 1
    first = run.skipped_first or run.scheduled_for
    last = run.skipped_last or run.scheduled_for
    try:
        if count == 1:
            windows = window_key(routine, first, timezone)
        else:
            start = window_key(routine, first, timezone).split("@", 1)[1]
            end = window_key(routine, last, timezone).split("@", 1)[1]
            windows = f"{count} windows of {routine} from {start} to {end}"
    except ValueError:  # an unknown zone: the row is written, say it in UTC
        windows = f"{count} window(s) of {routine} from {first.isoformat()} to {last.isoformat()}"
    return f"skipped {windows}: {run.reason}" + (f" ({note})" if note else "")


def _due(instant: datetime | None, now: datetime) -> bool:
    return instant is not None and instant <= now


def _count(counts: dict[str, int], key: str, n: int) -> None:
    counts[key] = counts.get(key, 0) + n


def _window(run: NewRun) -> tuple[int, str, int]:
    return (run.routine_id, run.idempotency_key, run.attempt)


def _message(send: tuple[_Prepared, NewRun, str]) -> OutgoingRun:
    item, run, run_id = send
    return outgoing_run(
        item.record,
        item.call,
        run_id=run_id,
        window=run.scheduled_for,
        idempotency_key=run.idempotency_key,
        attempt=run.attempt,
    )
