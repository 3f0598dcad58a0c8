"""celery-routines: a database-backed Celery beat.

Run it with ``celery -A proj beat -S celery_routines.Scheduler``.
"""

from __future__ import annotations

from . import worker as _worker
from .beat import Scheduler
from .ceilings import Ceiling
from .errors import (
    ConfigurationError,
    InvalidRoutine,
    RoutinesError,
    ScheduleError,
    UnknownRoutine,
)
from .registry import register, routine
from .spend import spend

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
