"""The named values of routines and runs.

Each is a ``StrEnum`` whose values are exactly the strings stored today
(``routine_runs.state``, ``routine_runs.reason``, ``routines.catch_up``,
``routines.overlap``): a member compares equal to its stored string and is
written as it, so no schema or data changes, and a row read back as a plain
string compares equal to the member.
"""

from __future__ import annotations

from enum import StrEnum


class RunState(StrEnum):
    PENDING = "pending"
    SENT = "sent"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RETRYING = "retrying"
    SKIPPED = "skipped"
    LOST = "lost"


RUN_STATES = tuple(state.value for state in RunState)
# Finished: the states history pruning may delete.
FINISHED_STATES = (
    RunState.SUCCEEDED.value,
    RunState.FAILED.value,
    RunState.LOST.value,
    RunState.SKIPPED.value,
)
# Written, and not finished: these hold a routine back under overlap="skip".
OPEN_STATES = (RunState.PENDING.value, RunState.SENT.value, RunState.RUNNING.value)


class Reason(StrEnum):
    """Why a run was skipped, failed, or not retried (``routine_runs.reason``).

    A cancelled retry stores ``no_retry:<why>`` (see :func:`no_retry`).
    """

    # Skips.
    CATCH_UP_CAP = "catch_up_cap"
    LATEST = "latest"
    SKIP_TO_NEXT = "skip_to_next"
    LATE = "late"
    OVERLAP = "overlap"
    CEILING = "ceiling"
    PAUSED = "paused"
    RETIRED = "retired"
    DISABLED = "disabled"
    # The worker took the message after its ``expires`` (window + max_lateness).
    EXPIRED = "expired"
    # Failures.
    LOST = "lost"
    SEND_FAILED = "send_failed"
    REPLACED = "replaced"


def no_retry(why: str) -> str:
    """The reason of an attempt whose retry was not scheduled or was dropped."""
    return f"no_retry:{why}"


class CatchUp(StrEnum):
    """What a recovery does with the windows missed while beat was away."""

    CATCH_UP = "catch_up"
    LATEST = "latest"
    SKIP_TO_NEXT = "skip_to_next"


class Overlap(StrEnum):
    """What a due window does while the routine's previous run is still open."""

    SKIP = "skip"
    QUEUE = "queue"
    OVERLAP = "overlap"
    REPLACE = "replace"


# What Celery beat, django-celery-beat and RedBeat do: a failed task is never
# sent again, and a window goes out while the previous run is still going. A
# routine imported from them keeps it (a task that is not idempotent must not
# run again after a failure) unless the operator asks for ours.
OLD_SCHEDULER_BEHAVIOUR = {"max_retries": 0, "overlap": Overlap.OVERLAP.value}


class RunKind(StrEnum):
    """Why a run's message went out (``current_run().kind``)."""

    SCHEDULED = "scheduled"  # a window beat found due, or beat's retry of one
    BACKFILL = "backfill"
    REPLAY = "replay"
    TRIGGER = "trigger"


# Policies under which a manual send must not start next to an open run either.
EXCLUSIVE_OVERLAP = (Overlap.SKIP, Overlap.QUEUE)


def choices(kind: type[StrEnum]) -> str:
    """``'a', 'b' or 'c'``, for error messages."""
    names = [repr(member.value) for member in kind]
    return ", ".join(names[:-1]) + " or " + names[-1]
