"""The pure parts of a routine's record: the strip's local days across DST
nights, the percentile picked from ranked neighbours, the period's bounds."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from celery_routines.policy.run_stats import check_days, percentile, strip_days


@pytest.mark.parametrize(
    ("zone", "now", "day", "start"),
    [
        # spring_forward: the 29th of March has 23 hours in Rome.
        ("Europe/Rome", datetime(2026, 3, 30, 12, tzinfo=UTC), date(2026, 3, 30),
         datetime(2026, 3, 29, 22, tzinfo=UTC)),
        ("Europe/Rome", datetime(2026, 3, 30, 12, tzinfo=UTC), date(2026, 3, 29),
         datetime(2026, 3, 28, 23, tzinfo=UTC)),
        # fall_back: the 1st of November has 25 hours in New York.
        ("America/New_York", datetime(2026, 11, 2, 12, tzinfo=UTC), date(2026, 11, 2),
         datetime(2026, 11, 2, 5, tzinfo=UTC)),
        ("America/New_York", datetime(2026, 11, 2, 12, tzinfo=UTC), date(2026, 11, 1),
         datetime(2026, 11, 1, 4, tzinfo=UTC)),
        # midnight_gap: Santiago springs forward at 00:00, the day starts at 01:00.
        ("America/Santiago", datetime(2026, 9, 7, 12, tzinfo=UTC), date(2026, 9, 6),
         datetime(2026, 9, 6, 4, tzinfo=UTC)),
    ],
)  # fmt: skip
def test_each_strip_day_starts_at_its_local_midnight(
    zone: str, now: datetime, day: date, start: datetime
) -> None:
    bounds = dict(strip_days(now, zone))
    assert bounds[day] == start


def test_the_strip_is_thirty_days_ending_today_plus_the_end_of_today() -> None:
    bounds = strip_days(datetime(2026, 11, 30, 23, 30, tzinfo=UTC), "Europe/Rome")
    # 23:30 UTC is already December 1st in Rome.
    assert len(bounds) == 31
    assert (bounds[0][0], bounds[-2][0], bounds[-1][0]) == (
        date(2026, 11, 2), date(2026, 12, 1), date(2026, 12, 2),
    )  # fmt: skip


def test_percentile_interpolates_like_percentile_cont() -> None:
    values = [10.0, 10.0, 20.0, 30.0, 40.0, 50.0]
    ranked = dict(enumerate(values))
    assert percentile(ranked, 6, 0.5) == 25.0
    assert percentile(ranked, 6, 0.95) == 47.5
    assert percentile({0: 3.0}, 1, 0.95) == 3.0
    assert percentile({}, 0, 0.5) is None
    with pytest.raises(ValueError, match="rank 2 or 3 of 6 was not read"):
        percentile({0: 1.0}, 6, 0.5)


@pytest.mark.parametrize(("raw", "days"), [(None, 7), ("", 7), ("1", 1), ("90", 90), (30, 30)])
def test_days_within_bounds(raw: str | int | None, days: int) -> None:
    assert check_days(raw, "r") == days
