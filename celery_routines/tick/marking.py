"""Marking a published chunk ``sent`` while the next chunk is published.

A tick publishes its runs in chunks and marks each chunk ``sent`` before the
one after it goes out is done (see :mod:`celery_routines.tick.send`). On PostgreSQL the
marking is the database's work, on its own core, and publishing is this
process's: the marking of chunk k runs on a thread of its own (with its own
connection, autocommitted like the statement it replaces) while this thread
publishes chunk k+1, and is waited for before anything else touches the
ledger or the claims.

Nothing about the order of what is written changes: every row was committed
before its message went out, a chunk's runs are marked only after they were
published, and the ledger keeps a batch until its marking succeeded. A
marking that fails raises here, in the tick's thread, where the synchronous
statement would have raised; its batches stay in the ledger and the next
tick writes them before it reads anything (marking is conditional on
``pending``, so a batch written twice changes nothing the second time).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from celery_routines.tick.ledger import PublishLedger, SentBatch


class BackgroundMarker:
    """At most one marking in flight; :meth:`finish` waits for it."""

    def __init__(self, ledger: PublishLedger, mark: Callable[[Sequence[SentBatch]], None]) -> None:
        self.ledger = ledger
        self.mark = mark
        self._thread: threading.Thread | None = None
        self._batches: list[SentBatch] = []
        self._error: BaseException | None = None

    def start(self) -> None:
        """Mark the ledger's published batches behind this thread's back
        (after the one in flight, if any, has finished)."""
        self.finish()
        batches = list(self.ledger.sent)
        if not batches:
            return
        self._batches = batches
        self._error = None
        self._thread = threading.Thread(
            target=self._run, args=(batches,), name="celery-routines-mark-sent", daemon=True
        )
        self._thread.start()

    def _run(self, batches: list[SentBatch]) -> None:
        try:
            self.mark(batches)
        except BaseException as exc:  # re-raised by finish(), in the tick's thread
            self._error = exc

    def finish(self) -> None:
        """Wait for the marking in flight; drop its batches from the ledger
        once written, or raise its error (the batches stay)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        thread.join()
        batches, self._batches = self._batches, []
        error, self._error = self._error, None
        if error is not None:
            raise error
        sent = self.ledger.sent
        # The marked batches are the ledger's oldest: only this thread
        # appends to it, and only at the end.
        if sent[: len(batches)] == batches:
            del sent[: len(batches)]
        else:  # never expected; a batch left in the ledger is written again, harmlessly
            sent[:] = [batch for batch in sent if batch not in batches]


class InlineMarker:
    """Elsewhere than PostgreSQL: a published chunk is marked ``sent`` on the
    tick's own thread, at once (a statement each; nothing to wait for)."""

    def __init__(self, mark: Callable[[], None]) -> None:
        self.mark = mark

    def start(self) -> None:
        self.mark()

    def finish(self) -> None:
        """Nothing in flight: the marking was done by :meth:`start`."""
