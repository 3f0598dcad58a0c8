"""celery-routines: a database-backed Celery beat.

Run it with ``celery -A proj beat -S celery_routines.Scheduler``.

The public names are imported when first used (PEP 562), not with the
package: the ``celery`` command imports this package in every process it
starts (our ``celery routines`` command is a ``celery.commands`` plugin), and
importing the scheduler, the store and SQLAlchemy there cost each worker,
each Celery beat and each ``celery inspect`` about 20 MB (issue 19).
``tests/test_imports.py`` pins what stays out.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from celery import signals

from .errors import (
    ConfigurationError,
    InvalidRoutine,
    RoutinesError,
    ScheduleError,
    UnknownRoutine,
)

if TYPE_CHECKING:
    from .beat import Scheduler
    from .operator.admin import Routines
    from .policy.ceilings import Ceiling
    from .registry import register, routine
    from .worker.current_run import RoutineRun, current_run
    from .worker.spend import spend

__all__ = [
    "Ceiling",
    "ConfigurationError",
    "InvalidRoutine",
    "RoutineRun",
    "Routines",
    "RoutinesError",
    "ScheduleError",
    "Scheduler",
    "UnknownRoutine",
    "current_run",
    "register",
    "routine",
    "spend",
]
__version__ = "0.1.0"

# Public name -> the module that defines it.
_LAZY = {
    "Scheduler": ".beat",
    "Routines": ".operator.admin",
    "Ceiling": ".policy.ceilings",
    "register": ".registry",
    "routine": ".registry",
    "spend": ".worker.spend",
    "current_run": ".worker.current_run",
    "RoutineRun": ".worker.current_run",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    _connect_worker_side()
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def _connect_worker_side() -> bool:
    """Connect the worker-side handlers (idempotent); True when connected now."""
    from .worker import hooks

    return hooks.connect()


# Importing the package (as every app that declares routines does, and as the
# `celery` command does through its plugin) still connects the worker-side
# handlers, which act only on messages beat marked as runs: these two cheap
# handlers import and connect them when a worker starts, and run the handler
# the signal being sent would have reached had they been connected before it.
def _on_worker_init(sender: object = None, **kwargs: object) -> None:
    from .worker import stopping

    # A worker -B whose beat died stops; one whose pool died under a group
    # SIGTERM exits (worker/stopping.py). Both act only with our beat embedded.
    stopping.connect()
    if _connect_worker_side():
        from .worker import hooks

        hooks.on_worker_init(sender=sender, **kwargs)


def _on_worker_process_init(**kwargs: object) -> None:
    if _connect_worker_side():
        from .worker import hooks

        hooks.after_fork(**kwargs)


signals.worker_init.connect(_on_worker_init, weak=False)
signals.worker_process_init.connect(_on_worker_process_init, weak=False)
