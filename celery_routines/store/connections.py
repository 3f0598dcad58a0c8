"""Where the store's queries get their connection.

Outside a session every query checks a connection out of the pool on its own
(single statements run in autocommit on PostgreSQL and MySQL). Inside
:meth:`Connections.session` the thread keeps one connection, and inside
:meth:`Connections.transaction` every query of the thread runs in that one
transaction: a beat tick is two transactions on one connection, so it pays one
pool pre-ping and two BEGIN/COMMIT pairs, not one of each per statement.

Every query class built on the same engine shares the same ``Connections``
(see :func:`connections_for`): a second connection writing a row that the
held transaction has locked would wait for it forever.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from .dialects import is_mysql
from .engine import fast_engine

_shared: weakref.WeakKeyDictionary[Engine, Connections] = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


def connections_for(engine: Engine) -> Connections:
    """The one ``Connections`` of ``engine``."""
    with _shared_lock:
        found = _shared.get(engine)
        if found is None:
            found = _shared[engine] = Connections(engine)
        return found


class Connections:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # Single statements outside a transaction: autocommit on PostgreSQL,
        # no BEGIN/COMMIT round trips around a statement that is atomic anyway.
        self._fast = fast_engine(engine)
        # On PostgreSQL and MySQL the held connection is in autocommit too,
        # and a transaction is an explicit BEGIN ... COMMIT on it: a tick's
        # probes then cost one round trip each. SQLite takes its write lock at
        # BEGIN (see engine.py) and keeps SQLAlchemy's own transactions.
        self._explicit = engine.dialect.name == "postgresql" or is_mysql(engine)
        self._local = threading.local()

    def _held(self) -> Connection | None:
        return getattr(self._local, "connection", None)

    def _in_transaction(self, held: Connection) -> bool:
        if self._explicit:
            return bool(getattr(self._local, "in_transaction", False))
        return held.in_transaction()

    @contextmanager
    def session(self) -> Iterator[None]:
        """Keep one connection for this thread until the block ends."""
        if self._held() is not None:
            yield
            return
        with self._fast.connect() as connection:
            self._local.connection = connection
            try:
                yield
            except DBAPIError:
                # Whatever failed, the next session (a beat's next tick, its
                # retry) starts on a fresh connection: one whose server
                # session may have gone wrong (a pooler's, a failover's) is
                # not handed back to the pool to fail again.
                connection.invalidate()
                raise
            finally:
                self._local.connection = None

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Run every query of this thread inside the block in one transaction,
        committed at its end (rolled back if the block raises)."""
        with self.session():
            connection = self._held()
            assert connection is not None
            if self._in_transaction(connection):
                yield
            elif self._explicit:
                with self._explicit_transaction(connection):
                    yield
            else:
                with connection.begin():
                    yield

    @contextmanager
    def _explicit_transaction(self, connection: Connection) -> Iterator[None]:
        connection.exec_driver_sql("BEGIN")
        self._local.in_transaction = True
        try:
            yield
        except BaseException:
            self._local.in_transaction = False
            try:
                connection.exec_driver_sql("ROLLBACK")
            except Exception:
                connection.invalidate()  # the connection itself failed: drop it
            raise
        self._local.in_transaction = False
        connection.exec_driver_sql("COMMIT")

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A connection in a transaction: the held one, or a pooled one that
        commits when the block ends."""
        held = self._held()
        if held is None:
            with self.engine.begin() as connection:
                yield connection
        elif self._in_transaction(held):
            yield held
        else:
            with self.transaction():
                yield held

    @contextmanager
    def read(self) -> Iterator[Connection]:
        held = self._held()
        if held is None:
            with self.engine.connect() as connection:
                yield connection
        elif self._explicit or self._in_transaction(held):
            yield held
        else:
            # Commit the read's implicit transaction: a held connection left
            # "idle in transaction" would pin old row versions.
            with held.begin():
                yield held

    @contextmanager
    def fast_write(self) -> Iterator[Connection]:
        """:meth:`write` for one atomic statement (autocommit when not held)."""
        held = self._held()
        if held is None:
            with self._fast.begin() as connection:
                yield connection
        elif self._explicit:
            yield held  # in the open transaction, or one autocommitted statement
        else:
            with self.write() as connection:
                yield connection

    @contextmanager
    def fast_read(self) -> Iterator[Connection]:
        if self._held() is None:
            with self._fast.connect() as connection:
                yield connection
        else:
            with self.read() as connection:
                yield connection
