"""Cron windows across DST transitions, as a table of hand-computed UTC instants.

Every expected value below was worked out by hand from the zone's offsets
(checked against zoneinfo when the table was written), not by calling the code
under test. Transitions used (all 2026 unless noted):

* Europe/Rome: spring 03-29 01:00Z (02:00 CET -> 03:00 CEST, +1 -> +2);
  autumn 10-25 01:00Z (03:00 CEST -> 02:00 CET).
* America/New_York: spring 03-08 07:00Z (02:00 EST -> 03:00 EDT, -5 -> -4);
  autumn 11-01 06:00Z (02:00 EDT -> 01:00 EST).
* Australia/Sydney (southern hemisphere): autumn 04-05 (03:00 AEDT -> 02:00
  AEST at 04-04 16:00Z, +11 -> +10); spring 10-04 (02:00 AEST -> 03:00 AEDT at
  10-03 16:00Z).
* Australia/Lord_Howe (30-minute shifts): autumn 04-05 (02:00 +11 -> 01:30
  +10:30 at 04-04 15:00Z); spring 10-04 (02:00 +10:30 -> 02:30 +11 at 10-03 15:30Z).
* America/Santiago: autumn 04-05 03:00Z (24:00 -03 -> 23:00 -04 on 04-04);
  spring 09-06 04:00Z (00:00 -04 -> 01:00 -03).
* America/Goose_Bay 2009-11-01 03:01Z: 00:01 ADT -> 23:01 AST the day BEFORE
  (the repeated hour straddles midnight).
* America/Nuuk 2024-03-31 01:00Z: 23:00 -02 -> 00:00 -01 (the gap ends at midnight).
* Pacific/Apia 2011-12-30 10:00Z: 12-29 24:00 -10 -> 12-31 00:00 +14 (a whole
  calendar day skipped).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from celery_routines.schedules.cron import CronSchedule


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# (id, expression, zone, after, until, expected windows in (after, until] as UTC)
CASES = [
    (
        "rome_spring_gap_0230_fires_0330",
        "30 2 * * *",
        "Europe/Rome",
        "2026-03-28 00:00",
        "2026-03-30 23:00",
        # 02:30 CET; 02:30 does not exist -> CET offset -> 01:30Z = 03:30 CEST; 02:30 CEST
        ["2026-03-28 01:30", "2026-03-29 01:30", "2026-03-30 00:30"],
    ),
    (
        "rome_autumn_0230_fires_once_cest",
        "30 2 * * *",
        "Europe/Rome",
        "2026-10-24 00:00",
        "2026-10-26 23:00",
        # 02:30 CEST; first of the two 02:30s (CEST) only; 02:30 CET
        ["2026-10-24 00:30", "2026-10-25 00:30", "2026-10-26 01:30"],
    ),
    (
        "rome_autumn_every_15_min_keeps_real_cadence",
        "*/15 * * * *",
        "Europe/Rome",
        "2026-10-24 23:30",
        "2026-10-25 02:00",
        # 01:45 CEST, then 02:00..02:45 CEST (00:00Z..00:45Z), then 02:00..02:45 CET
        # (01:00Z..01:45Z): 8 windows in the repeated hour, then 03:00 CET.
        [
            "2026-10-24 23:45",
            "2026-10-25 00:00",
            "2026-10-25 00:15",
            "2026-10-25 00:30",
            "2026-10-25 00:45",
            "2026-10-25 01:00",
            "2026-10-25 01:15",
            "2026-10-25 01:30",
            "2026-10-25 01:45",
            "2026-10-25 02:00",
        ],
    ),
    (
        "rome_spring_every_15_min_gap_has_nothing",
        "*/15 * * * *",
        "Europe/Rome",
        "2026-03-29 00:30",
        "2026-03-29 01:30",
        # 01:45 CET, then straight to 03:00 CEST: still one window per real quarter hour
        ["2026-03-29 00:45", "2026-03-29 01:00", "2026-03-29 01:15", "2026-03-29 01:30"],
    ),
    (
        "rome_hourly_spring",
        "0 * * * *",
        "Europe/Rome",
        "2026-03-28 23:30",
        "2026-03-29 02:00",
        # 01:00 CET, (02:00 does not exist), 03:00 CEST, 04:00 CEST
        ["2026-03-29 00:00", "2026-03-29 01:00", "2026-03-29 02:00"],
    ),
    (
        "rome_hourly_autumn",
        "0 * * * *",
        "Europe/Rome",
        "2026-10-24 23:30",
        "2026-10-25 02:00",
        # 02:00 CEST, 02:00 CET, 03:00 CET: every real hour
        ["2026-10-25 00:00", "2026-10-25 01:00", "2026-10-25 02:00"],
    ),
    (
        "rome_every_2_hours_spring_has_no_0200",
        "0 */2 * * *",
        "Europe/Rome",
        "2026-03-28 22:30",
        "2026-03-29 03:30",
        # 00:00 CET; 02:00 does not exist and a step hour is real-time; 04:00 CEST
        ["2026-03-28 23:00", "2026-03-29 02:00"],
    ),
    (
        "rome_every_2_hours_autumn_fires_0200_twice",
        "0 */2 * * *",
        "Europe/Rome",
        "2026-10-24 23:30",
        "2026-10-25 04:00",
        # 02:00 CEST, 02:00 CET, 04:00 CET
        ["2026-10-25 00:00", "2026-10-25 01:00", "2026-10-25 03:00"],
    ),
    (
        "rome_spring_dedup_0230_and_0330",
        "30 2,3 * * *",
        "Europe/Rome",
        "2026-03-28 12:00",
        "2026-03-29 12:00",
        # 02:30 shifts to 03:30 CEST, which is also the real 03:30: one window
        ["2026-03-29 01:30"],
    ),
    (
        "rome_spring_dedup_four_times_to_two",
        "0,30 2,3 * * *",
        "Europe/Rome",
        "2026-03-28 12:00",
        "2026-03-29 12:00",
        # 02:00 -> 03:00 CEST = real 03:00; 02:30 -> 03:30 CEST = real 03:30
        ["2026-03-29 01:00", "2026-03-29 01:30"],
    ),
    (
        "rome_fixed_hour_every_minute_spring_shifts_whole_hour",
        "*/20 2 * * *",
        "Europe/Rome",
        "2026-03-28 12:00",
        "2026-03-29 12:00",
        # 02:00, 02:20, 02:40 do not exist: each shifted by the gap to 03:xx CEST
        ["2026-03-29 01:00", "2026-03-29 01:20", "2026-03-29 01:40"],
    ),
    (
        "rome_fixed_hour_every_20_min_autumn_first_pass_only",
        "*/20 2 * * *",
        "Europe/Rome",
        "2026-10-24 12:00",
        "2026-10-25 12:00",
        ["2026-10-25 00:00", "2026-10-25 00:20", "2026-10-25 00:40"],
    ),
    (
        "weekly_cron_across_dst_sunday_0230",
        "30 2 * * 0",
        "Europe/Rome",
        "2026-03-21 00:00",
        "2026-04-06 00:00",
        # Sundays 03-22 (CET), 03-29 (the gap: 03:30 CEST), 04-05 (CEST)
        ["2026-03-22 01:30", "2026-03-29 01:30", "2026-04-05 00:30"],
    ),
    (
        "weekly_monday_0900_across_rome_spring",
        "0 9 * * 1",
        "Europe/Rome",
        "2026-03-20 00:00",
        "2026-04-07 00:00",
        ["2026-03-23 08:00", "2026-03-30 07:00", "2026-04-06 07:00"],
    ),
    (
        "new_york_spring",
        "30 2 * * *",
        "America/New_York",
        "2026-03-07 00:00",
        "2026-03-09 12:00",
        # 02:30 EST; 02:30 does not exist -> EST offset -> 07:30Z = 03:30 EDT; 02:30 EDT
        ["2026-03-07 07:30", "2026-03-08 07:30", "2026-03-09 06:30"],
    ),
    (
        "new_york_autumn",
        "30 1 * * *",
        "America/New_York",
        "2026-10-31 00:00",
        "2026-11-02 12:00",
        # 01:30 EDT; first 01:30 (EDT) only; 01:30 EST
        ["2026-10-31 05:30", "2026-11-01 05:30", "2026-11-02 06:30"],
    ),
    (
        "new_york_autumn_hourly_keeps_real_cadence",
        "30 * * * *",
        "America/New_York",
        "2026-11-01 04:45",
        "2026-11-01 07:45",
        # 01:30 EDT, 01:30 EST, 02:30 EST
        ["2026-11-01 05:30", "2026-11-01 06:30", "2026-11-01 07:30"],
    ),
    (
        "new_york_weekdays_9_and_17_across_spring",
        "0 9,17 * * 1-5",
        "America/New_York",
        "2026-03-06 00:00",
        "2026-03-10 00:00",
        # Friday 03-06 in EST, (weekend, DST starts Sunday), Monday 03-09 in EDT
        ["2026-03-06 14:00", "2026-03-06 22:00", "2026-03-09 13:00", "2026-03-09 21:00"],
    ),
    (
        "sydney_spring_october",
        "30 2 * * *",
        "Australia/Sydney",
        "2026-10-02 12:00",
        "2026-10-05 00:00",
        # 10-03 02:30 AEST; 10-04 02:30 does not exist -> +10 -> 03:30 AEDT; 10-05 02:30 AEDT
        ["2026-10-02 16:30", "2026-10-03 16:30", "2026-10-04 15:30"],
    ),
    (
        "sydney_autumn_april",
        "30 2 * * *",
        "Australia/Sydney",
        "2026-04-03 00:00",
        "2026-04-06 00:00",
        # 04-04 02:30 AEDT; 04-05 first 02:30 (AEDT); 04-06 02:30 AEST
        ["2026-04-03 15:30", "2026-04-04 15:30", "2026-04-05 16:30"],
    ),
    (
        "sydney_autumn_every_30_min_keeps_real_cadence",
        "*/30 * * * *",
        "Australia/Sydney",
        "2026-04-04 15:15",
        "2026-04-04 17:00",
        # 02:30 AEDT, 02:00 AEST, 02:30 AEST, 03:00 AEST
        ["2026-04-04 15:30", "2026-04-04 16:00", "2026-04-04 16:30", "2026-04-04 17:00"],
    ),
    (
        "lord_howe_30_min_gap",
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-02 12:00",
        "2026-10-05 00:00",
        # 10-03 02:15 +10:30; 10-04 02:15 does not exist -> +10:30 -> 02:45 +11;
        # 10-05 02:15 +11
        ["2026-10-02 15:45", "2026-10-03 15:45", "2026-10-04 15:15"],
    ),
    (
        "lord_howe_30_min_overlap",
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-03 00:00",
        "2026-04-06 00:00",
        # 04-04 01:45 +11; 04-05 first 01:45 (+11); 04-06 01:45 +10:30
        ["2026-04-03 14:45", "2026-04-04 14:45", "2026-04-05 15:15"],
    ),
    (
        "lord_howe_overlap_every_15_min",
        "*/15 * * * *",
        "Australia/Lord_Howe",
        "2026-04-04 14:20",
        "2026-04-04 15:30",
        # 01:30 +11, 01:45 +11, 01:30 +10:30, 01:45 +10:30, 02:00 +10:30
        [
            "2026-04-04 14:30",
            "2026-04-04 14:45",
            "2026-04-04 15:00",
            "2026-04-04 15:15",
            "2026-04-04 15:30",
        ],
    ),
    (
        "lord_howe_gap_every_15_min",
        "*/15 * * * *",
        "Australia/Lord_Howe",
        "2026-10-03 15:10",
        "2026-10-03 16:00",
        # 01:45 +10:30, then 02:30 +11 (02:00 and 02:15 do not exist), 02:45, 03:00
        ["2026-10-03 15:15", "2026-10-03 15:30", "2026-10-03 15:45", "2026-10-03 16:00"],
    ),
    (
        "santiago_midnight_gap",
        "0 0 * * *",
        "America/Santiago",
        "2026-09-04 00:00",
        "2026-09-08 00:00",
        # 00:00 -04 twice; 09-06 00:00 does not exist -> -04 -> 04:00Z = 01:00 -03; 00:00 -03
        ["2026-09-04 04:00", "2026-09-05 04:00", "2026-09-06 04:00", "2026-09-07 03:00"],
    ),
    (
        "santiago_autumn_repeated_2330",
        "30 23 * * *",
        "America/Santiago",
        "2026-04-03 12:00",
        "2026-04-07 00:00",
        # 04-03 23:30 -03; 04-04 first 23:30 (-03); 04-05 23:30 -04
        ["2026-04-04 02:30", "2026-04-05 02:30", "2026-04-06 03:30"],
    ),
    (
        "goose_bay_overlap_across_midnight_every_30_min",
        "*/30 * * * *",
        "America/Goose_Bay",
        "2009-11-01 01:45",
        "2009-11-01 04:45",
        # 23:00 ADT, 23:30 ADT, 00:00 ADT (11-01), 23:30 AST (10-31 again), 00:00 AST, 00:30
        [
            "2009-11-01 02:00",
            "2009-11-01 02:30",
            "2009-11-01 03:00",
            "2009-11-01 03:30",
            "2009-11-01 04:00",
            "2009-11-01 04:30",
        ],
    ),
    (
        "goose_bay_overlap_across_midnight_fixed_2330",
        "30 23 * * *",
        "America/Goose_Bay",
        "2009-10-30 00:00",
        "2009-11-03 00:00",
        # 10-31 23:30 happens twice: first (ADT, -3) only
        ["2009-10-30 02:30", "2009-10-31 02:30", "2009-11-01 02:30", "2009-11-02 03:30"],
    ),
    (
        "nuuk_gap_ending_at_midnight_moves_window_to_next_date",
        "30 23 * * *",
        "America/Nuuk",
        "2024-03-29 12:00",
        "2024-04-02 00:00",
        # 03-30 23:30 does not exist -> -02 -> 01:30Z = 00:30 -01 on 03-31
        ["2024-03-30 01:30", "2024-03-31 01:30", "2024-04-01 00:30"],
    ),
    (
        "apia_skipped_day_fires_once",
        "0 12 * * *",
        "Pacific/Apia",
        "2011-12-28 00:00",
        "2012-01-02 00:00",
        # 12-30 does not exist: its 12:00 (-10) lands on 12-31 12:00 +14, the same
        # instant as 12-31's own 12:00, so it fires once.
        [
            "2011-12-28 22:00",
            "2011-12-29 22:00",
            "2011-12-30 22:00",
            "2011-12-31 22:00",
            "2012-01-01 22:00",
        ],
    ),
]

# L, W, # and the @ aliases obey the same rules (issue 34): croniter only picks
# the calendar dates; the wall times of those dates go through cron.py.
# Asia/Jerusalem springs forward on a Friday (2026-03-27 02:00 -> 03:00, +2 ->
# +3 at 00:00Z) and Africa/Cairo on a Friday (2026-04-24 00:00 -> 01:00 at
# 04-23 22:00Z) and back on a Thursday (2026-10-29 24:00 +3 -> 23:00 +2 at
# 21:00Z), so a W day can land on a transition. 2027: Rome 03-28 / 10-31, New
# York 03-14 / 11-07, Lord_Howe 04-04 / 10-03, Santiago 04-03 (Sat 24:00 ->
# 23:00) / 09-05.
CALENDAR_CASES = [
    (
        "rome_last_sunday_0L_spring_gap_slides",
        "30 2 * * 0L",
        "Europe/Rome",
        "2026-03-01 00:00",
        "2026-04-30 00:00",
        # 03-29 (the gap: 03:30 CEST), 04-26 02:30 CEST
        ["2026-03-29 01:30", "2026-04-26 00:30"],
    ),
    (
        "rome_last_sunday_0L_autumn_fires_once",
        "30 2 * * 0L",
        "Europe/Rome",
        "2026-10-01 00:00",
        "2026-11-30 00:00",
        # 10-25 first 02:30 (CEST) only; 11-29 02:30 CET
        ["2026-10-25 00:30", "2026-11-29 01:30"],
    ),
    (
        "rome_last_sunday_7L_wildcard_hour_keeps_real_cadence",
        "0 * * * 7L",
        "Europe/Rome",
        "2026-10-24 23:30",
        "2026-10-25 02:00",
        # 02:00 CEST, 02:00 CET, 03:00 CET
        ["2026-10-25 00:00", "2026-10-25 01:00", "2026-10-25 02:00"],
    ),
    (
        "rome_fifth_sunday_hash_spring_gap",
        "30 2 * * 0#5",
        "Europe/Rome",
        "2026-03-01 00:00",
        "2026-06-01 00:00",
        # March 29 is the 5th Sunday (the gap); April has none; May 31 CEST
        ["2026-03-29 01:30", "2026-05-31 00:30"],
    ),
    (
        "rome_2027_last_day_L_is_the_autumn_sunday",
        "30 2 L * *",
        "Europe/Rome",
        "2027-10-01 00:00",
        "2027-11-30 12:00",
        # 10-31 first 02:30 (CEST); 11-30 02:30 CET
        ["2027-10-31 00:30", "2027-11-30 01:30"],
    ),
    (
        "new_york_first_sunday_hash_autumn_once",
        "30 1 * * 0#1",
        "America/New_York",
        "2026-10-01 00:00",
        "2026-12-31 00:00",
        # 10-04 01:30 EDT; 11-01 first 01:30 (EDT); 12-06 01:30 EST
        ["2026-10-04 05:30", "2026-11-01 05:30", "2026-12-06 06:30"],
    ),
    (
        "new_york_2027_second_sunday_hash_spring_gap",
        "30 2 * * 0#2",
        "America/New_York",
        "2027-03-01 00:00",
        "2027-04-30 00:00",
        # 03-14 02:30 does not exist -> EST offset -> 03:30 EDT; 04-11 02:30 EDT
        ["2027-03-14 07:30", "2027-04-11 06:30"],
    ),
    (
        "jerusalem_W_friday_spring_gap",
        "30 2 27W 3 *",
        "Asia/Jerusalem",
        "2026-03-01 00:00",
        "2026-03-31 00:00",
        # 27 is a Friday (itself); 02:30 does not exist -> +2 -> 03:30 +3
        ["2026-03-27 00:30"],
    ),
    (
        "cairo_W_friday_midnight_gap",
        "30 0 24W 4 *",
        "Africa/Cairo",
        "2026-04-01 00:00",
        "2026-05-01 00:00",
        # 24 is a Friday; 00:30 does not exist -> +2 -> 01:30 +3 (04-23 22:30Z)
        ["2026-04-23 22:30"],
    ),
    (
        "cairo_W_thursday_repeated_2330_once",
        "30 23 29W 10 *",
        "Africa/Cairo",
        "2026-10-01 00:00",
        "2026-11-01 00:00",
        # 29 is a Thursday; first 23:30 (+3) only
        ["2026-10-29 20:30"],
    ),
    (
        "cairo_W_thursday_wildcard_hour_twice",
        "30 * 29W 10 *",
        "Africa/Cairo",
        "2026-10-29 19:45",
        "2026-10-29 23:45",
        # 23:30 +3, 23:30 +2; 10-30 is not the W day
        ["2026-10-29 20:30", "2026-10-29 21:30"],
    ),
    (
        "lord_howe_2027_first_sunday_hash_30_min_gap",
        "15 2 * * 0#1",
        "Australia/Lord_Howe",
        "2027-09-01 00:00",
        "2027-11-30 00:00",
        # 09-05 02:15 +10:30; 10-03 02:15 does not exist -> 02:45 +11; 11-07 02:15 +11
        ["2027-09-04 15:45", "2027-10-02 15:45", "2027-11-06 15:15"],
    ),
    (
        "santiago_2027_first_saturday_hash_repeated_2330",
        "30 23 * * 6#1",
        "America/Santiago",
        "2027-03-01 00:00",
        "2027-05-31 00:00",
        # 03-06 23:30 -03; 04-03 first 23:30 (-03); 05-01 23:30 -04
        ["2027-03-07 02:30", "2027-04-04 02:30", "2027-05-02 03:30"],
    ),
    (
        "santiago_daily_alias_midnight_gap",
        "@daily",
        "America/Santiago",
        "2026-09-04 00:00",
        "2026-09-08 00:00",
        ["2026-09-04 04:00", "2026-09-05 04:00", "2026-09-06 04:00", "2026-09-07 03:00"],
    ),
    (
        "rome_hourly_alias_autumn_real_cadence",
        "@hourly",
        "Europe/Rome",
        "2026-10-24 23:30",
        "2026-10-25 02:00",
        ["2026-10-25 00:00", "2026-10-25 01:00", "2026-10-25 02:00"],
    ),
    (
        "kolkata_last_day_L",
        "0 9 L * *",
        "Asia/Kolkata",
        "2026-01-15 00:00",
        "2026-04-15 00:00",
        # +05:30 all year
        ["2026-01-31 03:30", "2026-02-28 03:30", "2026-03-31 03:30"],
    ),
]
CASES += CALENDAR_CASES


@pytest.mark.parametrize(
    ("expression", "zone", "after", "until", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_windows_across_dst(
    expression: str, zone: str, after: str, until: str, expected: list[str]
) -> None:
    schedule = CronSchedule(expression, zone)
    start, end = utc(after), utc(until)
    want = [utc(text) for text in expected]

    assert list(schedule.windows(start, end)) == want
    assert schedule.count_windows(start, end) == len(want)
    for n in range(1, len(want) + 2):
        assert schedule.last_windows(start, end, n) == want[-n:], n

    chained, cursor = [], start
    while (cursor := schedule.next_after(cursor)) <= end:
        chained.append(cursor)
    assert chained == want


def test_windows_are_aware_utc() -> None:
    schedule = CronSchedule("30 2 * * *", "Europe/Rome")
    window = schedule.next_after(utc("2026-03-28 12:00"))
    assert window.tzinfo is UTC
    assert window == utc("2026-03-29 01:30")


def test_non_utc_input_is_read_as_its_instant() -> None:
    schedule = CronSchedule("30 2 * * *", "Europe/Rome")
    rome = utc("2026-03-29 01:30").astimezone(ZoneInfo("Europe/Rome"))
    # 03:30 CEST is exactly the shifted window: next_after is strictly after it.
    assert schedule.next_after(rome - timedelta(seconds=1)) == utc("2026-03-29 01:30")
    assert schedule.next_after(rome) == utc("2026-03-30 00:30")


@pytest.mark.parametrize(
    ("after", "until", "minutes"),
    [
        # Local day 2026-03-29 in Rome: 00:00 CET (03-28 23:00Z) to 24:00 CEST (22:00Z).
        pytest.param("2026-03-28 22:59", "2026-03-29 21:59", 23 * 60, id="rome_spring_day_23h"),
        # Local day 2026-10-25: 00:00 CEST (10-24 22:00Z) to 24:00 CET (10-25 23:00Z).
        pytest.param("2026-10-24 21:59", "2026-10-25 22:59", 25 * 60, id="rome_autumn_day_25h"),
    ],
)
def test_every_minute_counts_real_minutes_of_a_dst_day(
    after: str, until: str, minutes: int
) -> None:
    schedule = CronSchedule("* * * * *", "Europe/Rome")
    assert schedule.count_windows(utc(after), utc(until)) == minutes
    assert len(list(schedule.windows(utc(after), utc(until)))) == minutes
