"""``django_database_url(alias)``: Django's DATABASES entry as a SQLAlchemy URL."""

from __future__ import annotations

import importlib.util

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from celery_routines.contrib.django import database_url_of, django_database_url
from celery_routines.errors import ConfigurationError
from celery_routines.store import Store
from tests.operator.dcb import DCB

PASSWORD = "p@ss:w/rd%?"


def test_postgresql_with_psycopg_3_and_the_password_carried_over() -> None:
    url = database_url_of(
        {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "proj",
            "USER": "app",
            "PASSWORD": PASSWORD,
            "HOST": "db.internal",
            "PORT": "6432",
            "OPTIONS": {"sslmode": "require", "pool": True},
        }
    )
    parsed = make_url(url)
    assert parsed.drivername == "postgresql+psycopg"
    assert (parsed.username, parsed.password, parsed.host, parsed.port, parsed.database) == (
        "app",
        PASSWORD,
        "db.internal",
        6432,
        "proj",
    )
    assert dict(parsed.query) == {"sslmode": "require"}  # Django's own "pool" is not libpq's


def test_postgresql_with_psycopg_2_only(monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: (
            object() if name == "psycopg2" else None if name == "psycopg" else find_spec(name, *a)
        ),
    )
    url = database_url_of(
        {"ENGINE": "django.db.backends.postgresql", "NAME": "proj", "HOST": "/var/run/postgresql"}
    )
    assert url == "postgresql+psycopg2:///proj?host=%2Fvar%2Frun%2Fpostgresql"


def test_mysql_and_sqlite() -> None:
    url = database_url_of(
        {
            "ENGINE": "django.db.backends.mysql",
            "NAME": "proj",
            "USER": "root",
            "PASSWORD": PASSWORD,
            "HOST": "127.0.0.1",
            "PORT": 3306,
            "OPTIONS": {"charset": "utf8mb4", "init_command": "SET x=1"},
        }
    )
    parsed = make_url(url)
    assert parsed.drivername == "mysql+pymysql" and parsed.password == PASSWORD
    assert dict(parsed.query) == {"charset": "utf8mb4"}
    assert (
        database_url_of({"ENGINE": "django.db.backends.sqlite3", "NAME": "/srv/proj/db.sqlite3"})
        == "sqlite:////srv/proj/db.sqlite3"
    )


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (
            {"ENGINE": "django.db.backends.oracle", "NAME": "x"},
            "uses ENGINE 'django.db.backends.oracle'",
        ),
        ({"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}, "give it a file"),
    ],
)
def test_what_cannot_hold_routines_is_refused(entry: dict, expected: str) -> None:
    with pytest.raises(ConfigurationError, match="Django database 'default'") as caught:
        database_url_of(entry)
    assert expected in str(caught.value)


def test_the_url_of_a_configured_alias_reaches_that_database(dcb: DCB) -> None:
    """A row Django wrote through an alias is read through that alias's URL."""
    every = dcb.schedule("IntervalSchedule", every=5, period="minutes")
    dcb.task("written-by-django", interval=every)
    store = Store.from_url(django_database_url(dcb.alias))
    try:
        with store.engine.connect() as conn:
            names = conn.execute(text("SELECT name FROM django_celery_beat_periodictask"))
            assert names.scalars().all() == ["written-by-django"]
    finally:
        store.dispose()
    with pytest.raises(ConfigurationError, match="no database alias 'nope'"):
        django_database_url("nope")
