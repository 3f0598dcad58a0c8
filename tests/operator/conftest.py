"""Fixtures of the import tests: django-celery-beat's real databases."""

from tests.operator.dcb import dcb, dcb_databases, dcb_mariadb  # noqa: F401 (fixtures)
