"""Beat's own heartbeat (issue 33): its row in ``routine_beats``.

After each tick the beat hands the tick's duration (measured on the monotonic
clock) to :class:`BeatHeartbeat`, which keeps the most recent ones in memory
and, at most once every ``every`` seconds (``routines_refresh_seconds``, at
least ``HEARTBEAT_SECONDS``), writes the row in one statement
(``store/beats.py``: an upsert that also counts the claims this beat holds and
stamps the database's clock). Not every tick: an idle beat ticks every
``routines_refresh_seconds`` anyway, and a busy one ticks back to back, where
one more round trip per tick would be paid hundreds of times a minute for a
row nobody reads that often.

A failed write never reaches the tick: it is logged at WARNING once per
outage (and once at INFO when a write succeeds again), and tried again at the
next write's time.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Protocol

from celery_routines.clock import Clock
from celery_routines.config import Settings
from celery_routines.sending.offload import publishing_processes
from celery_routines.store.beats import BeatPulse, BeatQueries
from celery_routines.store.faults import cause_of, traceback_unless_unreachable

logger = logging.getLogger("celery_routines.beat")

# Tick durations the percentiles are taken over: the beat's last few minutes
# when busy, its last hour or so when idle (one tick every few seconds).
TICK_WINDOW = 1000
# The heartbeat is written at most this often, however short
# routines_refresh_seconds is: the panel's live view refreshes every 5 s, so
# a fresher row would be seen by nobody, and an idle tick stays its probe
# alone (one statement, issue 36) between two heartbeats.
HEARTBEAT_SECONDS = 5.0
# A beat is shown stale after this many of its longest gaps between two
# heartbeats: one late heartbeat (a slow tick, a pause for GC) is not a
# dead beat, three in a row are.
STALE_AFTER_GAPS = 3


def package_version() -> str:
    """The installed celery-routines version, as beat reports it."""
    try:
        return version("celery-routines")
    except PackageNotFoundError:  # run from a source tree without installing
        return "unknown"


class HeartbeatScheduler(Protocol):
    """What the heartbeat reads of its ``celery_routines.Scheduler`` (named
    here, not imported: the scheduler imports this module)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def max_interval(self) -> float: ...


def heartbeat_for(
    beats: BeatQueries, beat_id: str, clock: Clock, scheduler: HeartbeatScheduler
) -> BeatHeartbeat:
    """The heartbeat of a ``celery_routines.Scheduler``: written at most once
    every ``routines_refresh_seconds`` (the longest it sleeps, or less under a
    smaller ``max_interval``), and at most once every ``HEARTBEAT_SECONDS``."""
    settings = scheduler.settings
    refresh = float(settings.refresh_seconds)
    return BeatHeartbeat(
        beats,
        beat_id,
        clock,
        every=max(refresh, HEARTBEAT_SECONDS),
        longest_sleep=min(float(scheduler.max_interval), refresh),
        publish_processes=publishing_processes(settings),
        version=package_version(),
    )


def percentile(sorted_values: list[float], share: float) -> float:
    """The nearest-rank percentile of ``sorted_values`` (not empty)."""
    rank = min(max(math.ceil(share * len(sorted_values)), 1), len(sorted_values))
    return sorted_values[rank - 1]


class BeatHeartbeat:
    """The heartbeat of one beat process."""

    def __init__(
        self,
        beats: BeatQueries,
        beat_id: str,
        clock: Clock,
        *,
        every: float,
        longest_sleep: float,
        publish_processes: int,
        version: str,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.beats = beats
        self.beat_id = beat_id
        self.clock = clock
        self.every = every
        self.monotonic = monotonic
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.started_at: datetime = clock()
        self.publish_processes = publish_processes
        self.version = version
        # A live beat writes at least once per (longest sleep + every) plus
        # one tick: stale after a few of those.
        self.stale_after = STALE_AFTER_GAPS * (longest_sleep + every)
        self.durations: deque[float] = deque(maxlen=TICK_WINDOW)
        self.next_write: float | None = None  # the first tick writes at once
        self.failing = False

    def tick_finished(self, duration: float) -> bool:
        """Note a tick's duration (seconds); write the row when it is due.
        True when a row was written."""
        self.durations.append(duration)
        now = self.monotonic()
        if self.next_write is not None and now < self.next_write:
            return False
        self.next_write = now + self.every
        try:
            self.beats.beat(self.pulse(), self.clock())
        except Exception as exc:
            if not self.failing:
                self.failing = True
                logger.warning(
                    "could not write this beat's heartbeat (the panel will show it stale; "
                    "ticks go on): %s",
                    cause_of(exc),
                    exc_info=traceback_unless_unreachable(exc),
                )
            return False
        if self.failing:
            self.failing = False
            logger.info("this beat's heartbeat is written again")
        return True

    def stopped(self) -> None:
        """A beat that stops cleanly takes its row off the Beats page: stale
        means stopped without a word (killed, frozen, cut off), not this."""
        try:
            self.beats.forget(self.beat_id)
        except Exception as exc:
            logger.info("this beat's heartbeat row stays (shown stale within the hour): %s", exc)

    def pulse(self) -> BeatPulse:
        measured = sorted(self.durations)
        p50 = percentile(measured, 0.50) * 1000 if measured else None
        p99 = percentile(measured, 0.99) * 1000 if measured else None
        return BeatPulse(
            beat_id=self.beat_id,
            host=self.host,
            pid=self.pid,
            started_at=self.started_at,
            tick_p50_ms=p50,
            tick_p99_ms=p99,
            ticks_measured=len(measured),
            publish_processes=self.publish_processes,
            version=self.version,
            stale_after_seconds=self.stale_after,
        )
