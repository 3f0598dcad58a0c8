"""The run listings across routines walk an index in their order and stop at
their limit: the cost follows the limit, not the size of the run history."""

from __future__ import annotations

from celery_routines.store import Store
from tests.store.conftest import HISTORY_RUNS, HISTORY_START, HISTORY_STEP
from tests.store.test_due_query_plan import explain


def assert_reads(plan: str, index: str) -> None:
    assert index in plan, plan
    assert "SCAN routine_runs\n" not in plan + "\n", plan
    assert "Seq Scan on routine_runs" not in plan, plan


def assert_walks(plan: str, index: str) -> None:
    assert_reads(plan, index)
    # The index gives the whole order: no sort step, the scan stops at the limit.
    assert "Sort" not in plan and "TEMP B-TREE" not in plan, plan


def test_the_runs_listing_walks_the_created_index(run_history: Store) -> None:
    plan = explain(run_history, run_history.admin.runs_select(limit=50))
    assert_walks(plan, "ix_routine_runs_created")


def test_the_runs_listing_since_an_instant_is_a_range_of_the_created_index(
    run_history: Store,
) -> None:
    since = HISTORY_START + (HISTORY_RUNS - 100) * HISTORY_STEP
    plan = explain(run_history, run_history.admin.runs_select(since=since, limit=50))
    assert_walks(plan, "ix_routine_runs_created")


def test_the_skips_listing_reads_the_partial_skipped_index(run_history: Store) -> None:
    plan = explain(run_history, run_history.admin.runs_select(states=["skipped"], limit=1000))
    # Every skip here fits in the limit: PostgreSQL may read them all off the
    # partial index and sort those few rows instead of walking it in order.
    assert_reads(plan, "ix_routine_runs_skipped_created")
