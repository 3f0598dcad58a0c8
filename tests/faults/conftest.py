"""Fault tests: real beat subprocesses against real PostgreSQL and Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_routines.store import Store
from tests import services
from tests.faults.cluster import Cluster

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
def cluster(tmp_path: Path, postgres_url: str, redis_url: str) -> Iterator[Cluster]:
    store = Store.from_url(postgres_url)
    store.migrate()
    cluster = Cluster(tmp_path, postgres_url, redis_url, store)
    try:
        yield cluster
    finally:
        cluster.stop_all()
        store.dispose()
