"""Sentry Crons for routines: the check-ins Celery beat's runs get, from our beat.

``sentry_sdk.init(..., integrations=[CeleryIntegration(monitor_beat_tasks=True)])``
makes Sentry patch ``celery.beat.Scheduler.apply_entry`` (and RedBeat's
``apply_async``): before each entry is sent it captures an ``in_progress``
check-in and adds the ``sentry-monitor-slug``, ``sentry-monitor-config`` and
``sentry-monitor-check-in-id`` headers; the worker's ``task_success`` /
``task_failure`` / ``task_retry`` handlers read them back and send ``ok`` or
``error`` under the same check-in id. Our tick never calls ``apply_entry``, so
:class:`CronsPublisher` does the beat half for every run beat (or the
operator's backfill, replay, trigger) sends; the worker half is Sentry's own,
unchanged.

Beyond Sentry's own beat support, the monitor config comes from the routine's
definition: a cron and the routine's zone (not the app's), ``checkin_margin``
from ``max_lateness`` and ``max_runtime`` from the run timeout. Schedules
Sentry cannot express (solar, one-off, RFC 5545 rules, jitter, intervals that
are not whole minutes) still send their check-ins, without a config: Sentry
then needs the monitor made by hand, with the slug the routine's name.

Nothing here imports ``sentry_sdk`` unless the application already did: the
publishers are wrapped only when ``"sentry_sdk" in sys.modules``
(``sending/offload.monitored``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final, Literal

from celery_routines.config import Settings
from celery_routines.policy.routine import Routine
from celery_routines.sending.publish import (
    OutgoingRun,
    PendingErrors,
    Publisher,
)

if TYPE_CHECKING:  # Sentry's own shapes of a check-in's monitor config
    from sentry_sdk._types import MonitorConfig, MonitorConfigSchedule
    from sentry_sdk.integrations.celery import CeleryIntegration

logger = logging.getLogger("celery_routines.sentry")

SLUG_HEADER = "sentry-monitor-slug"
CONFIG_HEADER = "sentry-monitor-config"
CHECK_IN_HEADER = "sentry-monitor-check-in-id"
START_HEADER = "sentry-monitor-start-timestamp-s"
# Sentry's interval units, largest first (as its beat integration picks them).
_INTERVAL_UNITS: Final[tuple[tuple[Literal["day", "hour", "minute"], int], ...]] = (
    ("day", 86400),
    ("hour", 3600),
    ("minute", 60),
)


def schedule_of(routine: Routine) -> MonitorConfigSchedule | None:
    """Sentry's ``schedule`` for a routine, or None when Sentry cannot express it."""
    if routine.jitter:
        return None  # each window goes out up to a day after it: no fixed cadence
    if routine.cron is not None and len(routine.cron.split()) == 5:
        return {"type": "crontab", "value": routine.cron}
    seconds = routine.interval_seconds
    if seconds is not None and routine.at is None:
        for unit, size in _INTERVAL_UNITS:
            if seconds >= size and seconds % size == 0:
                return {"type": "interval", "value": int(seconds // size), "unit": unit}
    return None


def monitor_config(routine: Routine, default_zone: str, run_timeout: float) -> MonitorConfig:
    """The monitor config sent with each check-in; ``{}`` for a schedule
    Sentry cannot express (its check-ins then go without one)."""
    schedule = schedule_of(routine)
    if schedule is None:
        return {}
    config: MonitorConfig = {
        "schedule": schedule,
        "timezone": routine.timezone or default_zone,
        # Sentry counts both in whole minutes.
        "max_runtime": max(1, math.ceil((routine.run_timeout or run_timeout) / 60)),
    }
    if routine.max_lateness is not None:
        config["checkin_margin"] = max(1, math.ceil(routine.max_lateness / 60))
    return config


def _integration() -> CeleryIntegration | None:
    """The active client's CeleryIntegration when it monitors beat tasks, else None."""
    import sentry_sdk
    from sentry_sdk.integrations.celery import CeleryIntegration

    integration = sentry_sdk.get_client().get_integration(CeleryIntegration)
    if integration is None or not integration.monitor_beat_tasks:
        return None
    return integration


def _excluded(integration: CeleryIntegration, name: str) -> bool:
    from sentry_sdk.utils import match_regex_list

    return bool(match_regex_list(name, integration.exclude_beat_tasks))


def check_in_headers(slug: str, config: MonitorConfig) -> dict[str, Any]:
    """Capture the ``in_progress`` check-in of one run; the headers that let the
    worker's Sentry handlers close it (what Sentry's beat patch adds)."""
    from sentry_sdk.crons import MonitorStatus, capture_checkin
    from sentry_sdk.integrations.celery.utils import _now_seconds_since_epoch

    check_in_id = capture_checkin(
        monitor_slug=slug, monitor_config=config or None, status=MonitorStatus.IN_PROGRESS
    )
    headers = {SLUG_HEADER: slug, CONFIG_HEADER: config, CHECK_IN_HEADER: check_in_id}
    # Sentry's send_task patch adds the start instant; the direct path does not
    # go through send_task, so it is set here (the worker measures the duration).
    headers[START_HEADER] = f"{_now_seconds_since_epoch():.9f}"
    # The worker reads them from the request's nested "headers" (celery/celery#4875),
    # where Sentry's send_task patch copies them too.
    return {**headers, "headers": dict(headers)}


class CronsPublisher(Publisher):
    """A publisher that gives every run the in-progress check-in and headers of
    Sentry Crons before the publisher it wraps sends it (in beat's own
    process, also when publishing processes send the message)."""

    def __init__(self, inner: Publisher, settings: Settings) -> None:
        self.inner = inner
        self.settings = settings
        self.app = getattr(inner, "app", None)  # the tick revokes through it
        self._said_unexpressed: set[str] = set()

    @property
    def in_background(self) -> bool:
        return self.inner.in_background

    def publish(self, run: OutgoingRun) -> None:
        self.inner.publish(self._all_monitored([run])[0])

    def publish_many(self, runs: Sequence[OutgoingRun]) -> list[Exception | None]:
        return self.begin_publish_many(runs)()

    def begin_publish_many(self, runs: Sequence[OutgoingRun]) -> PendingErrors:
        return self.inner.begin_publish_many(self._all_monitored(runs))

    def _all_monitored(self, runs: Sequence[OutgoingRun]) -> list[OutgoingRun]:
        if any(run.routine is not None for run in runs):
            # Sentry's beat patch starts a new trace per entry, right before
            # its send; the runs of one chunk are sent together after their
            # check-ins, so they share one new trace (Sentry's send_task
            # patch reads the scope's trace when each message goes out).
            with suppress(Exception):
                import sentry_sdk

                sentry_sdk.get_isolation_scope().set_new_propagation_context()
        return [self._monitored(run) for run in runs]

    def close(self) -> None:
        self.inner.close()

    def _monitored(self, run: OutgoingRun) -> OutgoingRun:
        routine = run.routine
        if routine is None:
            return run  # already monitored (an outer CronsPublisher), or not a routine's
        bare = replace(run, routine=None)
        try:
            integration = _integration()
            if integration is None or _excluded(integration, run.routine_name):
                return bare
            config = monitor_config(routine, self.settings.timezone, self.settings.run_timeout)
            if not config and run.routine_name not in self._said_unexpressed:
                self._said_unexpressed.add(run.routine_name)
                logger.info(
                    "Sentry Crons: routine %s has a schedule Sentry cannot express; its "
                    "check-ins go without a monitor config (create the monitor %r in Sentry)",
                    run.routine_name,
                    run.routine_name,
                )
            headers = check_in_headers(run.routine_name, config)
        except Exception:
            # Monitoring must never stop a run from going out.
            logger.exception("Sentry Crons: no check-in for run %s", run.run_id)
            return bare
        options = dict(run.options)
        own = dict(options.get("headers") or {})
        nested = {**(own.get("headers") or {}), **headers.pop("headers")}
        options["headers"] = {**own, **headers, "headers": nested}
        return replace(bare, options=options)
