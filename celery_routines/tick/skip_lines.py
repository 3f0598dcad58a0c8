"""The log lines a tick writes of what it did not send: skips (one line a
skip row, its windows written like window keys) and windows queued behind an
open run."""

from __future__ import annotations

import logging
from datetime import datetime

from celery_routines.observe.events import Events
from celery_routines.policy.decide import Decision, Verdict
from celery_routines.policy.runs import QUEUE_RECHECK
from celery_routines.policy.states import CatchUp, Overlap, Reason
from celery_routines.schedules.keys import window_key
from celery_routines.store import NewRun
from celery_routines.tick.report import TickReport

logger = logging.getLogger("celery_routines.beat")


def log_overlap(decision: Decision) -> None:
    """Say why windows wait behind an open run (a skip says it in its own line)."""
    if decision.verdict == Verdict.QUEUED:
        logger.info(
            "queued %s: previous run still open: %s; looking again in %.0f s",
            decision.sends[0].idempotency_key,
            _holding(decision),
            QUEUE_RECHECK.total_seconds(),
        )
    if decision.waiting and decision.sends:
        name, sends = decision.claimed.routine.name, len(decision.sends)
        if decision.claimed.routine.overlap == Overlap.QUEUE:
            logger.info(
                "%s: sending the oldest of %d queued window(s); the next waits for it",
                name,
                decision.waiting + sends,
            )
        else:
            logger.info(
                "%s: sending %d of %d window(s) of its catch-up this tick "
                "(routines_catch_up_per_tick); the rest go out in the next ticks",
                name,
                sends,
                decision.waiting + sends,
            )


def _holding(decision: Decision) -> str:
    return ", ".join(f"{run.idempotency_key} ({run.state})" for run in decision.holding)


def skip_note(decision: Decision, run: NewRun) -> str | None:
    """Why a skip row was written, beyond its reason: the open run an
    overlap skip waited on, or the window of the same recovery that went out
    instead (see ``policy.catch_up``)."""
    if run.reason == Reason.OVERLAP and decision.holding:
        return f"previous run still open: {_holding(decision)}"
    if run.reason == Reason.LATEST and decision.sends:
        sent = decision.sends[-1].idempotency_key
        policy = decision.claimed.routine
        why = "catch_up=latest" if policy.catch_up == CatchUp.LATEST else "overlap=skip"
        return f"a recovery under {why} sends only its newest window, {sent}"
    if run.reason == Reason.REPLACED and decision.sends:
        sent = decision.sends[-1].idempotency_key
        return f"a recovery under overlap=replace sends only its newest window, {sent}"
    return None


# Skips that are the routine's own policy doing what it was told (overlap
# "skip" or "replace", catch_up "skip_to_next"/"latest", a paused, retired or disabled
# routine): INFO, or a busy routine warns every other window. The others
# (a window too late, windows dropped past catch_up_cap, a ceiling) say
# something went wrong: WARNING.
POLICY_SKIPS = frozenset(
    {Reason.OVERLAP, Reason.SKIP_TO_NEXT, Reason.LATEST, Reason.PAUSED}
    | {Reason.RETIRED, Reason.DISABLED, Reason.REPLACED}
)


def skip_level(run: NewRun) -> int:
    """The log level of a skip row's line."""
    return logging.INFO if run.reason in POLICY_SKIPS else logging.WARNING


def skip_line(routine: str, run: NewRun, timezone: str, note: str | None = None) -> str:
    """The one log line of a skip row, its windows written like window keys
    (in the routine's zone, with the offset)."""
    count = run.skipped_count or 1
    first = run.skipped_first or run.scheduled_for
    last = run.skipped_last or run.scheduled_for
    try:
        if count == 1:
            windows = window_key(routine, first, timezone)
        else:
            start = window_key(routine, first, timezone).split("@", 1)[1]
            end = window_key(routine, last, timezone).split("@", 1)[1]
            windows = f"{count} windows of {routine} from {start} to {end}"
    except ValueError:  # an unknown zone: the row is written, say it in UTC
        windows = f"{count} window(s) of {routine} from {first.isoformat()} to {last.isoformat()}"
    return f"skipped {windows}: {run.reason}" + (f" ({note})" if note else "")


def late_skipped(
    report: TickReport, events: Events, routine: str, window: datetime, run_id: str
) -> None:
    """One window skipped ``late`` at the moment of sending (a first attempt
    or a retry past ``max_lateness``): counted, and sent as an event."""
    report.skipped(Reason.LATE)
    events.skipped(routine, reason=Reason.LATE, count=1, first=window, last=window, run_id=run_id)
