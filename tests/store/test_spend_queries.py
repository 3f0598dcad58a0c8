"""Ceiling usage and suspension queries against real SQLite and PostgreSQL."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text, update

from celery_routines.policy.ceilings import Ceiling, decide_after_run, decide_before_send
from celery_routines.store import NewRun, Store
from celery_routines.store.models import ROUTINE_RUNS
from celery_routines.store.spend_queries import RunCeiling, SpendQueries
from tests.store.test_due_query_plan import explain
from tests.store.test_store import add_routine

ROME = "Europe/Rome"
# Rome's 25-hour day: 2026-10-25 00:00 CEST is 2026-10-24 22:00 UTC, and the
# next midnight, 2026-10-26 00:00 CET, is 2026-10-25 23:00 UTC.
DAY_START = datetime(2026, 10, 24, 22, tzinfo=UTC)
DAY_END = datetime(2026, 10, 25, 23, tzinfo=UTC)
NOON = datetime(2026, 10, 25, 11, tzinfo=UTC)

runs_table = ROUTINE_RUNS


@pytest.fixture
def spend(store: Store) -> SpendQueries:
    return SpendQueries(store.engine)


def write_run(
    store: Store,
    routine_id: int,
    created_at: datetime,
    *,
    state: str = "pending",
    spend: dict[str, object] | str | None = None,
    reason: str | None = None,
    scheduled_for: datetime | None = None,
    skipped_count: int | None = None,
) -> str:
    """One run row as beat writes it, then moved to ``state`` as its lifecycle would."""
    run_id = str(uuid.uuid4())
    window = scheduled_for or created_at
    new = NewRun(
        id=run_id,
        routine_id=routine_id,
        idempotency_key=f"r@{window.isoformat()}#{run_id[:8]}",
        attempt=1,
        scheduled_for=window,
        state="skipped" if state == "skipped" else "pending",
        reason=reason if state == "skipped" else None,
        skipped_count=skipped_count,
    )
    assert store.runs.insert_new([new], created_at) == {run_id}
    if state not in ("pending", "skipped"):
        values: dict[str, object] = {"state": state, "reason": reason}
        if spend is not None:
            values["spend"] = spend if isinstance(spend, str) else json.dumps(spend)
        with store.engine.begin() as conn:
            conn.execute(update(runs_table).where(runs_table.c.id == run_id).values(**values))
    return run_id


# -- what a run costs ----------------------------------------------------------


def test_every_run_that_went_out_costs_a_fire_in_flight_ones_included(
    store: Store, spend: SpendQueries
) -> None:
    rid = add_routine(store, "poll")
    write_run(store, rid, NOON)  # pending: the row is written, the message not yet sent
    write_run(store, rid, NOON, state="sent")
    write_run(store, rid, NOON, state="running")
    write_run(store, rid, NOON, state="succeeded", spend={"fires": 1, "eur": 0.12})
    write_run(store, rid, NOON, state="failed", spend={"fires": 1, "eur": 0.05})
    write_run(store, rid, NOON, state="retrying", spend={"fires": 1})
    write_run(store, rid, NOON, state="lost")  # killed worker: no ledger
    used = spend.used(rid, DAY_START, DAY_END)
    assert used == {"fires": 7.0, "eur": pytest.approx(0.17)}


def test_skipped_rows_and_unpublished_runs_cost_nothing(store: Store, spend: SpendQueries) -> None:
    rid = add_routine(store, "poll")
    write_run(store, rid, NOON, state="skipped", reason="catch_up_cap", skipped_count=500)
    write_run(store, rid, NOON, state="skipped", reason="ceiling", skipped_count=12)
    write_run(store, rid, NOON, state="failed", reason="send_failed")
    write_run(store, rid, NOON, state="retrying", reason="send_failed")  # retried later
    assert spend.used(rid, DAY_START, DAY_END) == {"fires": 0.0}
    # Runs that went out and failed or were lost still cost.
    write_run(store, rid, NOON, state="failed", spend={"fires": 1})
    write_run(store, rid, NOON, state="retrying", reason="lost")
    write_run(store, rid, NOON, state="failed", reason="replaced")
    assert spend.used(rid, DAY_START, DAY_END) == {"fires": 3.0}


def test_a_run_is_charged_to_the_period_of_its_created_at(
    store: Store, spend: SpendQueries
) -> None:
    rid = add_routine(store, "poll")
    other = add_routine(store, "other")
    microsecond = timedelta(microseconds=1)
    write_run(store, rid, DAY_START - microsecond)  # the day before
    write_run(store, rid, DAY_START)  # the first instant of the day
    write_run(store, rid, DAY_END - timedelta(seconds=1))  # the last second of the day
    write_run(store, rid, DAY_END)  # the next day
    write_run(store, other, NOON)  # another routine
    # A catch-up replay of yesterday's window, sent today, is charged today.
    write_run(store, rid, NOON, scheduled_for=DAY_START - timedelta(hours=5))
    assert spend.used(rid, DAY_START, DAY_END) == {"fires": 3.0}


def test_decimal_amounts_add_up_exactly(store: Store, spend: SpendQueries) -> None:
    rid = add_routine(store, "poll")
    for _ in range(10):
        write_run(store, rid, NOON, state="succeeded", spend={"fires": 1, "eur": 0.1})
    for amount in (0.1, 0.2, 0.3):
        write_run(store, rid, NOON, state="succeeded", spend={"fires": 1, "eur": amount})
    used = spend.used(rid, DAY_START, DAY_END)
    assert used == {"fires": 13.0, "eur": 1.6}


def test_extra_fires_and_malformed_ledgers(store: Store, spend: SpendQueries) -> None:
    rid = add_routine(store, "poll")
    write_run(store, rid, NOON, state="succeeded", spend={"fires": 3})  # spend(2) inside
    write_run(store, rid, NOON, state="succeeded", spend={"fires": 0, "emails": 40})
    write_run(store, rid, NOON, state="succeeded", spend={"eur": 2})
    write_run(store, rid, NOON, state="succeeded", spend="not json")
    write_run(store, rid, NOON, state="succeeded", spend="[1, 2]")
    write_run(store, rid, NOON, state="succeeded", spend={"eur": -5, "sms": "x", "ok": True})
    used = spend.used(rid, DAY_START, DAY_END)
    # 3 + 1 (a run always costs its own fire) + 1 + 1 + 1 + 1.
    assert used == {"fires": 8.0, "emails": 40.0, "eur": 2.0}


def test_used_by_ceiling_reads_each_ceiling_in_its_own_period(
    store: Store, spend: SpendQueries
) -> None:
    rid = add_routine(store, "poll")
    earlier_this_month = datetime(2026, 10, 3, 9, tzinfo=UTC)
    last_month = datetime(2026, 9, 30, 21, 59, tzinfo=UTC)  # 23:59 CEST on 30 September
    write_run(store, rid, earlier_this_month, state="succeeded", spend={"fires": 1, "eur": 1.5})
    write_run(store, rid, last_month, state="succeeded", spend={"fires": 1, "eur": 9})
    write_run(store, rid, NOON, state="succeeded", spend={"fires": 1, "eur": 0.5})
    write_run(store, rid, NOON, state="running")
    ceilings = [Ceiling(10, per="day"), Ceiling(5, per="month", unit="eur")]
    used = spend.used_by_ceiling(rid, ceilings, NOON, ROME)
    assert used == {"fires": 2.0, "eur": 2.0}
    # Ceilings sharing a period share the query's answer.
    same_period = [Ceiling(10, per="day"), Ceiling(5, per="day", unit="eur")]
    assert spend.used_by_ceiling(rid, same_period, NOON, ROME) == {"fires": 2.0, "eur": 0.5}
    assert spend.used_by_ceiling(rid, [], NOON, ROME) == {}


def test_the_usage_query_is_a_range_scan_of_the_routine_created_index(
    run_history: Store, spend: SpendQueries
) -> None:
    plan = explain(run_history, spend.used_select(1, DAY_START, DAY_END))
    assert "ix_routine_runs_routine_created" in plan, plan
    assert "SCAN routine_runs\n" not in plan + "\n", plan


# -- suspension ----------------------------------------------------------------


def suspension_of(store: Store, rid: int) -> tuple[datetime | None, str | None]:
    record = store.routines.by_id(rid)
    assert record is not None
    return record.suspended_until, record.suspended_reason


def test_suspend_keeps_the_longest_suspension(store: Store, spend: SpendQueries) -> None:
    rid = add_routine(store, "poll")
    week_end = datetime(2026, 10, 25, 23, tzinfo=UTC) + timedelta(days=7)
    assert spend.suspend(rid, DAY_END, "day reason", NOON)
    assert suspension_of(store, rid) == (DAY_END, "day reason")
    assert spend.suspend(rid, week_end, "week reason", NOON)
    # A worker that decided on the day ceiling a moment later does not cut it short.
    assert not spend.suspend(rid, DAY_END, "day reason", NOON)
    assert suspension_of(store, rid) == (week_end, "week reason")


def test_lift_expired_clears_only_suspensions_that_ended(store: Store, spend: SpendQueries) -> None:
    ended = add_routine(store, "ended")
    running = add_routine(store, "running")
    never = add_routine(store, "never")
    spend.suspend(ended, DAY_END, "over", NOON)
    spend.suspend(running, DAY_END + timedelta(hours=1), "not yet", NOON)
    assert spend.lift_expired([ended, running, never], DAY_END) == {ended}
    assert suspension_of(store, ended) == (None, None)
    assert suspension_of(store, running)[1] == "not yet"
    assert suspension_of(store, never) == (None, None)
    assert spend.lift_expired([], DAY_END) == set()


# -- the checks carried out against the store ----------------------------------


def test_a_ceiling_hit_on_the_25_hour_day_suspends_until_local_midnight(
    store: Store, spend: SpendQueries
) -> None:
    """What beat will do each tick: read usage, decide, write rows or suspend."""
    rid = add_routine(store, "poll", timezone=ROME, ceiling=json.dumps([{"limit": 3}]))
    ceilings = [Ceiling(3, per="day")]
    now = datetime(2026, 10, 25, 0, 30, tzinfo=UTC)  # 02:30 CEST, the first of two
    sent = 0
    for _ in range(5):
        used = spend.used_by_ceiling(rid, ceilings, now, ROME)
        decision = decide_before_send(ceilings, used, now, ROME)
        for _ in range(decision.send):
            write_run(store, rid, now)  # pending: counted before it is even sent
            sent += 1
        if decision.suspension is not None:
            suspension = decision.suspension
            spend.suspend(rid, suspension.until, suspension.reason, now)
            break
        now += timedelta(hours=1)
    assert sent == 3
    assert suspension_of(store, rid) == (
        DAY_END,
        "ceiling 3 fires/day reached (3 used); resumes 2026-10-26 00:00 CET (Europe/Rome)",
    )
    # After the period turns the budget is fresh.
    assert spend.lift_expired([rid], DAY_END) == {rid}
    used = spend.used_by_ceiling(rid, ceilings, DAY_END, ROME)
    assert decide_before_send(ceilings, used, DAY_END, ROME).send == 1


def test_the_after_run_read_gives_the_run_and_its_routines_ceiling(
    store: Store, spend: SpendQueries
) -> None:
    ceiling = json.dumps([{"limit": 1, "per": "month", "unit": "eur"}])
    rid = add_routine(store, "poll", timezone=ROME, ceiling=ceiling)
    run_id = write_run(store, rid, NOON, state="succeeded")
    found = spend.run_ceiling(run_id)
    assert found == RunCeiling(
        routine_id=rid, routine_name="poll", created_at=NOON, ceiling=ceiling, timezone=ROME
    )
    assert found.created_at.tzinfo is UTC
    plain = add_routine(store, "plain")
    assert spend.run_ceiling(write_run(store, plain, NOON)) == RunCeiling(
        routine_id=plain, routine_name="plain", created_at=NOON, ceiling=None, timezone=None
    )
    assert spend.run_ceiling("no-such-run") is None


def test_the_after_run_check_sees_the_spend_the_run_recorded(
    store: Store, spend: SpendQueries
) -> None:
    """What the worker will do after recording a run's outcome."""
    rid = add_routine(store, "poll", timezone=ROME)
    ceilings = [Ceiling(1, per="month", unit="eur")]
    created = NOON
    run_id = write_run(store, rid, created, state="running")
    used = spend.used_by_ceiling(rid, ceilings, created, ROME)
    assert decide_after_run(ceilings, used, NOON, ROME, charged_at=created) is None
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE routine_runs SET state = 'succeeded', spend = :s WHERE id = :id"),
            {"s": json.dumps({"fires": 1, "eur": 1.25}), "id": run_id},
        )
    finished = NOON + timedelta(minutes=3)
    used = spend.used_by_ceiling(rid, ceilings, created, ROME)
    suspension = decide_after_run(ceilings, used, finished, ROME, charged_at=created)
    assert suspension is not None
    assert suspension.until == datetime(2026, 10, 31, 23, tzinfo=UTC)
    assert suspension.reason == (
        "ceiling 1 eur/month reached (1.25 used); resumes 2026-11-01 00:00 CET (Europe/Rome)"
    )
