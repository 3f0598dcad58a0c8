"""django-celery-beat's real tables, made by its own migrations, in a
throwaway SQLite file, a throwaway PostgreSQL database and a throwaway
MariaDB database, with rows written through its own models.

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
    postgresql = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": pg.database,
        "USER": pg.username or "",
        "PASSWORD": pg.password or "",
        "HOST": pg.host or "",
        "PORT": str(pg.port or ""),
    }
    settings.configure(
        DATABASES={
            # Django's own tables (users, sessions, admin log) and the change
            # marker of django-celery-beat (PeriodicTasks.changed, written to
            # the default alias whatever alias a row is saved to) live in
            # PostgreSQL, where the admin tests also keep celery-routines' tables.
            "default": postgresql,
            "sqlite": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(sqlite_path)},
            "postgresql": postgresql,
        },
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "django_celery_beat",
            "celery_routines.contrib.django",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.common.CommonMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
                "OPTIONS": {
                    "context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages",
                    ]
                },
            }
        ],
        ROOT_URLCONF="tests.contrib.django_urls",
        SECRET_KEY="celery-routines-tests",
        ALLOWED_HOSTS=["testserver"],
        USE_TZ=True,
        TIME_ZONE="UTC",
        CELERY_ROUTINES_DATABASE="default",
    )
    django.setup()
    for alias in ("default", "sqlite"):
        call_command("migrate", database=alias, verbosity=0)


# The databases this process configured Django with (settings.configure
# happens once; the fixture is registered by more than one conftest).
_configured: dict[str, str] = {}


@pytest.fixture(scope="session")
def dcb_databases(
    tmp_path_factory: pytest.TempPathFactory, postgres_databases: services.PostgresDatabases
) -> Iterator[dict[str, str]]:
    pytest.importorskip("django_celery_beat")
    from django.conf import settings

    if not _configured:
        if settings.configured:
            pytest.skip("Django was configured by another test of this process")
        sqlite_path = tmp_path_factory.mktemp("dcb") / "django.db"
        postgres_url = postgres_databases.create()
        configure_django(sqlite_path, postgres_url)
        _configured.update(sqlite=f"sqlite:///{sqlite_path}", postgresql=postgres_url)
    yield dict(_configured)
    from django.db import connections

    connections.close_all()


@pytest.fixture(scope="session")
def dcb_mariadb(dcb_databases: dict[str, str], mysql_databases: services.MySQLDatabases) -> str:
    """A third alias, ``mariadb``, added to the configured Django (through
    PyMySQL standing in for mysqlclient, as Django's MySQL backend allows)."""
    if "mariadb" not in _configured:
        import pymysql
        from django.conf import settings
        from django.core.management import call_command
        from django.db import connections

        pymysql.install_as_MySQLdb()
        url = mysql_databases.create()
        parsed = make_url(url)
        entry = {
            "ENGINE": "django.db.backends.mysql",
            "NAME": parsed.database,
            "USER": parsed.username or "",
            "PASSWORD": parsed.password or "",
            "HOST": parsed.host or "",
            "PORT": str(parsed.port or ""),
        }
        filled = connections.configure_settings(
            {"default": dict(settings.DATABASES["default"]), "mariadb": entry}
        )
        connections.settings["mariadb"] = filled["mariadb"]
        call_command("migrate", database="mariadb", verbosity=0)
        _configured["mariadb"] = url
    return _configured["mariadb"]


@pytest.fixture(params=[*ALIASES, "mariadb"])
def dcb(request: pytest.FixtureRequest, dcb_databases: dict[str, str]) -> Iterator[DCB]:
    if request.param == "mariadb":
        url = request.getfixturevalue("dcb_mariadb")
    else:
        url = dcb_databases[request.param]
    source = DCB(request.param, url)
    source.clear()
    yield source
    source.clear()
