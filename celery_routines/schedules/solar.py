"""Solar events (sunrise, dusk, ...) at a place, computed as Celery does.

The same events, horizons and library (``ephem``, the ``solar`` extra) as
``celery.schedules.solar``; windows are rounded to the whole second so every
beat derives the same instant and the same key. Pure: ``ephem`` computes, it
reads no clock. Stored as the text ``"<event> <lat> <lon>"`` in ``routines.solar``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from celery_routines.errors import ScheduleError
from celery_routines.schedules.base import walk_windows
from celery_routines.schedules.zones import aware_utc

__all__ = ["EVENTS", "SolarSchedule"]

# event -> (horizon, ephem method, use_center): celery.schedules.solar's tables.
EVENTS: dict[str, tuple[str, str, bool]] = {
    "dawn_astronomical": ("-18", "next_rising", True),
    "dawn_nautical": ("-12", "next_rising", True),
    "dawn_civil": ("-6", "next_rising", True),
    "sunrise": ("-0:34", "next_rising", False),
    "solar_noon": ("0", "next_transit", False),
    "sunset": ("-0:34", "next_setting", False),
    "dusk_civil": ("-6", "next_setting", True),
    "dusk_nautical": ("-12", "next_setting", True),
    "dusk_astronomical": ("-18", "next_setting", True),
}
# Celery's bound: an event that does not happen within a year (polar) is an error.
MAX_SEARCH_DAYS = 366
ONE_SECOND = timedelta(seconds=1)
# The search again from the event's hour finds the same event, milliseconds
# apart; a bigger gap (an event that does not happen every day, near a pole)
# keeps the first answer.
CANONICAL_AGREES = timedelta(seconds=60)


def _ephem() -> Any:
    try:
        import ephem
    except ImportError:
        raise ScheduleError(
            "solar schedules need the ephem library: pip install 'celery-routines[solar]'"
        ) from None
    return ephem


def _coordinate(label: str, value: object, limit: int) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScheduleError(f"solar {label} must be a number, got {value!r}")
    if not -limit <= value <= limit:
        raise ScheduleError(f"solar {label} must be from {-limit} to {limit}, got {value!r}")
    return float(value)


def _exact(value: float) -> str:
    """The shortest text that reads back as ``value`` ("9.19", "0")."""
    return str(int(value)) if value.is_integer() else repr(value)


@dataclass(frozen=True)
class SolarSchedule:
    event: str
    lat: float
    lon: float

    def __post_init__(self) -> None:
        if self.event not in EVENTS:
            raise ScheduleError(
                f"unknown solar event {self.event!r}: use one of {', '.join(sorted(EVENTS))}"
            )
        object.__setattr__(self, "lat", _coordinate("latitude", self.lat, 90))
        object.__setattr__(self, "lon", _coordinate("longitude", self.lon, 180))
        _ephem()

    @classmethod
    def from_spec(cls, spec: str) -> SolarSchedule:
        """From the stored text ``"sunrise 45.46 9.19"``."""
        parts = spec.split() if isinstance(spec, str) else []
        try:
            event, lat, lon = parts[0], float(parts[1]), float(parts[2])
        except (IndexError, ValueError):
            raise ScheduleError(
                f"solar must be '<event> <latitude> <longitude>', e.g. 'sunrise 45.46 9.19', "
                f"got {spec!r}"
            ) from None
        if len(parts) != 3:
            raise ScheduleError(f"solar must have exactly 3 parts, got {spec!r}")
        return cls(event, lat, lon)

    @property
    def spec(self) -> str:
        # Exact: ":g" kept six digits, moving a longitude of -123.4567 by
        # about 0.1 s of sunrise, enough to change the window's second.
        return f"{self.event} {_exact(self.lat)} {_exact(self.lon)}"

    def describe(self) -> str:
        return f"solar {self.event} at latitude {self.lat:g}, longitude {self.lon:g}"

    def _event_after(self, instant: datetime) -> datetime:
        """The event after ``instant``, to the whole second, the same from
        any ``instant`` before it: ephem's search lands a few milliseconds
        apart from different starts (2.9 ms over one morning), which rounds
        an event near half a second to two different seconds, two window
        keys. So the event found is searched again from a start that depends
        only on the event's hour (an hour before it), and that answer counts.
        """
        exact = self._search(instant)
        hour = exact.replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
        canonical = self._search(hour)
        if abs(canonical - exact) < CANONICAL_AGREES:
            exact = canonical
        return (exact + timedelta(microseconds=500_000)).replace(microsecond=0)

    def _search(self, instant: datetime) -> datetime:
        ephem = _ephem()
        horizon, method, use_center = EVENTS[self.event]
        observer = ephem.Observer()
        observer.lat, observer.lon = str(self.lat), str(self.lon)
        observer.elev, observer.pressure, observer.horizon = 0, 0, horizon
        sun = ephem.Sun()
        start = ephem.Date(instant.replace(tzinfo=None))
        kwargs = {"use_center": True} if use_center else {}
        for _ in range(MAX_SEARCH_DAYS):
            try:
                found = getattr(observer, method)(sun, start=start, **kwargs)
                break
            except ephem.CircumpolarError:
                start = observer.next_antitransit(sun, start=start)
        else:
            raise ScheduleError(
                f"{self.describe()} does not happen within {MAX_SEARCH_DAYS} days of "
                f"{instant.isoformat()}"
            )
        return found.datetime().replace(tzinfo=UTC)  # type: ignore[no-any-return]

    def next_after(self, instant: datetime) -> datetime:
        """The first event strictly after ``instant``, to the whole second."""
        instant = aware_utc(instant, "instant")
        start = instant
        while (window := self._event_after(start)) <= instant:
            start = window + ONE_SECOND  # rounded onto or before ``instant``
        return window

    def windows(self, after: datetime, until: datetime) -> Iterator[datetime]:
        return walk_windows(self, aware_utc(after, "after"), aware_utc(until, "until"))
