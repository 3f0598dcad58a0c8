"""The lifecycle's queries are index range scans, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import text

from celery_routines.store import Store
from tests.store.test_due_query_plan import explain

NOW = datetime(2026, 11, 30, tzinfo=UTC)


def test_the_lost_sweep_is_a_range_scan_of_the_deadline_index(store: Store) -> None:
    plan = explain(store, store.runs.overdue_select(NOW, 100))
    assert "ix_routine_runs_deadline" in plan, plan


def test_the_retry_query_is_a_range_scan_of_the_retry_index(store: Store) -> None:
    plan = explain(store, store.runs.retries_due_select(NOW, 100))
    assert "ix_routine_runs_retry_due" in plan, plan


def test_the_overlap_check_uses_the_open_runs_index(store: Store) -> None:
    # Only integers and constants: render them inline (the IN list expands).
    statement = store.runs.open_runs_select([1, 2, 3]).compile(
        store.engine, compile_kwargs={"literal_binds": True}
    )
    with store.engine.begin() as conn:
        if store.engine.dialect.name == "postgresql":
            conn.execute(text("SET LOCAL enable_seqscan = off"))
            plan = "\n".join(row[0] for row in conn.exec_driver_sql(f"EXPLAIN {statement}"))
        else:
            rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}")
            plan = "\n".join(str(row[-1]) for row in rows)
    assert "ix_routine_runs_open" in plan, plan


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
