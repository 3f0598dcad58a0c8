"""The operator's sends: trigger, replay and backfill.

Each refuses a send the routine's overlap policy or ceiling forbids (unless
forced) and hands the rows to :func:`celery_routines.sending.dispatch.dispatch`,
which writes, publishes and marks them in the tick's order.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from celery import Celery

from celery_routines.clock import Clock
from celery_routines.config import Settings
from celery_routines.declare import process_user
from celery_routines.errors import InvalidRoutine, RoutinesError, ScheduleError
from celery_routines.observe.events import RoutineEvents
from celery_routines.operator.lookup import RoutineLookup
from celery_routines.operator.views import (
    BackfillResult,
    SendResult,
    iso_utc,
    send_result,
)
from celery_routines.operator.windows import (
    check_count,
    count_range_windows,
    range_windows,
    to_instant,
)
from celery_routines.policy.ceilings import decide_before_send
from celery_routines.policy.states import EXCLUSIVE_OVERLAP, Overlap, RunState, choices
from celery_routines.schedules.keys import window_key
from celery_routines.sending.direct import publisher_for
from celery_routines.sending.dispatch import SENT, Dispatched, dispatch
from celery_routines.sending.offload import monitored
from celery_routines.sending.publish import Publisher
from celery_routines.store import NewRun, RoutineRecord, Store


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
# Above this many windows a preview counts stored runs by range, not by key.
PREVIEW_KEYS = 10_000
REPLAYABLE_STATES = (RunState.FAILED, RunState.SKIPPED, RunState.LOST)


def backfill_overlap(record: RoutineRecord, overlap: str | None) -> Overlap:
    """The overlap policy a backfill follows: ``overlap`` if given, else the routine's."""
    if overlap is None:
        return Overlap(record.overlap)
    try:
        return Overlap(overlap)
    except ValueError:
        raise InvalidRoutine(
            record.name, f"--overlap must be {choices(Overlap)}, got {overlap!r}"
        ) from None


def one_window_at_a_time(runs: list[NewRun], policy: Overlap) -> list[NewRun]:
    """What of a backfill's new windows (oldest first) goes out at once:
    all of them under ``overlap``; the oldest under ``skip`` and ``queue``;
    the newest under ``replace`` (as in a catch-up: policy.catch_up.one_at_a_time)."""
    if policy == Overlap.OVERLAP or len(runs) < 2:
        return runs
    return runs[-1:] if policy == Overlap.REPLACE else runs[:1]


class UnknownRun(RoutinesError, LookupError):
    """No run with this id is stored."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run with id {run_id!r} is stored")


class OperationRefused(RoutinesError, ValueError):
    """A send would break the routine's overlap policy or ceiling."""


class OperatorSends:
    """Trigger, replay and backfill (``Routines.sends``): checked against the
    routine's overlap policy and ceiling, then written, published and marked
    by :func:`~celery_routines.sending.dispatch.dispatch`.

    The publisher is built at the first send, from ``app`` (none given), and
    closed by :meth:`close`; one handed in is the caller's to close.
    """

    def __init__(
        self,
        lookup: RoutineLookup,
        store: Store,
        settings: Settings,
        clock: Clock,
        events: RoutineEvents | None,
        app: Celery | None,
        publisher: Publisher | None = None,
    ) -> None:
        self.lookup = lookup
        self.store = store
        self.settings = settings
        self.clock = clock
        self.events = events
        self.app = app
        self._publisher = publisher
        self._owns_publisher = publisher is None

    def close(self) -> None:
        if self._publisher is not None and self._owns_publisher:
            self._publisher.close()
            self._publisher = None

    def trigger(self, name: str, *, force: bool = False, by: str | None = None) -> SendResult:
        """Send the routine now, outside its schedule, under a manual key
        (``name@manual:<uuid>``) that can never collide with a window."""
        record = self.lookup.record(name)
        key = f"{record.name}@manual:{uuid.uuid4()}"
        result = self._send_one(record, key, 1, None, "trigger", force)
        self._log_change(record.name, "triggered", by, {"run_id": result.run_id, "force": force})
        return result

    def _send_one(
        self,
        record: RoutineRecord,
        key: str,
        attempt: int,
        scheduled_for: datetime | None,
        how: str,
        force: bool,
    ) -> SendResult:
        """Send one run of ``record`` now (``how``: trigger or replay), after
        the before-send checks unless ``force``; ``scheduled_for`` None: now."""
        now = self.clock()
        if not force:
            self._check_may_send(record, 1, now)
        run = NewRun(
            id=str(uuid.uuid4()),
            routine_id=record.id,
            idempotency_key=key,
            attempt=attempt,
            scheduled_for=now if scheduled_for is None else scheduled_for,
        )
        return send_result(record, self._dispatch(record, [run], how)[0])

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
        result = self._send_one(
            record, run.idempotency_key, latest.attempt + 1, run.scheduled_for, "replay", force
        )
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
        overlap: str | None = None,
    ) -> BackfillResult:
        """Send the windows in ``[start, end]``, oldest first, each under its
        own window key: a window that already has a run row (sent by beat,
        skipped, or sent by an earlier backfill) is not sent again.

        The overlap policy (``overlap``, else the routine's) holds here as in
        a catch-up: ``"overlap"`` sends every window at once; ``"skip"`` and
        ``"queue"`` send the oldest window not yet stored and leave the rest
        (the same backfill run again once it has ended sends the next);
        ``"replace"`` sends only the newest. Nothing is recorded for the
        windows left: they are the operator's to send, not missed windows.

        Naive and string bounds are read in the routine's zone. ``end`` may
        not be in the future: beat sends those windows.
        """
        record = self.lookup.record(name)
        policy = backfill_overlap(record, overlap)
        now = self.clock()
        first, last, runs = self._backfill_runs(record, start, end, max_windows, now)
        stored = self._stored_keys(runs)
        new = [run for run in runs if run.idempotency_key not in stored]
        chosen = one_window_at_a_time(new, policy)
        if not force and chosen:
            self._check_may_send(record, len(chosen), now, policy)
        going = [run for run in runs if run.idempotency_key in stored or run in chosen]
        results = self._dispatch(record, going, "backfill") if going else []
        left = len(new) - len(chosen)
        detail = {"from": first, "to": last, "windows": len(runs), "force": force}
        detail |= {"overlap": policy.value, "left": left}
        self._log_change(record.name, "backfilled", by, detail)
        sent = [send_result(record, d) for d in results]
        return BackfillResult(
            record.name, first, last, sent, overlap=policy.value, left=left, window_count=len(runs)
        )

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
        record = self.lookup.record(name)
        now = self.clock()
        first, last = self._backfill_range(record, start, end, max_windows, now)
        try:
            schedule = self.lookup.schedule(record)
            count = count_range_windows(schedule, record, first, last, max_windows)
        except ScheduleError as exc:
            raise InvalidRoutine(record.name, str(exc)) from None
        if count > PREVIEW_KEYS:
            # Listing a million keys took 35 s: the rows in the range are
            # counted instead (first attempts, manual sends aside).
            stored = self.store.admin.window_runs_between(record.id, first, last)
            return BackfillPlan(record.name, first, last, count, min(stored, count))
        _, _, runs = self._backfill_runs(record, start, end, max_windows, now)
        return BackfillPlan(record.name, first, last, len(runs), self._stored(runs))

    def _stored(self, runs: list[NewRun]) -> int:
        """How many of these windows already have a run row."""
        return len(self._stored_keys(runs))

    def _stored_keys(self, runs: list[NewRun]) -> set[str]:
        """The window keys of these windows that already have a run row."""
        if not runs:
            return set()
        keys = [(r.routine_id, r.idempotency_key, r.attempt) for r in runs]
        return {row.idempotency_key for row in self.store.runs.find_windows(keys)}

    def _backfill_runs(
        self,
        record: RoutineRecord,
        start: datetime | str,
        end: datetime | str,
        max_windows: int,
        now: datetime,
    ) -> tuple[datetime, datetime, list[NewRun]]:
        first, last = self._backfill_range(record, start, end, max_windows, now)
        timezone = self.lookup.zone_of(record)
        try:
            schedule = self.lookup.schedule(record)
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

    def _backfill_range(
        self,
        record: RoutineRecord,
        start: datetime | str,
        end: datetime | str,
        max_windows: int,
        now: datetime,
    ) -> tuple[datetime, datetime]:
        check_count("max_windows", max_windows, 1_000_000)
        timezone = self.lookup.zone_of(record)
        first = to_instant(start, timezone, now, "--from")
        last = to_instant(end, timezone, now, "--to")
        if last < first:
            raise ValueError(f"--to {iso_utc(last)} is before --from {iso_utc(first)}")
        if last > now:
            raise ValueError(
                f"--to {iso_utc(last)} is in the future (now is {iso_utc(now)}); backfill sends "
                "past windows only, beat sends the rest"
            )
        return first, last

    # -- internals ---------------------------------------------------------

    def _check_may_send(
        self, record: RoutineRecord, fires: int, now: datetime, overlap: Overlap | None = None
    ) -> None:
        """Refuse a manual send that the overlap policy (``overlap``, else the
        routine's) or a ceiling forbids."""
        if (overlap or record.overlap) in EXCLUSIVE_OVERLAP:
            open_runs = self.lookup.open_runs(record, now)
            if open_runs:
                raise OperationRefused(
                    f"routine {record.name!r} has {len(open_runs)} open run(s) "
                    f"(oldest {open_runs[0].id}, {open_runs[0].state}) and overlap="
                    f"{str(overlap or record.overlap)!r}; wait for it to finish or pass --force"
                )
        usage = self.lookup.usage(record, now)
        if not usage:
            return
        decision = decide_before_send(
            self.lookup.ceilings(record),
            {u.unit: u.spent for u in usage},
            now,
            self.lookup.zone_of(record),
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

    def _log_change(
        self, name: str, action: str, by: str | None, detail: dict[str, object]
    ) -> None:
        self.store.changes.record(name, action, by or process_user(), self.clock(), detail)

    def _dispatch(self, record: RoutineRecord, runs: list[NewRun], how: str) -> list[Dispatched]:
        results = dispatch(
            self.store,
            self._get_publisher(),
            record,
            runs,
            self.clock,
            self.settings.run_timeout,
            self.settings.start_timeout,
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
