"""The due-query is an index range scan, not a scan of every routine."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import text

from celery_routines.store import Store


def explain(store: Store, statement: object) -> str:
    with store.engine.begin() as conn:
        compiled = statement.compile(conn)  # type: ignore[attr-defined]
        params = {
            k: v.replace(tzinfo=None) if isinstance(v, datetime) else v
            for k, v in compiled.params.items()
        }
        if store.engine.dialect.name == "postgresql":
            # An empty table is cheaper to scan; make the planner choose honestly.
            conn.execute(text("SET LOCAL enable_seqscan = off"))
            rows = conn.exec_driver_sql("EXPLAIN " + str(compiled), params)
            return "\n".join(row[0] for row in rows)
        positional = tuple(params[name] for name in compiled.positiontup)
        rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + str(compiled), positional)
        return "\n".join(str(row[-1]) for row in rows)


def test_the_due_query_is_a_range_scan_of_the_due_index(store: Store) -> None:
    plan = explain(store, store.routines.due_select(datetime(2026, 11, 30, tzinfo=UTC), 100))
    assert "ix_routines_due" in plan, plan
    assert "SCAN routines\n" not in plan + "\n", plan
