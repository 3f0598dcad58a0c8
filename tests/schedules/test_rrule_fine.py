"""A minutely or secondly rule with filters that take whole days (BYMONTH,
BYMONTHDAY, BYDAY, ...) is walked a day at a time, and a BYSETPOS that picks
none of a period's times is refused outright: dateutil alone steps such a
rule a second (a minute) at a time through every day it leaves out, and took
minutes to refuse ``FREQ=SECONDLY;BYMONTH=2;BYMONTHDAY=30;BYHOUR=23``."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from itertools import islice

import pytest
from dateutil.rrule import MINUTELY, SECONDLY, rrule
from dateutil.rrule import weekday as rrule_weekday
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from celery_routines.errors import ScheduleError
from celery_routines.schedules.rrule import RRuleSchedule
from celery_routines.schedules.rrule_walk import bounded_walk, restarted_near

# Per call, on a shared 2-core machine; each of these took 30 s or more before.
BOUND_SECONDS = 1.0
START = "DTSTART:20261201T090000\nRRULE:"

NEVER_FIRES = {
    "secondly-february-30th-at-23h": "FREQ=SECONDLY;BYMONTH=2;BYMONTHDAY=30;BYHOUR=23",
    "minutely-february-30th-at-23h": "FREQ=MINUTELY;BYMONTH=2;BYMONTHDAY=30;BYHOUR=23",
    "secondly-31st-of-short-months": "FREQ=SECONDLY;BYMONTHDAY=31;BYMONTH=4,6,9,11;BYMINUTE=5",
    "minutely-day-366-in-june": "FREQ=MINUTELY;BYYEARDAY=366;BYMONTH=6;BYHOUR=1",
    "minutely-setpos-past-the-one-second": "FREQ=MINUTELY;BYSETPOS=5",
    "secondly-setpos-past-the-one-second": "FREQ=SECONDLY;BYSETPOS=-2;BYHOUR=3",
    "hourly-setpos-past-its-times": "FREQ=HOURLY;BYMINUTE=1,2;BYSETPOS=3",
}


@pytest.mark.parametrize("body", NEVER_FIRES.values(), ids=NEVER_FIRES.keys())
def test_a_fine_rule_that_never_fires_is_refused_in_well_under_a_second(body: str) -> None:
    rule = START + body
    started = time.perf_counter()
    with pytest.raises(ScheduleError) as excinfo:
        RRuleSchedule(rule, "Europe/Rome")
    elapsed = time.perf_counter() - started
    assert elapsed < BOUND_SECONDS, f"{elapsed:.2f} s"
    assert "has no window" in str(excinfo.value) and repr(rule) in str(excinfo.value)


SPARSE = [
    # (rule body, asked after (UTC), the window)
    (
        "FREQ=SECONDLY;BYHOUR=8;BYMONTH=2;BYMONTHDAY=28",
        datetime(2026, 12, 2),
        datetime(2027, 2, 28, 8),
    ),
    (
        "FREQ=MINUTELY;BYHOUR=23;BYMINUTE=59;BYMONTH=2;BYMONTHDAY=29",
        datetime(2027, 1, 1),
        datetime(2028, 2, 29, 23, 59),
    ),
    (
        "FREQ=SECONDLY;INTERVAL=7;BYHOUR=4;BYDAY=SU;BYMONTH=3",
        datetime(2027, 3, 7, 5),
        datetime(2027, 3, 14, 4, 0, 1),
    ),
    (
        "FREQ=MINUTELY;BYSETPOS=1;BYMONTHDAY=-1;BYHOUR=22;BYMINUTE=0",
        datetime(2026, 12, 31, 22, 30),
        datetime(2027, 1, 31, 22),
    ),
]


@pytest.mark.parametrize(("body", "after", "expected"), SPARSE)
def test_a_sparse_fine_rule_finds_its_window_in_well_under_a_second(
    body: str, after: datetime, expected: datetime
) -> None:
    schedule = RRuleSchedule(START + body, "UTC")
    started = time.perf_counter()
    window = schedule.next_after(after.replace(tzinfo=UTC))
    assert time.perf_counter() - started < BOUND_SECONDS
    assert window == expected.replace(tzinfo=UTC)


# -- walked a day at a time, the same occurrences as dateutil's own walk --------------


@st.composite
def fine_rules(draw: st.DrawFn) -> tuple[rrule, datetime]:
    freq = draw(st.sampled_from([MINUTELY, SECONDLY]))
    wall = draw(st.datetimes(datetime(2024, 1, 1), datetime(2030, 1, 1))).replace(microsecond=0)
    start = wall - timedelta(minutes=draw(st.integers(0, 3 * 1440)))
    start = start.replace(second=draw(st.integers(0, 59)))
    fields: dict[str, object] = {
        "interval": draw(st.integers(1, 90)),
        "wkst": draw(st.integers(0, 6)),
    }
    # Filters whose days come soon enough for dateutil's own walk (the oracle).
    day_filter = draw(st.sampled_from(["bymonth", "bymonthday", "byweekday", "mixed"]))
    if day_filter in ("bymonth", "mixed"):
        fields["bymonth"] = draw(st.lists(st.integers(1, 12), min_size=3, max_size=6))
    if day_filter in ("bymonthday", "mixed"):
        fields["bymonthday"] = draw(
            st.lists(st.integers(1, 28) | st.integers(-28, -1), min_size=2, max_size=6)
        )
    if day_filter in ("byweekday", "mixed"):
        days = draw(st.lists(st.integers(0, 6), min_size=2, max_size=5))
        fields["byweekday"] = [rrule_weekday(day) for day in days]
    if day_filter == "byweekday":
        # Time filters only where every day nearly matches: dateutil's own
        # walk steps each time of a day it leaves out.
        if freq == MINUTELY and draw(st.booleans()):
            fields["byhour"] = draw(st.lists(st.integers(0, 23), min_size=4, max_size=8))
        if freq == SECONDLY and draw(st.booleans()):
            fields["byminute"] = draw(st.lists(st.integers(0, 59), min_size=1, max_size=5))
    if freq == MINUTELY and draw(st.booleans()):
        seconds = draw(st.lists(st.integers(0, 59), min_size=1, max_size=3, unique=True))
        fields["bysecond"] = seconds
        # A position among a minute's times (one past them is refused outright).
        fields["bysetpos"] = draw(st.sampled_from([1, -1, len(seconds)]))
    # Always an end: dateutil's own walk of a rule whose days do not come
    # would run to the year 9999.
    if draw(st.booleans()):
        fields["count"] = draw(st.integers(1, 6000))
    else:
        fields["until"] = wall + timedelta(days=draw(st.integers(0, 40)))
    try:
        return rrule(freq, dtstart=start, **fields), wall  # type: ignore[arg-type]
    except ValueError:
        assume(False)
        raise


@settings(
    max_examples=120, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(drawn=fine_rules())
def test_a_fine_rule_walked_a_day_at_a_time_has_dateutils_occurrences(
    drawn: tuple[rrule, datetime],
) -> None:
    rule, wall = drawn
    try:
        expected = list(islice((o for o in rule if o > wall), 4))
    except ValueError:  # dateutil: the interval never meets BYHOUR/BYMINUTE
        assume(False)
    found = list(islice((o for o in bounded_walk(rule, wall, "r") if o > wall), 4))
    assert found == expected, (str(rule), wall)
    if not rule._count:
        restarted = restarted_near(rule, wall)
        again = list(islice((o for o in bounded_walk(restarted, wall, "r") if o > wall), 4))
        assert again == expected, (str(rule), wall, str(restarted))
