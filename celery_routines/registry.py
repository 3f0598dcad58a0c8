"""Declaring routines in code: ``routine``, ``register`` and ``beat_schedule``.

Declarations are validated when they are made (an invalid cron fails at
import, naming the routine) and written to the store when beat starts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, TypeVar

from celery import Celery
from celery.schedules import crontab
from celery.schedules import schedule as celery_schedule

from .config import setting
from .errors import ConfigurationError, InvalidRoutine
from .policy.notify_hosts import SETTING as NOTIFY_ALLOWED_HOSTS
from .policy.notify_hosts import NotifyHosts, door_refusal
from .policy.routine import Routine, define
from .policy.states import OLD_SCHEDULER_BEHAVIOUR
from .schedules.interval import whole_seconds
from .worker import hooks as worker

logger = logging.getLogger("celery_routines.registry")

TaskT = TypeVar("TaskT")

_declared: dict[str, Routine] = {}
# A beat_schedule entry that cannot be a routine: its error and its task name.
InvalidEntry = tuple[InvalidRoutine, str | None]


def routine(schedule: Any = None, **options: Any) -> Callable[[TaskT], TaskT]:
    """Run the decorated Celery task on ``schedule`` (or once, ``at=...``);
    returns the same task."""

    def decorate(task: TaskT) -> TaskT:
        register(task, schedule, **options)
        return task

    return decorate


def register(task_or_task_name: Any, schedule: Any = None, **options: Any) -> Routine:
    """Declare a routine for a task object or a task name defined elsewhere."""
    task_name = _task_name(task_or_task_name, options.get("name"))
    definition = define(task_name, schedule, **options)
    previous = _declared.get(definition.name)
    if previous is not None and previous != definition:
        logger.warning("routine %r declared twice; the later declaration wins", definition.name)
    _declared[definition.name] = definition
    if not isinstance(task_or_task_name, str):
        # The worker claims the run before the body; see worker.install.
        worker.install(task_or_task_name)
    return definition


def declared() -> list[Routine]:
    """Every routine declared in this process, in declaration order."""
    return list(_declared.values())


def forget(name: str) -> None:
    """Drop a declaration (tests and interactive sessions)."""
    _declared.pop(name, None)


def _task_name(task: Any, routine_name: str | None) -> str:
    if isinstance(task, str):
        return task
    name = getattr(task, "name", None)
    if not isinstance(name, str) or not name:
        raise InvalidRoutine(
            str(routine_name or task),
            f"expected a Celery task or a task name, got {task!r}; "
            "put @routine(...) above @app.task",
        )
    return name


# The setting that gives beat_schedule entries our retries and overlap.
BEAT_SCHEDULE_DEFAULTS = "routines_beat_schedule_defaults"


def from_beat_schedule(
    beat_schedule: Mapping[str, Any] | None,
    invalid: list[InvalidEntry] | None = None,
    *,
    our_defaults: bool = False,
) -> list[Routine]:
    """Entries of ``app.conf.beat_schedule`` as routine definitions.

    crontab, schedule and timedelta entries keep their meaning; the entry's
    key is the routine's name. As under Celery beat, a failed run is not
    retried and a window is sent while the previous run goes on, unless
    ``our_defaults``. An entry that cannot be a routine raises, unless
    ``invalid`` is given: then its error is added there (beat stores it as an
    invalid routine and starts anyway).
    """
    behaviour = {} if our_defaults else OLD_SCHEDULER_BEHAVIOUR
    definitions = []
    for name, entry in (beat_schedule or {}).items():
        try:
            definitions.append(_beat_entry(name, entry, behaviour))
        except InvalidRoutine as exc:
            if invalid is None:
                raise
            task = entry.get("task") if isinstance(entry, Mapping) else None
            invalid.append((exc, task if isinstance(task, str) else None))
    return definitions


def _beat_entry(name: str, entry: Any, behaviour: Mapping[str, Any]) -> Routine:
    if not isinstance(entry, Mapping) or "task" not in entry or "schedule" not in entry:
        raise InvalidRoutine(str(name), "beat_schedule entries need at least 'task' and 'schedule'")
    options: dict[str, Any] = {"name": name, **behaviour}
    for key in ("args", "kwargs", "options"):
        if entry.get(key) is not None:
            options[key] = entry[key]
    return define(entry["task"], _whole_interval(entry["schedule"]), **options)


def _whole_interval(value: Any) -> Any:
    """A ``timedelta``, number or Celery ``schedule`` entry as whole seconds
    (:func:`whole_seconds`: the grid of windows and keys is whole seconds;
    under a second is one, never 0); any other schedule as it is."""
    if isinstance(value, celery_schedule) and isinstance(value.run_every, timedelta):
        return timedelta(seconds=whole_seconds(value.run_every.total_seconds()))
    if isinstance(value, timedelta):
        return timedelta(seconds=whole_seconds(value.total_seconds()))
    if isinstance(value, int | float) and not isinstance(value, bool):
        return whole_seconds(value)
    return value


def celery_default_entries(app: Celery) -> list[Routine]:
    """The backend clean-up Celery's own beat installs when results do not expire
    by themselves; users of the stock beat get it, so ours keeps it."""
    if not app.conf.result_expires or app.backend.supports_autoexpire:
        return []
    return [
        define(
            "celery.backend_cleanup",
            crontab("0", "4", "*"),
            options={"expires": 12 * 3600},
        )
    ]


def beat_schedule_our_defaults(app: Celery) -> bool:
    """``routines_beat_schedule_defaults``: ``"celery"`` (the default: Celery
    beat's behaviour) or ``"routines"`` (ours)."""
    raw = setting(app, BEAT_SCHEDULE_DEFAULTS) or "celery"
    if raw not in ("celery", "routines"):
        raise ConfigurationError(
            f"{BEAT_SCHEDULE_DEFAULTS} must be 'celery' (no retries, overlap, as Celery beat) "
            f"or 'routines' (this package's defaults), got {raw!r}"
        )
    return raw == "routines"


def definitions_for(app: Celery, invalid: list[InvalidEntry] | None = None) -> list[Routine]:
    """Everything beat writes to the store at start-up, by name (code wins
    over beat_schedule when both name the same routine); ``invalid``: see
    :func:`from_beat_schedule`. With ``invalid``, a routine whose notify_url
    host is refused by ``routines_notify_allowed_hosts`` is added there too,
    in the words ``add`` uses (the decorator cannot know the settings)."""
    merged: dict[str, Routine] = {}
    for definition in [
        *celery_default_entries(app),
        *from_beat_schedule(
            app.conf.beat_schedule, invalid, our_defaults=beat_schedule_our_defaults(app)
        ),
        *declared(),
    ]:
        merged[definition.name] = definition
    if invalid is not None:
        allowed = NotifyHosts.parse(setting(app, NOTIFY_ALLOWED_HOSTS))
        for definition in list(merged.values()):
            refused = door_refusal(definition.notify_url, allowed)
            if refused is not None:
                invalid.append((InvalidRoutine(definition.name, refused), definition.task))
                del merged[definition.name]
    return list(merged.values())
