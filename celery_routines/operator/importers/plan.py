"""What an import means to write, and what it wrote: plain dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from celery_routines.policy.routine import Routine


@dataclass(frozen=True)
class Planned:
    """One routine read from a source, already validated."""

    definition: Routine
    # When the source last sent it: the first window is the next one after.
    last_run_at: datetime | None = None
    description: str | None = None


@dataclass(frozen=True)
class Unmappable:
    """An entry of the source that cannot become a routine, and why."""

    name: str
    reason: str


@dataclass
class ImportPlan:
    source: str
    """``django-celery-beat``, ``redbeat`` or ``file``."""
    owner: str
    """The ``owner`` written on the routines it adds, e.g. ``import:redbeat``."""
    routines: list[Planned] = field(default_factory=list)
    unmappable: list[Unmappable] = field(default_factory=list)
    left: list[Unmappable] = field(default_factory=list)
    """Entries deliberately not imported (RedBeat's copies of beat_schedule)."""
    exclusive: bool = True
    """Refuse to update a routine stored under another owner (a routine of the
    same name added by hand or by another import); a file updates any routine
    not declared in code."""


@dataclass(frozen=True)
class ImportLine:
    name: str
    action: str
    """``added``, ``updated``, ``unchanged``, ``retired``, ``left alone`` or
    ``not imported``."""
    fields: dict[str, Any] = field(default_factory=dict)
    next_run_at: datetime | None = None
    reason: str | None = None


@dataclass(frozen=True)
class ImportResult:
    source: str
    dry_run: bool
    lines: list[ImportLine]
    by: str | None = None

    def count(self, action: str) -> int:
        return sum(1 for line in self.lines if line.action == action)

    @property
    def refused(self) -> list[ImportLine]:
        return [line for line in self.lines if line.action == "not imported"]
