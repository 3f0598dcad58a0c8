"""Property tests of the bounded, one-off and jittered schedules over random zones.

The crons, zones and starts are test_cron_properties' strategies (random
zones, often just before an offset change); the oracle is the plain cron
schedule (pinned by its own properties) filtered by the bounds, and zoneinfo.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import given
from hypothesis import strategies as st

from celery_routines.schedules.base import NEVER, count_windows, first_window, last_windows
from celery_routines.schedules.bounds import bounded
from celery_routines.schedules.cron import CronSchedule
from celery_routines.schedules.interval import IntervalSchedule
from celery_routines.schedules.jitter import jitter_offset, send_instant, window_of
from celery_routines.schedules.oneoff import OneOffSchedule, parse_at
from tests.schedules.test_cron_properties import SETTINGS, Cron, any_crons, starts, zones


def _chain(schedule, after: datetime, until: datetime) -> list[datetime]:
    found, current = [], after
    while (current := schedule.next_after(current)) <= until:
        found.append(current)
    return found


@SETTINGS
@given(
    data=st.data(),
    cron=any_crons,
    zone=zones,
    lead=st.integers(-48 * 60, 48 * 60),
    span=st.integers(0, 72 * 60),
)
def test_bounded_windows_are_the_cron_windows_inside_the_bounds(
    data: st.DataObject, cron: Cron, zone: str, lead: int, span: int
) -> None:
    after = data.draw(starts(zone))
    starts_at = after + timedelta(minutes=lead)
    ends_at = starts_at + timedelta(minutes=span)
    until = after + timedelta(days=4)
    plain = CronSchedule(cron.text, zone)
    b = bounded(plain, starts_at, ends_at)
    first = max(after, starts_at - timedelta(microseconds=1))
    expected = [w for w in plain.windows(first, until) if starts_at <= w <= ends_at]
    assert list(b.windows(after, until)) == expected
    assert count_windows(b, after, until) == len(expected)
    assert last_windows(b, after, until, 3) == expected[-3:]
    # next_after walks the same windows, and after the last one it is NEVER.
    assert _chain(b, after, until) == expected
    if ends_at < until:
        assert b.next_after(expected[-1] if expected else ends_at) == NEVER


@SETTINGS
@given(
    data=st.data(),
    zone=zones,
    step=st.integers(1, 6 * 3600),
    lead=st.integers(-3600, 3600),
)
def test_a_bounded_interval_is_anchored_on_starts_at_across_offset_changes(
    data: st.DataObject, zone: str, step: int, lead: int
) -> None:
    now = data.draw(starts(zone))
    starts_at = now + timedelta(seconds=lead)
    b = bounded(IntervalSchedule(step), starts_at, None)
    first = first_window(b, now)
    assert first >= starts_at and (first - starts_at) % timedelta(seconds=step) == timedelta(0)
    assert b.next_after(first) - first == timedelta(seconds=step)  # real time, not wall time


@SETTINGS
@given(data=st.data(), zone=zones)
def test_a_one_off_at_a_local_time_fires_at_that_wall_time_or_just_after_a_gap(
    data: st.DataObject, zone: str
) -> None:
    near = data.draw(starts(zone)).astimezone(ZoneInfo(zone))
    wall = near.replace(tzinfo=None, second=0, microsecond=0) + timedelta(
        minutes=data.draw(st.integers(0, 6 * 60))
    )
    at = parse_at(wall.isoformat(), zone)
    local = at.astimezone(ZoneInfo(zone)).replace(tzinfo=None)
    occurrences = sorted(
        {
            wall.replace(tzinfo=ZoneInfo(zone), fold=fold).astimezone(UTC)
            for fold in (0, 1)
            if wall.replace(tzinfo=ZoneInfo(zone), fold=fold)
            .astimezone(UTC)
            .astimezone(ZoneInfo(zone))
            .replace(tzinfo=None)
            == wall
        }
    )
    if occurrences:
        assert at == occurrences[0]  # a repeated wall time fires at its first occurrence
    else:
        # In a spring gap: the same offset as before the gap, so later on the wall clock.
        assert local > wall and local - wall <= timedelta(hours=2)
    once = OneOffSchedule(at)
    assert _chain(once, at - timedelta(days=1), at + timedelta(days=1)) == [at]
    assert once.next_after(at) == NEVER


@SETTINGS
@given(
    data=st.data(),
    cron=any_crons,
    zone=zones,
    name=st.text(min_size=1, max_size=30),
    jitter=st.integers(1, 86400),
)
def test_jitter_keeps_the_windows_and_moves_every_send_instant_by_the_same_offset(
    data: st.DataObject, cron: Cron, zone: str, name: str, jitter: int
) -> None:
    after = data.draw(starts(zone))
    windows = list(CronSchedule(cron.text, zone).windows(after, after + timedelta(days=2)))
    offset = jitter_offset(name, jitter)
    assert timedelta(0) <= offset < timedelta(seconds=jitter)
    assert offset.microseconds == 0
    for window in windows:
        sent = send_instant(window, name, jitter)
        assert sent - window == offset
        assert window_of(sent, name, jitter) == window


@SETTINGS
@given(
    data=st.data(),
    zone=zones,
    hour=st.integers(0, 23),
    minute=st.integers(0, 59),
    days=st.integers(1, 20),
    lead=st.integers(1, 400),
)
def test_a_daily_rrule_fires_like_the_fixed_hour_cron_of_the_same_time(
    data: st.DataObject, zone: str, hour: int, minute: int, days: int, lead: int
) -> None:
    from celery_routines.schedules.rrule import RRuleSchedule

    after = data.draw(starts(zone))
    # DTSTART up to 400 days back. dateutil steps every occurrence from
    # DTSTART at each next_after: a 1999 DTSTART cost 50 s for this test.
    dtstart = after.astimezone(ZoneInfo(zone)).date() - timedelta(days=lead)
    rule = RRuleSchedule(
        f"DTSTART:{dtstart:%Y%m%d}T{hour:02d}{minute:02d}00\nRRULE:FREQ=DAILY", zone
    )
    cron = CronSchedule(f"{minute} {hour} * * *", zone)
    until = after + timedelta(days=days)
    assert list(rule.windows(after, until)) == list(cron.windows(after, until))
