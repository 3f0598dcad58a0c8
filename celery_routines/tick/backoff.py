"""How long beat waits after a failed tick, and what it says about it.

A failed tick backs off, doubling from ERROR_BACKOFF_START, so a long outage
costs a few log lines, not a hot loop. A tick whose connection was cut
(connections are not pinged between close ticks: see beat's
PING_MARGIN_SECONDS) is tried again at once on a new one. While the database
cannot be reached at all (a restart, a failover), the back-off stops growing
at DATABASE_BACKOFF_CAP: the first send after a standby is promoted then
comes within that many seconds, not within ERROR_BACKOFF_CAP (it came 11.8 s
after the promotion of a 20 s failover: tests/topology/test_pg_failover.py).
A connection attempt every few seconds costs nothing; such an outage is
logged once, with its traceback, and once more when it ends.
"""

from __future__ import annotations

import logging
import time

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from .send import CLAIM_TRUSTED_SHARE

ERROR_BACKOFF_START = 1.0
ERROR_BACKOFF_CAP = 30.0
DATABASE_BACKOFF_CAP = 2.0
# MySQL client errors that mean the server is away: can't connect (local,
# TCP), gone away, lost the connection, lost it at the handshake.
MYSQL_UNREACHABLE = frozenset({2002, 2003, 2006, 2013, 2055})


class TickBackoff:
    """Beat's wait after each failed tick, and its log lines (on ``logger``)."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.current = 0.0  # seconds; 0 while ticks succeed
        self._outage: tuple[float, int] | None = None  # unreachable since, failed ticks

    def failed(self, exc: BaseException, longest: float) -> float:
        """Seconds to wait before the next tick after ``exc`` (``longest`` at most)."""
        if connection_cut(exc) and not self.current:
            self.current = ERROR_BACKOFF_START / 2  # the next failure backs off
            self.logger.warning(
                "beat tick failed: its database connection was cut (%s); trying again at "
                "once on a new connection",
                first_line(exc),
            )
            return 0.0
        unreachable = database_unreachable(exc)
        cap = DATABASE_BACKOFF_CAP if unreachable else ERROR_BACKOFF_CAP
        self.current = min(max(self.current * 2, ERROR_BACKOFF_START), cap)
        wait = min(self.current, longest)
        if unreachable and self._outage is not None:
            since, failed = self._outage
            self._outage = (since, failed + 1)
            self.logger.debug("beat tick failed again; trying again in %.0f s", wait, exc_info=exc)
            return wait
        if unreachable:
            self._outage = (time.monotonic(), 1)
        self.logger.error(
            "beat tick failed; trying again in %.0f s%s",
            wait,
            f" (then every {cap:.0f} s at most while the database is unreachable; "
            "said again when it is back)"
            if unreachable
            else "",
            exc_info=exc,
        )
        return wait

    def succeeded(self) -> None:
        if self.current:
            if self._outage is not None:
                since, failed = self._outage
                self.logger.info(
                    "beat tick succeeded again: the database was unreachable for %.1f s "
                    "(%d failed ticks)",
                    time.monotonic() - since,
                    failed,
                )
            else:
                self.logger.info("beat tick succeeded again after errors")
            self.current = 0.0
        self._outage = None


def ledger_deadline(holding: bool, lock_ttl: float) -> float:
    """How long a failed tick may wait before the next: while beat holds
    runs it published and has not written down (``holding``), a quarter of
    ``routines_lock_ttl`` at most, so the write-down is tried again several
    times before its claims expire (once they have, another beat takes the
    routines over and sends those runs again)."""
    if not holding:
        return float("inf")
    return max(ERROR_BACKOFF_START, lock_ttl * CLAIM_TRUSTED_SHARE)


def connection_cut(exc: BaseException) -> bool:
    """True when ``exc`` says the connection died (the pool has replaced it)."""
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def database_unreachable(exc: BaseException) -> bool:
    """True when ``exc`` says the database could not be reached or dropped
    the connection (refused, no server taking writes yet, shutting down),
    not that it refused a statement (a deadlock is an OperationalError too)."""
    if connection_cut(exc):
        return True
    if not isinstance(exc, (OperationalError, InterfaceError)):
        return False
    orig = exc.orig
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate is not None:  # psycopg: class 08 connection exception, 57P shutting down
        return str(sqlstate).startswith(("08", "57P"))
    code = orig.args[0] if orig is not None and orig.args else None
    if isinstance(code, int):  # PyMySQL
        return code in MYSQL_UNREACHABLE
    return True  # a client-side failure to connect (psycopg gives it no SQLSTATE)


def first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
