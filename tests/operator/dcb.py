"""django-celery-beat's real tables, made by its own migrations, in a
throwaway SQLite file and a throwaway PostgreSQL database, with rows written
through its own models.

Django is configured once per test process (``settings.configure`` cannot be
undone): two database aliases, ``sqlite`` and ``postgresql``, migrated once;
each test empties the tables of the alias it uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from tests import services

ALIASES = ("sqlite", "postgresql")


@dataclass
class DCB:
    """One migrated django-celery-beat database."""

    alias: str
    url: str  # the SQLAlchemy URL the import reads

    def models(self) -> Any:
        from django_celery_beat import models

        return models

    def task(self, name: str, task: str = "tasks.noop", **fields: Any) -> Any:
        """A PeriodicTask saved through the model (its save() rules apply)."""
        row = self.models().PeriodicTask(name=name, task=task, **fields)
        row.save(using=self.alias)
        return row

    def schedule(self, kind: str, **fields: Any) -> Any:
        model = getattr(self.models(), kind)
        row = model(**fields)
        row.save(using=self.alias)
        return row

    def set(self, name: str, **fields: Any) -> None:
        """Columns written as django-celery-beat's scheduler writes them after
        a run (``last_run_at``, ``total_run_count``), bypassing save()'s rules."""
        self.models().PeriodicTask.objects.using(self.alias).filter(name=name).update(**fields)

    def clear(self) -> None:
        models = self.models()
        for model in (
            models.PeriodicTask,
            models.CrontabSchedule,
            models.IntervalSchedule,
            models.SolarSchedule,
            models.ClockedSchedule,
        ):
            model.objects.using(self.alias).all().delete()


def configure_django(sqlite_path: Path, postgres_url: str) -> None:
    import django
    from django.conf import settings
    from django.core.management import call_command

    pg = make_url(postgres_url)
    settings.configure(
        DATABASES={
            # django-celery-beat's change marker (PeriodicTasks.changed) is
            # written to the default alias whatever alias a row is saved to.
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": str(sqlite_path.with_name("default.db")),
            },
            "sqlite": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(sqlite_path)},
            "postgresql": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": pg.database,
                "USER": pg.username or "",
                "PASSWORD": pg.password or "",
                "HOST": pg.host or "",
                "PORT": str(pg.port or ""),
            },
        },
        INSTALLED_APPS=["django_celery_beat"],
        USE_TZ=True,
        TIME_ZONE="UTC",
    )
    django.setup()
    for alias in ("default", *ALIASES):
        call_command("migrate", database=alias, verbosity=0)


@pytest.fixture(scope="session")
def dcb_databases(
    tmp_path_factory: pytest.TempPathFactory, postgres_databases: services.PostgresDatabases
) -> Iterator[dict[str, str]]:
    pytest.importorskip("django_celery_beat")
    from django.conf import settings

    if settings.configured:
        pytest.skip("Django was configured by another test of this process")
    sqlite_path = tmp_path_factory.mktemp("dcb") / "django.db"
    postgres_url = postgres_databases.create()
    configure_django(sqlite_path, postgres_url)
    yield {"sqlite": f"sqlite:///{sqlite_path}", "postgresql": postgres_url}
    from django.db import connections

    connections.close_all()


@pytest.fixture(params=ALIASES)
def dcb(request: pytest.FixtureRequest, dcb_databases: dict[str, str]) -> Iterator[DCB]:
    source = DCB(request.param, dcb_databases[request.param])
    source.clear()
    yield source
    source.clear()
