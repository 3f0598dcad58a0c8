"""celery-routines in a Django project.

``django_database_url("default")`` gives the SQLAlchemy URL of a Django
database alias, so the routines can live in the project's own database::

    # proj/celery.py
    from celery_routines.contrib.django import django_database_url

    app.conf.routines_database_url = django_database_url("default")

This module imports Django only inside the function: listing
``celery_routines.contrib.django`` in ``INSTALLED_APPS`` (the admin, see
:mod:`celery_routines.contrib.django.admin`) costs a process nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_routines.errors import ConfigurationError

__all__ = ["database_url_of", "django_database_url"]

# Django's ENGINE -> our backend name.
ENGINES = {
    "django.db.backends.postgresql": "postgresql",
    "django.db.backends.postgresql_psycopg2": "postgresql",
    "django.contrib.gis.db.backends.postgis": "postgresql",
    "django.db.backends.mysql": "mysql",
    "django.contrib.gis.db.backends.mysql": "mysql",
    "django.db.backends.sqlite3": "sqlite",
    "django.contrib.gis.db.backends.spatialite": "sqlite",
}
# The OPTIONS that are libpq connection parameters (Django passes them to the
# driver as they are; SQLAlchemy passes URL query parameters the same way).
LIBPQ_OPTIONS = (
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "connect_timeout",
    "application_name",
    "options",
    "target_session_attrs",
    "service",
    "passfile",
)
MYSQL_OPTIONS = ("charset",)


def django_database_url(alias: str = "default") -> str:
    """The SQLAlchemy URL of the Django database ``alias`` (its password
    included: pass it to ``routines_database_url``, do not log it)."""
    from django.conf import settings

    databases = getattr(settings, "DATABASES", {})
    if alias not in databases:
        raise ConfigurationError(
            f"Django has no database alias {alias!r} (DATABASES has "
            f"{', '.join(sorted(databases)) or 'none'})"
        )
    return database_url_of(databases[alias], alias)


def database_url_of(entry: Mapping[str, Any], alias: str = "default") -> str:
    """The SQLAlchemy URL of one ``DATABASES`` entry."""
    from sqlalchemy.engine import URL

    engine = str(entry.get("ENGINE", ""))
    backend = ENGINES.get(engine)
    if backend is None:
        raise ConfigurationError(
            f"Django database {alias!r} uses ENGINE {engine!r}: celery-routines stores "
            "routines in PostgreSQL, MySQL/MariaDB or SQLite"
        )
    name = str(entry.get("NAME") or "")
    if backend == "sqlite":
        if not name or name == ":memory:" or name.startswith("file:"):
            raise ConfigurationError(
                f"Django database {alias!r} is SQLite {name or '(no NAME)'!r}: give it a file, "
                "which beat and the workers can share"
            )
        return URL.create("sqlite", database=name).render_as_string(hide_password=False)
    options = dict(entry.get("OPTIONS") or {})
    host = str(entry.get("HOST") or "") or None
    query: dict[str, str] = {}
    if backend == "postgresql":
        driver = _postgres_driver()
        query.update({k: str(options[k]) for k in LIBPQ_OPTIONS if k in options})
        if host and host.startswith("/"):  # a Unix socket folder
            query["host"], host = host, None
    else:
        driver = _mysql_driver()
        query.update({k: str(options[k]) for k in MYSQL_OPTIONS if k in options})
        if host and host.startswith("/"):
            query["unix_socket"], host = host, None
    port = entry.get("PORT")
    url = URL.create(
        f"{backend}+{driver}",
        username=entry.get("USER") or None,
        password=entry.get("PASSWORD") or None,
        host=host,
        port=int(port) if port not in (None, "") else None,
        database=name or None,
        query=query,
    )
    return url.render_as_string(hide_password=False)


def _postgres_driver() -> str:
    """psycopg 3 when installed (Django prefers it too), else psycopg2."""
    return _first_installed(
        (("psycopg", "psycopg"), ("psycopg2", "psycopg2")),
        "a PostgreSQL database needs psycopg: pip install 'celery-routines[postgres]'",
    )


def _mysql_driver() -> str:
    """PyMySQL (the mysql extra), else mysqlclient, which Django itself uses."""
    return _first_installed(
        (("pymysql", "pymysql"), ("MySQLdb", "mysqldb")),
        "a MySQL/MariaDB database needs a driver: pip install 'celery-routines[mysql]'",
    )


def _first_installed(drivers: tuple[tuple[str, str], ...], missing: str) -> str:
    """The SQLAlchemy driver name of the first (module, driver) whose module
    is installed, in the order of preference; else ConfigurationError(missing)."""
    import importlib.util

    for module, driver in drivers:
        if importlib.util.find_spec(module) is not None:
            return driver
    raise ConfigurationError(missing)
