"""What one tick did (for logs, metrics and tests), and a claimed routine on
its way through the tick."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from celery_routines.policy.catch_up import FirePlan
from celery_routines.schedules.base import Schedule
from celery_routines.sending.delivery import Call
from celery_routines.store import NewRun, RoutineRecord


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
    more_due: bool = False
    duration: float = 0.0
    next_wakeup: datetime | None = None


@dataclass
class _Prepared:
    """One claimed routine, planned and ready to carry out."""

    record: RoutineRecord
    plan: FirePlan
    timezone: str
    call: Call
    sends: list[NewRun] = field(default_factory=list)
    skips: list[NewRun] = field(default_factory=list)
    # Where the routine's due time moves; the plan's, unless overlap="queue"
    # holds back all but the first window.
    next_run_at: datetime | None = None
    # Open runs to revoke before sending (overlap="replace").
    replace: list[str] = field(default_factory=list)
    schedule: Schedule | None = None
