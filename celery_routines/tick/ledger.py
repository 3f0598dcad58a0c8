"""What a beat published and has not yet written down.

Publishing and the bookkeeping after it (runs marked ``sent``, routines moved
to their next window) cannot be one atomic step: the broker is not the
database. If the bookkeeping fails (a deadlock, a dropped connection, a
failover), the database still says ``pending`` and the routine is still due,
and a beat that trusted only the database would publish those runs again on
every retry. The ledger is this beat's memory of what it did: the next tick
writes it down before it reads anything else, so no tick of this beat ever
plans from a database that has not heard what it published. A beat that dies
loses its ledger; its claims then expire, and only then does another beat send
its ``pending`` rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from celery_routines.store import Advance

# Run ids published at one instant, with their routines' own run_timeout
# (None: routines_run_timeout): marked ``sent`` together.
SentBatch = tuple[list[str], datetime, float | None]


@dataclass
class PublishLedger:
    """What this beat published and has not yet written down."""

    # Batches published, not yet marked sent, oldest first.
    sent: list[SentBatch] = field(default_factory=list)
    # Next windows of routines whose runs went out, not yet written.
    advances: dict[int, Advance] = field(default_factory=dict)

    def published(
        self, run_ids: Sequence[str], sent_at: datetime, timeouts: Sequence[float | None] = ()
    ) -> None:
        """``timeouts``: each run's routine's own run_timeout (none given: all
        the default); one batch per distinct timeout, so each is marked sent
        with its own lost deadline."""
        if not run_ids:
            return
        by_timeout: dict[float | None, list[str]] = {}
        for run_id, timeout in zip(run_ids, timeouts or [None] * len(run_ids), strict=True):
            by_timeout.setdefault(timeout, []).append(run_id)
        for timeout, ids in by_timeout.items():
            self.sent.append((ids, sent_at, timeout))

    def advanced(self, advances: Sequence[Advance]) -> None:
        for advance in advances:
            self.advances[advance.routine_id] = advance

    def marked(self) -> None:
        """The oldest batch of :attr:`sent` is written down."""
        self.sent.pop(0)

    def __bool__(self) -> bool:
        return bool(self.sent or self.advances)

    def describe(self) -> str:
        runs = sum(len(ids) for ids, _, _ in self.sent)
        return f"{runs} published run(s) and {len(self.advances)} routine advance(s)"
