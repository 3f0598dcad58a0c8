"""An rrule is searched in bounded time: a rule with no window is refused in
milliseconds (dateutil alone walks ~15 s to the year 9999), a rule that
started long ago is restarted near the asked time, and rare rules that do
fire keep firing."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from itertools import islice
from zoneinfo import ZoneInfo

import pytest
from dateutil.rrule import DAILY, HOURLY, MINUTELY, MONTHLY, WEEKLY, YEARLY, rrule
from dateutil.rrule import weekday as rrule_weekday
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from celery_routines.errors import ScheduleError
from celery_routines.schedules.rrule import RRuleSchedule
from celery_routines.schedules.rrule_walk import HORIZON_YEARS, bounded_walk, restarted_near

FEBRUARY_30 = "DTSTART:20261201T090000\nRRULE:FREQ=SECONDLY;BYMONTH=2;BYMONTHDAY=30"
# Well under the ~15 s of dateutil's walk, and loose enough for a busy shared machine.
BOUND_SECONDS = 2.0

NEVER_FIRES = {
    "february-30th": FEBRUARY_30,
    "april-31st-daily": "DTSTART:20261201T090000\nRRULE:FREQ=DAILY;BYMONTH=4;BYMONTHDAY=31",
    "day-366-in-january": "DTSTART:20261201T090000\nRRULE:FREQ=YEARLY;BYYEARDAY=366;BYMONTH=1",
    "every-7-days-on-the-wrong-weekday": (
        "DTSTART:20261201T090000\nRRULE:FREQ=DAILY;INTERVAL=7;BYDAY=WE"  # a Tuesday
    ),
    "every-12-months-in-another-month": (
        "DTSTART:20261201T090000\nRRULE:FREQ=MONTHLY;INTERVAL=12;BYMONTH=3"
    ),
    "easter-in-june": "DTSTART:20261201T090000\nRRULE:FREQ=YEARLY;BYEASTER=0;BYMONTH=6",
    "february-30th-from-1900": (
        "DTSTART:19000101T000000\nRRULE:FREQ=MINUTELY;BYMONTH=2;BYMONTHDAY=30"
    ),
}


@pytest.mark.parametrize("rule", NEVER_FIRES.values(), ids=NEVER_FIRES.keys())
def test_a_rule_that_never_fires_is_refused_in_milliseconds(rule: str) -> None:
    started = time.perf_counter()
    with pytest.raises(ScheduleError) as excinfo:
        RRuleSchedule(rule, "Europe/Rome")
    assert time.perf_counter() - started < BOUND_SECONDS
    message = str(excinfo.value)
    assert f"has no window in the {HORIZON_YEARS} years after" in message, message
    assert repr(rule) in message


RARE = [
    # (rule, asked after, the window: local wall time in Europe/Rome)
    (
        "DTSTART:20240229T090000\nRRULE:FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=29",
        datetime(2029, 3, 1),
        datetime(2032, 2, 29, 9),
    ),
    (  # 2100 is not a leap year: eight years without a February 29th
        "DTSTART:20240229T090000\nRRULE:FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=29",
        datetime(2096, 3, 1),
        datetime(2104, 2, 29, 9),
    ),
    (  # a fifth Friday in February: 2036, then 28 years later
        "DTSTART:20260101T090000\nRRULE:FREQ=YEARLY;BYMONTH=2;BYDAY=5FR",
        datetime(2036, 3, 1),
        datetime(2064, 2, 29, 9),
    ),
    (
        "DTSTART:20200103T180000\nRRULE:FREQ=MONTHLY;BYDAY=-1FR",
        datetime(2026, 12, 1),
        datetime(2026, 12, 25, 18),
    ),
    (
        "DTSTART:20200101T080000\nRRULE:FREQ=YEARLY;BYEASTER=1",
        datetime(2027, 1, 1),
        datetime(2027, 3, 29, 8),
    ),
    (
        "DTSTART:20200101T080000\nRRULE:FREQ=YEARLY;BYWEEKNO=53;BYDAY=TH",
        datetime(2027, 1, 1),
        datetime(2032, 12, 30, 8),
    ),
]


@pytest.mark.parametrize(("rule", "after", "expected"), RARE)
def test_rare_rules_that_do_fire_keep_firing(
    rule: str, after: datetime, expected: datetime
) -> None:
    zone = "Europe/Rome"
    schedule = RRuleSchedule(rule, zone)
    tz = ZoneInfo(zone)
    started = time.perf_counter()
    window = schedule.next_after(after.replace(tzinfo=tz).astimezone(UTC))
    assert time.perf_counter() - started < BOUND_SECONDS
    assert window == expected.replace(tzinfo=tz).astimezone(UTC)


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ("DTSTART:20200101T000000\nRRULE:FREQ=MINUTELY", datetime(2026, 12, 7, 12, 1)),
        ("DTSTART:19000101T000000\nRRULE:FREQ=SECONDLY;BYHOUR=9", datetime(2026, 12, 8, 9)),
        ("DTSTART:00010101T000000\nRRULE:FREQ=SECONDLY", datetime(2026, 12, 7, 12, 0, 31)),
        ("DTSTART:20180105T230000\nRRULE:FREQ=HOURLY;INTERVAL=7", datetime(2026, 12, 7, 14)),
    ],
)
def test_a_rule_that_started_long_ago_is_answered_in_milliseconds(
    rule: str, expected: datetime
) -> None:
    asked = datetime(2026, 12, 7, 12, 0, 30, tzinfo=UTC)
    started = time.perf_counter()
    window = RRuleSchedule(rule, "UTC").next_after(asked)
    assert time.perf_counter() - started < BOUND_SECONDS
    assert window == expected.replace(tzinfo=UTC)


def test_a_counted_rule_that_lists_too_much_before_now_is_refused_naming_the_fix() -> None:
    schedule = RRuleSchedule("DTSTART:20200101T000000\nRRULE:FREQ=MINUTELY;COUNT=5000000", "UTC")
    started = time.perf_counter()
    with pytest.raises(ScheduleError, match="end it with UNTIL rather than COUNT"):
        schedule.next_after(datetime(2026, 12, 7, tzinfo=UTC))
    assert time.perf_counter() - started < BOUND_SECONDS


def test_a_set_of_rules_is_refused_as_the_limits_page_says() -> None:
    with pytest.raises(ScheduleError, match="is a set"):
        RRuleSchedule("DTSTART:20261201T090000\nRRULE:FREQ=DAILY\nEXDATE:20261202T090000", "UTC")


# -- a restarted rule has the same later occurrences --------------------------------

FREQS = st.sampled_from([YEARLY, MONTHLY, WEEKLY, DAILY, HOURLY, MINUTELY])
# How far back DTSTART may lie, per frequency: dateutil's own walk (the
# oracle) from there must stay quick.
REACH = {
    YEARLY: 3000,
    MONTHLY: 2000,
    WEEKLY: 1500,
    DAILY: 1500,
    HOURLY: 200,
    MINUTELY: 10,
}


@st.composite
def rules(draw: st.DrawFn) -> tuple[rrule, datetime]:
    freq = draw(FREQS)
    wall = draw(st.datetimes(datetime(2000, 1, 1), datetime(2090, 1, 1)))
    start = wall - timedelta(
        days=draw(st.integers(0, REACH[freq])), minutes=draw(st.integers(0, 1439))
    )
    start = start.replace(second=draw(st.integers(0, 59)), microsecond=0)
    fields: dict[str, object] = {
        "interval": draw(st.integers(1, 5)),
        "wkst": draw(st.integers(0, 6)),
    }
    if draw(st.booleans()):
        fields["bymonth"] = draw(st.lists(st.integers(1, 12), min_size=1, max_size=4))
    if draw(st.booleans()):
        fields["bymonthday"] = draw(
            st.lists(st.integers(1, 31) | st.integers(-31, -1), min_size=1, max_size=3)
        )
    if draw(st.booleans()):
        days = draw(st.lists(st.integers(0, 6), min_size=1, max_size=3))
        nth = draw(st.sampled_from([None, 1, 2, -1]))
        fields["byweekday"] = [rrule_weekday(day, nth) for day in days]
    if draw(st.booleans()):
        fields["byhour"] = draw(st.lists(st.integers(0, 23), min_size=1, max_size=3))
    if draw(st.booleans()):
        fields["bysetpos"] = draw(st.sampled_from([1, -1, 2]))
        fields.setdefault("byhour", [9, 17])
    try:
        return rrule(freq, dtstart=start, **fields), wall  # type: ignore[arg-type]
    except ValueError:
        assume(False)
        raise


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=rules())
def test_a_rule_restarted_near_the_asked_time_has_the_same_later_occurrences(
    drawn: tuple[rrule, datetime],
) -> None:
    rule, wall = drawn
    try:
        expected = list(islice((o for o in bounded_walk(rule, wall, "r") if o > wall), 3))
    except ScheduleError:
        assume(False)
    restarted = restarted_near(rule, wall)
    assert restarted._dtstart <= max(wall, rule._dtstart)  # never later than asked
    found = list(islice((o for o in bounded_walk(restarted, wall, "r") if o > wall), 3))
    assert found == expected, (str(rule), wall, str(restarted))
