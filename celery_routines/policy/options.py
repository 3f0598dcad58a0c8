"""What a routine option is: the one declaration every door reads.

Each option is declared once, as a field of
:class:`celery_routines.policy.routine.Routine` made with :func:`option`: its
type (the field's annotation), its default, its check, the ``routines``
column holding it and how it is written there, and its wording (the form's
label, the help of the CLI flag, the form and the API). From that
declaration come the names ``routine()`` accepts, the row a routine is
stored as and read back from, the ``routines`` table's columns
(:mod:`celery_routines.store.models`), the options of ``add``/``edit``, the
CLI's flags, the panel's form fields, the API's definition and the export
file's keys. Adding an option is one field there (plus its column in
``RoutineRecord`` and a migration).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# The key of a Routine field's metadata holding its RoutineOption.
OPTION = "routine_option"


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


def same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Stored:
    """A ``routines`` column, as :mod:`celery_routines.store.models` builds it:
    ``kind`` is text, json (text holding JSON), string (of ``length``),
    integer, seconds, instant or boolean; a column with a server default is
    NOT NULL."""

    kind: str
    length: int | None = None
    server_default: str | None = None

    @property
    def nullable(self) -> bool:
        return self.server_default is None


@dataclass(frozen=True)
class RoutineOption:
    """One option of a routine; ``name`` and ``default`` are the Routine
    field's, filled in by :func:`declared_options`."""

    stored: Stored
    column: str = ""
    """The ``routines`` column; empty: the option's name."""
    keyword: str | None = ""
    """``routine()``'s keyword; empty: the name; None: not one (a schedule's
    fields come from the schedule argument)."""
    check: Callable[[Any], Any] = same
    """Checks a value (raising ``ScheduleError`` in the user's words) and
    returns it normalised; called with the default too."""
    to_column: Callable[[Any], Any] = same
    from_column: Callable[[Any], Any] = same
    """The value as the column holds it, and back (a row typed by hand
    included: raising ``ScheduleError`` for text that does not read)."""
    label: str = ""
    words: str = ""
    """What it does, in the words of the CLI's help, the form and the API."""
    entry: str | None = None
    """How the CLI, the form and the API take it: text, multiline, lines,
    json, whole, number, duration, instant, choice or ceilings; None: not
    there (set in code or SQL only)."""
    flag: str = ""
    """The CLI flag; empty: ``--`` and the name with dashes."""
    choices: tuple[str, ...] = ()
    clears: tuple[Any, ...] = ()
    """The values ``edit`` takes as "back to the default" (``--shift none``);
    empty: it cannot be cleared, only changed."""
    shown: Callable[[Any], Any] = same
    """The value as ``show``, the API and the history print it."""
    secret: bool = False
    """Its stored value holds a secret that ``shown`` masks: the panel's form
    never holds it (an empty input keeps it), and the masked value is never
    taken back as a value."""
    name: str = ""
    default: Any = UNSET
    factory: Callable[[], Any] | None = None
    """Makes the default when it is mutable (a dict): one for each routine."""

    def new_default(self) -> Any:
        """The default for one routine (a new dict, not one shared by all)."""
        return self.default if self.factory is None else self.factory()

    @property
    def column_name(self) -> str:
        return self.column or self.name

    @property
    def keyword_name(self) -> str | None:
        return None if self.keyword is None else self.keyword or self.name

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


def option(default: Any = UNSET, *, factory: Callable[[], Any] | None = None, **spec: Any) -> Any:
    """A Routine field declaring an option (``spec``: :class:`RoutineOption`'s)."""
    metadata = {OPTION: RoutineOption(**spec)}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    if default is UNSET:
        return field(metadata=metadata)
    return field(default=default, metadata=metadata)


def declared_options(model: type) -> tuple[RoutineOption, ...]:
    """The options ``model``'s fields declare, in their order."""
    found = []
    for item in dataclasses.fields(model):
        spec = item.metadata.get(OPTION)
        if spec is None:
            continue
        factory = None
        if item.default is not dataclasses.MISSING:
            default = item.default
        elif item.default_factory is not dataclasses.MISSING:
            factory = item.default_factory
            default = factory()
        else:
            default = None
        found.append(dataclasses.replace(spec, name=item.name, default=default, factory=factory))
    return tuple(found)
