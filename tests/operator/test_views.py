"""How stored rows become the admin API's answers (pure)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from celery_routines.operator.views import definition_of, describe_schedule, routine_state
from tests.operator.test_windows import record

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_a_routines_state_in_order_of_precedence() -> None:
    active = record(NOW)
    assert routine_state(active, NOW) == "enabled"
    assert (
        routine_state(replace(active, suspended_until=NOW + timedelta(hours=1)), NOW) == "suspended"
    )
    assert routine_state(replace(active, suspended_until=NOW), NOW) == "enabled"
    assert routine_state(replace(active, paused=True), NOW) == "paused"
    assert routine_state(replace(active, enabled=False, paused=True), NOW) == "disabled"
    assert routine_state(replace(active, last_error="bad", enabled=False), NOW) == "invalid"


def test_the_schedule_and_definition_as_shown() -> None:
    assert describe_schedule(record(None)) == "every 600s"
    assert describe_schedule(replace(record(None), interval_seconds=None, cron="0 3 * * *")) == (
        "0 3 * * *"
    )
    shown = definition_of(replace(record(None), args="[1]", ceiling='[{"limit": 3}]'))
    assert shown["args"] == [1] and shown["ceiling"] == [{"limit": 3}]
    assert definition_of(replace(record(None), kwargs="not json"))["kwargs"] == "not json"
