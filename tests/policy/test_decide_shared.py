"""What decide.py computes once for the many routines of a burst: run ids,
window keys and plans shared by routines that differ only in their names."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from celery_routines.policy.catch_up import FirePlan, one_at_a_time, plan_due
from celery_routines.policy.decide import Claimed, Facts, SharedAnswers, decide, plan, random_id
from celery_routines.policy.routine import define
from celery_routines.policy.states import Overlap
from celery_routines.schedules.cron import CronSchedule
from celery_routines.schedules.keys import window_key
from celery_routines.store.records import RoutineRecord

DUE = datetime(2026, 10, 25, 0, 0, tzinfo=UTC)
EVERY_FIVE = CronSchedule("*/5 * * * *", "UTC")
HOURLY = CronSchedule("0 * * * *", "UTC")


def planned(*args: object, overlap: Overlap = Overlap.SKIP, **options: object) -> FirePlan:
    """What decide.plan answers: the catch-up plan, then the overlap policy
    among its windows."""
    return one_at_a_time(plan_due(*args, **options), overlap)  # type: ignore[arg-type]


def claimed(name: str, schedule: CronSchedule, timezone: str = "UTC", **options: object) -> Claimed:
    routine = define("tasks.poll", schedule.expression, name=name, timezone=timezone, **options)
    record = RoutineRecord(
        id=hash(name) % 1000,
        **{k: v for k, v in routine.columns().items() if k != "name"},
        name=name,
        next_run_at=DUE,
        paused=False,
        suspended_until=None,
        suspended_reason=None,
        last_error=None,
        locked_by="this-beat",
        locked_until=None,
    )
    return Claimed(record, routine, schedule, timezone)


def test_run_ids_are_random_version_4_uuids_written_as_uuid4_writes_them() -> None:
    ids = [random_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for run_id in ids:
        parsed = uuid.UUID(run_id)
        assert str(parsed) == run_id
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_window_keys_are_window_key_for_every_routine_sharing_a_window() -> None:
    # Rome's repeated hour: 00:30 and 01:30 UTC are both 02:30 local.
    now = DUE + timedelta(hours=2)
    answers = SharedAnswers()
    for zone in ("UTC", "Europe/Rome", "America/New_York"):
        for name in ("first", "second", "third"):
            item = claimed(name, CronSchedule("30 * * * *", zone), zone, catch_up_cap=5)
            planned = plan(item, now, answers=answers)
            decision = decide(item, planned, Facts(), now, run_timeout=60, answers=answers)
            assert decision.sends, zone
            assert [run.idempotency_key for run in decision.sends] == [
                window_key(name, run.scheduled_for, zone) for run in decision.sends
            ]
    rome = [
        window_key("x", w, "Europe/Rome")
        for w in (datetime(2026, 10, 25, h, 30, tzinfo=UTC) for h in (0, 1))
    ]
    assert rome == ["x@2026-10-25T02:30:00+02:00", "x@2026-10-25T02:30:00+01:00"]


def test_a_window_in_another_zone_is_keyed_without_the_shared_answers() -> None:
    local = datetime(2026, 10, 25, 2, 30, tzinfo=ZoneInfo("Europe/Rome"))
    first, second = local, local.replace(fold=1)
    assert first == second  # equal as Python compares them, an hour apart
    keys = [SharedAnswers().window_key("x", w, "Europe/Rome") for w in (first, second)]
    assert keys == ["x@2026-10-25T02:30:00+02:00", "x@2026-10-25T02:30:00+01:00"]


def test_routines_sharing_schedule_window_and_options_share_one_plan() -> None:
    now = DUE + timedelta(hours=3, minutes=1)
    first, second = claimed("first", EVERY_FIVE), claimed("second", EVERY_FIVE)
    answers = SharedAnswers()  # held by the tick engine for its life
    assert plan(first, now, answers=answers) is plan(second, now, answers=answers)
    assert plan(first, now) == planned(EVERY_FIVE, DUE, now)


def test_a_plan_is_shared_only_with_the_same_schedule_and_options() -> None:
    now = DUE + timedelta(hours=3, minutes=1)
    answers = SharedAnswers()

    def shared_plan(item: Claimed, now: datetime) -> FirePlan:
        return plan(item, now, answers=answers)

    every_five = shared_plan(claimed("a", EVERY_FIVE), now)
    capped = shared_plan(claimed("b", EVERY_FIVE, catch_up_cap=2), now)
    latest = shared_plan(claimed("c", EVERY_FIVE, catch_up="latest"), now)
    late = shared_plan(claimed("d", EVERY_FIVE, max_lateness=600), now)
    queued = shared_plan(claimed("f", EVERY_FIVE, overlap="queue"), now)
    overlapping = shared_plan(claimed("g", EVERY_FIVE, overlap="overlap"), now)
    # Another schedule object: its own plan.
    hourly = shared_plan(claimed("e", CronSchedule("0 * * * *", "UTC")), now)
    assert every_five == planned(EVERY_FIVE, DUE, now)
    assert capped == planned(EVERY_FIVE, DUE, now, catch_up_cap=2)
    assert latest == planned(EVERY_FIVE, DUE, now, catch_up="latest")
    assert late == planned(EVERY_FIVE, DUE, now, max_lateness=600)
    assert queued == planned(EVERY_FIVE, DUE, now, overlap=Overlap.QUEUE)
    assert overlapping == plan_due(EVERY_FIVE, DUE, now)
    assert hourly == planned(HOURLY, DUE, now)
    assert len({every_five, capped, latest, late, queued, overlapping, hourly}) == 7
