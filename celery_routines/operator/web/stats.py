"""A routine's record on the panel (issue 33, item 5): ``GET
/api/routines/{name}/stats?days=7`` and the record shown on the routine's
page, both from :class:`celery_routines.operator.routine_stats.RoutineRecords`
(one query)."""

from __future__ import annotations

from starlette.requests import Request

from celery_routines.operator.listing import SORT_DAYS, RoutineRow
from celery_routines.operator.output import jsonable
from celery_routines.operator.web.context import panel_of
from celery_routines.policy.run_stats import RoutineStats, Spread


def spread_json(spread: Spread) -> dict[str, object]:
    return {"p50_seconds": spread.p50, "p95_seconds": spread.p95, "count": spread.count}


def stats_json(stats: RoutineStats) -> dict[str, object]:
    """The record as the API answers it: field names say their unit."""
    return {
        "routine": stats.routine,
        "timezone": stats.timezone,
        "days": stats.days,
        "since": jsonable(stats.since),
        "until": jsonable(stats.until),
        "counts": stats.counts,
        "success_rate": stats.success_rate,
        "ended_windows": stats.ended,
        "duration": spread_json(stats.duration),
        "lateness": {
            "sent": spread_json(stats.send_lateness),
            "started": spread_json(stats.start_lateness),
        },
        "retries": {"attempts": stats.retry_attempts, "celery_retries": stats.celery_retries},
        "skipped_windows": stats.skipped_windows,
        "skips_by_reason": stats.skips_by_reason,
        "dropped_by_catch_up": stats.dropped_by_catch_up,
        "missed_late": stats.missed_late,
        "strip": [
            {"day": day.day.isoformat(), "counts": day.counts, "text": day.words}
            for day in stats.strip
        ],
    }


def routine_stats(request: Request) -> dict[str, object]:
    """``GET /api/routines/{name}/stats?days=7`` (days 1..90)."""
    name = request.path_params["name"]
    stats = panel_of(request).admin.stats.of(name, request.query_params.get("days"))
    return stats_json(stats)


def seconds_words(seconds: float | None) -> str:
    """``1.5 s``, ``2 min 5 s``, ``-`` when nothing was measured."""
    if seconds is None:
        return "-"
    if abs(seconds) < 60:
        return f"{seconds:.3g} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def rate_words(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.1f}%"


def day_outcome(counts: dict[str, int]) -> str:
    """The class of a strip day: its worst outcome (the text says all of it)."""
    for state in ("lost", "failed", "skipped", "retrying", "running", "sent", "pending"):
        if counts.get(state):
            return state
    return "ok" if counts.get("succeeded") else "none"


# The routine list's orders, as its select offers them.
SORT_CHOICES = (
    ("", "by name"),
    ("failure_rate", "failure rate, worst first"),
    ("lateness", "lateness, worst first"),
)


def figure_words(row: RoutineRow) -> str:
    """What a sorted list says under a routine's last outcome."""
    if row.failure_rate is None and row.lateness_seconds is None:
        return f"nothing ended or sent in {SORT_DAYS} days"
    return (
        f"{SORT_DAYS} days: failure rate {rate_words(row.failure_rate)}, "
        f"sent {seconds_words(row.lateness_seconds)} late on average"
    )
