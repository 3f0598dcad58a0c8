"""Prepared statements where they are safe: on a connection that reaches the
PostgreSQL server directly (plans kept per session, as psycopg's default
does), never through a pooler, where the next transaction may run on another
server session that lacks the statement (PgBouncer 1.18 in transaction
pooling here). The choice is made per connection, at connect, by comparing
the address and port dialled with the ones the server took the connection on
(``celery_routines.store.prepared.prepare_unless_pooled``).
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from celery_routines.store import Store
from celery_routines.store.prepared import same_endpoint
from tests.faults.pgbouncer import PgBouncer

pytestmark = [pytest.mark.postgres]


def threshold_and_prepared(store: Store) -> tuple[Any, int]:
    """The connection's prepare threshold, and the statements it prepared
    after running one statement more times than psycopg's threshold."""
    with store.engine.connect() as conn:
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        threshold = dbapi.prepare_threshold  # type: ignore[attr-defined]
        for _ in range(8):
            conn.execute(text("SELECT count(*) FROM routines WHERE enabled")).scalar()
        prepared = conn.execute(text("SELECT count(*) FROM pg_prepared_statements")).scalar()
    return threshold, int(prepared or 0)


def test_a_direct_connection_prepares_its_statements(postgres_url: str) -> None:
    store = Store.from_url(postgres_url)
    try:
        store.migrate()
        threshold, prepared = threshold_and_prepared(store)
    finally:
        store.dispose()
    assert threshold == 5
    assert prepared >= 1


def test_a_connection_through_pgbouncer_prepares_nothing(
    postgres_url: str, pgbouncer: PgBouncer
) -> None:
    Store.from_url(postgres_url).migrate()
    store = Store.from_url(pgbouncer.url(postgres_url))
    try:
        threshold, prepared = threshold_and_prepared(store)
    finally:
        store.dispose()
    assert threshold is None
    assert prepared == 0


@pytest.mark.parametrize(("setting", "expected"), [("on", 5), ("off", None)])
def test_the_setting_overrides_the_choice(postgres_url: str, setting: str, expected: Any) -> None:
    store = Store.from_url(postgres_url, prepared_statements=setting)
    try:
        store.migrate()
        threshold, _ = threshold_and_prepared(store)
    finally:
        store.dispose()
    assert threshold == expected


def test_only_the_same_address_and_port_count_as_direct() -> None:
    assert same_endpoint(("127.0.0.1", 5432), ("127.0.0.1", 5432))
    assert same_endpoint(("::1", 5432), ("0:0:0:0:0:0:0:1", 5432))
    assert not same_endpoint(("127.0.0.1", 6432), ("127.0.0.1", 5432))  # a pooler's port
    assert not same_endpoint(("10.0.0.5", 5432), ("10.0.0.9", 5432))  # a proxy's host
    assert not same_endpoint(("", 5432), (None, None))  # a Unix socket: maybe PgBouncer's
    assert not same_endpoint(("127.0.0.1", 5432), (None, None))
