"""Beat's wait after a failed tick (tick/backoff.py), on errors a real
PostgreSQL gives: a server that is not there is an outage (short back-off,
said once), a statement the server cancelled is not."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from celery_routines.store.faults import database_unreachable, tables_missing
from celery_routines.tick.backoff import (
    DATABASE_BACKOFF_CAP,
    ERROR_BACKOFF_CAP,
    TickBackoff,
)
from tests.faults.cluster import free_port
from tests.faults.connection_cuts import shut_down_socket

pytestmark = pytest.mark.postgres


def error_of(url: str, sql: str = "SELECT 1") -> DBAPIError:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(text(sql))
    except DBAPIError as exc:
        return exc
    finally:
        engine.dispose()
    raise AssertionError(f"{sql} did not fail")


@pytest.fixture
def cut(postgres_url: str) -> DBAPIError:
    """What a tick meets when its connection was reset under it: the socket
    shut down, the next statement fails on the client."""
    engine = create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            shut_down_socket(conn)
            conn.execute(text("SELECT 1"))
    except DBAPIError as exc:
        assert exc.connection_invalidated
        return exc
    finally:
        engine.dispose()
    raise AssertionError("a statement on a shut-down socket did not fail")


@pytest.fixture
def refused() -> DBAPIError:
    """What a tick meets while no server listens (a primary gone, no standby promoted)."""
    return error_of(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/postgres")


def test_an_absent_server_is_an_outage_and_a_cancelled_statement_is_not(
    refused: DBAPIError, postgres_url: str
) -> None:
    cancelled = error_of(postgres_url, "SET statement_timeout = 1; SELECT pg_sleep(1)")
    assert database_unreachable(refused)
    assert not database_unreachable(cancelled)  # an OperationalError too (57014)


class Ticking:
    """An injected monotonic clock: the test moves it; nothing sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_backs_off_to_the_database_cap_and_is_said_once(
    refused: DBAPIError, caplog: pytest.LogCaptureFixture
) -> None:
    monotonic = Ticking()
    backoff = TickBackoff(logging.getLogger("celery_routines.beat"), monotonic)
    with caplog.at_level(logging.INFO, logger="celery_routines.beat"):
        waits = []
        for _ in range(8):
            waits.append(backoff.failed(refused, 300.0))
            monotonic.now += waits[-1]
        backoff.succeeded()
    assert waits == [1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0] and DATABASE_BACKOFF_CAP == 2.0
    records = caplog.records
    assert [r.levelno for r in records] == [logging.WARNING, logging.INFO], records
    said = records[0].getMessage()
    # One line, naming the fault and the driver's own words; no traceback.
    assert said.startswith(
        "beat tick failed: the database is unreachable (OperationalError: connection failed"
    ), said
    assert "\n" not in said and records[0].exc_info is None
    assert said.endswith(
        "; no sent run is left unrecorded (runs not sent stay due); trying again in 1 s, "
        "then every 2 s at most while it stays unreachable"
    ), said
    assert records[1].getMessage() == (
        "database reachable again after 15.0 s, 8 failed tick(s); ticking as usual"
    )


def test_the_traceback_of_an_outage_is_at_debug_only(
    refused: DBAPIError, caplog: pytest.LogCaptureFixture
) -> None:
    backoff = TickBackoff(logging.getLogger("celery_routines.beat"), Ticking())
    with caplog.at_level(logging.DEBUG, logger="celery_routines.beat"):
        backoff.failed(refused, 300.0, unrecorded="2 published run(s) and 1 routine advance(s)")
    [warning, debug] = caplog.records
    assert "2 published run(s) and 1 routine advance(s) not written down yet" in (
        warning.getMessage()
    )
    assert debug.levelno == logging.DEBUG and debug.exc_info is not None


def test_a_long_outage_says_so_once_a_minute_in_one_line(
    refused: DBAPIError, caplog: pytest.LogCaptureFixture
) -> None:
    monotonic = Ticking()
    backoff = TickBackoff(logging.getLogger("celery_routines.beat"), monotonic)
    with caplog.at_level(logging.INFO, logger="celery_routines.beat"):
        for _ in range(100):  # 1 s, then 2 s each: the first line, then one a minute
            monotonic.now += backoff.failed(refused, 300.0)
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 4, lines
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in caplog.records)
    assert lines[1].startswith(
        "beat tick failed: the database is still unreachable after 61 s (32 failed ticks; "
        "last: OperationalError: connection failed"
    ), lines[1]


def test_a_cut_connection_is_tried_again_at_once_then_backs_off(
    cut: DBAPIError, refused: DBAPIError, caplog: pytest.LogCaptureFixture
) -> None:
    backoff = TickBackoff(logging.getLogger("celery_routines.beat"), Ticking())
    with caplog.at_level(logging.INFO, logger="celery_routines.beat"):
        waits = [backoff.failed(cut, 300.0), backoff.failed(refused, 300.0)]
        waits.append(backoff.failed(refused, 300.0))
    assert waits == [0.0, 1.0, 2.0]
    [line] = [record.getMessage() for record in caplog.records]
    assert line.startswith("beat tick failed: its database connection was cut (OperationalError:")
    assert line.endswith("trying again at once on a new connection"), line


def test_redis_or_broker_unreachable_is_an_outage_too(caplog: pytest.LogCaptureFixture) -> None:
    import kombu.exceptions
    import redis

    for error, words in (
        (redis.exceptions.ConnectionError("Error 111 connecting"), "Redis is unreachable"),
        (redis.exceptions.TimeoutError("Timeout reading"), "Redis is unreachable"),
        (kombu.exceptions.OperationalError("[Errno 104] reset"), "the broker is unreachable"),
    ):
        caplog.clear()
        backoff = TickBackoff(logging.getLogger("celery_routines.beat"), Ticking())
        with caplog.at_level(logging.INFO, logger="celery_routines.beat"):
            assert backoff.failed(error, 300.0) == 1.0
        [record] = caplog.records
        assert record.levelno == logging.WARNING and record.exc_info is None
        assert record.getMessage().startswith(f"beat tick failed: {words} ("), record.getMessage()


def test_other_errors_back_off_to_the_general_cap_and_each_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backoff = TickBackoff(logging.getLogger("celery_routines.beat"))
    with caplog.at_level(logging.INFO, logger="celery_routines.beat"):
        waits = [backoff.failed(ValueError("a bug"), 300.0) for _ in range(7)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, ERROR_BACKOFF_CAP, ERROR_BACKOFF_CAP]
    assert len(caplog.records) == 7
    # A bug is not an outage: each failed tick an ERROR line; its traceback
    # once, with the first (someone has to read it to report the bug).
    assert all(r.levelno == logging.ERROR for r in caplog.records)
    assert [bool(r.exc_info) for r in caplog.records] == [True] + [False] * 6
    assert caplog.records[0].getMessage() == (
        "beat tick failed: ValueError: a bug; trying again in 1 s"
    )
    assert backoff.failed(ValueError("a bug"), 5.0) == 5.0  # never past the longest sleep
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="celery_routines.beat"):
        backoff.failed(KeyError("another bug"), 5.0)  # a new bug: its traceback too
        backoff.succeeded()
        backoff.failed(ValueError("a bug"), 5.0)  # back after a good tick: again
    assert [bool(r.exc_info) for r in caplog.records if r.levelno == logging.ERROR] == [True, True]


def test_missing_tables_are_one_line_per_failed_tick_without_the_statement(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The database recreated empty under a running beat: each failed tick
    says so in one line (no SQL, no parameters, no traceback) and what beat
    does about it; the traceback is there at DEBUG."""
    missing = error_of(postgres_url, "SELECT name FROM routines WHERE name = 'secret-param'")
    assert tables_missing(missing) and not database_unreachable(missing)
    assert not tables_missing(ValueError("no such table"))
    backoff = TickBackoff(logging.getLogger("celery_routines.beat"))
    with caplog.at_level(logging.DEBUG, logger="celery_routines.beat"):
        backoff.failed(missing, 300.0)
        backoff.failed(missing, 300.0)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        "beat tick failed: the store's tables are missing (UndefinedTable: relation "
        '"routines" does not exist); the next tick creates them and declares the code\'s '
        f"routines again, as at beat start; trying again in {wait:.0f} s"
        for wait in (1.0, 2.0)
    ]
    assert not any(r.exc_info for r in errors)
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(debug) == 2 and all(r.exc_info for r in debug)
