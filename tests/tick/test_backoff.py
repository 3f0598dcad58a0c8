"""Beat's wait after a failed tick (tick/backoff.py), on errors a real
PostgreSQL gives: a server that is not there is an outage (short back-off,
said once), a statement the server cancelled is not."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from celery_routines.tick.backoff import (
    DATABASE_BACKOFF_CAP,
    ERROR_BACKOFF_CAP,
    TickBackoff,
    database_unreachable,
)
from tests.faults.cluster import free_port

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
def refused() -> DBAPIError:
    """What a tick meets while no server listens (a primary gone, no standby promoted)."""
    return error_of(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/postgres")


def test_an_absent_server_is_an_outage_and_a_cancelled_statement_is_not(
    refused: DBAPIError, postgres_url: str
) -> None:
    cancelled = error_of(postgres_url, "SET statement_timeout = 1; SELECT pg_sleep(1)")
    assert database_unreachable(refused)
    assert not database_unreachable(cancelled)  # an OperationalError too (57014)


def test_an_outage_backs_off_to_the_database_cap_and_is_said_once(
    refused: DBAPIError, caplog: pytest.LogCaptureFixture
) -> None:
    backoff = TickBackoff(logging.getLogger("celery_routines.beat"))
    with caplog.at_level(logging.INFO, logger="celery_routines.beat"):
        waits = [backoff.failed(refused, 300.0) for _ in range(8)]
        backoff.succeeded()
    assert waits == [1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0] and DATABASE_BACKOFF_CAP == 2.0
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("beat tick failed; trying again in 1 s (then every 2 s at most")
    assert lines[1].startswith("beat tick succeeded again: the database was unreachable for")
    assert lines[1].endswith("(8 failed ticks)")


def test_other_errors_back_off_to_the_general_cap_and_each_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backoff = TickBackoff(logging.getLogger("celery_routines.beat"))
    with caplog.at_level(logging.INFO, logger="celery_routines.beat"):
        waits = [backoff.failed(ValueError("a bug"), 300.0) for _ in range(7)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, ERROR_BACKOFF_CAP, ERROR_BACKOFF_CAP]
    assert len(caplog.records) == 7
    assert backoff.failed(ValueError("a bug"), 5.0) == 5.0  # never past the longest sleep
