"""Spend ceilings: how much a routine may spend per period.

Enforcement (the before-send and after-run checks, suspension) is not built
yet; see the README's "Not yet" section.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .errors import ScheduleError

PERIODS = ("hour", "day", "week", "month")
UNIT_MAX_LENGTH = 32


@dataclass(frozen=True)
class Ceiling:
    """At most ``limit`` of ``unit`` per ``per`` (hour, day, ISO week, calendar month)."""

    limit: float
    per: str = "day"
    unit: str = "fires"

    def __post_init__(self) -> None:
        limit = self.limit
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int | float)
            or not math.isfinite(limit)
            or limit <= 0
        ):
            raise ScheduleError(f"ceiling limit must be a positive number, got {limit!r}")
        if self.per not in PERIODS:
            raise ScheduleError(
                f"ceiling period {self.per!r} is unknown; use one of {', '.join(PERIODS)}"
            )
        if not isinstance(self.unit, str) or not self.unit or len(self.unit) > UNIT_MAX_LENGTH:
            raise ScheduleError(
                f"ceiling unit must be a non-empty string of at most {UNIT_MAX_LENGTH} "
                f"characters, got {self.unit!r}"
            )

    def as_json(self) -> dict[str, Any]:
        return {"limit": self.limit, "per": self.per, "unit": self.unit}
