"""A one-off: one window at a fixed instant, then nothing (the routine is ``done``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from celery_routines.errors import ScheduleError
from celery_routines.schedules.base import NEVER
from celery_routines.schedules.zones import aware_utc, load_zone, local_to_utc_first

__all__ = ["OneOffSchedule", "parse_at"]


@dataclass(frozen=True)
class OneOffSchedule:
    """Fires once, at ``at`` (aware UTC)."""

    at: datetime

    def __post_init__(self) -> None:
        if not isinstance(self.at, datetime) or self.at.utcoffset() is None:
            raise ScheduleError(f"at must be a timezone-aware datetime, got {self.at!r}")
        at = aware_utc(self.at, "at")
        if at >= NEVER:
            raise ScheduleError(f"at must be before {NEVER.date()}, got {at.isoformat()}")
        object.__setattr__(self, "at", at)

    def describe(self) -> str:
        return f"once at {self.at.isoformat()}"

    def next_after(self, instant: datetime) -> datetime:
        return self.at if aware_utc(instant, "instant") < self.at else NEVER

    def first_window(self, now: datetime) -> datetime:
        # Adopted after its instant passed (beat was down, or the row came
        # late): it still fires once; max_lateness decides if too late.
        return self.at

    def first_from(self, start: datetime) -> datetime:
        return self.at if self.at >= aware_utc(start, "start") else NEVER

    def windows(self, after: datetime, until: datetime) -> Iterator[datetime]:
        if aware_utc(after, "after") < self.at <= aware_utc(until, "until"):
            yield self.at

    def count_windows(self, after: datetime, until: datetime) -> int:
        return sum(1 for _ in self.windows(after, until))

    def last_windows(self, after: datetime, until: datetime, n: int) -> list[datetime]:
        return list(self.windows(after, until)) if n > 0 else []


def parse_at(value: object, timezone: str | None, label: str = "at") -> datetime:
    """An instant (aware UTC) from a datetime or an ISO 8601 string.

    With an offset it is that instant; without one it is a wall time in
    ``timezone``, read by the contract's fixed-hour rule: a time in the spring
    gap fires at the same offset after the gap (02:30 -> 03:30 CEST), a
    repeated time fires at its first occurrence (02:30 CEST).
    """
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ScheduleError(
                f"{label} must be an ISO 8601 date and time such as 2026-12-24T18:00, got {value!r}"
            ) from None
    if not isinstance(value, datetime):
        raise ScheduleError(
            f"{label} must be a datetime or an ISO 8601 string, got {type(value).__name__} "
            f"{value!r}"
        )
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        if timezone is None:
            # The configured routines_timezone is not known where routines are
            # declared; guessing UTC would fire an hour or more off.
            raise ScheduleError(
                f"{label} {value.isoformat()} has no UTC offset and the routine no timezone: "
                f"give timezone='Europe/Rome' (an IANA name) or an offset ({value.isoformat()}Z)"
            )
        return local_to_utc_first(value.replace(tzinfo=None), load_zone(timezone))
    return aware_utc(value, label)
