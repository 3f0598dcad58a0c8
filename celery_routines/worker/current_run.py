"""``current_run()``: the routine run a task body is executing, read from its message.

Beat (and the operator's backfill, replay and trigger) put the routine's
name, the window's key, the attempt and, where needed, the routine's zone,
the run's kind and a trigger's instant into the message headers
(``sending/publish.py``). Celery hands them to the body as
``task.request``, which lives on Celery's per-thread request stack, so the
answer is the one of the task executing in this thread, in every pool
(prefork, solo, threads, gevent) and for ``task.apply(headers=...)``. A task
called directly (``task()``), or sent by anything other than celery-routines,
has none of these headers: ``current_run()`` is ``None`` there.

Nothing here touches the database: the answer is the message's own.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo

from celery import current_task
from celery.app.task import Task

from celery_routines.policy.states import RunKind
from celery_routines.schedules.zones import load_zone
from celery_routines.sending.publish import (
    ATTEMPT_HEADER,
    KIND_HEADER,
    ROUTINE_HEADER,
    WINDOW_AT_HEADER,
    WINDOW_HEADER,
    ZONE_HEADER,
    header_of,
)

__all__ = ["RoutineRun", "current_run", "run_of_request"]

_CACHE_ATTRIBUTE = "_routines_current_run"


@dataclass(frozen=True)
class RoutineRun:
    """The run a task body is executing.

    ``window`` is the instant the run stands for (aware, UTC): the scheduled
    window, also for a backfill or a replay of an old window, never the time
    the message went out; for a trigger, the instant it was triggered.
    ``local_window`` is the same instant in the routine's zone.
    """

    routine: str
    window: datetime
    local_window: datetime
    attempt: int
    run_id: str
    kind: RunKind
    idempotency_key: str


def current_run() -> RoutineRun | None:
    """The routine run the calling task body executes, or ``None`` outside one."""
    task = current_task
    if task is None:
        return None
    request = getattr(task, "request", None)
    if request is None:
        return None
    cached = getattr(request, _CACHE_ATTRIBUTE, None)
    if cached is not None and cached.run_id == request.id:
        return cached
    found = run_of_request(request, _default_zone(task))
    if found is not None:
        with suppress(AttributeError):  # a request that takes no attributes: uncached
            setattr(request, _CACHE_ATTRIBUTE, found)
    return found


def run_of_request(request: object, default_zone: str = "UTC") -> RoutineRun | None:
    """The run a task request carries, or None when its message is not a routine run."""
    routine = header_of(request, ROUTINE_HEADER)
    key = header_of(request, WINDOW_HEADER)
    if not routine or not isinstance(key, str):
        return None
    zone_name = header_of(request, ZONE_HEADER) or default_zone
    zone: tzinfo
    try:
        zone = load_zone(zone_name)
    except ValueError:
        zone = UTC
    window = _window(key, routine, header_of(request, WINDOW_AT_HEADER))
    if window is None:
        return None
    kind = header_of(request, KIND_HEADER) or (
        RunKind.TRIGGER if "@manual:" in key else RunKind.SCHEDULED
    )
    try:
        kind = RunKind(kind)
    except ValueError:
        kind = RunKind.SCHEDULED
    try:
        attempt = int(header_of(request, ATTEMPT_HEADER) or 1)
    except (TypeError, ValueError):
        attempt = 1
    return RoutineRun(
        routine=str(routine),
        window=window,
        local_window=window.astimezone(zone),
        attempt=attempt,
        run_id=str(getattr(request, "id", None) or ""),
        kind=kind,
        idempotency_key=key,
    )


def _window(key: str, routine: str, window_at: object) -> datetime | None:
    """The window's UTC instant: from the key (``name@<ISO with offset>``),
    else from the instant a trigger's message carries."""
    text = window_at if isinstance(window_at, str) else None
    prefix = f"{routine}@"
    if text is None and key.startswith(prefix):
        text = key[len(prefix) :]
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def _default_zone(task: Task) -> str:
    """``routines_timezone`` of the task's app: the zone of a routine that names none."""
    try:
        from celery_routines.worker.stores import settings_for

        return settings_for(task.app).timezone
    except Exception:
        return "UTC"
