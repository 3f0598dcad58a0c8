"""How the panel shows values: state words, times, strip colours and the
lateness plot (inline SVG). No I/O; every text is escaped by Jinja2 or here."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

from markupsafe import Markup, escape

from celery_routines.operator.listing import LatenessPoint
from celery_routines.operator.views import RoutineSummary
from celery_routines.schedules.zones import load_zone

# The contract's word for a routine that fires (the CLI says "enabled").
STATE_WORDS = {"enabled": "active"}
OUTCOME_CLASSES = {
    "succeeded": "ok",
    "failed": "failed",
    "lost": "lost",
    "skipped": "skipped",
    "running": "running",
    "sent": "running",
    "pending": "running",
    "retrying": "retrying",
}


def state_word(state: str) -> str:
    return STATE_WORDS.get(state, state)


def state_text(
    summary: RoutineSummary,
    suspended_until: datetime | None,
    suspended_reason: str | None,
    error: str | None,
) -> str:
    """``active``, ``paused``, ``suspended until <time>: <reason>``,
    ``invalid: <error>``, ``disabled``, ``retired (... since <time>)``."""
    state = state_word(summary.state)
    if state == "suspended" and suspended_until is not None:
        return f"suspended until {utc(suspended_until)}: {suspended_reason or 'no reason recorded'}"
    if state == "invalid" and error:
        return f"invalid: {error}"
    retired_at = getattr(summary, "retired_at", None)
    if state == "retired" and retired_at is not None:
        return f"retired (no longer declared in code since {utc(retired_at)})"
    return state


def outcome_class(state: str | None) -> str:
    word = (state or "").split(" ", 1)[0]
    return OUTCOME_CLASSES.get(word, "other")


def utc(instant: datetime | None) -> str:
    return instant.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if instant else "-"


def local(instant: datetime | None, zone: str | None = None) -> str:
    if instant is None:
        return "-"
    if zone:
        with contextlib.suppress(ValueError):
            instant = instant.astimezone(load_zone(zone))
    return instant.strftime("%Y-%m-%d %H:%M:%S %Z")


def local_input(instant: datetime, zone: str) -> str:
    """``2026-11-30T08:00`` in ``zone``: a form field's default."""
    with contextlib.suppress(ValueError):
        instant = instant.astimezone(load_zone(zone))
    return instant.strftime("%Y-%m-%dT%H:%M")


def duration(started: datetime | None, finished: datetime | None) -> str:
    if started is None or finished is None:
        return "-"
    seconds = (finished - started).total_seconds()
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def seconds_text(seconds: float) -> str:
    """``850 ms``, ``12 s``, ``4.5 min``, ``5.2 h``: an axis label."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.2g} min"
    return f"{seconds / 3600:.2g} h"


def path_part(value: str) -> str:
    """A routine name or run id as one URL path segment."""
    return quote(value, safe="")


def flower_link(flower_url: str | None, run_id: str) -> str | None:
    if not flower_url:
        return None
    return f"{flower_url.rstrip('/')}/task/{quote(run_id, safe='')}"


def lateness_svg(
    points: Sequence[LatenessPoint], now: datetime, hours: float = 24, width: int = 720
) -> Markup:
    """Scheduled vs sent over the last ``hours``: one dot per window at its
    scheduled time (x) and its lateness in seconds (y)."""
    height, left, bottom, top = 180, 56, 28, 12
    start = now - timedelta(hours=hours)
    span = (now - start).total_seconds()
    worst = max((p.seconds for p in points), default=0.0)
    ceiling = max(1.0, worst * 1.1)
    inner_w, inner_h = width - left - 8, height - bottom - top

    def x(at: datetime) -> float:
        return left + inner_w * min(1.0, max(0.0, (at - start).total_seconds() / span))

    def y(seconds: float) -> float:
        return top + inner_h * (1 - max(0.0, seconds) / ceiling)

    parts = [
        f'<svg class="plot" role="img" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(f'lateness of {len(points)} sends, last {hours:g} h')}</title>",
        f'<line class="axis" x1="{left}" y1="{top + inner_h}" x2="{left + inner_w}" '
        f'y2="{top + inner_h}"/>',
        f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{top + inner_h}"/>',
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{seconds_text(ceiling)}</text>',
        f'<text x="{left - 4}" y="{top + inner_h}" text-anchor="end">0 s</text>',
        f'<text x="{left}" y="{height - 8}">{escape(utc(start))}</text>',
        f'<text x="{left + inner_w}" y="{height - 8}" text-anchor="end">{escape(utc(now))}</text>',
    ]
    for point in points:
        label = escape(
            f"{utc(point.scheduled_for)} sent {point.seconds:.3f} s late at {utc(point.sent_at)}"
        )
        parts.append(
            f'<circle class="dot" cx="{x(point.scheduled_for):.1f}" cy="{y(point.seconds):.1f}" '
            f'r="3"><title>{label}</title></circle>'
        )
    if not points:
        parts.append(
            f'<text x="{left + inner_w / 2}" y="{top + inner_h / 2}" text-anchor="middle">'
            "no window sent in this period</text>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))
