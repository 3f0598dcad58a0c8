"""Cutting a beat's real database connection at a chosen statement.

:func:`shut_down_socket` shuts the TCP socket under a psycopg connection down
(both ways, from the client's side): libpq's next read or write fails as a
reset connection does, with psycopg's own ``server closed the connection
unexpectedly``, and the server sees the connection go and rolls back its
open transaction. Nothing is simulated past that point: the driver, the
pool's invalidation and the server's rollback are the real ones.

:class:`ConnectionCut` hooks a beat's engine and cuts the connection of the
first statement that starts with ``prefix`` once armed: ``before``, the
statement never reaches the server; ``after``, the server ran it (and, for a
COMMIT or an autocommitted statement, made it durable) and the answer is
lost with the connection (the driver's own error, from its next round trip
on the reset socket).
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine, event


def shut_down_socket(connection: Connection | psycopg.Connection[Any]) -> None:
    """Reset ``connection``'s socket from the client's side."""
    driver = connection
    if isinstance(connection, Connection):
        driver = connection.connection.driver_connection  # type: ignore[assignment]
    assert isinstance(driver, psycopg.Connection)
    # A duplicate of the descriptor: shutdown acts on the socket itself (every
    # descriptor of it), and closing the duplicate leaves libpq's own intact.
    duplicate = socket.socket(fileno=os.dup(driver.pgconn.socket))
    try:
        duplicate.shutdown(socket.SHUT_RDWR)
    finally:
        duplicate.close()


class ConnectionCut:
    def __init__(self, engine: Engine, prefix: str, mode: str) -> None:
        assert mode in ("before", "after")
        self.prefix = prefix
        self.mode = mode
        self.armed = False
        self.cut: str | None = None  # the statement whose connection was cut
        self._lock = threading.Lock()
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)

    def arm(self) -> None:
        self.armed = True

    def _take(self, statement: str) -> bool:
        shown = " ".join(statement.split())
        with self._lock:
            if not self.armed or self.cut is not None or not shown.startswith(self.prefix):
                return False
            self.cut = shown[:90]
            self.armed = False
            return True

    def _before(self, _conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if self.mode == "before" and self._take(statement):
            shut_down_socket(cursor.connection)  # psycopg fails the statement itself

    def _after(self, _conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if self.mode == "after" and self._take(statement):
            driver = cursor.connection
            shut_down_socket(driver)
            # The server has answered; the answer is lost with the connection.
            # The driver's next round trip meets the reset, and that real error
            # (its words, the connection marked broken) is what the beat sees.
            try:
                driver.execute("SELECT 1")
            except psycopg.OperationalError as exc:
                raise exc from None
            raise AssertionError("a statement on a shut-down socket did not fail")
