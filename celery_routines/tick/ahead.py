"""A burst's next batch, claimed and written while this one is published.

A burst (more routines due than one tick claims) is a run of ticks, each
claiming ``routines_batch_size`` routines, writing their run rows, then
publishing them. Publishing is this process's work; the claim, the run rows
and their commit are mostly the database's, on its own core. On PostgreSQL
the next batch is claimed, decided and written on a thread of its own (its
own connection and transaction) while this tick publishes, and the next
tick publishes it at once.

What each batch writes, and in which order, is what one tick writes: the
claims and the run rows commit together before any of their messages goes
out; the batch is published under claims renewed if they aged (its claims
are dated from its own claim instant); its bookkeeping follows its
publishing. What changes is only that the next batch's claim may read the
database before this batch's bookkeeping is written, which issue 11's ledger
rule forbids for the routines of this batch: so the next claim excludes
them (``RoutineQueries.claim_due(excluding=...)``), and they are the only
routines this beat holds whose rows the ledger may not have written yet.

A prepared batch that is never published (the tick that should have sent it
failed, or beat stopped) is left as a beat that dies between writing and
sending leaves one: ``pending`` rows under this beat's claims, which the next
tick (or the beat that takes the claims over) finds and sends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from celery_routines.tick.report import TickReport

if TYPE_CHECKING:
    from celery_routines.tick.send import Outgoing


@dataclass
class WrittenBatch:
    """One tick's claimed routines, decided and written, not yet published."""

    # The instant the routines were claimed and decided at (beat's clock).
    claimed_at: datetime
    # time.monotonic() at the claim: how old the claims are when written down.
    started: float
    claimed_ids: list[int]
    outgoing: Outgoing | None
    # As many routines as one tick claims: more may be due.
    full: bool
    report: TickReport = field(default_factory=TickReport)


class BatchPreparer:
    """At most one batch in preparation; :meth:`take` waits for it."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._batch: WrittenBatch | None = None
        self._error: BaseException | None = None

    def start(self, prepare: Callable[[], WrittenBatch]) -> None:
        if self._thread is not None:  # each tick takes the batch before starting the next
            raise RuntimeError("a batch is already being prepared")
        self._thread = threading.Thread(
            target=self._run, args=(prepare,), name="celery-routines-next-batch", daemon=True
        )
        self._thread.start()

    def _run(self, prepare: Callable[[], WrittenBatch]) -> None:
        try:
            self._batch = prepare()
        except BaseException as exc:  # raised by take(), in the tick's thread
            self._error = exc

    def take(self) -> WrittenBatch | None:
        """The prepared batch (None if none was started); raises the error
        that stopped its preparation (its transaction was rolled back)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return None
        thread.join()
        batch, self._batch = self._batch, None
        error, self._error = self._error, None
        if error is not None:
            raise error
        return batch
