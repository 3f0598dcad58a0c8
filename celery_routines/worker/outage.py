"""Riding out a database the worker cannot reach for a while.

A failover, a pooler restart or a dropped NAT entry looks, from the worker,
like a statement whose connection is reset mid-way or a connection that
cannot be opened for a few seconds. Each of the worker's statements (the
claim, a heartbeat, the outcome) is safe to run again: one conditional
UPDATE, and one whose earlier try may have landed is told so by the caller
(:class:`Attempts.uncertain`). So a statement that fails for a connection
reason is tried again with a short back-off for ``routines_database_patience``
seconds, measured on the monotonic clock, before the caller gives up and
hands the work on (a claim: the delivery back to the broker; an outcome: to
:mod:`celery_routines.worker.pending`).

Errors that are not about the connection (a constraint, a bug) are raised at
once: retrying them would only hide them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import exc as sa_exc

from celery_routines.store.faults import cause_of, connection_cut, database_unreachable

logger = logging.getLogger("celery_routines.worker")
T = TypeVar("T")

# The first retry comes this soon (seconds); each wait doubles up to the cap,
# so a blip of a second costs about a second, and a long outage a try every
# couple of seconds rather than a busy loop.
FIRST_WAIT = 0.1
MOST_WAIT = 2.0


def is_connection_fault(error: BaseException) -> bool:
    """The statement failed because the database could not be reached or the
    connection broke (reset, refused, timed out), not because of what it
    said (:mod:`celery_routines.store.faults`); a pool that could not hand
    out a connection in time is one too, and so is a statement that already
    gave up on one."""
    if isinstance(error, DatabaseUnreachable):
        return True
    return database_unreachable(error) or isinstance(error, sa_exc.TimeoutError)


def log_failure(what: str, error: BaseException) -> None:
    """``could not <what>``: one WARNING line with the cause for a database
    that could not be reached (expected in production; the traceback at
    DEBUG), the full traceback at ERROR for anything else (a bug)."""
    if is_connection_fault(error):
        logger.warning("could not %s: the database is unreachable (%s)", what, cause_of(error))
        logger.debug("could not %s", what, exc_info=error)
    else:
        logger.error("could not %s", what, exc_info=error)


@dataclass
class Attempts:
    """How a statement run through :func:`patiently` went."""

    tries: int = 0
    # A try failed after the statement may have reached the database (a
    # connection cut mid-way): a later try must allow for its having landed.
    uncertain: bool = False


class DatabaseUnreachable(Exception):
    """A worker statement kept failing for connection reasons for the whole
    of ``routines_database_patience``."""

    def __init__(self, what: str, seconds: float, attempts: Attempts, cause: BaseException):
        self.what = what
        self.seconds = seconds
        self.attempts = attempts
        self.cause = cause
        super().__init__(
            f"could not {what}: the database was unreachable for {seconds:.1f} s "
            f"({attempts.tries} tries; last: {cause_of(cause)})"
        )


def patiently(
    statement: Callable[[Attempts], T],
    *,
    what: str,
    patience: float,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> T:
    """Run ``statement`` (given the attempts so far), trying again after a
    connection fault until ``patience`` seconds have passed; then raise
    :class:`DatabaseUnreachable`. Any other error is raised at once."""
    attempts = Attempts()
    started = monotonic()
    wait = FIRST_WAIT
    warned = False
    while True:
        attempts.tries += 1
        try:
            result = statement(attempts)
        except Exception as error:
            if not is_connection_fault(error):
                raise
            attempts.uncertain = True  # it may have reached the server before the cut
            waited = monotonic() - started
            if waited + wait > patience:
                raise DatabaseUnreachable(what, waited, attempts, error) from error
            if attempts.tries == 1 and connection_cut(error):
                # A kept or pooled connection found cut (connections are
                # pinged only after sitting idle): a fresh one, at once.
                logger.info("could not %s: its connection was cut (%s); trying again at once",
                            what, cause_of(error))  # fmt: skip
                continue
            if not warned:
                warned = True
                logger.warning(
                    "could not %s: the database is unreachable (%s); trying again for up to %.0f s",
                    what,
                    cause_of(error),
                    patience,
                )
            sleep(wait)
            wait = min(wait * 2, MOST_WAIT)
            continue
        if warned:
            logger.info(
                "%s: done after %d tries (%.1f s), the database is reachable again",
                what,
                attempts.tries,
                monotonic() - started,
            )
        return result
