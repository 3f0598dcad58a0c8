"""The brute-force oracle of issue 34: exclusions, business-day shifts and
unions of specs over random calendars, in the issue's zones around their 2026
and 2027 transitions.

The expected windows come from the drawn cron fields, zoneinfo, the calendar
and the ``holidays`` package (the data the ``holidays:CC`` entries name),
never from the code under test:

* each spec's windows follow the contract's rules (``expected_windows`` of
  test_cron_properties: a time in a spring gap slides, a repeated fixed time
  fires at its first pass, a wildcard hour keeps its real cadence); a union is
  the set of them (an instant two specs share is one window);
* without a shift, a window is dropped when its local date is an excluded
  date, in a range or a holiday, or when it is a window of an excluded cron;
* with a shift, a window of an excluded cron is dropped; a window on a local
  date that is a weekend or an excluded day fires on the next / previous
  business day at the wall time the cron names (not the time a gap slid it
  to), read by the fixed-hour rule; what lands on one instant fires once.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import holidays
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_routines.errors import ScheduleError
from celery_routines.schedules.parse import schedule_from_columns
from tests.schedules.test_cron_properties import (
    CALENDAR_ZONES,
    SETTINGS,
    Cron,
    calendar_token_crons,
    expected_windows,
    fixed_hour_crons,
    real_time_crons,
    transition_starts,
)

# Longer than any run of non-business days drawn below (weekends, at most two
# ranges of 4 days, three dates and a country's holidays), so every window
# that can move into (after, until] is computed.
MARGIN = timedelta(days=21)
HOLIDAY_CALENDARS = ["IT", "US-NY", "GB-SCT", "CL", "IN", "AU-NSW"]
SHIFTS = [None, "next_business_day", "previous_business_day"]
# Each example computes a month or two of windows twice: fewer than the
# cron properties' 250 keep it near half a minute on a shared machine.
ORACLE_SETTINGS = settings(SETTINGS, max_examples=120)

inner_crons = st.one_of(fixed_hour_crons(), calendar_token_crons(), real_time_crons())


@st.composite
def excluded_crons(draw: st.DrawFn) -> Cron:
    """A fixed time on one weekday: it removes instants without being able to
    remove every window of a daily routine."""
    minute, hour, weekday = (
        draw(st.integers(0, 59)),
        draw(st.integers(0, 23)),
        draw(st.integers(0, 6)),
    )
    return Cron((minute,), (hour,), (weekday,), f"{minute} {hour} * * {weekday}", real_time=False)


@st.composite
def calendars(draw: st.DrawFn, around: date) -> tuple[list[str], set[date], list[Cron]]:
    """``exclude`` entries, the whole days they name near ``around``, and
    their crons."""
    entries: list[str] = []
    days: set[date] = set()
    offsets = st.integers(-10, 50)
    for _ in range(draw(st.integers(0, 3))):
        day = around + timedelta(days=draw(offsets))
        entries.append(day.isoformat())
        days.add(day)
    for _ in range(draw(st.integers(0, 2))):
        start = around + timedelta(days=draw(offsets))
        end = start + timedelta(days=draw(st.integers(0, 3)))
        entries.append(f"{start.isoformat()}..{end.isoformat()}")
        days.update(start + timedelta(days=k) for k in range((end - start).days + 1))
    crons = draw(st.lists(excluded_crons(), max_size=2, unique_by=lambda c: c.text))
    entries += [c.text for c in crons]
    if draw(st.booleans()):
        code = draw(st.sampled_from(HOLIDAY_CALENDARS))
        country, _, subdivision = code.partition("-")
        known = holidays.country_holidays(country, subdiv=subdivision or None)
        entries.append(f"holidays:{code}")
        first, last = around - 2 * MARGIN, around + 4 * MARGIN
        days.update(
            d for d in (first + timedelta(days=k) for k in range((last - first).days)) if d in known
        )
    return entries, days, crons


def nominal(cron: Cron, zone: ZoneInfo, lo: datetime, hi: datetime) -> list[tuple[datetime, time]]:
    """``cron``'s windows in (lo, hi] with the wall time each one names."""
    found = []
    for instant in expected_windows(cron, zone.key, lo, hi):
        wall = instant.astimezone(zone).replace(tzinfo=None)
        if cron.real_time:
            found.append((instant, wall.time()))
            continue
        # A fixed hour names its own wall time or, slid by a spring gap, the
        # missing one just before (both, when both are in the cron).
        for back in range(0, 181):
            named = wall - timedelta(minutes=back)
            if (
                named.minute in cron.minutes
                and named.hour in cron.hours
                and cron.day_matches(named.date())
                and named.replace(tzinfo=zone, fold=0).astimezone(UTC) == instant
            ):
                found.append((instant, named.time()))
    return found


def oracle(
    crons: list[Cron],
    zone_name: str,
    excluded_days: set[date],
    excluded: list[Cron],
    shift: str | None,
    after: datetime,
    until: datetime,
) -> list[datetime]:
    zone = ZoneInfo(zone_name)
    lo, hi = after - MARGIN, until + MARGIN
    removed = {w for cron in excluded for w in expected_windows(cron, zone_name, lo, hi)}

    def business(day: date) -> bool:
        return day.weekday() < 5 and day not in excluded_days

    found: set[datetime] = set()
    for cron in crons:
        for instant, wall in nominal(cron, zone, lo, hi):
            if instant in removed:
                continue
            day = instant.astimezone(zone).date()
            if shift is None:
                if day not in excluded_days:
                    found.add(instant)
                continue
            if business(day):
                found.add(instant)
                continue
            step = timedelta(days=1 if shift == "next_business_day" else -1)
            while not business(day):
                day += step
            moved = datetime.combine(day, wall).replace(tzinfo=zone, fold=0).astimezone(UTC)
            found.add(moved)
    return sorted(w for w in found if after < w <= until)


@ORACLE_SETTINGS
@given(
    data=st.data(),
    crons=st.lists(inner_crons, min_size=1, max_size=2, unique_by=lambda c: c.text),
    zone=st.sampled_from(CALENDAR_ZONES),
    shift=st.sampled_from(SHIFTS),
    days=st.integers(1, 30),
)
def test_calendars_match_the_oracle(
    data: st.DataObject, crons: list[Cron], zone: str, shift: str | None, days: int
) -> None:
    after = data.draw(transition_starts(zone))
    until = after + timedelta(days=days)
    entries, excluded_days, excluded = data.draw(calendars(after.date()))
    single = len(crons) == 1
    schedule = schedule_from_columns(
        crons[0].text if single else None,
        None,
        zone,
        schedules=None if single else [c.text for c in crons],
        exclude=entries or None,
        shift=shift,
    )
    expected = oracle(crons, zone, excluded_days, excluded, shift, after, until)
    try:
        listed = list(schedule.windows(after, until))
    except ScheduleError:
        # A shifted stream that finds no window for ten years says so; the
        # drawn calendar must then have nothing here either.
        assert expected == []
        return
    assert listed == expected
    # next_after walks the same windows (the first 20).
    chained, cursor = [], after
    while len(chained) < min(20, len(listed)):
        cursor = schedule.next_after(cursor)
        chained.append(cursor)
    assert chained == listed[: len(chained)]


@pytest.mark.parametrize(
    ("zone", "cron", "shift", "after", "expected"),
    [
        # The spring Sunday's 02:30 fired at 03:30; moved, it is 02:30 again.
        ("Europe/Rome", "30 2 * * 0", "next_business_day", "2026-03-28", "2026-03-30 02:30"),
        (
            "America/New_York",
            "30 2 * * 0",
            "previous_business_day",
            "2026-03-07",
            "2026-03-06 02:30",
        ),
        ("America/New_York", "30 2 * * 0", "next_business_day", "2027-03-13", "2027-03-15 02:30"),
        # Lord Howe's gap is 30 minutes, on the first Sunday of October.
        (
            "Australia/Lord_Howe",
            "15 2 * * 0",
            "next_business_day",
            "2026-10-03",
            "2026-10-05 02:15",
        ),
        # Santiago moves its clocks at 24:00 Saturday: Sunday 00:30 is missing.
        ("America/Santiago", "30 0 * * 0", "next_business_day", "2026-09-05", "2026-09-07 00:30"),
        # Kolkata never changes: a Saturday window moves to Friday at its time.
        ("Asia/Kolkata", "0 9 * * 6", "previous_business_day", "2026-12-05", "2026-12-04 09:00"),
    ],
)
def test_named_transitions_move_as_the_oracle_says(
    zone: str, cron: str, shift: str, after: str, expected: str
) -> None:
    tz = ZoneInfo(zone)
    around = datetime.fromisoformat(after).replace(tzinfo=tz).astimezone(UTC)
    schedule = schedule_from_columns(cron, None, zone, shift=shift)
    wanted = datetime.fromisoformat(expected).replace(tzinfo=tz, fold=0).astimezone(UTC)
    listed = list(schedule.windows(around - timedelta(days=2), around + timedelta(days=4)))
    assert listed == [wanted], ([w.astimezone(tz) for w in listed], wanted.astimezone(tz))
