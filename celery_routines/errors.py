"""The exception tree of celery-routines.

Every error a user can cause is a ``ValueError`` or ``LookupError`` subclass
whose message names the routine (when there is one), the bad value, and the fix.
"""

from __future__ import annotations


class RoutinesError(Exception):
    """Base of every error raised by celery-routines."""


class ConfigurationError(RoutinesError, ValueError):
    """A ``routines_*`` setting has a value we cannot use."""


class ScheduleError(RoutinesError, ValueError):
    """A schedule (cron expression, interval, timezone) cannot be computed.

    Raised by the pure schedule modules, which do not know the routine's name;
    :class:`InvalidRoutine` wraps it with the name.
    """


class InvalidRoutine(RoutinesError, ValueError):
    """A routine definition is invalid; the message names the routine."""

    def __init__(self, routine_name: str, problem: str) -> None:
        self.routine_name = routine_name
        self.problem = problem
        super().__init__(f"routine {routine_name!r}: {problem}")


class NotifyRefused(RoutinesError, ValueError):
    """A notification was not posted, and trying again would not post it: its
    URL's host is not allowed (``routines_notify_allowed_hosts``), or the
    endpoint answered with a redirect, which notifications do not follow."""


class UnknownRoutine(RoutinesError, LookupError):
    """No routine with this name is stored."""

    def __init__(self, routine_name: str) -> None:
        self.routine_name = routine_name
        super().__init__(f"no routine named {routine_name!r} is stored")
