"""Fixtures of the Django tests: a configured Django with real databases."""

from tests.operator.dcb import dcb, dcb_databases, dcb_mariadb  # noqa: F401 (fixtures)
