from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from celery_routines.store import Store
from tests import services
from tests.harness import migrated_store
from tests.work import ScheduleWork, count_schedule_work

pytest_plugins = ("celery.contrib.pytest",)


class FakeClock:
    """An injected clock: tests move time; nothing sleeps."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2026, 11, 30, 12, 0, tzinfo=UTC))


@pytest.fixture(scope="session")
def postgres_databases() -> Iterator[services.PostgresDatabases]:
    try:
        databases = services.PostgresDatabases()
    except Exception as exc:
        services.unavailable("PostgreSQL", exc)
    yield databases
    databases.drop_all()


def wants_schema(request: pytest.FixtureRequest) -> bool:
    """A test that uses ``store`` or ``migrated_schema`` gets its databases
    migrated, copied from a template migrated once per run, which costs a
    fraction of migrating. Every other test gets an empty database, as
    before: the migration tests, beat creating its schema at start-up."""
    return not {"store", "migrated_schema"}.isdisjoint(request.fixturenames)


@pytest.fixture
def migrated_schema() -> None:
    """Asks for the test's databases at the newest revision (see wants_schema)."""


@pytest.fixture
def postgres_url(
    postgres_databases: services.PostgresDatabases, request: pytest.FixtureRequest
) -> Iterator[str]:
    url = postgres_databases.create(migrated=wants_schema(request))
    yield url
    postgres_databases.drop(url)


@pytest.fixture(scope="session")
def mysql_databases() -> Iterator[services.MySQLDatabases]:
    try:
        databases = services.MySQLDatabases()
    except Exception as exc:
        services.unavailable("MariaDB/MySQL", exc)
    yield databases
    databases.drop_all()


@pytest.fixture
def mariadb_url(
    mysql_databases: services.MySQLDatabases, request: pytest.FixtureRequest
) -> Iterator[str]:
    url = mysql_databases.create(migrated=wants_schema(request))
    yield url
    mysql_databases.drop(url)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> services.SQLiteTemplate:
    return services.SQLiteTemplate(tmp_path_factory.mktemp("sqlite-template"))


@pytest.fixture
def sqlite_url(tmp_path: Path, request: pytest.FixtureRequest) -> str:
    path = tmp_path / "routines.db"
    if wants_schema(request):
        request.getfixturevalue("sqlite_template").copy_to(path)
    return f"sqlite:///{path}"


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def database_url(request: pytest.FixtureRequest) -> str:
    """Every store test runs against every supported database."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    if request.param == "mariadb":
        return request.getfixturevalue("mariadb_url")
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    yield from migrated_store(database_url)


@pytest.fixture(scope="session")
def redis_db() -> Iterator[int]:
    if not services.port_open(services.REDIS_HOST, services.REDIS_PORT):
        services.unavailable(
            "Redis", f"nothing listens on {services.REDIS_HOST}:{services.REDIS_PORT}"
        )
    import redis

    number = services.free_redis_db()
    yield number
    client = redis.Redis(host=services.REDIS_HOST, port=services.REDIS_PORT, db=number)
    client.flushdb()
    client.close()


@pytest.fixture
def redis_url(redis_db: int) -> Iterator[str]:
    import redis

    url = f"redis://{services.REDIS_HOST}:{services.REDIS_PORT}/{redis_db}"
    yield url
    client = redis.Redis.from_url(url)
    # One MULTI: between a bare FLUSHDB and the SET, another test run could
    # find the database empty and claim it (services.free_redis_db).
    client.pipeline(transaction=True).flushdb().set("celery_routines:test-owner", "1").execute()
    client.close()


@pytest.fixture(autouse=True)
def _own_root_logger() -> Iterator[None]:
    """Each test starts with the root logger as the session set it up.

    Celery's in-thread test worker sets the root logger's level (to ERROR by
    default) for the rest of the process: a later test in the same xdist
    worker then saw no WARNING at all (a CI run failed on it).
    """
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)  # its handlers are pytest's to add and remove, per phase


@pytest.fixture(autouse=True)
def _sentry_only_where_asked(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each test runs as an application that never imported sentry_sdk,
    except the Sentry tests themselves.

    Beat wraps its publisher for Sentry Crons when ``sentry_sdk`` is loaded
    (sending/offload.py ``monitored``), and tests/integrations/test_sentry.py
    imports it when collected, so on every xdist worker: the publishing
    process tests then saw Sentry's wrapper, not their ProcessPublisher, in
    a full run only.
    """
    if "sentry" not in request.node.path.name:
        monkeypatch.delitem(sys.modules, "sentry_sdk", raising=False)


@pytest.fixture(autouse=True)
def _forget_declarations() -> Iterator[None]:
    """Declarations are process-wide; each test starts with none."""
    from celery_routines import registry

    saved = dict(registry._declared)
    registry._declared.clear()
    yield
    registry._declared.clear()
    registry._declared.update(saved)


@pytest.fixture(autouse=True)
def _forget_shared_tasks() -> Iterator[None]:
    """Tasks a test defines stay with that test.

    ``@app.task`` is shared by default, like ``@shared_task``: Celery adds it
    to every app finalized later in the process. Without this, a task a test
    defines (or an example module a test executes again) is added to the
    apps of later tests, and a later task of the same name warns
    DuplicateTaskNameWarning (21 of them per run).
    """
    from celery import _state

    saved = set(_state._on_app_finalizers)
    yield
    _state._on_app_finalizers.intersection_update(saved)


@pytest.fixture
def schedule_work(monkeypatch: pytest.MonkeyPatch) -> ScheduleWork:
    """What schedules did during the test: days listed, croniter steps."""
    return count_schedule_work(monkeypatch)
