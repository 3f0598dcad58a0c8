"""Claimed rows read through the driver become the same records the constructor builds."""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime

import pytest

from celery_routines.store.records import ROUTINE_RECORD_FIELDS, RoutineRecord
from celery_routines.store.routines import INSTANT_POSITIONS, _record_from_driver

NAIVE = datetime(2026, 3, 29, 1, 30)


def driver_row() -> tuple[object, ...]:
    """A row as psycopg returns it: every field set, instants naive UTC."""
    values: list[object] = [f"value-{i}" for i in range(len(ROUTINE_RECORD_FIELDS))]
    for i in INSTANT_POSITIONS:
        values[i] = NAIVE
    values[INSTANT_POSITIONS[-1]] = None
    return tuple(values)


def test_a_driver_row_becomes_the_record_the_constructor_builds() -> None:
    row = driver_row()
    record = _record_from_driver(row)
    aware = [
        value.replace(tzinfo=UTC) if i in INSTANT_POSITIONS and value is not None else value
        for i, value in enumerate(row)
    ]
    expected = RoutineRecord(*aware)
    assert record == expected
    assert vars(record) == vars(expected)
    assert hash(repr(record)) == hash(repr(expected))
    assert record.next_run_at is not None and record.next_run_at.tzinfo is UTC
    with pytest.raises(AttributeError):
        record.name = "changed"  # type: ignore[misc]


def test_a_shorter_row_takes_the_defaults() -> None:
    row = driver_row()[: len(ROUTINE_RECORD_FIELDS) - 1]
    record = _record_from_driver(row)
    last = fields(RoutineRecord)[-1]
    assert getattr(record, last.name) == last.default
