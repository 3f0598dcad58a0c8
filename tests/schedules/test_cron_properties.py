"""Property tests of CronSchedule over random zones, dates and expressions.

Starts are drawn from 2000-2037, half of them just before a real offset change
of the drawn zone, so gaps and repeated hours are hit often. The expected
windows come from zoneinfo and the drawn cron fields, never from the code
under test.
"""

from __future__ import annotations

import calendar
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo, available_timezones

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_routines.schedules.cron import CronSchedule

ALL_ZONES = sorted(available_timezones())
# Zones with the transitions we care most about (all also in ALL_ZONES).
FOCUS_ZONES = [
    "Europe/Rome",
    "America/New_York",
    "Australia/Sydney",
    "Australia/Lord_Howe",
    "America/Santiago",
    "America/Goose_Bay",
    "America/Nuuk",
    "Pacific/Apia",
    "Pacific/Chatham",
    "Asia/Gaza",
    "America/St_Johns",
    "Europe/London",
]

SETTINGS = settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@dataclass(frozen=True)
class Cron:
    """A drawn cron expression with its fields as sets, for the oracle."""

    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    weekdays: tuple[int, ...] | None  # cron numbering, Sunday = 0; None = every day
    text: str
    real_time: bool  # the hour field is a wildcard or a step
    day_token: str | None = None  # L, nW (day of month), wL, w#k (day of week)

    def day_matches(self, day: date) -> bool:
        if self.day_token is not None:
            return day_token_matches(self.day_token, day)
        return self.weekdays is None or day.isoweekday() % 7 in self.weekdays


def day_token_matches(token: str, day: date) -> bool:
    """Whether ``day`` matches one of cron's calendar tokens, from the calendar
    alone: ``L`` the last day of the month, ``nW`` the weekday nearest the
    n-th (never in another month; n past the month's end reads as its last
    day), ``wL`` the last weekday w of the month, ``w#k`` the k-th weekday w."""
    last = calendar.monthrange(day.year, day.month)[1]
    weekday = day.isoweekday() % 7  # cron numbering, Sunday = 0
    if token == "L":
        return day.day == last
    if token.endswith("W"):
        target = date(day.year, day.month, min(int(token[:-1]), last))
        if target.weekday() == 5:  # Saturday: the Friday, or Monday at the 1st
            target += timedelta(days=-1 if target.day > 1 else 2)
        elif target.weekday() == 6:  # Sunday: the Monday, or Friday at the end
            target += timedelta(days=1 if target.day < last else -2)
        return day == target
    if token.endswith("L"):
        return weekday == int(token[:-1]) % 7 and day.day + 7 > last
    wanted, nth = token.split("#")
    return weekday == int(wanted) % 7 and (day.day - 1) // 7 + 1 == int(nth)


day_tokens = st.one_of(
    st.just("L"),
    st.integers(1, 31).map(lambda n: f"{n}W"),
    st.integers(0, 7).map(lambda w: f"{w}L"),
    st.tuples(st.integers(0, 7), st.integers(1, 5)).map(lambda wk: f"{wk[0]}#{wk[1]}"),
)


@st.composite
def calendar_token_crons(draw: st.DrawFn) -> Cron:
    """A fixed-hour or real-time cron whose days are an L/W/# token."""
    base = draw(st.one_of(fixed_hour_crons(), real_time_crons()))
    token = draw(day_tokens)
    minute, hour = base.text.split()[:2]
    days = f"{token} * *" if token == "L" or token.endswith("W") else f"* * {token}"
    return Cron(base.minutes, base.hours, None, f"{minute} {hour} {days}", base.real_time, token)


def _list(values: list[int]) -> str:
    return ",".join(str(v) for v in sorted(set(values)))


@st.composite
def fixed_hour_crons(draw: st.DrawFn) -> Cron:
    minutes = draw(st.lists(st.integers(0, 59), min_size=1, max_size=3))
    hours = draw(st.lists(st.integers(0, 23), min_size=1, max_size=3))
    weekdays = draw(st.none() | st.lists(st.integers(0, 6), min_size=1, max_size=3))
    dow = "*" if weekdays is None else _list(weekdays)
    return Cron(
        tuple(sorted(set(minutes))),
        tuple(sorted(set(hours))),
        None if weekdays is None else tuple(sorted(set(weekdays))),
        f"{_list(minutes)} {_list(hours)} * * {dow}",
        real_time=False,
    )


@st.composite
def real_time_crons(draw: st.DrawFn) -> Cron:
    step = draw(st.sampled_from([5, 10, 15, 20, 30, 60]))
    offset = draw(st.integers(0, step - 1))
    minutes = tuple(range(offset, 60, step))
    minute_text = f"{offset}-59/{step}" if step < 60 else str(offset)
    hour_step = draw(st.sampled_from([1, 1, 2, 3]))
    hour_start = draw(st.integers(0, hour_step - 1))
    hours = tuple(range(hour_start, 24, hour_step))
    hour_text = "*" if hour_step == 1 else f"{hour_start}-23/{hour_step}"
    weekdays = draw(st.none() | st.lists(st.integers(0, 6), min_size=1, max_size=4))
    dow = "*" if weekdays is None else _list(weekdays)
    return Cron(
        minutes,
        hours,
        None if weekdays is None else tuple(sorted(set(weekdays))),
        f"{minute_text} {hour_text} * * {dow}",
        real_time=True,
    )


any_crons = st.one_of(fixed_hour_crons(), real_time_crons(), calendar_token_crons())
zones = st.one_of(st.sampled_from(FOCUS_ZONES), st.sampled_from(ALL_ZONES))


def _next_offset_change(zone: ZoneInfo, start: datetime) -> datetime | None:
    """The first instant within 400 days after ``start`` where the offset changes."""
    previous = start.astimezone(zone).utcoffset()
    for step in range(1, 400 * 4):
        probe = start + timedelta(hours=6 * step)
        if probe.astimezone(zone).utcoffset() != previous:
            return probe
    return None


@st.composite
def starts(draw: st.DrawFn, zone_name: str) -> datetime:
    """A UTC instant in 2000-2037, often a few hours before an offset change."""
    start = draw(
        st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2037, 10, 1))
    ).replace(tzinfo=UTC)
    if draw(st.booleans()):
        change = _next_offset_change(ZoneInfo(zone_name), start)
        if change is not None:
            start = change - timedelta(minutes=draw(st.integers(0, 48 * 60)))
    return start


# -- oracle -------------------------------------------------------------------

_HOURS_6 = timedelta(hours=6)


def expected_windows(
    cron: Cron, zone_name: str, after: datetime, until: datetime
) -> list[datetime]:
    """The windows in (after, until] straight from the contract's rules."""
    zone = ZoneInfo(zone_name)
    found: set[datetime] = set()
    if cron.real_time:
        # Real-time cadence: every real minute whose local wall clock matches,
        # walked only around the local dates that match (a local date lasts
        # at most 26 hours, wherever its midnight falls).
        day = after.astimezone(zone).date() - timedelta(days=1)
        last = until.astimezone(zone).date() + timedelta(days=1)
        while day <= last:
            if cron.day_matches(day):
                midnight = datetime.combine(day, time()).replace(tzinfo=zone).astimezone(UTC)
                instant = max(after.replace(second=0, microsecond=0), midnight - _HOURS_6)
                end = min(until, midnight + timedelta(hours=30))
                while instant <= end:
                    local = instant.astimezone(zone)
                    if (
                        instant > after
                        and local.date() == day
                        and local.second == 0
                        and local.minute in cron.minutes
                        and local.hour in cron.hours
                    ):
                        found.add(instant)
                    instant += timedelta(minutes=1)
            day += timedelta(days=1)
    else:
        # Fixed hours: every matching wall time at fold=0 (gap: shifted by the
        # gap; repeated: first occurrence); instants shared by two wall times once.
        day = after.astimezone(zone).date() - timedelta(days=2)
        last = until.astimezone(zone).date() + timedelta(days=2)
        while day <= last:
            if cron.day_matches(day):
                for hour in cron.hours:
                    for minute in cron.minutes:
                        wall = datetime.combine(day, time(hour, minute))
                        instant = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
                        if after < instant <= until:
                            found.add(instant)
            day += timedelta(days=1)
    return sorted(found)


# -- properties -----------------------------------------------------------------


@SETTINGS
@given(data=st.data(), cron=any_crons, zone=zones, hours=st.integers(1, 72))
def test_windows_match_the_contract_rules(
    data: st.DataObject, cron: Cron, zone: str, hours: int
) -> None:
    after = data.draw(starts(zone))
    until = after + timedelta(hours=hours)
    schedule = CronSchedule(cron.text, zone)
    assert list(schedule.windows(after, until)) == expected_windows(cron, zone, after, until)


# The zones and years issue 34 names for the calendar forms.
CALENDAR_ZONES = [
    "Europe/Rome",
    "America/New_York",
    "Australia/Lord_Howe",
    "America/Santiago",
    "Asia/Kolkata",
    "Asia/Jerusalem",  # springs forward on a Friday: W days land on it
    "Africa/Cairo",  # changes on a Friday and a Thursday
]


@st.composite
def transition_starts(draw: st.DrawFn, zone_name: str) -> datetime:
    """A UTC instant in 2026-2027, often a few days before an offset change."""
    start = draw(
        st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2027, 12, 1))
    ).replace(tzinfo=UTC)
    if draw(st.booleans()):
        change = _next_offset_change(ZoneInfo(zone_name), start)
        if change is not None:
            start = change - timedelta(minutes=draw(st.integers(0, 40 * 24 * 60)))
    return start


@SETTINGS
@given(
    data=st.data(),
    cron=calendar_token_crons(),
    zone=st.sampled_from(CALENDAR_ZONES),
    days=st.integers(1, 70),
)
def test_L_W_hash_windows_match_the_contract_rules(
    data: st.DataObject, cron: Cron, zone: str, days: int
) -> None:
    """L, nW, wL and w#k days, in the issue's zones around their 2026 and 2027
    transitions: the same gap, repeated-hour and real-cadence rules."""
    after = data.draw(transition_starts(zone))
    until = after + timedelta(days=days)
    schedule = CronSchedule(cron.text, zone)
    assert list(schedule.windows(after, until)) == expected_windows(cron, zone, after, until)


@SETTINGS
@given(data=st.data(), cron=any_crons, zone=zones, days=st.integers(1, 40))
def test_windows_increase_strictly_and_agree_with_count_last_and_next_after(
    data: st.DataObject, cron: Cron, zone: str, days: int
) -> None:
    after = data.draw(starts(zone))
    until = after + timedelta(days=days, seconds=data.draw(st.integers(0, 86399)))
    schedule = CronSchedule(cron.text, zone)
    listed = list(schedule.windows(after, until))

    assert all(a < b for a, b in pairwise(listed))  # no repeats either
    assert all(w.tzinfo is UTC and after < w <= until for w in listed)
    assert schedule.count_windows(after, until) == len(listed)
    n = data.draw(st.integers(1, 30))
    assert schedule.last_windows(after, until, n) == listed[-n:]

    # Repeated next_after walks the same windows (the first 40 of them).
    chained, cursor = [], after
    while len(chained) < 40 and (cursor := schedule.next_after(cursor)) <= until:
        chained.append(cursor)
    assert chained == listed[:40]


@SETTINGS
@given(
    zone=zones,
    first=st.dates(min_value=date(2000, 1, 1), max_value=date(2037, 10, 1)),
    minute=st.integers(0, 59),
    hour=st.integers(0, 23),
)
def test_a_fixed_local_time_fires_once_on_every_calendar_day(
    zone: str, first: date, minute: int, hour: int
) -> None:
    """``M H * * *`` fires exactly once per local calendar date, with one exception.

    When H:M does not exist on a date and the gap ends at or after midnight, the
    shifted window lands on the NEXT date: the date itself gets none, the next
    gets two, or one when it coincides with that date's own window. This
    happens when a zone skips a whole calendar day (Pacific/Apia and
    Pacific/Fakaofo on 2011-12-30: there is no 2011-12-30 to fire on) and when a
    gap ends at midnight (America/Nuuk 23:00 -> 00:00 each March since 2024).
    Those dates are found with zoneinfo and checked for that shape instead.
    """
    tz = ZoneInfo(zone)
    schedule = CronSchedule(f"{minute} {hour} * * *", zone)
    noon = time(12)
    after = datetime.combine(first, noon).replace(tzinfo=tz).astimezone(UTC)
    until = datetime.combine(first + timedelta(days=60), noon).replace(tzinfo=tz).astimezone(UTC)
    per_date = Counter(w.astimezone(tz).date() for w in schedule.windows(after, until))

    interior = [first + timedelta(days=k) for k in range(1, 60)]
    moved = set()
    for day in interior:
        wall = datetime.combine(day, time(hour, minute))
        if wall.replace(tzinfo=tz, fold=0).astimezone(UTC).astimezone(tz).date() != day:
            moved.add(day)
    for day in interior:
        if day in moved:
            assert per_date[day] == 0, day
        elif day - timedelta(days=1) in moved:
            assert per_date[day] in (1, 2), day
        else:
            assert per_date[day] == 1, day


def test_skipped_day_and_midnight_gap_examples_are_real() -> None:
    """The exceptions named above exist in the tz database this runs with."""
    apia = ZoneInfo("Pacific/Apia")
    skipped = datetime(2011, 12, 30, 12, 0).replace(tzinfo=apia).astimezone(UTC)
    assert skipped.astimezone(apia).date() == date(2011, 12, 31)
    nuuk = ZoneInfo("America/Nuuk")
    gap = datetime(2024, 3, 30, 23, 30).replace(tzinfo=nuuk).astimezone(UTC)
    assert gap.astimezone(nuuk).date() == date(2024, 3, 31)
