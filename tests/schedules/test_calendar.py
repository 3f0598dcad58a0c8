"""Exclusions, business-day shifts and unions of specs (issue 34), by hand.

Expected instants are worked out from the calendar and the zones' offsets
(Rome +1 in winter, +2 in summer; Jerusalem +2 -> +3 on Friday 2026-03-27 at
02:00; Cairo +3 -> +2 on Thursday 2026-10-29 at 24:00), not from the code. The
brute-force oracle over random calendars is in test_calendar_oracle.py.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from celery_routines.errors import ScheduleError
from celery_routines.schedules.calendar import CalendarSchedule, Shift, calendar
from celery_routines.schedules.cron import CronSchedule
from celery_routines.schedules.exclusions import Exclusions, exclusion_entries, holiday_calendar
from celery_routines.schedules.interval import IntervalSchedule
from celery_routines.schedules.keys import window_key
from celery_routines.schedules.parse import parse_specs, schedule_from_columns

ROME = ZoneInfo("Europe/Rome")


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def local_dates(schedule: CalendarSchedule, after: str, until: str) -> list[str]:
    zone = ZoneInfo(schedule.timezone)
    windows = schedule.windows(utc(after), utc(until))
    return [w.astimezone(zone).date().isoformat() for w in windows]


def chained(schedule: object, after: datetime, n: int) -> list[datetime]:
    found, cursor = [], after
    for _ in range(n):
        cursor = schedule.next_after(cursor)  # type: ignore[attr-defined]
        found.append(cursor)
    return found


def rome(expression: str, exclude: list[str], shift: Shift | None = None) -> CalendarSchedule:
    schedule = calendar(
        CronSchedule(expression, "Europe/Rome"), Exclusions(exclude), shift, "Europe/Rome"
    )
    assert isinstance(schedule, CalendarSchedule)
    return schedule


# -- entries -----------------------------------------------------------------------


def test_entries_are_read_from_a_list_a_json_column_or_text() -> None:
    assert exclusion_entries(None) == ()
    assert exclusion_entries(["2026-12-25", date(2026, 12, 26), " *  * 24 12 * "]) == (
        "2026-12-25",
        "2026-12-26",
        "* * 24 12 *",
    )
    assert exclusion_entries('["holidays:IT", "2026-08-10..2026-08-21"]') == (
        "holidays:IT",
        "2026-08-10..2026-08-21",
    )
    assert exclusion_entries("holidays:IT; 2026-12-24\n0 9 * * 1") == (
        "holidays:IT",
        "2026-12-24",
        "0 9 * * 1",
    )


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (["2026-02-30"], "exclude entry '2026-02-30': '2026-02-30' is not a date (YYYY-MM-DD)"),
        (
            ["2026-08-21..2026-08-10"],
            "exclude range '2026-08-21..2026-08-10' ends before it starts",
        ),
        (["2026-08-10..later"], "exclude entry '2026-08-10..later': 'later' is not a date"),
        (["holidays:XX"], "exclude 'holidays:XX': Country XX not available"),
        (["holidays:US-ZZ"], "exclude 'holidays:US-ZZ': Entity `US` does not have subdivision ZZ"),
        (["61 * * * *"], "exclude entry '61 * * * *' is not a date (YYYY-MM-DD), a range"),
        (["christmas"], "exclude entry 'christmas' is not a date (YYYY-MM-DD), a range"),
        ([5], "exclude entry 5 is not a date"),
        ("[not json", "exclude is not a valid JSON list"),
        (42, "exclude must be a string or a list"),
    ],
)
def test_bad_entries_name_the_value(entries: object, message: str) -> None:
    with pytest.raises(ScheduleError) as raised:
        Exclusions(exclusion_entries(entries))
    assert message in str(raised.value)


def test_day_names_come_from_the_holiday_calendar_the_dates_and_the_ranges() -> None:
    exclusions = Exclusions(("holidays:IT", "2026-12-24", "2026-08-10..2026-08-21"))
    assert exclusions.day_name(date(2026, 12, 25)) == "Christmas Day"
    assert exclusions.day_name(date(2026, 4, 25)) == "Liberation Day"
    assert exclusions.day_name(date(2026, 12, 24)) == "2026-12-24"
    assert exclusions.day_name(date(2026, 8, 15)) == "Assumption Of Mary Day"
    assert exclusions.day_name(date(2026, 8, 14)) == "2026-08-10..2026-08-21"
    assert exclusions.day_name(date(2026, 8, 22)) is None
    # A subdivision's own holidays: Lincoln's Birthday in New York only.
    assert Exclusions(("holidays:US-NY",)).day_name(date(2026, 2, 12)) == "Lincoln's Birthday"
    assert Exclusions(("holidays:US",)).day_name(date(2026, 2, 12)) is None
    assert Exclusions(("holidays:GB-SCT",)).day_name(date(2026, 11, 30)) == "Saint Andrew's Day"


@pytest.mark.parametrize("language", ["it_IT", "C.UTF-8", "de"])
def test_holiday_names_do_not_depend_on_the_hosts_language(
    language: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The library reads LANGUAGE, LC_ALL, LC_MESSAGES and LANG: a beat and a
    # panel on differently configured hosts must still name a day alike.
    for variable in ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG"):
        monkeypatch.setenv(variable, language)
    holiday_calendar.cache_clear()
    try:
        assert Exclusions(("holidays:IT",)).day_name(date(2026, 12, 25)) == "Christmas Day"
    finally:
        holiday_calendar.cache_clear()


# -- exclusions: the window is not a window -------------------------------------------


def test_the_issue_example_weekdays_except_italian_holidays() -> None:
    schedule = rome("0 9 * * 1-5", ["holidays:IT"])
    windows = chained(schedule, datetime(2026, 12, 21, tzinfo=ROME) - timedelta(microseconds=1), 6)
    assert [w.astimezone(ROME).day for w in windows] == [21, 22, 23, 24, 28, 29]
    assert schedule.next_excluded(utc("2026-12-09 00:00")) == (
        utc("2026-12-25 08:00"),
        "Christmas Day",
    )


def test_dates_ranges_and_crons_remove_their_windows() -> None:
    schedule = rome("0 9,18 * * *", ["2026-12-24", "2026-12-27..2026-12-29", "* 18 25 12 *"])
    windows = list(schedule.windows(utc("2026-12-23 00:00"), utc("2026-12-31 00:00")))
    assert [w.astimezone(ROME).strftime("%d %H") for w in windows] == [
        "23 09",
        "23 18",
        "25 09",  # the cron removes only 18:00 on the 25th
        "26 09",
        "26 18",
        "30 09",
        "30 18",
    ]
    assert schedule.why_not(utc("2026-12-25 17:00")) == "cron '* 18 25 12 *'"
    assert schedule.why_not(utc("2026-12-28 08:00")) == "2026-12-27..2026-12-29"


def test_dates_are_local_dates_of_the_routines_zone() -> None:
    # 00:30 in Rome on the 25th is 23:30 UTC on the 24th: excluded with the 25th.
    schedule = rome("30 0 * * *", ["2026-12-25"])
    windows = list(schedule.windows(utc("2026-12-23 12:00"), utc("2026-12-26 12:00")))
    assert windows == [utc("2026-12-23 23:30"), utc("2026-12-25 23:30")]


def test_an_interval_keeps_its_grid_across_an_excluded_range() -> None:
    schedule = calendar(
        IntervalSchedule(7 * 3600), Exclusions(("2026-12-24..2026-12-26",)), None, "UTC"
    )
    start = utc("2026-12-23 20:00")
    windows = chained(schedule, start, 3)
    # 23rd 20:00 + 7h steps: 24th 03:00, 10:00, ... all excluded until the 27th.
    step = timedelta(hours=7)
    grid = [start + k * step for k in range(1, 20)]
    assert (
        windows
        == [w for w in grid if w.date() not in {date(2026, 12, d) for d in (24, 25, 26)}][:3]
    )
    assert windows[0] == utc("2026-12-27 01:00")


def test_a_calendar_that_removes_everything_says_so() -> None:
    schedule = rome("0 9 1 1 *", ["* * 1 1 *"])
    with pytest.raises(ScheduleError, match="the exclusions remove every window"):
        schedule.next_after(utc("2026-01-01 00:00"))


# -- shift: payroll on the 25th ----------------------------------------------------------


def test_payroll_on_the_25th_moves_to_the_previous_business_day() -> None:
    schedule = rome("0 9 25 * *", ["holidays:IT"], Shift.PREVIOUS_BUSINESS_DAY)
    assert local_dates(schedule, "2026-03-31 00:00", "2027-03-31 00:00") == [
        "2026-04-24",  # Saturday 25th, Liberation Day -> Friday
        "2026-05-25",
        "2026-06-25",
        "2026-07-24",  # Saturday -> Friday
        "2026-08-25",
        "2026-09-25",
        "2026-10-23",  # Sunday -> Friday
        "2026-11-25",
        "2026-12-24",  # Christmas (Friday) -> Thursday
        "2027-01-25",
        "2027-02-25",
        "2027-03-25",
    ]
    # 09:00 local at the offset of the day it fires on (CEST in April).
    assert schedule.next_after(utc("2026-04-01 00:00")) == utc("2026-04-24 07:00")
    assert schedule.next_excluded(utc("2026-04-01 00:00")) == (
        utc("2026-04-25 07:00"),
        "Liberation Day",
    )


def test_next_business_day_skips_a_holiday_after_a_weekend() -> None:
    # 2026-12-26 is Saturday (and Saint Stephen's Day), 27 Sunday: Monday 28th.
    schedule = rome("0 9 26 12 *", ["holidays:IT"], Shift.NEXT_BUSINESS_DAY)
    assert local_dates(schedule, "2026-12-01 00:00", "2027-01-31 00:00") == ["2026-12-28"]


def test_a_moved_window_on_a_window_of_its_own_fires_once() -> None:
    # Every day at 09:00; Saturday's and Sunday's move to Monday 09:00.
    schedule = rome("0 9 * * *", [], Shift.NEXT_BUSINESS_DAY)
    windows = list(schedule.windows(utc("2026-12-03 12:00"), utc("2026-12-08 12:00")))
    assert [w.astimezone(ROME).strftime("%a %d") for w in windows] == [
        "Fri 04",
        "Mon 07",
        "Tue 08",
    ]
    assert schedule.moved_from(utc("2026-12-07 08:00")) == (utc("2026-12-06 08:00"), "Sunday")


def test_a_window_moved_onto_a_spring_gap_slides_like_any_fixed_hour() -> None:
    # Jerusalem springs forward on Friday 2026-03-27 at 02:00 (+2 -> +3).
    # Saturday 28th 02:30 moves back to Friday 02:30, which does not exist:
    # it fires at 03:30 (+3), 00:30 UTC.
    schedule = calendar(
        CronSchedule("30 2 28 3 *", "Asia/Jerusalem"),
        None,
        Shift.PREVIOUS_BUSINESS_DAY,
        "Asia/Jerusalem",
    )
    assert list(schedule.windows(utc("2026-03-01 00:00"), utc("2026-04-01 00:00"))) == [
        utc("2026-03-27 00:30")
    ]


def test_a_window_slid_by_a_spring_gap_moves_as_the_time_it_names() -> None:
    # Rome springs forward on Sunday 2026-03-29: that day's 02:30 fires at
    # 03:30. Moved to Monday (or back to Friday) it is 02:30 again, the same
    # as that day's own window: one fire, not 02:30 and 03:30.
    walls = {
        shift: [
            w.astimezone(ROME).strftime("%a %H:%M")
            for w in rome("30 2 * * *", [], shift).windows(
                utc("2026-03-26 12:00"), utc("2026-03-31 12:00")
            )
        ]
        for shift in Shift
    }
    assert walls == {
        Shift.NEXT_BUSINESS_DAY: ["Fri 02:30", "Mon 02:30", "Tue 02:30"],
        Shift.PREVIOUS_BUSINESS_DAY: ["Fri 02:30", "Mon 02:30", "Tue 02:30"],
    }
    # 03:30 CEST on the 29th stands for both times of '30 2,3': both move.
    moved = rome("30 2,3 * * *", [], Shift.NEXT_BUSINESS_DAY)
    assert [
        w.astimezone(ROME).strftime("%a %H:%M")
        for w in moved.windows(utc("2026-03-28 12:00"), utc("2026-03-30 12:00"))
    ] == ["Mon 02:30", "Mon 03:30"]
    assert moved.moved_from(utc("2026-03-30 00:30")) == (utc("2026-03-29 01:30"), "Sunday")


def test_a_window_moved_onto_a_repeated_hour_fires_once_at_its_first_pass() -> None:
    # Cairo falls back on Thursday 2026-10-29 at 24:00 (+3 -> +2): 23:30 twice.
    schedule = calendar(
        CronSchedule("30 23 30 10 *", "Africa/Cairo"),
        Exclusions(("2026-10-30",)),
        Shift.PREVIOUS_BUSINESS_DAY,
        "Africa/Cairo",
    )
    assert list(schedule.windows(utc("2026-10-01 00:00"), utc("2026-11-01 00:00"))) == [
        utc("2026-10-29 20:30")
    ]


def test_shift_is_refused_for_an_interval_and_a_bad_value_is_named() -> None:
    with pytest.raises(ScheduleError, match="shift='next_business_day' moves calendar windows"):
        calendar(IntervalSchedule(60), None, Shift.NEXT_BUSINESS_DAY, "UTC")
    with pytest.raises(ScheduleError, match="shift must be 'next_business_day' or"):
        schedule_from_columns("0 9 * * *", None, "UTC", shift="next_working_day")


# -- several specs ------------------------------------------------------------------------


def test_a_union_fires_each_instant_once_with_one_key() -> None:
    schedule = schedule_from_columns(
        None,
        None,
        "Europe/Rome",
        schedules=parse_specs(["0 9 * * 1-5", "0 9,12 * * *"], "Europe/Rome"),
    )
    windows = list(schedule.windows(utc("2026-12-04 00:00"), utc("2026-12-06 00:00")))
    assert windows == [
        utc("2026-12-04 08:00"),  # Friday: both specs, once
        utc("2026-12-04 11:00"),
        utc("2026-12-05 08:00"),
        utc("2026-12-05 11:00"),
    ]
    keys = [window_key("report", w, "Europe/Rome") for w in windows]
    assert len(set(keys)) == len(keys)
    assert chained(schedule, utc("2026-12-04 00:00"), 4) == windows
    assert schedule.last_windows(utc("2026-12-04 00:00"), utc("2026-12-06 00:00"), 2) == windows[2:]  # type: ignore[attr-defined]


def test_an_interval_in_a_union_is_a_grid_on_the_epoch() -> None:
    schedule = schedule_from_columns(None, None, "UTC", schedules=["17 * * * *", 3600.0])
    # Another spec's 10:17 does not drag the hourly grid to :17.
    assert chained(schedule, utc("2026-12-04 10:00"), 4) == [
        utc("2026-12-04 10:17"),
        utc("2026-12-04 11:00"),
        utc("2026-12-04 11:17"),
        utc("2026-12-04 12:00"),
    ]


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["0 9 * * *"], "a list of schedules needs 2 to 20 specs, got 1"),
        (["0 9 * * *", "0  9 * * *"], "names the same spec twice"),
        (["0 9 * * *", "61 * * * *"], "cron expression '61 * * * *' is invalid"),
        (["0 9 * * *", True], "cannot use bool True as a schedule"),
    ],
)
def test_bad_unions_are_named(specs: list[object], message: str) -> None:
    with pytest.raises(ScheduleError, match=message.replace("*", r"\*")):
        parse_specs(specs, "UTC")


def test_exclusions_and_shift_apply_to_the_union() -> None:
    schedule = schedule_from_columns(
        None,
        None,
        "Europe/Rome",
        schedules=["0 9 25 * *", "0 9 L * *"],
        exclude=["holidays:IT"],
        shift="previous_business_day",
    )
    dates = [
        w.astimezone(ROME).date().isoformat()
        for w in schedule.windows(utc("2026-04-01 00:00"), utc("2026-06-01 00:00"))
    ]
    # 25 Apr (Sat, holiday) -> 24; 30 Apr (Thu); 25 May (Mon); 31 May (Sun) -> 29 May (Fri).
    assert dates == ["2026-04-24", "2026-04-30", "2026-05-25", "2026-05-29"]


def test_an_rrule_window_slid_by_a_spring_gap_moves_as_the_time_it_names() -> None:
    """As a cron's (above), alone and in a union: the rule's Sunday 02:30,
    slid to 03:30 by Rome's change on 2026-03-29, is Monday's 02:30."""
    rule = "DTSTART:20260301T023000\nRRULE:FREQ=WEEKLY;BYDAY=SU"
    alone = schedule_from_columns(None, None, "Europe/Rome", rrule=rule, shift="next_business_day")
    union = schedule_from_columns(
        None, None, "Europe/Rome", schedules=[rule, "0 12 * * 1-5"], shift="next_business_day"
    )
    for moved in (alone, union):
        walls = [
            w.astimezone(ROME).strftime("%a %d %H:%M")
            for w in moved.windows(utc("2026-03-20 12:00"), utc("2026-04-07 00:00"))
            if w.astimezone(ROME).hour != 12
        ]
        assert walls == ["Mon 23 02:30", "Mon 30 02:30", "Mon 06 02:30"], moved
