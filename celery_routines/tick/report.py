"""What one tick did, for logs, metrics and tests."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime


@dataclass
class TickReport:
    """What one tick did, for logs, metrics and tests."""

    adopted: int = 0
    claimed: int = 0
    sent: int = 0
    skipped_windows: int = 0
    # The same windows by the skip's reason (the run row's), for metrics.
    skipped_by_reason: dict[str, int] = field(default_factory=dict)
    send_failures: int = 0
    invalid: int = 0
    # Windows whose run row already existed: another beat got there first.
    conflicts: int = 0
    # Routines left due because the gate holds a window with no row yet.
    deferred: int = 0
    # Routines left due because their previous run is still open (overlap="queue").
    queued: int = 0
    # Open runs revoked for a newer window (overlap="replace").
    replaced: int = 0
    lost: int = 0
    retries_sent: int = 0
    retries_cancelled: int = 0
    # Routines changed outside beat whose next window was recomputed.
    rescheduled: int = 0
    more_due: bool = False
    duration: float = 0.0
    next_wakeup: datetime | None = None

    def add(self, other: TickReport) -> None:
        """Count in what ``other`` did: a batch prepared in an earlier tick
        (see tick/ahead.py) is reported by the tick that publishes it."""
        for counter in fields(self):
            if counter.type == "int":
                setattr(
                    self, counter.name, getattr(self, counter.name) + getattr(other, counter.name)
                )
        for reason, count in other.skipped_by_reason.items():
            self.skipped_by_reason[reason] = self.skipped_by_reason.get(reason, 0) + count

    def skipped(self, reason: str, count: int = 1) -> None:
        """``count`` windows skipped for ``reason`` (the run row's)."""
        self.skipped_windows += count
        self.skipped_by_reason[reason] = self.skipped_by_reason.get(reason, 0) + count
