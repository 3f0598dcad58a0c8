"""The answers of the admin API's lifecycle operations (add, edit, enable,
disable, delete, history, prune): plain frozen dataclasses. No I/O here."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class ChangeResult:
    """What ``add``, ``edit``, ``enable`` or ``disable`` did to one routine."""

    routine: str
    action: str
    """``added``, ``edited``, ``enabled`` or ``disabled``."""
    changed: bool
    """False when the routine already was as asked (nothing written)."""
    fields: dict[str, Any] = field(default_factory=dict)
    """The definition columns written, with their new values."""
    next_run_at: datetime | None = None
    skipped_windows: int = 0
    """Windows that fell due while disabled, recorded as one skipped row."""
    by: str | None = None


@dataclass(frozen=True)
class DeleteResult:
    routine: str
    runs_deleted: int
    """With ``dry_run``: the runs a delete would remove."""
    by: str | None = None
    dry_run: bool = False
    runs_by_state: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ChangeView:
    """One line of a routine's history (``routine_changes``)."""

    id: int
    routine: str
    action: str
    changed_by: str | None
    changed_at: datetime
    detail: dict[str, Any] | None


@dataclass(frozen=True)
class PruneResult:
    cutoff: datetime
    """Finished runs created before this instant were candidates."""
    dry_run: bool
    deleted: dict[str, int] = field(default_factory=dict)
    """Rows deleted (or, on a dry run, that would be) by state."""
    kept_for_ceilings: int = 0
    """Routines whose runs are kept longer: a ceiling period still counts them."""

    @property
    def total(self) -> int:
        return sum(self.deleted.values())
