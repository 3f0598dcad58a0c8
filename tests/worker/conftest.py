"""What every worker test shares: an app on the test's store, and the
worker module's cached stores and settings forgotten after each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

from celery_routines.store import Store
from celery_routines.worker.stores import forget_stores


@pytest.fixture
def app(database_url: str, store: Store) -> Celery:
    app = Celery("worker_test", set_as_current=False)
    app.conf.update(routines_database_url=database_url, broker_url="memory://")
    return app


@pytest.fixture(autouse=True)
def _forget_worker_stores() -> Iterator[None]:
    yield
    forget_stores()
