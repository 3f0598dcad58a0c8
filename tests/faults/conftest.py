"""Fault tests: real beat subprocesses against real PostgreSQL (or MariaDB) and Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_routines.store import Store
from tests import services
from tests.faults.cluster import Cluster, MariaDBServer
from tests.faults.pgbouncer import PgBouncer

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


@pytest.fixture
def libfaketime() -> Path:
    """Debian's libfaketime (``apt-get install faketime``): skipped without
    it, failed without it under ROUTINES_REQUIRE_SERVICES=1."""
    if not LIBFAKETIME.exists():
        message = f"libfaketime is not installed ({LIBFAKETIME}): apt-get install faketime"
        if services.services_required():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return LIBFAKETIME


@pytest.fixture
def cluster(
    tmp_path: Path, postgres_url: str, redis_url: str, migrated_schema: None
) -> Iterator[Cluster]:
    store = Store.from_url(postgres_url)
    store.migrate()
    cluster = Cluster(tmp_path, postgres_url, redis_url, store)
    try:
        yield cluster
    finally:
        cluster.stop_all()
        store.dispose()


@pytest.fixture(params=["postgresql", "mariadb"])
def store_cluster(
    request: pytest.FixtureRequest, tmp_path: Path, redis_url: str, migrated_schema: None
) -> Iterator[Cluster]:
    """:func:`cluster` on each server store: the faults that test the store's
    own guarantees (claims, the unique window key) run on both."""
    url = request.getfixturevalue(
        "postgres_url" if request.param == "postgresql" else "mariadb_url"
    )
    store = Store.from_url(url)
    store.migrate()
    cluster = Cluster(tmp_path, url, redis_url, store)
    try:
        yield cluster
    finally:
        cluster.stop_all()
        store.dispose()


@pytest.fixture
def private_mariadb(tmp_path: Path) -> Iterator[MariaDBServer]:
    """A MariaDB server of the test's own, which the test may kill."""
    missing = MariaDBServer.available()
    if missing:
        if services.services_required():
            pytest.fail(missing, pytrace=False)
        pytest.skip(missing)
    server = MariaDBServer(tmp_path)
    server.install()
    server.start()
    yield server
    server.kill()


@pytest.fixture
def pgbouncer(request: pytest.FixtureRequest) -> Iterator[PgBouncer]:
    """A private PgBouncer in front of the test PostgreSQL, in transaction
    pooling (``@pytest.mark.parametrize("pgbouncer", [...], indirect=True)``
    for another mode, or ``(mode, pool_size)``); stopped at teardown."""
    missing = PgBouncer.available()
    if missing:
        if services.services_required():
            pytest.fail(missing, pytrace=False)
        pytest.skip(missing)
    param = getattr(request, "param", "transaction")
    mode, size = param if isinstance(param, tuple) else (param, 20)
    bouncer = PgBouncer(mode, size)
    bouncer.start()
    yield bouncer
    bouncer.stop()
