"""EXPLAIN of what our tick asks PostgreSQL.

``explain_tick`` runs one tick while recording every statement it sends, then
asks PostgreSQL for the plan of each (EXPLAIN ANALYZE inside a transaction
that is rolled back, so nothing changes), plus the due-query itself
(``store.routines.due_select``, as the claim runs it: FOR UPDATE SKIP LOCKED).
Recording at the cursor keeps this independent of how the store builds its
statements.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, event

EXPLAIN = "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "


def _plan(conn: Any, sql: str, params: Any) -> str:
    if conn.dialect.name in ("mysql", "mariadb"):
        # MariaDB's EXPLAIN (not ANALYZE: that would run the statement) as
        # one line per table: access type, index, estimated rows, extra.
        rows = conn.exec_driver_sql("EXPLAIN " + sql, params).mappings().all()
        return "\n".join(
            f"{r['table']}: {r['type']} key={r['key']} rows={r['rows']} {r['Extra'] or ''}".strip()
            for r in rows
        )
    trans = conn.begin()
    try:
        rows = conn.exec_driver_sql(EXPLAIN + sql, params).all()
    finally:
        trans.rollback()
    return "\n".join(row[0] for row in rows)


def explain_due_select(store: Any, now: Any, limit: int) -> dict[str, str]:
    stmt = store.routines.due_select(now, limit).with_for_update(skip_locked=True)
    compiled = stmt.compile(dialect=store.engine.dialect)
    params = compiled.construct_params()
    processors = getattr(compiled, "_bind_processors", {})
    params = {k: (processors[k](v) if k in processors else v) for k, v in params.items()}
    with store.engine.connect() as conn:
        return {"sql": str(compiled), "plan": _plan(conn, str(compiled), params)}


def explain_tick(scheduler: Any) -> dict[str, Any]:
    store = scheduler.store
    statements: list[tuple[str, Any]] = []

    def record(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
    ) -> None:
        # An executemany is explained with its first parameter set.
        if many:
            parameters = parameters[0] if parameters else {}
        statements.append((statement, parameters))

    # While the hot routines are due, so the plan shows the rows it finds.
    due = explain_due_select(store, scheduler._clock(), scheduler.settings.batch_size)
    checkouts = [0]

    def checkout(*_: Any) -> None:
        checkouts[0] += 1

    # On the Engine class: the store also runs statements through option
    # engines (autocommit) derived from its engine.
    event.listen(Engine, "before_cursor_execute", record)
    event.listen(store.engine.pool, "checkout", checkout)
    try:
        scheduler.tick()
    finally:
        event.remove(Engine, "before_cursor_execute", record)
        event.remove(store.engine.pool, "checkout", checkout)
    report = getattr(scheduler, "last_report", None)
    out: dict[str, Any] = {
        "report": repr(report),
        "due_select": due,
        "tick_statements": [],
        # Each checkout is a pre-ping round trip when pool_pre_ping is on, and
        # each begin() a BEGIN and a COMMIT.
        "statement_count": len(statements),
        "pool_checkouts": checkouts[0],
        "pre_ping": bool(getattr(store.engine.pool, "_pre_ping", False)),
    }
    with store.engine.connect() as conn:
        for sql, params in statements:
            head = sql.lstrip().split(None, 1)[0].upper()
            if head not in ("SELECT", "UPDATE", "INSERT", "DELETE", "WITH"):
                continue
            try:
                plan = _plan(conn, sql, params)
            except Exception as exc:  # a plan we cannot get is reported, not fatal
                plan = f"(no plan: {type(exc).__name__}: {exc})"
            out["tick_statements"].append({"sql": " ".join(sql.split()), "plan": plan})
    return out
