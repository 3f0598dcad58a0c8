"""Which PostgreSQL connections prepare their statements on the server.

psycopg 3 prepares a statement on its fifth execution on a connection and
afterwards sends only its name: the server reuses the plan. That saves most
of the idle tick's cost (docs/pgbouncer.md), and is unsafe behind a pooler in
transaction mode, where the next transaction may run on a server session that
never saw the name. Every connection starts with it off (``postgres_connect_args``
in :mod:`celery_routines.store.engine`); :func:`chooser` turns it on per
connection, as ``routines_prepared_statements`` says.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from sqlalchemy.engine.interfaces import DBAPIConnection

# psycopg 3's own default: a statement is prepared on its fifth execution.
PREPARE_THRESHOLD = 5


def prepare_unless_pooled(dbapi_connection: DBAPIConnection, _record: object = None) -> None:
    """Turn psycopg's prepared statements on for a connection whose server is
    the one dialled, and leave them off for one that goes through a pooler
    or proxy (PgBouncer, pgcat, RDS Proxy, a TCP forwarder).

    The server says which address and port it took the connection on
    (``inet_server_addr()``/``inet_server_port()``); libpq says which it
    dialled. They are the same only when nothing sits between: a pooler
    dials the server itself, from its own socket, so the server reports its
    own port and address, not the pooler's. A Unix socket reports none, and
    is taken as possibly pooled (PgBouncer listens on one too): off, as for
    anything that does not match. So a bare server gets plans cached per
    session and a pooled one never sees a statement name it did not prepare.
    """
    info = dbapi_connection.info
    dialled = (getattr(info, "hostaddr", "") or "", getattr(info, "port", None))
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SELECT host(inet_server_addr()), inet_server_port()")
        row = cursor.fetchone()
    finally:
        cursor.close()
    dbapi_connection.rollback()  # leave the new connection idle, not in a transaction
    if row is not None and same_endpoint(dialled, (row[0], row[1])):
        dbapi_connection.prepare_threshold = PREPARE_THRESHOLD


def same_endpoint(dialled: tuple[str, int | None], served: tuple[str | None, int | None]) -> bool:
    """The address and port dialled are the ones the server took the connection on."""
    (dialled_host, dialled_port), (served_host, served_port) = dialled, served
    if not dialled_host or not served_host or dialled_port is None or served_port is None:
        return False
    try:
        same_host = ipaddress.ip_address(dialled_host) == ipaddress.ip_address(served_host)
    except ValueError:
        return False
    return same_host and int(dialled_port) == int(served_port)


def _prepare_always(dbapi_connection: DBAPIConnection, _record: object = None) -> None:
    dbapi_connection.prepare_threshold = PREPARE_THRESHOLD


def chooser(setting: str) -> Callable[[DBAPIConnection, object], None]:
    """The connect hook for ``routines_prepared_statements`` (``auto`` or ``on``)."""
    return _prepare_always if setting == "on" else prepare_unless_pooled
