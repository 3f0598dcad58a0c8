"""Array parameters bound as one literal: PostgreSQL reads back exactly the list."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import create_engine, text

from celery_routines.store.compiled import naive_utc
from celery_routines.store.pg_arrays import int_array, text_array, timestamp_array

# Every character an array literal gives a meaning to, and the word NULL.
AWKWARD = [
    "plain",
    "with,comma",
    "{braces}",
    'double "quoted"',
    "back\\slash",
    "\\",
    '"',
    "NULL",
    "null",
    "",
    "  spaced  ",
    "nightly@2026-03-29T03:30:00+02:00",
    "été ☃",
    None,
]
ROME = ZoneInfo("Europe/Rome")
# 02:30 on 2026-10-25 in Rome, both readings: equal as Python compares (and
# hashes) them, an hour apart in UTC.
FIRST = datetime(2026, 10, 25, 2, 30, tzinfo=ROME)
SECOND = FIRST.replace(fold=1)
INSTANTS = [
    FIRST,
    SECOND,
    None,
    datetime(2026, 1, 1, tzinfo=UTC),
    datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=UTC),
    datetime(1, 1, 1, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC),
] * 2


@pytest.fixture
def read_back(postgres_url: str):  # type: ignore[no-untyped-def]
    engine = create_engine(postgres_url)

    def read(literal: str, cast: str) -> list[object]:
        with engine.connect() as conn:
            return list(conn.execute(text(f"SELECT CAST(:v AS {cast})"), {"v": literal}).scalar())

    yield read
    engine.dispose()


def test_text_values_read_back_unchanged(read_back) -> None:  # type: ignore[no-untyped-def]
    assert read_back(text_array(AWKWARD), "varchar[]") == AWKWARD
    assert read_back(text_array(AWKWARD), "text[]") == AWKWARD
    assert read_back(text_array([]), "varchar[]") == []


def test_integers_read_back_unchanged(read_back) -> None:  # type: ignore[no-untyped-def]
    values = [1, None, 0, -7, 2**31 - 1]
    assert read_back(int_array(values), "integer[]") == values


def test_instants_are_written_as_the_column_type_stores_them(read_back) -> None:  # type: ignore[no-untyped-def]
    assert read_back(timestamp_array(INSTANTS), "timestamp[]") == [naive_utc(i) for i in INSTANTS]
    assert read_back(timestamp_array([FIRST, SECOND]), "timestamp[]") == [
        datetime(2026, 10, 25, 0, 30),
        datetime(2026, 10, 25, 1, 30),
    ]


def test_a_naive_instant_is_refused_like_the_column_type_refuses_it() -> None:
    with pytest.raises(ValueError, match="naive datetime"):
        timestamp_array([datetime(2026, 1, 1)])


def test_the_run_statements_bind_their_array_literals_untyped() -> None:
    # A literal bound as ``%(ids)s::VARCHAR`` and cast to an array is an
    # expression PostgreSQL evaluates per row (a burst's overlap check went
    # from 6 ms to 430 ms a tick); untyped, it is read once as the array.
    from sqlalchemy.dialects.postgresql import psycopg

    from celery_routines.store.runs import RunQueries

    engine = create_engine("postgresql+psycopg://", module=__import__("psycopg"))
    queries = RunQueries(engine)
    dialect = psycopg.dialect()
    for statement in (queries._open_runs, queries._mark_sent, queries._mark_sent_with_deadline):
        sql = str(statement.compile(dialect=dialect))
        assert "CAST(%(ids)s AS" in sql, sql
