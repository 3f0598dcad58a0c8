"""One-off, bounded (starts_at/ends_at), jittered and solar schedules: table cases.

Property tests over random zones are in test_schedule_types_properties.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from celery.schedules import solar

from celery_routines.errors import ScheduleError
from celery_routines.schedules.base import NEVER, count_windows, first_window, last_windows
from celery_routines.schedules.bounds import BoundedSchedule, bounded
from celery_routines.schedules.cron import CronSchedule
from celery_routines.schedules.interval import IntervalSchedule
from celery_routines.schedules.jitter import jitter_offset, send_instant, window_of
from celery_routines.schedules.oneoff import OneOffSchedule, parse_at
from celery_routines.schedules.parse import parse_schedule, schedule_from_columns
from celery_routines.schedules.solar import SolarSchedule

T = datetime(2026, 12, 24, 17, 0, tzinfo=UTC)


# -- one-off ---------------------------------------------------------------------------


def test_a_one_off_has_one_window_then_never() -> None:
    once = OneOffSchedule(T)
    assert once.next_after(T - timedelta(days=3)) == T
    assert once.next_after(T) == NEVER
    assert list(once.windows(T - timedelta(hours=1), T)) == [T]
    assert list(once.windows(T, T + timedelta(days=1))) == []
    assert count_windows(once, T - timedelta(1), T + timedelta(1)) == 1
    assert last_windows(once, T - timedelta(1), T + timedelta(1), 5) == [T]


def test_a_one_off_adopted_after_its_instant_still_has_its_window() -> None:
    # Beat was down when it passed: it fires on recovery (max_lateness decides).
    assert first_window(OneOffSchedule(T), T + timedelta(hours=5)) == T


@pytest.mark.parametrize(
    ("text", "zone", "expected"),
    [
        pytest.param("2026-12-24T18:00", "Europe/Rome", T, id="local_winter"),
        pytest.param("2026-12-24T18:00+01:00", "UTC", T, id="offset_wins"),
        pytest.param("2026-12-24T17:00Z", "Asia/Tokyo", T, id="z_suffix"),
        # Spring gap: 02:30 does not exist in Rome on 2026-03-29; fires at 03:30 CEST.
        pytest.param(
            "2026-03-29T02:30",
            "Europe/Rome",
            datetime(2026, 3, 29, 1, 30, tzinfo=UTC),
            id="spring_gap_shifts_forward",
        ),
        # Autumn repeat: 02:30 exists twice on 2026-10-25; the first (CEST) fires.
        pytest.param(
            "2026-10-25T02:30",
            "Europe/Rome",
            datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
            id="autumn_repeat_first",
        ),
    ],
)
def test_at_follows_the_fixed_hour_rule(text: str, zone: str, expected: datetime) -> None:
    assert parse_at(text, zone) == expected
    assert parse_at(datetime.fromisoformat(text), zone) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("christmas", r"at must be an ISO 8601 date and time such as 2026-12-24T18:00, got 'chr"),
        (1766595600, r"at must be a datetime or an ISO 8601 string, got int 1766595600"),
    ],
)
def test_a_bad_at_is_named(value: object, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        parse_at(value, "UTC")


# -- starts_at / ends_at -------------------------------------------------------------------


def test_bounds_cut_a_cron_and_the_last_window_is_followed_by_never() -> None:
    hourly = CronSchedule("0 * * * *", "UTC")
    start, end = T + timedelta(minutes=30), T + timedelta(hours=3)
    b = bounded(hourly, start, end)
    assert b.next_after(T - timedelta(days=1)) == T + timedelta(hours=1)
    assert list(b.windows(T - timedelta(days=1), T + timedelta(days=1))) == [
        T + timedelta(hours=h) for h in (1, 2, 3)
    ]
    assert b.next_after(T + timedelta(hours=3)) == NEVER
    assert count_windows(b, T - timedelta(days=1), T + timedelta(days=1)) == 3
    assert last_windows(b, T - timedelta(days=1), T + timedelta(days=1), 2) == [
        T + timedelta(hours=2),
        T + timedelta(hours=3),
    ]


def test_an_interval_with_starts_at_is_anchored_on_it() -> None:
    b = bounded(IntervalSchedule(600), T, None)
    assert first_window(b, T - timedelta(days=2)) == T
    assert list(b.windows(T - timedelta(days=2), T + timedelta(minutes=20))) == [
        T,
        T + timedelta(minutes=10),
        T + timedelta(minutes=20),
    ]


def test_an_unbounded_schedule_is_left_as_it_is_and_ends_before_starts_is_refused() -> None:
    hourly = CronSchedule("0 * * * *", "UTC")
    assert bounded(hourly, None, None) is hourly
    with pytest.raises(ScheduleError, match=r"^ends_at \(2026-12-24T16:00:00\+00:00\) is before"):
        BoundedSchedule(hourly, T, T - timedelta(hours=1))


def test_a_one_off_outside_its_bounds_never_fires() -> None:
    b = bounded(OneOffSchedule(T), T + timedelta(hours=1), None)
    assert first_window(b, T - timedelta(days=1)) == NEVER


# -- jitter ------------------------------------------------------------------------------------


def test_jitter_is_deterministic_within_its_range_and_invertible() -> None:
    offsets = {jitter_offset(f"routine-{i}", 60) for i in range(1000)}
    assert all(timedelta(0) <= o < timedelta(seconds=60) for o in offsets)
    assert len(offsets) == 60  # a thousand routines spread over every second of the range
    assert jitter_offset("nightly", 60) == jitter_offset("nightly", 60)
    sent = send_instant(T, "nightly", 60)
    assert window_of(sent, "nightly", 60) == T
    assert send_instant(NEVER, "nightly", 60) == NEVER
    assert jitter_offset("nightly", None) == timedelta(0)


# -- solar -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "event", ["sunrise", "sunset", "solar_noon", "dawn_civil", "dusk_astronomical"]
)
def test_solar_windows_are_celerys_to_the_second(event: str) -> None:
    now = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    ours = SolarSchedule(event, 45.46, 9.19)
    theirs = solar(event, 45.46, 9.19, nowfun=lambda: now)
    expected = now + theirs.remaining_estimate(now)
    assert abs(ours.next_after(now) - expected) <= timedelta(seconds=0.5)
    assert ours.next_after(now).microsecond == 0


MIDNIGHT_DEC_3 = datetime(2026, 12, 3, tzinfo=UTC)
# Starts over the ten hours before that morning's sunrise (09:46 at 0, -60).
SOLAR_STARTS = [MIDNIGHT_DEC_3 + timedelta(minutes=m) for m in range(0, 9 * 60 + 40, 7)]


def _sunrise_straddling_half_a_second() -> tuple[SolarSchedule, set[datetime]]:
    """A place whose sunrise, searched from each of SOLAR_STARTS, lands a few
    milliseconds either side of hh:mm:ss.5 (ephem's searches disagree by up
    to ~3 ms), with the raw answers."""
    lon = -60.0
    for _ in range(10):
        found = {SolarSchedule("sunrise", 0, lon)._search(start) for start in SOLAR_STARTS}
        middle = min(found) + (max(found) - min(found)) / 2
        off = middle.microsecond / 1e6 - 0.5
        if abs(off) < 0.00005:
            break
        lon += off / 240  # the sun crosses a degree of longitude in 240 s
    return SolarSchedule("sunrise", 0, lon), found


def test_a_solar_window_is_the_same_second_from_any_start() -> None:
    # Two beats adopting the routine at different times must key the same
    # window: every start in the ten hours before it gives one answer.
    schedule, found = _sunrise_straddling_half_a_second()
    rounded = {(f + timedelta(microseconds=500_000)).replace(microsecond=0) for f in found}
    assert len(rounded) == 2  # the raw searches do round to two seconds here
    assert len({schedule.next_after(start) for start in SOLAR_STARTS}) == 1


def test_a_celery_solar_entry_parses_and_round_trips_through_its_column() -> None:
    parsed = parse_schedule(solar("sunset", -33.87, 151.21), "UTC")
    assert parsed == SolarSchedule("sunset", -33.87, 151.21)
    assert schedule_from_columns(None, None, "UTC", solar=parsed.spec) == parsed
    days = list(parsed.windows(T, T + timedelta(days=10)))
    assert len(days) == 10 and all(
        b - a < timedelta(hours=24, minutes=5) for a, b in pairwise(days)
    )


def test_polar_night_has_no_sunrise_for_weeks_but_the_next_one_is_found() -> None:
    tromso = SolarSchedule("sunrise", 69.65, 18.96)
    first = tromso.next_after(datetime(2026, 12, 1, tzinfo=UTC))
    assert datetime(2027, 1, 10, tzinfo=UTC) < first < datetime(2027, 1, 20, tzinfo=UTC)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("moonrise 1 2", r"unknown solar event 'moonrise': use one of dawn_astronomical"),
        ("sunrise 91 0", r"solar latitude must be from -90 to 90, got 91.0"),
        ("sunrise 0 181", r"solar longitude must be from -180 to 180, got 181.0"),
        ("sunrise north", r"solar must be '<event> <latitude> <longitude>'"),
    ],
)
def test_a_bad_solar_spec_is_named(spec: str, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        SolarSchedule.from_spec(spec)


# -- rrule ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "after", "expected"),
    [
        pytest.param(
            "DTSTART:20260301T023000\nRRULE:FREQ=DAILY",
            datetime(2026, 3, 28, 12, 0, tzinfo=UTC),
            datetime(2026, 3, 29, 1, 30, tzinfo=UTC),  # 03:30 CEST: 02:30 does not exist
            id="spring_gap_shifts_forward",
        ),
        pytest.param(
            "DTSTART:20260301T023000\nRRULE:FREQ=DAILY",
            datetime(2026, 10, 24, 12, 0, tzinfo=UTC),
            datetime(2026, 10, 25, 0, 30, tzinfo=UTC),  # the first 02:30 (CEST) only
            id="autumn_repeat_first",
        ),
    ],
)
def test_rrule_follows_the_fixed_hour_rule(rule: str, after: datetime, expected: datetime) -> None:
    from celery_routines.schedules.rrule import RRuleSchedule

    schedule = RRuleSchedule(rule, "Europe/Rome")
    assert schedule.next_after(after) == expected
    # The repeated hour fires once: the next window is the next day's.
    assert schedule.next_after(expected) - expected >= timedelta(hours=23)


def test_an_rrule_with_count_ends_and_one_is_parsed_from_a_string() -> None:
    rule = "DTSTART:20261201T090000\nRRULE:FREQ=WEEKLY;BYDAY=MO;COUNT=2"
    parsed = parse_schedule(rule, "Europe/Rome")
    assert list(parsed.windows(T - timedelta(days=60), T + timedelta(days=60))) == [
        datetime(2026, 12, 7, 8, 0, tzinfo=UTC),
        datetime(2026, 12, 14, 8, 0, tzinfo=UTC),
    ]
    assert parsed.next_after(datetime(2026, 12, 14, 8, 0, tzinfo=UTC)) == NEVER
    assert schedule_from_columns(None, None, "Europe/Rome", rrule=rule) == parsed


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("RRULE:FREQ=DAILY", r"needs a DTSTART"),
        ("DTSTART;TZID=Europe/Rome:20261201T090000\nRRULE:FREQ=DAILY", r"as a local time"),
        ("DTSTART:20261201T090000\nRRULE:FREQ=SOMETIMES", r"is invalid"),
    ],
)
def test_a_bad_rrule_is_named(rule: str, message: str) -> None:
    from celery_routines.schedules.rrule import RRuleSchedule

    with pytest.raises(ScheduleError, match=message):
        RRuleSchedule(rule, "UTC")


def test_a_local_at_without_a_timezone_is_refused_not_read_as_utc() -> None:
    with pytest.raises(ScheduleError, match=r"^at 2026-12-24T18:00:00 has no UTC offset and the"):
        parse_at("2026-12-24T18:00", None)
    assert parse_at("2026-12-24T17:00Z", None) == T


def test_a_solar_spec_keeps_every_digit_of_its_coordinates() -> None:
    # Six significant digits moved this sunrise by a fraction of a second,
    # enough to change the whole second of its window (and its key).
    place = SolarSchedule("sunrise", 45.123456789, -123.456789)
    assert place.spec == "sunrise 45.123456789 -123.456789"
    assert SolarSchedule.from_spec(place.spec) == place
    assert SolarSchedule("sunset", 0, 9.19).spec == "sunset 0 9.19"
