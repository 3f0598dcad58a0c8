"""Fault tests: real beat subprocesses against real PostgreSQL and Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_routines.store import Store
from tests.faults.cluster import Cluster


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
