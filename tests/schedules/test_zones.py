"""Zone loading and the contract's wall-time rules (guarantee 4)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from celery_routines.errors import ScheduleError
from celery_routines.schedules.zones import (
    aware_utc,
    instants_of_wall_time,
    is_ambiguous,
    is_nonexistent,
    load_zone,
    local_to_utc_first,
    steady_offset,
)

ROME = load_zone("Europe/Rome")
LORD_HOWE = load_zone("Australia/Lord_Howe")


@pytest.mark.parametrize("name", ["Europe/Rome", "UTC", "America/Argentina/Buenos_Aires"])
def test_load_zone_accepts_iana_names(name: str) -> None:
    assert load_zone(name).key == name


@pytest.mark.parametrize(
    "name",
    [
        "Mars/Base",
        "",
        " Europe/Rome",
        "../etc/passwd",
        "Europe/../Europe/Rome",
        "/usr/share/zoneinfo/Europe/Rome",
        "Europe\\Rome",
        "Europe",  # a directory of the tz database, not a zone
        "Europe/Rome\x00",
    ],
)
def test_load_zone_refuses_unknown_or_malformed_names(name: str) -> None:
    with pytest.raises(ScheduleError) as raised:
        load_zone(name)
    assert str(raised.value) == (
        f"unknown timezone {name!r}: use an IANA name such as 'Europe/Rome' or 'UTC'"
    )


def test_load_zone_refuses_non_strings() -> None:
    with pytest.raises(ScheduleError, match="unknown timezone None"):
        load_zone(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("zone", "wall", "expected_utc"),
    [
        # Spring gap: same offset as before the gap (shift forward by the gap).
        pytest.param(ROME, datetime(2026, 3, 29, 2, 30), "2026-03-29 01:30", id="rome_gap"),
        pytest.param(ROME, datetime(2026, 3, 29, 2, 0), "2026-03-29 01:00", id="rome_gap_start"),
        pytest.param(
            LORD_HOWE, datetime(2026, 10, 4, 2, 15), "2026-10-03 15:45", id="lord_howe_30min_gap"
        ),
        # Repeated time: the first occurrence.
        pytest.param(ROME, datetime(2026, 10, 25, 2, 30), "2026-10-25 00:30", id="rome_overlap"),
        pytest.param(
            LORD_HOWE,
            datetime(2026, 4, 5, 1, 45),
            "2026-04-04 14:45",
            id="lord_howe_30min_overlap",
        ),
        # Ordinary times.
        pytest.param(ROME, datetime(2026, 3, 29, 3, 0), "2026-03-29 01:00", id="rome_after_gap"),
        pytest.param(ROME, datetime(2026, 7, 1, 12, 0), "2026-07-01 10:00", id="rome_summer"),
    ],
)
def test_local_to_utc_first(zone, wall: datetime, expected_utc: str) -> None:
    assert local_to_utc_first(wall, zone) == datetime.fromisoformat(expected_utc).replace(
        tzinfo=UTC
    )


def test_rome_gap_maps_to_0330_cest() -> None:
    instant = local_to_utc_first(datetime(2026, 3, 29, 2, 30), ROME)
    assert instant.astimezone(ROME).isoformat() == "2026-03-29T03:30:00+02:00"


def test_classification_of_wall_times() -> None:
    gap, overlap, plain = (
        datetime(2026, 3, 29, 2, 30),
        datetime(2026, 10, 25, 2, 30),
        datetime(2026, 10, 25, 3, 0),
    )
    assert is_nonexistent(gap, ROME) and not is_ambiguous(gap, ROME)
    assert is_ambiguous(overlap, ROME) and not is_nonexistent(overlap, ROME)
    assert not is_ambiguous(plain, ROME) and not is_nonexistent(plain, ROME)
    assert instants_of_wall_time(gap, ROME) == ()
    assert instants_of_wall_time(overlap, ROME) == (
        datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
        datetime(2026, 10, 25, 1, 30, tzinfo=UTC),
    )
    assert instants_of_wall_time(plain, ROME) == (datetime(2026, 10, 25, 2, 0, tzinfo=UTC),)


def test_wall_time_helpers_refuse_aware_input() -> None:
    with pytest.raises(ValueError, match="naive local wall time"):
        local_to_utc_first(datetime(2026, 1, 1, tzinfo=UTC), ROME)


def test_aware_utc_refuses_naive_and_converts_aware() -> None:
    with pytest.raises(ValueError, match="after must be a timezone-aware datetime"):
        aware_utc(datetime(2026, 1, 1), "after")
    rome_noon = datetime(2026, 7, 1, 12, 0, tzinfo=ROME)
    assert aware_utc(rome_noon) == datetime(2026, 7, 1, 10, 0, tzinfo=UTC)
    assert aware_utc(rome_noon).tzinfo is UTC


def test_steady_offset() -> None:
    day = datetime(2026, 7, 1)
    assert steady_offset(ROME, day, day + timedelta(days=1)) == timedelta(hours=2)
    spring = datetime(2026, 3, 29)
    assert steady_offset(ROME, spring, spring + timedelta(days=1)) is None
    autumn = datetime(2026, 10, 25)
    assert steady_offset(ROME, autumn, autumn + timedelta(days=1)) is None
    # The day before a transition is steady; the span touching it is not.
    assert steady_offset(ROME, spring - timedelta(days=1), spring) == timedelta(hours=1)
    assert steady_offset(ROME, spring - timedelta(days=1), spring + timedelta(hours=3)) is None
