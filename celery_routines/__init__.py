"""celery-routines: a database-backed Celery beat.

Run it with ``celery -A proj beat -S celery_routines.Scheduler``.
"""

from __future__ import annotations

from .beat import Scheduler
from .errors import (
    ConfigurationError,
    InvalidRoutine,
    RoutinesError,
    ScheduleError,
    UnknownRoutine,
)
from .policy.ceilings import Ceiling
from .registry import register, routine
from .worker import hooks as _worker
from .worker.spend import spend

__all__ = [
    "Ceiling",
    "ConfigurationError",
    "InvalidRoutine",
    "RoutinesError",
    "ScheduleError",
    "Scheduler",
    "UnknownRoutine",
    "register",
    "routine",
    "spend",
]
__version__ = "0.1.0"

# Importing the package (as every app that declares routines does) connects
# the worker-side handlers; they act only on messages beat marked as runs.
_worker.connect()
