"""Fixtures of the Django tests: a configured Django with real databases."""

from tests.operator.dcb import dcb, dcb_databases  # noqa: F401 (fixtures)
