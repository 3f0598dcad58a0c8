"""RFC 5545 recurrence rules (RedBeat's ``rrule``) through python-dateutil.

The rule's times are wall times in the routine's zone: ``DTSTART`` is given
without a zone (``DTSTART:20261201T090000``) and every occurrence becomes an
instant by the contract's fixed-hour rule (a time in a spring gap fires the
gap later, a repeated time fires at its first occurrence), like a fixed-hour
cron. A rule with ``COUNT`` or ``UNTIL`` ends: then ``next_after`` answers
:data:`NEVER` and the routine is ``done``. ``DTSTART`` is required: without
it dateutil anchors the rule on the moment it is read, and two beats (or one
beat twice) would disagree about the windows.

dateutil walks a rule from its ``DTSTART`` on every question: a daily rule that
started years ago steps thousands of days for each window. A schedule keeps
the newest occurrence it walked past as an anchor and asks the same rule
restarted there (an occurrence keeps the rule's phase: the weeks of an
``INTERVAL=2``, the hour and weekday ``DTSTART`` stood for). A rule with
``COUNT`` (the count runs from ``DTSTART``) is walked from the start, as is
any question about a time before the anchor.

A rule that never fires again does not end dateutil's walk: it steps day by
day to the year 9999 (``FREQ=SECONDLY;BYMONTH=2;BYMONTHDAY=30`` walks for
about 15 s). Every question is therefore bounded (``rrule_walk.py``): the walk
restarts in phase near the asked time, gives up :data:`HORIZON_YEARS` after
it, and lists at most :data:`MAX_WALKED` occurrences on the way.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery_routines.errors import ScheduleError
from celery_routines.schedules.base import NEVER, walk_windows
from celery_routines.schedules.zones import aware_utc, load_zone, local_to_utc_first

__all__ = ["RRuleSchedule", "looks_like_rrule"]

# A wall time is at most this far from its instant's wall time (a gap shift).
SHIFT_MARGIN = timedelta(hours=3)


def looks_like_rrule(text: str) -> bool:
    return "FREQ=" in text.upper()


@dataclass(frozen=True)
class RRuleSchedule:
    rule: str
    timezone: str
    _rule: Any = field(init=False, repr=False, compare=False)
    _can_anchor: bool = field(init=False, repr=False, compare=False, default=False)
    # (anchor, the rule restarted there): the newest occurrence walked past.
    _anchored: list[tuple[datetime, Any]] = field(
        init=False, repr=False, compare=False, default_factory=list
    )

    def __post_init__(self) -> None:
        from dateutil.rrule import rrule, rrulestr

        if not isinstance(self.rule, str) or "DTSTART" not in self.rule.upper():
            raise ScheduleError(
                f"rrule {self.rule!r} needs a DTSTART (e.g. 'DTSTART:20261201T090000"
                "\\nRRULE:FREQ=WEEKLY;BYDAY=MO'): without it the rule starts when it is read"
            )
        load_zone(self.timezone)
        try:
            parsed = rrulestr(self.rule.strip().replace("\\n", "\n"))
        except (ValueError, TypeError) as exc:
            raise ScheduleError(f"rrule {self.rule!r} is invalid: {exc}") from None
        if not isinstance(parsed, rrule):
            raise ScheduleError(
                f"rrule {self.rule!r} is a set (RDATE, EXDATE or several RRULE lines): "
                "write one RRULE, and exclude dates with the exclude option"
            )
        start = getattr(parsed, "_dtstart", None)
        if start is None or start.tzinfo is not None:
            raise ScheduleError(
                f"rrule {self.rule!r}: give DTSTART as a local time (no TZID, no Z); "
                "the routine's timezone reads it"
            )
        until = getattr(parsed, "_until", None)  # dateutil's own; no public accessor
        if until is not None and until.replace(tzinfo=None) < start:
            # Refused without a walk: dateutil would search minute by minute
            # for an occurrence that cannot come.
            raise ScheduleError(
                f"rrule {self.rule!r} has no window: its UNTIL {until:%Y-%m-%d %H:%M:%S} is "
                f"before its DTSTART {start:%Y-%m-%d %H:%M:%S}, so it never fires"
            )
        object.__setattr__(self, "_rule", parsed)
        # A COUNT runs from DTSTART: such a rule is never restarted.
        counted = getattr(parsed, "_count", None)  # dateutil's own; no public accessor
        object.__setattr__(self, "_can_anchor", not counted)
        # A rule with no window after its start is refused where it is
        # written (every door builds the schedule), not found out by beat.
        # (DTSTART itself is walked past: a rule whose only occurrence is
        # DTSTART is simply done.)
        next(self._occurrences_after(start), None)

    def describe(self) -> str:
        return f"rrule {' '.join(self.rule.split())!r} in {self.timezone}"

    def next_after(self, instant: datetime) -> datetime:
        instant = aware_utc(instant, "instant")
        zone = load_zone(self.timezone)
        wall = instant.astimezone(zone).replace(tzinfo=None) - SHIFT_MARGIN
        for occurrence in self._occurrences_after(wall):
            candidate = local_to_utc_first(occurrence, zone)
            if candidate > instant:
                return candidate
        return NEVER

    def nominal_walls(self, instant: datetime) -> tuple[datetime, ...]:
        """The rule's local wall times (naive) whose window is ``instant``:
        its own, or one a spring gap slid to it (an 02:30 occurrence fires
        at 03:30 on the night of the change). A business-day shift moves
        these, not the slid time (``calendar.py``)."""
        instant = aware_utc(instant, "instant")
        zone = load_zone(self.timezone)
        wall = instant.astimezone(zone).replace(tzinfo=None)
        found = []
        # A gap slides a time later, never earlier: what names ``instant``
        # is at its wall time or up to a gap before it.
        for occurrence in self._occurrences_after(wall - SHIFT_MARGIN):
            if occurrence > wall:
                break
            if local_to_utc_first(occurrence, zone) == instant:
                found.append(occurrence)
        return tuple(found)

    def _occurrences_after(self, wall: datetime) -> Iterator[datetime]:
        """The rule's wall times after ``wall``, in order, walked from the
        anchor when it is at or before ``wall``."""
        # Imported here: dateutil is loaded only by a process that has an
        # rrule routine (tests/test_imports.py pins a plain beat without it).
        from celery_routines.schedules.rrule_walk import bounded_walk, restarted_near

        rule = self._rule
        anchored = self._anchored[-1] if self._anchored else None
        if anchored is not None and anchored[0] <= wall:
            rule = anchored[1]
        can_anchor = self._can_anchor
        if can_anchor:
            rule = restarted_near(rule, wall)
        passed: datetime | None = None
        for occurrence in bounded_walk(rule, wall, self.rule):
            if occurrence <= wall:
                passed = occurrence
                continue
            if can_anchor and passed is not None and (anchored is None or passed > anchored[0]):
                # One entry, replaced whole: a reader in another thread sees
                # the old anchor or the new one, each an occurrence.
                self._anchored[:] = [(passed, self._rule.replace(dtstart=passed))]
                can_anchor = False
            yield occurrence

    def windows(self, after: datetime, until: datetime) -> Iterator[datetime]:
        return walk_windows(self, aware_utc(after, "after"), aware_utc(until, "until"))
