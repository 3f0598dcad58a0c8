"""How long a run may go without a sign of life, read off its task's request."""

from __future__ import annotations

from celery.app.task import Context, Task

from celery_routines.sending.publish import RUN_TIMEOUT_HEADER


def run_timeout_of(request: Context, configured: float) -> float:
    """The routine's own ``run_timeout`` (a message header beat sets), else
    ``configured`` (``routines_run_timeout``): how long the run may show no sign of life."""
    headers = getattr(request, "headers", None) or {}
    own = headers.get(RUN_TIMEOUT_HEADER) if isinstance(headers, dict) else None
    own = own or getattr(request, RUN_TIMEOUT_HEADER, None)
    try:
        if own is not None and float(own) > 0:
            return float(own)
    except (TypeError, ValueError):
        pass
    return configured


def hard_time_limit(task: Task, request: Context) -> float | None:
    limits = getattr(request, "timelimit", None) or (None, None)
    hard = limits[0] if isinstance(limits, list | tuple) and limits else None
    return hard or task.time_limit or task.app.conf.task_time_limit
