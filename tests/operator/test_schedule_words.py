"""Schedules in words (issue 33): the wording of each kind of schedule, pure
(no store), and `celery routines show` printing it beside the expression."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from celery_routines.operator.schedule_words import (
    cron_words,
    interval_words,
    rrule_words,
    solar_words,
    union_words,
)
from celery_routines.store import Store
from tests.operator.test_cli import Invoke, broker_folder, invoke, ok  # noqa: F401
from tests.operators import add_routine


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("30 2 * * 1-5", "At 02:30, Monday through Friday"),
        ("*/15 * * * *", "Every 15 minutes"),
        ("@daily", "At 00:00"),
        ("0 9 L * *", "At 09:00, on the last day of the month"),
        ("0 9 * * 1#2", "At 09:00, on the second Monday of the month"),
        ("0 9 * * 5L", "At 09:00, on the last Friday of the month"),
        # Both day fields restricted: cron fires on either (not on both).
        ("0 12 1-7 * 1", "At 12:00, between day 1 and 7 of the month or on Monday"),
        # Invalid: the expression itself (the routine's error says why).
        ("61 * * * *", "61 * * * *"),
    ],
    ids=[
        "weekdays",
        "step",
        "alias",
        "last-day",
        "nth-weekday",
        "last-friday",
        "dom-or-dow",
        "bad",
    ],
)
def test_a_cron_reads_in_plain_english(expression: str, words: str) -> None:
    assert cron_words(expression) == words


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(300, "Every 5 minutes"), (3600, "Every hour"), (90, "Every 90 seconds"),
     (86400, "Every day"), (7200, "Every 2 hours"), (1.5, "Every 1.5 seconds")],
)  # fmt: skip
def test_an_interval_reads_in_its_largest_whole_unit(seconds: float, words: str) -> None:
    assert interval_words(seconds) == words


def test_solar_rrule_and_union_schedules_read_in_the_same_style() -> None:
    assert solar_words("sunrise 45.46 9.19") == "At sunrise at latitude 45.46, longitude 9.19"
    assert solar_words("dusk_civil 45.46 9.19").startswith("At civil dusk")
    rule = "DTSTART:20261201T090000\nRRULE:FREQ=WEEKLY;INTERVAL=2;BYDAY=MO,WE;COUNT=10"
    assert rrule_words(rule) == "Every 2 weeks on Monday and Wednesday at 09:00, 10 times"
    last = "DTSTART:20261201T090000\nRRULE:FREQ=MONTHLY;BYDAY=-1FR"
    assert rrule_words(last) == "Every month on the last Friday at 09:00"
    # A part not worded here leaves the rule as written, never a wrong sentence.
    odd = "DTSTART:20261201T090000 RRULE:FREQ=DAILY;BYSETPOS=1"
    assert rrule_words(odd) == f"Recurrence rule {odd}"
    words, zoned = union_words(json.dumps(["0 9 * * 1-5", 21600]))
    assert words == "At 09:00, Monday through Friday; and every 6 hours"
    assert zoned


def test_show_prints_the_schedule_in_words_beside_the_expression(
    invoke: Invoke,  # noqa: F811
    store: Store,
) -> None:
    add_routine(store, "nightly", cron="30 2 * * 1-5", timezone="Europe/Rome")
    add_routine(store, "poll", cron=None, interval_seconds=300)
    add_routine(
        store, "launch", cron=None, at=datetime(2026, 12, 1, 8, 0, tzinfo=UTC),
        timezone="Europe/Rome",
    )  # fmt: skip
    text = ok(invoke("show", "nightly"))
    assert "  schedule:              30 2 * * 1-5\n" in text
    assert "  in words:              At 02:30, Monday through Friday (Europe/Rome)\n" in text
    assert "in words:              Every 5 minutes\n" in ok(invoke("show", "poll"))
    assert "in words:              Once, at 2026-12-01 09:00 (Europe/Rome)" in ok(
        invoke("show", "launch")
    )
    shown = json.loads(ok(invoke("show", "nightly", "--json")))
    assert shown["summary"]["schedule_words"] == "At 02:30, Monday through Friday (Europe/Rome)"


def test_pause_takes_a_reason_that_list_and_show_print(
    invoke: Invoke,  # noqa: F811
    store: Store,
) -> None:
    add_routine(store, "nightly", cron="30 2 * * *")
    assert "paused nightly" in ok(invoke("pause", "nightly", "--reason", "disk full"))
    assert store.routines.by_name("nightly").paused_reason == "disk full"
    assert ok(invoke("show", "nightly")).startswith("nightly  [paused: disk full]")
    assert "paused: disk full" in ok(invoke("list"))
    too_long = invoke("pause", "other", "--reason", "x" * 201)
    assert too_long.exit_code != 0


def test_a_union_one_off_seconds_and_one_window_read_as_written(
    invoke: Invoke,  # noqa: F811
    store: Store,
) -> None:
    add_routine(store, "mixed", cron=None, schedules=json.dumps(["*/2 * * * *", 90.0]))
    add_routine(
        store, "launch", cron=None, at=datetime(2026, 12, 24, 11, 0, 30, tzinfo=UTC),
        timezone="Europe/Rome",
    )  # fmt: skip
    # Each part as its single schedule is listed, so preview reads the line back.
    listed = {s["name"]: s for s in json.loads(ok(invoke("list", "--json")))}
    assert listed["mixed"]["schedule"] == "*/2 * * * * + every 90s"
    assert listed["mixed"]["schedule_words"] == "Every 2 minutes; and every 90 seconds (UTC)"
    assert "'*/2 * * * * + every 90s' in UTC" in ok(invoke("preview", "*/2 * * * * + every 90s"))
    # A one-off keeps its seconds in words.
    assert listed["launch"]["schedule_words"] == "Once, at 2026-12-24 12:00:30 (Europe/Rome)"
    text = ok(invoke("show", "launch", "-n", "1"))
    assert "next window (UTC, then Europe/Rome):" in text
    assert "next 3 windows (UTC):" in ok(invoke("show", "mixed", "-n", "3"))
