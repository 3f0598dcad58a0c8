"""What deciding reads: a claimed routine as read and validated, the facts
read beside it, the rows it reads through Protocols (the store's records fit
them), and the answers a burst's routines share (held by the caller).

Pure, like the rest of :mod:`celery_routines.policy`: nothing here reads the
store, the broker or the clock, and the module keeps no state of its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Generic, Protocol, TypeVar

from celery_routines.policy.catch_up import FirePlan
from celery_routines.policy.routine import Routine
from celery_routines.policy.runs import OpenRunLike, lost_deadline
from celery_routines.schedules.base import Schedule
from celery_routines.schedules.jitter import jitter_offset, send_instant, window_of
from celery_routines.schedules.keys import window_key

IdFactory = Callable[[], str]


class ClaimedRowLike(Protocol):
    """What deciding reads of a claimed routine's stored row (the store's
    ``RoutineRecord``)."""

    @property
    def id(self) -> int: ...
    @property
    def next_run_at(self) -> datetime | None: ...
    @property
    def suspended_until(self) -> datetime | None: ...
    @property
    def last_error(self) -> str | None: ...


class OpenRunRowLike(OpenRunLike, Protocol):
    """An open run as deciding reads it: :class:`OpenRunLike` and its id
    (what ``overlap="replace"`` closes)."""

    @property
    def id(self) -> str: ...


class RunWindowLike(Protocol):
    """Which attempt of which window a stored run row is (the store's ``RunRecord``)."""

    @property
    def routine_id(self) -> int: ...
    @property
    def idempotency_key(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def scheduled_for(self) -> datetime: ...


class WrittenRunLike(RunWindowLike, Protocol):
    """A due window's row another beat already wrote, and its state."""

    @property
    def state(self) -> str: ...


# The claimed row's own type, handed back on the decision to the caller.
Row = TypeVar("Row", bound=ClaimedRowLike)


# The RFC 4122 variant digit of a version 4 UUID, from a random hex digit.
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


def random_id() -> str:
    """A random version 4 UUID, as ``str(uuid.uuid4())`` writes it: 122
    random bits from ``os.urandom``, like ``uuid4``, formatted directly
    (a burst draws one per run; ``uuid.UUID``'s checks cost four times this)."""
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"


# Answers one SharedAnswers keeps before it starts again (a miss only recomputes).
SHARED_ANSWERS = 4096


class SharedAnswers:
    """Answers shared by the thousands of routines of a burst, which differ
    mostly in their names: window keys, plans and run deadlines. Held by the
    caller (the tick engine keeps one for its life) and handed in, so this
    module keeps no state of its own; bounded, cleared when full. Only UTC
    instants are looked up: in another zone, two readings of a repeated hour
    compare (and hash) equal, an hour apart."""

    def __init__(self, most: int = SHARED_ANSWERS) -> None:
        self.most = most
        self._local_windows: dict[tuple[datetime, str], str] = {}
        self._plans: dict[tuple[object, ...], tuple[Schedule, FirePlan]] = {}
        self._deadlines: dict[tuple[datetime, timedelta, float], datetime] = {}

    def window_key(self, name: str, window: datetime, timezone: str) -> str:
        """:func:`window_key`, its ``@<window in timezone>`` part computed
        once per (window, zone)."""
        if window.tzinfo is not UTC:
            return window_key(name, window, timezone)
        local = self._local_windows.get((window, timezone))
        if local is None:
            local = window_key("", window, timezone)
            if len(self._local_windows) >= self.most:
                self._local_windows.clear()
            self._local_windows[(window, timezone)] = local
        return name + local

    def lost_deadline(self, now: datetime, offset: timedelta, run_timeout: float) -> datetime:
        """:func:`lost_deadline` on the database's clock, once per tick and
        timeout (the same for a burst's thousands of runs)."""
        if now.tzinfo is not UTC:
            return lost_deadline(now + offset, run_timeout)
        key = (now, offset, run_timeout)
        found = self._deadlines.get(key)
        if found is None:
            if len(self._deadlines) >= self.most:
                self._deadlines.clear()
            found = self._deadlines[key] = lost_deadline(now + offset, run_timeout)
        return found

    def plan(self, key: tuple[object, ...], schedule: Schedule) -> FirePlan | None:
        """The plan stored under ``key`` for ``schedule`` (the key holds the
        schedule by identity, checked here: the answer holds it, so its id
        cannot be reused meanwhile)."""
        found = self._plans.get(key)
        return found[1] if found is not None and found[0] is schedule else None

    def keep_plan(self, key: tuple[object, ...], schedule: Schedule, planned: FirePlan) -> None:
        if len(self._plans) >= self.most:
            self._plans.clear()
        self._plans[key] = (schedule, planned)


@dataclass(frozen=True)
class Claimed(Generic[Row]):
    """A routine this tick holds the claim on, as read and validated."""

    record: Row
    routine: Routine
    schedule: Schedule
    timezone: str
    """The routine's zone, or the configured default."""

    # Both are read several times per routine in a tick and computed once,
    # kept in the instance's __dict__ beside the fields (not compared or
    # shown). functools.cached_property takes a lock per read on Python 3.11:
    # it cost more than computing them.
    @property
    def due(self) -> datetime:
        """The due window (the stored ``next_run_at`` is its send instant)."""
        found: datetime | None = self.__dict__.get("_due")
        if found is None:
            assert self.record.next_run_at is not None  # claim_due returns scheduled rows only
            found = self.__dict__["_due"] = window_of(
                self.record.next_run_at, self.routine.name, self.routine.jitter
            )
        return found

    @property
    def offset(self) -> timedelta:
        """How long after its window each window goes out (``jitter``)."""
        found: timedelta | None = self.__dict__.get("_offset")
        if found is None:
            found = self.__dict__["_offset"] = jitter_offset(self.routine.name, self.routine.jitter)
        return found

    def send_at(self, window: datetime) -> datetime:
        """The send instant of ``window``: what ``next_run_at`` stores."""
        return send_instant(window, self.routine.name, self.routine.jitter)


@dataclass(frozen=True)
class Facts:
    """What the tick read for one routine besides its row."""

    used: Mapping[str, float] | None = None
    """Ceiling usage in the periods holding now; read when :func:`needs_usage`."""
    open_runs: Sequence[OpenRunRowLike] = ()
    """The routine's open runs; read when its plan sends anything."""
    offset: timedelta = timedelta(0)
    """The database's clock minus the beat's: run deadlines are written and
    compared on the database's clock (windows stay on the beat's)."""
