"""An rrule schedule walks from the newest occurrence it passed, not from
DTSTART each time, and answers exactly what a walk from DTSTART answers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from celery_routines.schedules.rrule import RRuleSchedule

RULES = [
    "DTSTART:19990104T090000\nRRULE:FREQ=DAILY",
    "DTSTART:20010105T023000\nRRULE:FREQ=DAILY",  # 02:30: the spring gap fires later
    "DTSTART:20190107T080000\nRRULE:FREQ=WEEKLY;INTERVAL=2;BYDAY=MO,WE,SU",
    "DTSTART:20190107T080000\nRRULE:FREQ=WEEKLY;INTERVAL=3;WKST=SU",
    "DTSTART:20150131T120000\nRRULE:FREQ=MONTHLY",  # the 31st: months without one are skipped
    "DTSTART:20150101T070000\nRRULE:FREQ=MONTHLY;INTERVAL=2;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1",
    "DTSTART:20260101T003000\nRRULE:FREQ=HOURLY;INTERVAL=5",
    "DTSTART:20261001T000000\nRRULE:FREQ=MINUTELY;INTERVAL=7;BYHOUR=1,2,3",
    "DTSTART:20100329T013000\nRRULE:FREQ=YEARLY;BYMONTH=3,10;BYDAY=-1SU",  # both DST nights
    "DTSTART:20200101T090000\nRRULE:FREQ=DAILY;UNTIL=20270115T090000",
]
START = datetime(2026, 10, 20, tzinfo=UTC)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York", "UTC"])
def test_walking_from_the_anchor_answers_what_walking_from_dtstart_answers(
    rule: str, zone: str
) -> None:
    kept = RRuleSchedule(rule, zone)
    instant, answers = START, 0
    while answers < 40:
        expected = RRuleSchedule(rule, zone).next_after(instant)  # walked from DTSTART
        assert kept.next_after(instant) == expected, (rule, zone, instant)
        answers += 1
        if expected.year > 2200:  # NEVER: the rule ended
            break
        instant = expected
    # A question about an earlier time than the anchor is walked from DTSTART.
    earlier = START - timedelta(days=400)
    assert kept.next_after(earlier) == RRuleSchedule(rule, zone).next_after(earlier)


def test_a_rule_that_started_decades_ago_is_walked_from_its_last_window() -> None:
    schedule = RRuleSchedule("DTSTART:19990104T090000\nRRULE:FREQ=DAILY", "Europe/Berlin")
    window = schedule.next_after(START)
    for _ in range(3):
        window = schedule.next_after(window)
    anchor, _ = schedule._anchored[-1]
    # The anchor follows the windows: the next question walks a day, not 28 years.
    assert timedelta(0) < window.replace(tzinfo=None) - anchor < timedelta(days=2)


def test_a_rule_with_a_count_is_walked_from_dtstart() -> None:
    counted = RRuleSchedule("DTSTART:20261201T090000\nRRULE:FREQ=DAILY;COUNT=3", "UTC")
    windows = []
    instant = datetime(2026, 11, 30, tzinfo=UTC)
    for _ in range(4):
        instant = counted.next_after(instant)
        windows.append(instant)
    assert [w.day for w in windows[:3]] == [1, 2, 3] and windows[3].year > 2200
    assert counted._anchored == []
