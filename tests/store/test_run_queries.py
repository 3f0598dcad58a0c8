"""The lifecycle's queries are index range scans, on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from celery_routines.store import Store
from celery_routines.store.dialects import is_mysql
from tests.store.test_due_query_plan import explain, mysql_plan_line

NOW = datetime(2026, 11, 30, tzinfo=UTC)
HISTORY = 2000


@pytest.fixture
def planned(store: Store) -> Store:
    """On MySQL/MariaDB, the store with a run history and its statistics:
    on empty tables its optimizer breaks ties between indexes that share a
    leading column at random (PostgreSQL's tests switch sequential scans off
    instead). Mostly finished runs, past their deadlines, as in a real store."""
    if not is_mysql(store.engine):
        return store
    start = NOW - timedelta(days=14)  # the later half of the deadlines still ahead
    with store.engine.begin() as conn:
        conn.execute(
            text("INSERT INTO routines (name, task, interval_seconds) VALUES (:n, 't', 60)"),
            [{"n": f"plan-{i}"} for i in range(20)],
        )
        ids = conn.execute(text("SELECT id FROM routines ORDER BY id")).scalars().all()
        states = ["succeeded"] * 17 + ["sent", "running", "retrying"]
        conn.execute(
            text(
                "INSERT INTO routine_runs (id, routine_id, idempotency_key, attempt,"
                " scheduled_for, state, created_at, deadline_at, retry_at)"
                " VALUES (:id, :rid, :key, 1, :at, :state, :at, :deadline, :retry)"
            ),
            [
                {
                    "id": f"plan-{i}",
                    "rid": ids[i % len(ids)],
                    "key": f"plan@{i}",
                    "at": (start + timedelta(minutes=20 * i)).replace(tzinfo=None),
                    "state": states[i % len(states)],
                    "deadline": (start + timedelta(minutes=20 * i + 60)).replace(tzinfo=None),
                    "retry": (start + timedelta(minutes=20 * i + 5)).replace(tzinfo=None)
                    if states[i % len(states)] == "retrying"
                    else None,
                }
                for i in range(HISTORY)
            ],
        )
        conn.execute(text("ANALYZE TABLE routines, routine_runs"))
    return store


def test_the_lost_sweep_is_a_range_scan_of_the_deadline_index(planned: Store) -> None:
    store = planned
    plan = explain(store, store.runs.overdue_select(NOW, 100))
    assert "ix_routine_runs_deadline" in plan, plan


def test_the_retry_query_is_a_range_scan_of_the_retry_index(planned: Store) -> None:
    store = planned
    plan = explain(store, store.retries.retries_due_select(NOW, 100))
    assert "ix_routine_runs_retry_due" in plan, plan


def test_the_overlap_check_uses_the_open_runs_index(planned: Store) -> None:
    store = planned
    # Only integers and constants: render them inline (the IN list expands).
    statement = store.runs.open_runs_select([1, 2, 3]).compile(
        store.engine, compile_kwargs={"literal_binds": True}
    )
    with store.engine.begin() as conn:
        if store.engine.dialect.name == "postgresql":
            conn.execute(text("SET LOCAL enable_seqscan = off"))
            plan = "\n".join(row[0] for row in conn.exec_driver_sql(f"EXPLAIN {statement}"))
        elif is_mysql(store.engine):
            rows = conn.exec_driver_sql(f"EXPLAIN {statement}")
            plan = "\n".join(mysql_plan_line(row._mapping) for row in rows)
        else:
            rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}")
            plan = "\n".join(str(row[-1]) for row in rows)
    assert "ix_routine_runs_open" in plan, plan


def test_the_tick_s_overlap_check_on_postgresql_is_one_array_on_the_open_runs_index(
    planned: Store,
) -> None:
    """The statement the tick runs: the routine ids as one array parameter
    (``= ANY``), not a rendered IN list; the same partial index."""
    store = planned
    if store.engine.dialect.name != "postgresql":
        pytest.skip("the array form is PostgreSQL's")
    sql = str(store.runs._open_runs.compile(store.engine))
    assert "ANY (" in sql and "POSTCOMPILE" not in sql, sql
    # Marking a chunk sent takes its run ids the same way.
    for marking in (store.runs._mark_sent, store.runs._mark_sent_with_deadline):
        marked = str(marking.compile(store.engine))
        assert "ANY (" in marked and "POSTCOMPILE" not in marked, marked
    with store.engine.begin() as conn:
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        rows = conn.exec_driver_sql(f"EXPLAIN {sql}", {"ids": [1, 2, 3]})
        plan = "\n".join(row[0] for row in rows)
    assert "ix_routine_runs_open" in plan, plan
    assert store.runs.open_runs([]) == {}


def test_runs_left_open_before_migration_0002_get_a_deadline(database_url: str) -> None:
    from alembic import command

    from celery_routines.store import migrate

    store = Store.from_url(database_url)
    try:
        config = migrate._alembic_config()
        with store.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, "0001_initial")
        with store.engine.begin() as conn:
            conn.execute(
                text("INSERT INTO routines (name, task, interval_seconds) VALUES ('r', 't', 60)")
            )
            conn.execute(
                text(
                    "INSERT INTO routine_runs (id, routine_id, idempotency_key, attempt, "
                    "scheduled_for, state, created_at, sent_at) VALUES ('open', 1, 'r@x', 1, "
                    "'2026-01-01 00:00:00', 'sent', '2026-01-01 00:00:00', '2026-01-01 00:00:05')"
                )
            )
        store.migrate()
        assert store.runs.get("open").deadline_at == datetime(2026, 1, 1, 1, 0, 5, tzinfo=UTC)
        assert [r.id for r in store.runs.overdue(datetime(2026, 1, 1, 2, tzinfo=UTC), 10)] == [
            "open"
        ]
    finally:
        store.dispose()
