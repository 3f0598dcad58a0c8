"""Ceilings: period math in the routine's zone, the decisions, the reason text.

Pure: no database, no clock; every instant is an argument.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_routines.errors import ScheduleError
from celery_routines.policy.catch_up import FirePlan, SkippedWindows, plan_due
from celery_routines.policy.ceilings import (
    Ceiling,
    decide_after_run,
    decide_before_send,
    limit_plan,
    parse_ceilings,
    period_bounds,
    plan_suspended,
    suspension_reason,
)
from celery_routines.schedules.cron import CronSchedule
from celery_routines.schedules.interval import IntervalSchedule


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def at(text: str) -> datetime:
    """``"2026-03-29T12:00"`` read as UTC."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


ROME = "Europe/Rome"
NOW = utc(2026, 11, 30, 12, 0)  # a Monday afternoon in Rome (13:00 CET)


def cases(prefix: str, zone: str, table: str) -> list[tuple[str, str, str, str, str, str]]:
    """Rows of ``id per instant start end`` (UTC instants) for one zone."""
    rows = []
    for line in table.strip().splitlines():
        name, per, instant, start, end = line.split()
        rows.append((f"{prefix}_{name}", zone, per, instant, start, end))
    return rows


# Each instant, and the [start, end) of its period; all UTC.
PERIODS = [
    # Europe/Rome: CET +01, CEST +02; spring 2026-03-29 02:00 -> 03:00 (a 23-hour
    # day), autumn 2026-10-25 03:00 -> 02:00 (a 25-hour day).
    *cases(
        "rome",
        ROME,
        """
        day_spring_23h              day    2026-03-29T12:00  2026-03-28T23:00  2026-03-29T22:00
        day_autumn_25h              day    2026-10-25T12:00  2026-10-24T22:00  2026-10-25T23:00
        day_in_repeated_hour        day    2026-10-25T01:30  2026-10-24T22:00  2026-10-25T23:00
        day_ordinary                day    2026-11-30T12:00  2026-11-29T23:00  2026-11-30T23:00
        hour_before_gap             hour   2026-03-29T00:30  2026-03-29T00:00  2026-03-29T01:00
        hour_after_gap              hour   2026-03-29T01:30  2026-03-29T01:00  2026-03-29T02:00
        hour_repeated_first         hour   2026-10-25T00:30  2026-10-25T00:00  2026-10-25T01:00
        hour_repeated_second        hour   2026-10-25T01:30  2026-10-25T01:00  2026-10-25T02:00
        hour_at_its_start           hour   2026-10-25T01:00  2026-10-25T01:00  2026-10-25T02:00
        week_across_new_year        week   2027-01-01T12:00  2026-12-27T23:00  2027-01-03T23:00
        week_with_autumn_change     week   2026-10-22T12:00  2026-10-18T22:00  2026-10-25T23:00
        week_monday_midnight        week   2026-11-29T23:00  2026-11-29T23:00  2026-12-06T23:00
        week_sunday_last_minute     week   2026-11-29T22:59  2026-11-22T23:00  2026-11-29T23:00
        month_february_leap         month  2028-02-15T12:00  2028-01-31T23:00  2028-02-29T23:00
        month_leap_day              month  2028-02-29T22:59  2028-01-31T23:00  2028-02-29T23:00
        month_with_spring_change    month  2026-03-15T00:00  2026-02-28T23:00  2026-03-31T22:00
        month_november              month  2026-11-30T12:00  2026-10-31T23:00  2026-11-30T23:00
        month_december              month  2026-12-31T22:59  2026-11-30T23:00  2026-12-31T23:00
        """,
    ),
    # America/New_York: EST -05, EDT -04; spring 2026-03-08, autumn 2026-11-01.
    *cases(
        "new_york",
        "America/New_York",
        """
        day_spring_23h              day    2026-03-08T12:00  2026-03-08T05:00  2026-03-09T04:00
        day_autumn_25h              day    2026-11-01T12:00  2026-11-01T04:00  2026-11-02T05:00
        hour_repeated_first         hour   2026-11-01T05:30  2026-11-01T05:00  2026-11-01T06:00
        hour_repeated_second        hour   2026-11-01T06:30  2026-11-01T06:00  2026-11-01T07:00
        hour_after_gap              hour   2026-03-08T07:30  2026-03-08T07:00  2026-03-08T08:00
        """,
    ),
    # Australia/Lord_Howe: +10:30 standard, +11 summer, a 30-minute shift:
    # spring 2026-10-04 02:00 -> 02:30, autumn 2026-04-05 02:00 -> 01:30.
    *cases(
        "lord_howe",
        "Australia/Lord_Howe",
        """
        hour_before_spring_shift    hour   2026-10-03T15:10  2026-10-03T14:30  2026-10-03T15:30
        half_hour_after_spring      hour   2026-10-03T15:40  2026-10-03T15:30  2026-10-03T16:00
        hour_before_autumn_shift    hour   2026-04-04T14:30  2026-04-04T14:00  2026-04-04T15:00
        repeated_half_hour          hour   2026-04-04T15:10  2026-04-04T15:00  2026-04-04T15:30
        hour_after_autumn_shift     hour   2026-04-04T15:40  2026-04-04T15:30  2026-04-04T16:30
        day_spring_23h30            day    2026-10-04T00:00  2026-10-03T13:30  2026-10-04T13:00
        day_autumn_24h30            day    2026-04-05T00:00  2026-04-04T13:00  2026-04-05T13:30
        """,
    ),
    # Midnights that do not exist: DST starts at 00:00 and the clock reads 01:00.
    *cases(
        "santiago",
        "America/Santiago",
        """
        missing_midnight            day    2026-09-06T12:00  2026-09-06T04:00  2026-09-07T03:00
        day_before_it               day    2026-09-06T03:59  2026-09-05T04:00  2026-09-06T04:00
        week_from_it                week   2026-09-08T00:00  2026-09-07T03:00  2026-09-14T03:00
        repeated_hour_at_midnight   day    2026-04-05T03:30  2026-04-04T03:00  2026-04-05T04:00
        """,
    ),
    *cases(
        "beirut",
        "Asia/Beirut",
        """
        missing_midnight            day    2022-03-27T12:00  2022-03-26T22:00  2022-03-27T21:00
        """,
    ),
    # 2011-12-30 never happened in Samoa: an empty period between two days.
    *cases(
        "apia",
        "Pacific/Apia",
        """
        day_before_skipped_day      day    2011-12-29T12:00  2011-12-29T10:00  2011-12-30T10:00
        day_after_skipped_day       day    2011-12-30T10:00  2011-12-30T10:00  2011-12-31T10:00
        """,
    ),
    # A half-hour offset without DST: hours start at :30 UTC.
    *cases(
        "kolkata",
        "Asia/Kolkata",
        """
        hour                        hour   2026-11-30T12:00  2026-11-30T11:30  2026-11-30T12:30
        """,
    ),
    *cases(
        "utc",
        "UTC",
        """
        month                       month  2026-12-31T23:59  2026-12-01T00:00  2027-01-01T00:00
        """,
    ),
]


@pytest.mark.parametrize(
    ("zone", "per", "instant", "start", "end"),
    [(zone, per, at(instant), at(start), at(end)) for _, zone, per, instant, start, end in PERIODS],
    ids=[row[0] for row in PERIODS],
)
def test_period_bounds(
    zone: str, per: str, instant: datetime, start: datetime, end: datetime
) -> None:
    assert period_bounds(instant, per, zone) == (start, end)
    # Both ends are UTC instants, and the zone object works like its name.
    assert period_bounds(instant, per, ZoneInfo(zone)) == (start, end)
    assert period_bounds(instant, per, zone)[0].tzinfo is UTC


def test_the_dst_days_in_rome_are_23_and_25_hours_long() -> None:
    spring = period_bounds(utc(2026, 3, 29, 12), "day", ROME)
    autumn = period_bounds(utc(2026, 10, 25, 12), "day", ROME)
    assert spring[1] - spring[0] == timedelta(hours=23)
    assert autumn[1] - autumn[0] == timedelta(hours=25)


def test_an_aware_instant_in_another_zone_is_the_same_instant() -> None:
    instant = utc(2026, 10, 25, 1, 30).astimezone(ZoneInfo("Asia/Tokyo"))
    assert period_bounds(instant, "hour", ROME) == (utc(2026, 10, 25, 1), utc(2026, 10, 25, 2))


def test_period_bounds_refuses_naive_instants_unknown_periods_and_zones() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        period_bounds(datetime(2026, 11, 30, 12), "day", ROME)
    with pytest.raises(ScheduleError, match="'fortnight' is unknown"):
        period_bounds(NOW, "fortnight", ROME)
    with pytest.raises(ScheduleError, match="unknown timezone 'Mars/Olympus'"):
        period_bounds(NOW, "day", "Mars/Olympus")


ZONES = [
    ROME,
    "America/New_York",
    "Australia/Lord_Howe",
    "America/Santiago",
    "Asia/Kolkata",
    "Pacific/Apia",
    "UTC",
]


@settings(max_examples=300, deadline=None)
@given(
    seconds=st.integers(0, 3 * 366 * 24 * 3600),
    zone=st.sampled_from(ZONES),
    per=st.sampled_from(["hour", "day", "week", "month"]),
)
def test_periods_tile_time(seconds: int, zone: str, per: str) -> None:
    """Each instant is in exactly one period; periods are contiguous; an
    hour is never longer than a real hour; a period starts on its local edge."""
    instant = utc(2025, 1, 1) + timedelta(seconds=seconds, microseconds=seconds % 7)
    start, end = period_bounds(instant, per, zone)
    assert start <= instant < end
    assert period_bounds(start, per, zone) == (start, end)
    assert period_bounds(end, per, zone)[0] == end
    assert period_bounds(end - timedelta(microseconds=1), per, zone) == (start, end)
    local = start.astimezone(ZoneInfo(zone))
    if per == "hour":
        assert end - start <= timedelta(hours=1)
    else:
        # Midnight, or the first instant after a midnight the clock skipped.
        assert local.hour in (0, 1) and local.minute in (0, 30) and local.second == 0
        assert (local.hour, local.minute) == (0, 0) or _clock_jumped_at(start, zone)
        if per == "week":
            assert local.weekday() == 0 or _clock_jumped_at(start, zone)


def _clock_jumped_at(instant: datetime, zone: str) -> bool:
    tz = ZoneInfo(zone)
    before = (instant - timedelta(microseconds=1)).astimezone(tz).utcoffset()
    return before != instant.astimezone(tz).utcoffset()


# -- stored rows ---------------------------------------------------------------


def test_parse_ceilings_reads_the_stored_list() -> None:
    text = (
        '[{"limit": 100, "per": "day", "unit": "fires"},'
        ' {"limit": 2.5, "per": "month", "unit": "eur"}]'
    )
    assert parse_ceilings(text) == (Ceiling(100, "day"), Ceiling(2.5, "month", "eur"))


def test_parse_ceilings_defaults_and_a_single_object() -> None:
    assert parse_ceilings('{"limit": 5}') == (Ceiling(5, "day", "fires"),)
    assert parse_ceilings('[{"limit": 5, "per": "hour"}]') == (Ceiling(5, "hour"),)


@pytest.mark.parametrize("text", [None, "", "  ", "null", "[]"])
def test_parse_ceilings_empty(text: str | None) -> None:
    assert parse_ceilings(text) == ()


def test_parse_ceilings_round_trips_the_definition_column() -> None:
    ceilings = (Ceiling(100, per="day"), Ceiling(3, per="week", unit="emails"))
    from celery_routines.policy.routine import define

    column = define("tasks.poll", 300, ceiling=list(ceilings)).columns()["ceiling"]
    assert parse_ceilings(column) == ceilings


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{limit: 1}", r"ceiling is not valid JSON .*'\{limit: 1\}'"),
        ("42", "ceiling must be a JSON list .* got '42'"),
        ('["day"]', "each ceiling must be a JSON object .* got 'day'"),
        ('[{"limit": 1, "period": "day"}]', "unknown key\\(s\\) period; use limit, per and unit"),
        ('[{"per": "day"}]', "has no limit"),
        ('[{"limit": -1}]', "limit must be a positive number, got -1"),
        ('[{"limit": "100"}]', "limit must be a positive number, got '100'"),
        ('[{"limit": true}]', "limit must be a positive number, got True"),
        ('[{"limit": 1, "per": "year"}]', "ceiling period 'year' is unknown"),
        ('[{"limit": 1, "unit": ""}]', "unit must be a non-empty string"),
        ('[{"limit": 1}, {"limit": 2, "per": "hour"}]', "at most one ceiling per unit"),
    ],
)
def test_parse_ceilings_names_the_bad_value(text: str, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        parse_ceilings(text)


# -- the before-send check -----------------------------------------------------

FIRES_PER_DAY = Ceiling(100, per="day")
EUR_PER_MONTH = Ceiling(5, per="month", unit="eur")
MIDNIGHT_ROME = utc(2026, 11, 30, 23)  # 2026-12-01 00:00 CET


def test_no_ceiling_sends_everything() -> None:
    decision = decide_before_send((), {}, NOW, ROME, wanted=25)
    assert decision.send == 25 and not decision.suspend


def test_under_the_limit_sends_and_does_not_suspend() -> None:
    decision = decide_before_send([FIRES_PER_DAY], {"fires": 42}, NOW, ROME)
    assert decision.send == 1 and decision.suspension is None


def test_a_reached_limit_sends_nothing_and_suspends_until_the_next_period() -> None:
    decision = decide_before_send([FIRES_PER_DAY], {"fires": 100}, NOW, ROME)
    assert decision.send == 0 and decision.suspend
    suspension = decision.suspension
    assert suspension is not None
    assert suspension.ceiling == FIRES_PER_DAY
    assert suspension.used == 100
    assert suspension.until == MIDNIGHT_ROME
    assert suspension.reason == (
        "ceiling 100 fires/day reached (100 used); resumes 2026-12-01 00:00 CET (Europe/Rome)"
    )


def test_an_overspent_period_says_how_much_was_used() -> None:
    decision = decide_before_send([FIRES_PER_DAY], {"fires": 103}, NOW, ROME)
    assert decision.send == 0
    assert decision.suspension is not None
    assert decision.suspension.reason.startswith("ceiling 100 fires/day reached (103 used);")


def test_the_fires_left_cap_how_many_windows_go_out() -> None:
    decision = decide_before_send([FIRES_PER_DAY], {"fires": 98}, NOW, ROME, wanted=5)
    assert decision.send == 2
    # The two sends spend the last fires: suspended now, not on the next window.
    assert decision.suspension is not None
    assert decision.suspension.used == 100
    assert decision.suspension.until == MIDNIGHT_ROME


def test_the_last_fire_goes_out_and_suspends() -> None:
    decision = decide_before_send([FIRES_PER_DAY], {"fires": 99}, NOW, ROME)
    assert decision.send == 1
    assert decision.suspension is not None
    assert decision.suspension.reason == (
        "ceiling 100 fires/day reached (100 used); resumes 2026-12-01 00:00 CET (Europe/Rome)"
    )


def test_a_fractional_fire_limit_allows_the_send_that_starts_under_it() -> None:
    decision = decide_before_send([Ceiling(2.5, per="hour")], {"fires": 2}, NOW, ROME, wanted=3)
    assert decision.send == 1
    assert decision.suspension is not None
    assert decision.suspension.until == utc(2026, 11, 30, 13)


def test_in_flight_fires_are_counted_by_the_caller_so_nothing_more_goes_out() -> None:
    # 100 rows written this day, some still running: `used` counts them all.
    decision = decide_before_send([FIRES_PER_DAY], {"fires": 100, "eur": 0}, NOW, ROME)
    assert decision.send == 0


def test_a_reached_money_ceiling_stops_sends_though_fires_are_left() -> None:
    decision = decide_before_send(
        [FIRES_PER_DAY, EUR_PER_MONTH], {"fires": 3, "eur": 5.3}, NOW, ROME, wanted=2
    )
    assert decision.send == 0
    assert decision.suspension is not None
    assert decision.suspension.ceiling == EUR_PER_MONTH
    assert decision.suspension.reason == (
        "ceiling 5 eur/month reached (5.3 used); resumes 2026-12-01 00:00 CET (Europe/Rome)"
    )


def test_money_under_its_ceiling_does_not_limit_the_count() -> None:
    decision = decide_before_send([EUR_PER_MONTH], {"eur": 4.99}, NOW, ROME, wanted=3)
    assert decision.send == 3 and not decision.suspend


def test_amounts_reported_as_floats_reach_their_decimal_limit() -> None:
    used = sum([0.1] * 10)  # 0.9999999999999999
    decision = decide_before_send([Ceiling(1, per="day", unit="eur")], {"eur": used}, NOW, ROME)
    assert decision.send == 0


def test_several_exhausted_ceilings_suspend_until_the_last_one_resets() -> None:
    decision = decide_before_send(
        [
            Ceiling(10, per="hour"),
            Ceiling(1, per="week", unit="eur"),
            Ceiling(9, per="day", unit="sms"),
        ],
        {"fires": 10, "eur": 1, "sms": 9},
        NOW,
        ROME,
    )
    assert decision.suspension is not None
    assert decision.suspension.ceiling.unit == "eur"
    assert decision.suspension.until == utc(2026, 12, 6, 23)  # Monday 2026-12-07 00:00 CET


def test_wanted_must_be_a_count() -> None:
    with pytest.raises(ValueError, match="wanted must be a non-negative integer, got -1"):
        decide_before_send([FIRES_PER_DAY], {}, NOW, ROME, wanted=-1)


# -- the after-run check -------------------------------------------------------


def test_after_run_under_the_limit_does_nothing() -> None:
    assert decide_after_run([EUR_PER_MONTH], {"fires": 1, "eur": 4}, NOW, ROME) is None


def test_after_run_the_run_that_crosses_the_limit_suspends() -> None:
    suspension = decide_after_run([EUR_PER_MONTH], {"fires": 7, "eur": 5.12}, NOW, ROME)
    assert suspension is not None
    assert suspension.until == MIDNIGHT_ROME
    assert suspension.reason == (
        "ceiling 5 eur/month reached (5.12 used); resumes 2026-12-01 00:00 CET (Europe/Rome)"
    )


def test_after_run_a_period_that_already_ended_suspends_nothing() -> None:
    # Charged on Monday evening, finished after midnight: the new day has a fresh budget.
    suspension = decide_after_run(
        [FIRES_PER_DAY],
        {"fires": 100},
        MIDNIGHT_ROME + timedelta(minutes=5),
        ROME,
        charged_at=utc(2026, 11, 30, 22, 50),
    )
    assert suspension is None


def test_after_run_suspends_until_the_end_of_the_period_it_was_charged_to() -> None:
    # Charged on 2026-10-25, the 25-hour day, finished in its last hour.
    suspension = decide_after_run(
        [FIRES_PER_DAY],
        {"fires": 100},
        utc(2026, 10, 25, 22, 30),
        ROME,
        charged_at=utc(2026, 10, 25, 0, 30),
    )
    assert suspension is not None
    assert suspension.until == utc(2026, 10, 25, 23)
    assert suspension.reason == (
        "ceiling 100 fires/day reached (100 used); resumes 2026-10-26 00:00 CET (Europe/Rome)"
    )


# -- the reason text -----------------------------------------------------------


@pytest.mark.parametrize(
    ("ceiling", "used", "until", "zone", "reason"),
    [
        (
            FIRES_PER_DAY,
            100.0,
            MIDNIGHT_ROME,
            ROME,
            "ceiling 100 fires/day reached (100 used); resumes 2026-12-01 00:00 CET (Europe/Rome)",
        ),
        (
            Ceiling(10, per="hour"),
            10,
            utc(2026, 10, 3, 16),
            "Australia/Lord_Howe",
            "ceiling 10 fires/hour reached (10 used); "
            "resumes 2026-10-04 03:00 +11 (Australia/Lord_Howe)",
        ),
        (
            Ceiling(2.5, per="week", unit="eur"),
            0.1 + 0.2 + 2.3,
            utc(2026, 3, 29, 22),
            ROME,
            "ceiling 2.5 eur/week reached (2.6 used); resumes 2026-03-30 00:00 CEST (Europe/Rome)",
        ),
        (
            Ceiling(3, per="month"),
            3,
            utc(2026, 9, 6, 4),
            "America/Santiago",
            "ceiling 3 fires/month reached (3 used); "
            "resumes 2026-09-06 01:00 -03 (America/Santiago)",
        ),
    ],
    ids=["rome_day", "lord_howe_hour", "float_amounts", "santiago_missing_midnight"],
)
def test_suspension_reason(
    ceiling: Ceiling, used: float, until: datetime, zone: str, reason: str
) -> None:
    assert suspension_reason(ceiling, used, until, zone) == reason


# -- the windows of a suspension -----------------------------------------------


def test_a_suspension_skips_its_windows_in_one_summary_and_resumes_at_the_period_start() -> None:
    every_five = CronSchedule("*/5 * * * *", ROME)
    plan = plan_suspended(every_five, utc(2026, 11, 30, 12, 5), MIDNIGHT_ROME)
    assert plan.skipped is not None
    assert plan.skipped.reason == "ceiling"
    assert plan.skipped.count == 131  # 12:05 .. 22:55 UTC
    assert (plan.skipped.first, plan.skipped.last) == (
        utc(2026, 11, 30, 12, 5),
        utc(2026, 11, 30, 22, 55),
    )
    # The window at local midnight is the new period's first: it fires.
    assert plan.next_run_at == MIDNIGHT_ROME


def test_a_suspension_across_the_october_change_resumes_at_local_midnight() -> None:
    hourly = CronSchedule("0 * * * *", ROME)
    until = period_bounds(utc(2026, 10, 25, 0, 30), "day", ROME)[1]
    plan = plan_suspended(hourly, utc(2026, 10, 25, 0, 0), until)
    assert until == utc(2026, 10, 25, 23)
    assert plan.skipped is not None
    assert plan.skipped.count == 23  # 00:00 .. 22:00 UTC, the repeated hour included
    assert plan.next_run_at == until


def test_an_interval_keeps_its_grid_through_a_suspension() -> None:
    every_ten = IntervalSchedule(600)
    plan = plan_suspended(every_ten, utc(2026, 11, 30, 12, 0, 7), utc(2026, 11, 30, 13))
    assert plan.skipped is not None
    assert plan.skipped.count == 6
    assert plan.skipped.last == utc(2026, 11, 30, 12, 50, 7)
    assert plan.next_run_at == utc(2026, 11, 30, 13, 0, 7)


def test_a_long_suspension_is_counted_not_listed() -> None:
    every_minute = CronSchedule("* * * * *", ROME)
    plan = plan_suspended(every_minute, utc(2026, 1, 1), utc(2027, 1, 1))
    assert plan.skipped is not None
    assert plan.skipped.count == 365 * 24 * 60
    assert plan.next_run_at == utc(2027, 1, 1)


def test_a_window_at_or_after_the_end_is_not_skipped() -> None:
    every_five = CronSchedule("*/5 * * * *", ROME)
    plan = plan_suspended(every_five, MIDNIGHT_ROME, MIDNIGHT_ROME)
    assert plan.skipped is None and plan.next_run_at == MIDNIGHT_ROME


def test_a_suspended_plan_in_the_planners_shape() -> None:
    every_five = CronSchedule("*/5 * * * *", ROME)
    suspended = plan_suspended(every_five, utc(2026, 11, 30, 12, 5), MIDNIGHT_ROME)
    fire_plan = suspended.as_fire_plan()
    assert fire_plan.send == ()
    assert fire_plan.skipped == (suspended.skipped,)
    assert fire_plan.next_run_at == MIDNIGHT_ROME
    nothing = plan_suspended(every_five, MIDNIGHT_ROME, MIDNIGHT_ROME).as_fire_plan()
    assert nothing.skipped == () and nothing.next_run_at == MIDNIGHT_ROME


# -- cutting the catch-up plan ---------------------------------------------------

EVERY_FIVE = CronSchedule("*/5 * * * *", ROME)


def recovery(cap: int = 25) -> FirePlan:
    """Down since 11:40: five windows due at noon, the next at 12:05."""
    return plan_due(EVERY_FIVE, utc(2026, 11, 30, 11, 40), NOW, catch_up_cap=cap)


def test_a_plan_under_its_ceiling_is_unchanged() -> None:
    plan = recovery()
    decision = decide_before_send([FIRES_PER_DAY], {"fires": 10}, NOW, ROME, wanted=5)
    assert limit_plan(plan, decision, EVERY_FIVE) is plan


def test_the_budget_sends_the_oldest_windows_and_summarises_the_rest_until_midnight() -> None:
    plan = recovery()
    assert len(plan.send) == 5
    decision = decide_before_send([FIRES_PER_DAY], {"fires": 98}, NOW, ROME, wanted=5)
    limited = limit_plan(plan, decision, EVERY_FIVE)
    assert limited.send == (utc(2026, 11, 30, 11, 40), utc(2026, 11, 30, 11, 45))
    # 11:50, 11:55 and 12:00 held back, then 12:05 .. 22:55 inside the suspension.
    assert limited.skipped == (
        SkippedWindows("ceiling", 3 + 131, utc(2026, 11, 30, 11, 50), utc(2026, 11, 30, 22, 55)),
    )
    assert limited.next_run_at == MIDNIGHT_ROME


def test_the_fire_that_spends_the_last_of_the_budget_goes_out_and_the_rest_wait() -> None:
    plan = plan_due(EVERY_FIVE, NOW, NOW)
    decision = decide_before_send([FIRES_PER_DAY], {"fires": 99}, NOW, ROME, wanted=1)
    limited = limit_plan(plan, decision, EVERY_FIVE)
    assert limited.send == (NOW,)
    assert limited.skipped == (
        SkippedWindows("ceiling", 131, utc(2026, 11, 30, 12, 5), utc(2026, 11, 30, 22, 55)),
    )
    assert limited.next_run_at == MIDNIGHT_ROME


def test_a_spent_ceiling_sends_nothing_and_keeps_the_planners_own_skips_first() -> None:
    plan = recovery(cap=2)
    assert [s.reason for s in plan.skipped] == ["catch_up_cap"]
    decision = decide_before_send([EUR_PER_MONTH], {"eur": 7}, NOW, ROME, wanted=2)
    limited = limit_plan(plan, decision, EVERY_FIVE)
    assert limited.send == ()
    assert [s.reason for s in limited.skipped] == ["catch_up_cap", "ceiling"]
    assert limited.skipped[1].first == utc(2026, 11, 30, 11, 55)
    assert limited.skipped[1].count == 2 + 131
    assert limited.next_run_at == MIDNIGHT_ROME


def test_a_suspension_ending_before_the_next_window_skips_only_what_was_held() -> None:
    daily = CronSchedule("0 9 * * *", ROME)
    plan = plan_due(daily, utc(2026, 11, 30, 8), NOW)
    decision = decide_before_send([Ceiling(1, per="hour")], {"fires": 1}, NOW, ROME)
    limited = limit_plan(plan, decision, daily)
    assert limited.send == ()
    assert limited.skipped == (
        SkippedWindows("ceiling", 1, utc(2026, 11, 30, 8), utc(2026, 11, 30, 8)),
    )
    assert limited.next_run_at == plan.next_run_at == utc(2026, 12, 1, 8)


def test_a_decision_made_for_fewer_windows_is_refused() -> None:
    plan = recovery()
    decision = decide_before_send([FIRES_PER_DAY], {"fires": 0}, NOW, ROME, wanted=1)
    with pytest.raises(ValueError, match=r"decide with wanted=len\(plan\.send\)"):
        limit_plan(plan, decision, EVERY_FIVE)
