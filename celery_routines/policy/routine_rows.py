"""The routine a ``routines`` row describes: the second door to the one
validated model (:mod:`celery_routines.policy.routine`), for rows read by beat,
the sweeps and the operator's sends, JSON columns included."""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from celery_routines.errors import InvalidRoutine, ScheduleError
from celery_routines.policy.routine import OPTIONS, Routine, check_name

# The columns a Routine is built from besides ``name`` (the declared
# options'); a row's values of these (and their types) key the cache below.
COLUMNS = ("task", *(o.column_name for o in OPTIONS))
# Distinct definitions (all columns but the name) kept validated; bounded, so
# a million routines that all differ cost a miss each, never memory.
VALIDATED_CACHE_SIZE = 1024
_validated: dict[tuple[Any, ...], Routine] = {}
_every_column = attrgetter(*COLUMNS)


def from_columns(row: Any) -> Routine:
    """The routine a ``routines`` row describes (a ``RoutineRecord`` or any
    object with the columns as attributes). Raises :class:`InvalidRoutine`
    with the message a declaration with the same values would get; only the
    JSON columns have errors of their own (text that is not JSON).

    A tick builds one per claimed row, and a burst's thousands of rows differ
    mostly in their name: a definition validated once (same values of the
    same types in every other column) is copied with the row's name, which
    is all that is checked again. Its ``args``, ``kwargs`` and ``options``
    are then shared by those routines, like any frozen model's values:
    readers copy before changing them (``sending.sender.outgoing_run``).
    """
    try:
        values = _every_column(row)
    except AttributeError:  # a row without the newer, optional columns
        values = tuple(getattr(row, column, None) for column in COLUMNS)
    key = (values, tuple(map(type, values)))
    template = _validated.get(key)
    if template is None:
        routine = _from_columns(row)
        if len(_validated) >= VALIDATED_CACHE_SIZE:
            _validated.clear()
        _validated[key] = routine
        return routine
    check_name(row.name, template.task)
    routine = object.__new__(Routine)
    routine.__dict__.update(template.__dict__)
    routine.__dict__["name"] = row.name
    return routine


def _from_columns(row: Any) -> Routine:
    try:
        options = {o.name: o.from_column(getattr(row, o.column_name, None)) for o in OPTIONS}
    except ScheduleError as exc:
        raise InvalidRoutine(row.name, str(exc)) from None
    return Routine(name=row.name, task=row.task, **options, from_json=True)
