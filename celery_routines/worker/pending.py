"""Outcomes the database did not take yet.

When a body has run and its outcome cannot be written within
``routines_database_patience`` (the database is down for longer), the outcome
is kept here and written when the database answers again. Dropping it would
leave the run open until its deadline, when the lost sweep would retry it and
run the body a second time.

Each kept outcome is also written to a small SQLite file on the worker's host
(``routines_outcome_spool``; the standard library's ``sqlite3``, safe for the
pool processes writing it at once), so a worker restarted meanwhile writes
them when it starts (:func:`recover`). Outcomes are keyed by run id and tagged
with the database they belong to (a fingerprint of its URL without the
password), so a worker on another database never writes them there.

Writing one is the same conditional UPDATE as when the body ends: an outcome
that did land before its answer was lost changes nothing the second time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime

from sqlalchemy.engine import make_url

from celery_routines.store.faults import cause_of
from celery_routines.worker.outage import is_connection_fault

logger = logging.getLogger("celery_routines.worker")

# How often kept outcomes are tried while the database stays away (seconds).
RETRY_EVERY = 2.0


@dataclass(frozen=True)
class PendingOutcome:
    """What a body's end would have written."""

    run_id: str
    routine: str
    succeeded: bool
    finished_at: datetime
    error: str | None = None
    # The worker process died under the body (WorkerLostError).
    lost: bool = False
    spend: dict[str, float] | None = None

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "finished_at": self.finished_at.isoformat()})

    @classmethod
    def from_json(cls, text: str) -> PendingOutcome:
        fields = json.loads(text)
        fields["finished_at"] = datetime.fromisoformat(fields["finished_at"])
        return cls(**fields)


Write = Callable[[PendingOutcome], None]
"""Writes one outcome to the database; raises if it cannot."""


def database_key(database_url: str) -> str:
    """The database an outcome belongs to, without its password."""
    url = make_url(database_url).set(password=None)
    return hashlib.sha256(url.render_as_string(hide_password=False).encode()).hexdigest()[:16]


class OutcomeSpool:
    """The host's file of kept outcomes (one SQLite table)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._warned = False

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=10)
        conn.execute(
            "CREATE TABLE IF NOT EXISTS kept_outcomes ("
            " run_id TEXT PRIMARY KEY, database TEXT NOT NULL, outcome TEXT NOT NULL)"
        )
        return conn

    def add(self, database: str, outcome: PendingOutcome) -> None:
        self._quietly(
            "keep",
            "INSERT OR REPLACE INTO kept_outcomes (run_id, database, outcome) VALUES (?, ?, ?)",
            (outcome.run_id, database, outcome.to_json()),
        )

    def remove(self, run_id: str) -> None:
        self._quietly("forget", "DELETE FROM kept_outcomes WHERE run_id = ?", (run_id,))

    def load(self, database: str) -> list[PendingOutcome]:
        if not self.path or not os.path.exists(self.path):
            return []
        try:
            with self._connect() as conn:
                rows = conn.execute(
                    "SELECT outcome FROM kept_outcomes WHERE database = ?", (database,)
                ).fetchall()
        except (sqlite3.Error, OSError) as error:
            self._warn("read", error)
            return []
        kept = []
        for (text,) in rows:
            try:
                kept.append(PendingOutcome.from_json(text))
            except (ValueError, TypeError, KeyError) as error:
                logger.warning("a kept outcome in %s does not read (%s); skipped", self.path, error)
        return kept

    def _quietly(self, what: str, sql: str, params: tuple[str, ...]) -> None:
        if not self.path:
            return
        try:
            with self._connect() as conn:
                conn.execute(sql, params)
        except (sqlite3.Error, OSError) as error:
            self._warn(what, error)

    def _warn(self, what: str, error: BaseException) -> None:
        # Once per process: the outcome is still kept in memory.
        if not self._warned:
            self._warned = True
            logger.warning(
                "could not %s an outcome in %s (%s): outcomes waiting for the database are "
                "kept in this process only (set routines_outcome_spool to a writable file)",
                what,
                self.path,
                error,
            )


class PendingOutcomes:
    """This process's outcomes waiting for one database, and the thread that
    writes them when it answers."""

    def __init__(
        self,
        database: str,
        spool: OutcomeSpool,
        write: Write,
        retry_every: float = RETRY_EVERY,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.database = database
        self.spool = spool
        self._write = write
        self._retry_every = retry_every
        self._sleep = sleep
        self._waiting: dict[str, PendingOutcome] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def keep(self, outcome: PendingOutcome) -> None:
        """Keep ``outcome`` until the database takes it."""
        self.spool.add(self.database, outcome)
        with self._lock:
            self._waiting[outcome.run_id] = outcome
        logger.warning(
            "the outcome of run %s of %s (%s) is kept until the database is back; "
            "the run is not lost",
            outcome.run_id,
            outcome.routine,
            "succeeded" if outcome.succeeded else "failed",
        )
        self._ensure_writer()

    def recover(self) -> int:
        """Take over the outcomes a previous worker on this host kept; how many."""
        kept = self.spool.load(self.database)
        with self._lock:
            fresh = [o for o in kept if o.run_id not in self._waiting]
            self._waiting.update((o.run_id, o) for o in fresh)
        if fresh:
            logger.info(
                "found %d outcome(s) a previous worker kept for the database; writing them",
                len(fresh),
            )
            self._ensure_writer()
        return len(fresh)

    @property
    def waiting(self) -> list[PendingOutcome]:
        with self._lock:
            return list(self._waiting.values())

    def write_all(self) -> bool:
        """Write what is waiting; False if the database is still away."""
        for outcome in self.waiting:
            try:
                self._write(outcome)
            except Exception as error:
                if is_connection_fault(error):
                    return False
                # Not the connection: it will not get better by waiting.
                logger.exception(
                    "could not write the kept outcome of run %s; dropped", outcome.run_id
                )
            else:
                logger.info(
                    "wrote the kept outcome of run %s of %s", outcome.run_id, outcome.routine
                )
            with self._lock:
                self._waiting.pop(outcome.run_id, None)
            self.spool.remove(outcome.run_id)
        return True

    def _ensure_writer(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(
                target=self._run, name="routines-kept-outcomes", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        # Sleeps in plain slices (no timed waits: see worker/heartbeat.py).
        while True:
            try:
                if self.write_all():
                    with self._lock:
                        if not self._waiting:
                            self._thread = None
                            return
            except Exception as error:
                logger.warning("writing kept outcomes failed (%s); trying again", cause_of(error))
            self._sleep(self._retry_every)
