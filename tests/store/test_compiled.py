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
