"""The due-query is an index range scan, not a scan of every routine (on
MySQL/MariaDB too; benchmarks/explain.py shows it at 1M routines)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text

from celery_routines.store import Store
from celery_routines.store.dialects import is_mysql


def mysql_plan_line(step: Any) -> str:
    """One row of MySQL's EXPLAIN in the words the assertions look for: a
    full table scan reads as SQLite's ``SCAN <table>``, a sort as ``Sort``."""
    access, table, extra = step["type"], step["table"], step["Extra"] or ""
    if access == "ALL":
        return f"SCAN {table}"
    sort = " Sort (filesort)" if "filesort" in extra else ""
    return f"{access} {table} USING INDEX {step['key']} ({extra}){sort}"


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
        if is_mysql(store.engine):
            return "\n".join(
                mysql_plan_line(row._mapping)
                for row in conn.exec_driver_sql("EXPLAIN " + str(compiled), params)
            )
        positional = tuple(params[name] for name in compiled.positiontup)
        rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + str(compiled), positional)
        return "\n".join(str(row[-1]) for row in rows)


def test_the_due_query_is_a_range_scan_of_the_due_index(store: Store) -> None:
    plan = explain(store, store.routines.due_select(datetime(2026, 11, 30, tzinfo=UTC), 100))
    assert "ix_routines_due" in plan, plan
    assert "SCAN routines\n" not in plan + "\n", plan
    if is_mysql(store.engine):
        assert plan.startswith("range routines USING INDEX ix_routines_due"), plan
