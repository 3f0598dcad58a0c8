"""What an import means to write, and what it wrote: plain dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from celery_routines.policy.routine import Routine
from celery_routines.policy.states import OLD_SCHEDULER_BEHAVIOUR


def behaviour_options(our_defaults: bool) -> dict[str, Any]:
    """The options an imported routine gets for retries and overlap: the
    old scheduler's behaviour, or (``our_defaults``) this package's defaults."""
    return {} if our_defaults else dict(OLD_SCHEDULER_BEHAVIOUR)


def behaviour_text(source: str, our_defaults: bool) -> str:
    """What the plan says about the behaviour it gives its routines."""
    if our_defaults:
        return (
            "retries and overlap: celery-routines' defaults (max_retries 4, "
            f"retry_base_seconds 60, overlap skip), not {source}'s"
        )
    return (
        f"retries and overlap kept as {source} had them: a failed run is not retried "
        "(max_retries 0) and a window is sent while the previous run goes on "
        "(overlap overlap); --our-defaults gives celery-routines' (4 retries, overlap skip)"
    )


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
    behaviour: str | None = None
    """What retries and overlap the imported routines get, and why (printed)."""
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
    note: str | None = None
    """What else happens to it: what beat does to a routine the code declares too."""


@dataclass(frozen=True)
class ImportResult:
    source: str
    dry_run: bool
    lines: list[ImportLine]
    by: str | None = None
    behaviour: str | None = None
    """What retries and overlap the routines got (the plan's)."""
    notes: list[str] = field(default_factory=list)
    """What the plan could not say line by line (printed)."""

    def count(self, action: str) -> int:
        return sum(1 for line in self.lines if line.action == action)

    @property
    def refused(self) -> list[ImportLine]:
        return [line for line in self.lines if line.action == "not imported"]
