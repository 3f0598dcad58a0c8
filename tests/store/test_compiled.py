"""Statements compiled once to the driver's SQL (the worker's claim and outcome)."""

from __future__ import annotations

import pytest
from sqlalchemy import column, select, table
from sqlalchemy.dialects import postgresql, sqlite

from celery_routines.store.compiled import DriverStatement

runs = table("routine_runs", column("id"), column("state"))


def test_a_statement_keeps_its_literal_values_beside_the_sql() -> None:
    statement = select(runs.c.id).where(runs.c.state == "running")
    compiled = DriverStatement.compile(statement, postgresql.psycopg.dialect())
    assert "%(state_1)s" in compiled.sql
    assert compiled.defaults["state_1"] == "running"


def test_an_expanding_in_is_refused_rather_than_run_as_a_broken_string() -> None:
    statement = select(runs.c.id).where(runs.c.state.in_(["pending", "sent"]))
    with pytest.raises(ValueError, match="cannot compile once"):
        DriverStatement.compile(statement, postgresql.psycopg.dialect())


def test_a_positional_driver_is_refused() -> None:
    statement = select(runs.c.id).where(runs.c.state == "running")
    with pytest.raises(ValueError, match="cannot compile once"):
        DriverStatement.compile(statement, sqlite.dialect())


def test_many_instants_convert_like_the_column_type_through_a_repeated_hour() -> None:
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    from celery_routines.store.compiled import naive_utc, naive_utc_many

    rome = ZoneInfo("Europe/Rome")
    # 02:30 on 2026-10-25 in Rome, both readings: equal as Python compares
    # them (and hashed alike), an hour apart in UTC.
    first = datetime(2026, 10, 25, 2, 30, tzinfo=rome)
    second = first.replace(fold=1)
    instants = [first, second, None, datetime(2026, 1, 1, tzinfo=UTC)] * 2
    assert naive_utc_many(instants) == [naive_utc(i) for i in instants]
    assert naive_utc_many([first, second]) == [
        datetime(2026, 10, 25, 0, 30),
        datetime(2026, 10, 25, 1, 30),
    ]
    with pytest.raises(ValueError, match="naive datetime"):
        naive_utc_many([datetime(2026, 1, 1)])
