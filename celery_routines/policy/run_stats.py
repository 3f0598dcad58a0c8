"""A routine's record (issue 33, item 5), as pure functions: the days of its
strip in its own zone, the percentiles picked from a sorted set, and the
summary built from the grouped rows the store's one query returns.

No I/O and no clock: the caller passes ``now`` and the rows. The store
(:mod:`celery_routines.store.routine_stats`) asks the database for counts
grouped by state and reason over the period, counts grouped by state per day
of the strip, and the percentiles (PostgreSQL's ``percentile_cont``, or the
rows at the percentile's two neighbouring ranks elsewhere, interpolated here
the same way ``percentile_cont`` does).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from .states import Reason, RunState

MIN_DAYS, MAX_DAYS, DEFAULT_DAYS = 1, 90, 7
STRIP_DAYS = 30
PERCENTILES = (0.5, 0.95)
# Skips that are a catch-up policy declining windows missed while beat was away.
CATCH_UP_REASONS = (Reason.CATCH_UP_CAP.value, Reason.LATEST.value, Reason.SKIP_TO_NEXT.value)
# Skips of a window that came too late to run (max_lateness, a message's expires).
LATE_REASONS = (Reason.LATE.value, Reason.EXPIRED.value)
# States a finished run ends in; success rate is over windows that ended.
ENDED_STATES = (RunState.SUCCEEDED.value, RunState.FAILED.value, RunState.LOST.value)


def check_days(raw: str | int | None, routine: str) -> int:
    """The ``days`` of a stats request, 1..90 (7 when not given); a bad value
    is a ``ValueError`` naming the routine and the value."""
    if raw is None or raw == "":
        return DEFAULT_DAYS
    try:
        days = int(raw)
    except (TypeError, ValueError):
        raise ValueError(
            f"stats of {routine!r}: days must be a whole number from {MIN_DAYS} to {MAX_DAYS}, "
            f"got {raw!r}"
        ) from None
    if not MIN_DAYS <= days <= MAX_DAYS:
        raise ValueError(
            f"stats of {routine!r}: days must be from {MIN_DAYS} to {MAX_DAYS}, got {days}"
        )
    return days


def strip_days(now: datetime, zone: str, days: int = STRIP_DAYS) -> list[tuple[date, datetime]]:
    """The last ``days`` local dates in ``zone`` (today last) with the UTC
    instant each begins, plus the start of tomorrow: ``days + 1`` entries.

    Each local midnight is converted on its own, so a day of 23 or 25 hours
    (a DST night) is as long as it is; a midnight that does not exist (zones
    that jump at 00:00) begins the day at the first instant after the gap.
    """
    tz = ZoneInfo(zone)
    today = now.astimezone(tz).date()
    first = today - timedelta(days=days - 1)
    bounds = []
    for offset in range(days + 1):
        day = first + timedelta(days=offset)
        bounds.append((day, _day_start(day, tz)))
    return bounds


def _day_start(day: date, tz: ZoneInfo) -> datetime:
    local = datetime.combine(day, time(0), tzinfo=tz)
    instant = local.astimezone(UTC)
    # A midnight inside a gap reads back as another wall time: the day
    # starts when the clock resumes, one gap later.
    if instant.astimezone(tz).replace(tzinfo=None) != local.replace(tzinfo=None):
        instant = datetime.combine(day, time(1), tzinfo=tz).astimezone(UTC)
    return instant


def percentile(ranked: Mapping[int, float], count: int, fraction: float) -> float | None:
    """``percentile_cont(fraction)`` of ``count`` sorted values, from the
    values at the ranks around ``fraction * (count - 1)`` (0-based):
    linear interpolation between the two neighbours, as PostgreSQL does."""
    if count == 0:
        return None
    position = fraction * (count - 1)
    low, high = math.floor(position), math.ceil(position)
    if low not in ranked or high not in ranked:
        raise ValueError(f"rank {low} or {high} of {count} was not read")
    return ranked[low] + (ranked[high] - ranked[low]) * (position - low)


@dataclass(frozen=True)
class Spread:
    """p50 and p95 of some seconds (None: nothing measured)."""

    p50: float | None = None
    p95: float | None = None
    count: int = 0


@dataclass(frozen=True)
class StateCount:
    """Runs grouped by state and reason over the period: ``runs`` rows, the
    ``windows`` they stand for (a skip row may summarise several), the
    ``ended`` ones (no later attempt of their window), and retries."""

    state: str
    reason: str | None
    runs: int
    windows: int
    ended: int
    retry_attempts: int
    celery_retries: int


@dataclass(frozen=True)
class StripDay:
    day: date
    counts: dict[str, int]
    """Runs written that day by state (skips counted in windows)."""

    @property
    def words(self) -> str:
        """The day as text (the strip is never colour only)."""
        if not self.counts:
            return f"{self.day.isoformat()}: no runs"
        parts = ", ".join(f"{n} {state}" for state, n in sorted(self.counts.items()))
        return f"{self.day.isoformat()}: {parts}"


@dataclass(frozen=True)
class RoutineStats:
    routine: str
    timezone: str
    days: int
    since: datetime
    until: datetime
    counts: dict[str, int]
    """Run rows by state over the period (skips: rows, see ``skipped_windows``)."""
    success_rate: float | None
    """Windows that ended in success over windows that ended (a failed
    attempt followed by a retry has not ended); None: none ended."""
    ended: int
    duration: Spread
    """finished_at - started_at of the runs that finished after starting."""
    send_lateness: Spread
    """sent_at - window of each scheduled window's first attempt."""
    start_lateness: Spread
    """started_at - window of each scheduled window's first attempt."""
    retry_attempts: int
    """Attempts after the first (beat's retries, each its own run row)."""
    celery_retries: int
    """Redeliveries by Celery's own ``self.retry()`` inside runs."""
    skipped_windows: int
    skips_by_reason: dict[str, int]
    """Windows skipped, by reason."""
    dropped_by_catch_up: int
    """Windows missed while beat was away that catch-up did not run."""
    missed_late: int
    """Windows skipped as too late to run (max_lateness, expired)."""
    strip: list[StripDay] = field(default_factory=list)
    """The last 30 days in the routine's zone, oldest first."""


def summarise(
    routine: str,
    zone: str,
    days: int,
    since: datetime,
    until: datetime,
    groups: Iterable[StateCount],
    spreads: Mapping[str, Spread],
    strip_dates: list[date],
    strip_counts: Iterable[tuple[int, str, int]],
) -> RoutineStats:
    """The record from the grouped rows: ``groups`` over the period,
    ``spreads`` by name (``duration``, ``send_lateness``, ``start_lateness``),
    ``strip_counts`` as (day index, state, count)."""
    counts: dict[str, int] = {}
    skips: dict[str, int] = {}
    succeeded = ended = retry_attempts = celery_retries = 0
    for group in groups:
        counts[group.state] = counts.get(group.state, 0) + group.runs
        retry_attempts += group.retry_attempts
        celery_retries += group.celery_retries
        if group.state == RunState.SKIPPED:
            reason = group.reason or "unknown"
            skips[reason] = skips.get(reason, 0) + group.windows
        if group.state in ENDED_STATES:
            ended += group.ended
            if group.state == RunState.SUCCEEDED:
                succeeded += group.ended
    per_day: list[dict[str, int]] = [{} for _ in strip_dates]
    for index, state, count in strip_counts:
        if 0 <= index < len(per_day):
            per_day[index][state] = per_day[index].get(state, 0) + count
    return RoutineStats(
        routine=routine,
        timezone=zone,
        days=days,
        since=since,
        until=until,
        counts=dict(sorted(counts.items())),
        success_rate=succeeded / ended if ended else None,
        ended=ended,
        duration=spreads.get("duration", Spread()),
        send_lateness=spreads.get("send_lateness", Spread()),
        start_lateness=spreads.get("start_lateness", Spread()),
        retry_attempts=retry_attempts,
        celery_retries=celery_retries,
        skipped_windows=sum(skips.values()),
        skips_by_reason=dict(sorted(skips.items())),
        dropped_by_catch_up=sum(skips.get(r, 0) for r in CATCH_UP_REASONS),
        missed_late=sum(skips.get(r, 0) for r in LATE_REASONS),
        strip=[StripDay(day, counts) for day, counts in zip(strip_dates, per_day, strict=True)],
    )
