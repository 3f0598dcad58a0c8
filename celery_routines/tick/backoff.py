"""How long beat waits after a failed tick, and what it says about it.

A failed tick backs off, doubling from ERROR_BACKOFF_START, so a long outage
costs a few log lines, not a hot loop. A tick whose connection was cut
(connections are not pinged between close ticks: see beat's
PING_MARGIN_SECONDS) is tried again at once on a new one. While the database
cannot be reached at all (a restart, a failover, a pooler's restart), the
back-off stops growing at DATABASE_BACKOFF_CAP: the first send after a
standby is promoted then comes within that many seconds, not within
ERROR_BACKOFF_CAP (it came 11.8 s after the promotion of a 20 s failover:
tests/topology/test_pg_failover.py). A connection attempt every few seconds
costs nothing.

A connection fault is expected in production, so it is said as an outage, in
one line each, with no traceback (that is at DEBUG): a WARNING when it
begins, another every OUTAGE_REMINDER_EVERY while it lasts, and an INFO when
the database answers again. Any other error is a bug, a refused statement or
missing tables: an ERROR line at every failed tick with the error's class and
first line (no statement, no parameters); its traceback is at DEBUG, except a
bug's (not the database's error) the first time it fails a tick in a row.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

from celery_routines.store.faults import (
    cause_of,
    connection_cut,
    database_unreachable,
    from_the_database,
    tables_missing,
)

from .send import CLAIM_TRUSTED_SHARE

ERROR_BACKOFF_START = 1.0
ERROR_BACKOFF_CAP = 30.0
DATABASE_BACKOFF_CAP = 2.0
# While an outage lasts, one line this often says it still does.
OUTAGE_REMINDER_EVERY = 60.0


class _Outage:
    """Connection faults in a row: since when, how many ticks, said when."""

    def __init__(self, now: float) -> None:
        self.since = now
        self.failed_ticks = 0
        self.said_at = now


class TickBackoff:
    """Beat's wait after each failed tick, and its log lines (on ``logger``)."""

    def __init__(
        self, logger: logging.Logger, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.logger = logger
        self.monotonic = monotonic
        self.current = 0.0  # seconds; 0 while ticks succeed
        self._outage: _Outage | None = None
        self._bug_said: str | None = None  # the bug whose traceback this streak showed

    def failed(self, exc: BaseException, longest: float, unrecorded: str | None = None) -> float:
        """Seconds to wait before the next tick after ``exc`` (``longest`` at
        most). ``unrecorded``: what this beat published and has not written
        down yet (its ledger), None when nothing."""
        if not connection_fault(exc):
            self._outage = None
            self.current = min(max(self.current * 2, ERROR_BACKOFF_START), ERROR_BACKOFF_CAP)
            wait = min(self.current, longest)
            # One line per failed tick: SQLAlchemy's text of an error carries
            # the statement and its parameters, and a traceback at every
            # back-off buries the log; both are at DEBUG. A bug (an error
            # that is not the database's) shows its traceback once, the first
            # time it fails a tick: without it nobody can report it.
            bug = not from_the_database(exc) and cause_of(exc) != self._bug_said
            self.logger.error(
                "beat tick failed: %s; trying again in %.0f s",
                _refused(exc),
                wait,
                exc_info=exc if bug else None,
            )
            if bug:
                self._bug_said = cause_of(exc)
            else:
                self.logger.debug("beat tick failed (%s) in full", cause_of(exc), exc_info=exc)
            return wait
        now = self.monotonic()
        outage = self._outage
        if connection_cut(exc) and outage is None:
            # A connection cut between two ticks: the pool has dropped it,
            # and the next tick, at once, takes a fresh one.
            wait = 0.0
            self.current = ERROR_BACKOFF_START / 2  # a second failure backs off
            plan = "trying again at once on a new connection"
        else:
            self.current = min(max(self.current * 2, ERROR_BACKOFF_START), DATABASE_BACKOFF_CAP)
            wait = min(self.current, longest)
            plan = (
                f"trying again in {wait:.0f} s, then every {DATABASE_BACKOFF_CAP:.0f} s "
                "at most while it stays unreachable"
            )
        if outage is None:
            outage = self._outage = _Outage(now)
            outage.failed_ticks = 1
            self.logger.warning(
                "beat tick failed: %s (%s); %s; %s",
                what_failed(exc),
                cause_of(exc),
                _left(unrecorded),
                plan,
            )
        else:
            outage.failed_ticks += 1
            if now - outage.said_at >= OUTAGE_REMINDER_EVERY:
                outage.said_at = now
                self.logger.warning(
                    "beat tick failed: the database is still unreachable after %.0f s "
                    "(%d failed ticks; last: %s); %s; trying again every %.0f s",
                    now - outage.since,
                    outage.failed_ticks,
                    cause_of(exc),
                    _left(unrecorded),
                    DATABASE_BACKOFF_CAP,
                )
        self.logger.debug("beat tick failed (%s) in full", cause_of(exc), exc_info=exc)
        return wait

    def succeeded(self) -> None:
        outage, self._outage = self._outage, None
        if outage is not None:
            self.logger.info(
                "database reachable again after %.1f s, %d failed tick(s); ticking as usual",
                self.monotonic() - outage.since,
                outage.failed_ticks,
            )
        elif self.current:
            self.logger.info("beat tick succeeded again after errors")
        self.current = 0.0
        self._bug_said = None


def _refused(exc: BaseException) -> str:
    """A failure that is not an outage, in one line: its class and message."""
    if tables_missing(exc):
        return (
            f"the store's tables are missing ({cause_of(exc)}); the next tick creates them "
            "and declares the code's routines again, as at beat start"
        )
    return cause_of(exc)


def _left(unrecorded: str | None) -> str:
    """What the failed tick leaves behind, for the operator who wonders
    whether anything was sent twice or lost."""
    if unrecorded is None:
        return "no sent run is left unrecorded (runs not sent stay due)"
    return f"{unrecorded} not written down yet (the next tick writes them first, never resends)"


def ledger_deadline(holding: bool, lock_ttl: float) -> float:
    """How long a failed tick may wait before the next: while beat holds
    runs it published and has not written down (``holding``), a quarter of
    ``routines_lock_ttl`` at most, so the write-down is tried again several
    times before its claims expire (once they have, another beat takes the
    routines over and sends those runs again)."""
    if not holding:
        return float("inf")
    return max(ERROR_BACKOFF_START, lock_ttl * CLAIM_TRUSTED_SHARE)


def connection_fault(exc: BaseException) -> bool:
    """True for the errors a network or a server going away gives: the
    database unreachable or its connection cut, Redis or the broker not
    answering. Not a statement the server refused, nor a bug."""
    return database_unreachable(exc) or _service_unreachable(exc)


def _service_unreachable(exc: BaseException) -> bool:
    """Redis's or the broker's connection errors. Looked up among the modules
    already loaded: an error of a library this process never imported
    cannot be the one raised (and beat need not have redis installed)."""
    classes: list[type[BaseException]] = []
    redis_exceptions = sys.modules.get("redis.exceptions")
    if redis_exceptions is not None:
        classes += [redis_exceptions.ConnectionError, redis_exceptions.TimeoutError]
    kombu_exceptions = sys.modules.get("kombu.exceptions")
    if kombu_exceptions is not None:
        classes.append(kombu_exceptions.OperationalError)
    amqp_exceptions = sys.modules.get("amqp.exceptions")
    if amqp_exceptions is not None:
        classes.append(amqp_exceptions.ConnectionError)
    return isinstance(exc, tuple(classes))


def what_failed(exc: BaseException) -> str:
    """The fault in an operator's words."""
    if connection_cut(exc):
        return "its database connection was cut"
    if database_unreachable(exc):
        return "the database is unreachable"
    module = type(exc).__module__.split(".", 1)[0]
    if module == "redis":
        return "Redis is unreachable"
    return "the broker is unreachable"
