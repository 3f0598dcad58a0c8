"""Throwaway PostgreSQL and MariaDB/MySQL databases and Redis key spaces for the test run.

Locally a missing server skips its tests with the reason; with
ROUTINES_REQUIRE_SERVICES=1 (set by .ci/run) it fails them instead, so CI can
never go green by skipping.
"""

from __future__ import annotations

import os
import queue
import shutil
import socket
import sqlite3
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

PG_ADMIN_URL = os.environ.get("ROUTINES_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
MYSQL_ADMIN_URL = os.environ.get("ROUTINES_TEST_MYSQL", "mysql+pymysql://root@127.0.0.1:3306/mysql")
REDIS_HOST = os.environ.get("ROUTINES_TEST_REDIS_HOST", "127.0.0.1")
REDIS_PORT = int(os.environ.get("ROUTINES_TEST_REDIS_PORT", "6379"))
RABBITMQ_URL = os.environ.get("ROUTINES_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")


def services_required() -> bool:
    return os.environ.get("ROUTINES_REQUIRE_SERVICES", "") not in ("", "0", "false")


def unavailable(what: str, why: object) -> None:
    message = f"{what} is not reachable ({why}); start it or unset ROUTINES_REQUIRE_SERVICES"
    if services_required():
        pytest.fail(message, pytrace=False)
    pytest.skip(f"{what} is not reachable ({why})")


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


class PostgresDatabases:
    """Creates databases named routines_test_<random> and drops them after.

    ``create(migrated=True)`` copies a template migrated once per run
    (``CREATE DATABASE ... TEMPLATE`` copies files: about 30 ms, where the
    migrations take about 250 ms): a byte-for-byte copy of a fresh migration.
    """

    def __init__(self) -> None:
        import sqlalchemy

        self.admin = sqlalchemy.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with self.admin.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        self.created: list[str] = []
        self._template: str | None = None
        self._drops = BackgroundDrops(self.admin, 'DROP DATABASE IF EXISTS "{}" WITH (FORCE)')

    def create(self, *, migrated: bool = False) -> str:
        name = f"routines_test_{uuid.uuid4().hex[:12]}"
        template = f' TEMPLATE "{self._migrated_template()}"' if migrated else ""
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"{template}')
        self.created.append(name)
        return self.url(name)

    def url(self, name: str) -> str:
        return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name

    def _migrated_template(self) -> str:
        if self._template is None:
            url = self.create()
            migrate_and_close(url)  # no connection may stay: a template must be idle
            self._template = url.rsplit("/", 1)[1]
        return self._template

    def drop(self, url: str) -> None:
        """Drop one database, in the background (see BackgroundDrops)."""
        self._drops.drop(self.created, url)

    def drop_all(self) -> None:
        self._drops.drop_all(self.created)


class MySQLDatabases:
    """MariaDB/MySQL: creates databases named routines_test_<random> and
    drops them after.

    MariaDB has no template databases, and its migrations rebuild tables at
    each ALTER (about 400 ms). ``create(migrated=True)`` replays instead what
    ``SHOW CREATE TABLE`` says of a database migrated once per run, and copies
    its rows (the version table's): what mysqldump does, in about 60 ms.
    """

    def __init__(self) -> None:
        import sqlalchemy

        self.admin = sqlalchemy.create_engine(MYSQL_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with self.admin.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        self.created: list[str] = []
        self._template: tuple[str, list[str], list[str]] | None = None
        self._drops = BackgroundDrops(self.admin, "DROP DATABASE IF EXISTS `{}`")

    def create(self, *, migrated: bool = False) -> str:
        name = f"routines_test_{uuid.uuid4().hex[:12]}"
        with self.admin.connect() as conn:
            conn.exec_driver_sql(
                f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci"
            )
            self.created.append(name)
            if migrated:
                template, tables, filled = self._migrated_template()
                conn.exec_driver_sql(f"USE `{name}`")
                # The statements come in name order, not in foreign-key order.
                conn.exec_driver_sql("SET SESSION foreign_key_checks = 0")
                for statement in tables:
                    conn.exec_driver_sql(statement)
                for table in filled:
                    conn.exec_driver_sql(
                        f"INSERT INTO `{table}` SELECT * FROM `{template}`.`{table}`"
                    )
                conn.exec_driver_sql("SET SESSION foreign_key_checks = 1")
                conn.exec_driver_sql("USE mysql")
        return self.url(name)

    def url(self, name: str) -> str:
        return MYSQL_ADMIN_URL.rsplit("/", 1)[0] + "/" + name

    def _migrated_template(self) -> tuple[str, list[str], list[str]]:
        """The template's name, its CREATE TABLE statements, its tables with rows."""
        if self._template is None:
            url = self.create()
            migrate_and_close(url)
            name = url.rsplit("/", 1)[1]
            with self.admin.connect() as conn:
                tables = [
                    row[0]
                    for row in conn.exec_driver_sql(
                        "SELECT table_name FROM information_schema.tables "
                        "WHERE table_schema = %s AND table_type = 'BASE TABLE' ORDER BY table_name",
                        (name,),
                    )
                ]
                statements = [
                    conn.exec_driver_sql(f"SHOW CREATE TABLE `{name}`.`{table}`").one()[1]
                    for table in tables
                ]
                filled = [
                    table
                    for table in tables
                    if conn.exec_driver_sql(f"SELECT 1 FROM `{name}`.`{table}` LIMIT 1").first()
                ]
            self._template = (name, statements, filled)
        return self._template

    def drop(self, url: str) -> None:
        """Drop one database, in the background (see BackgroundDrops): a
        test's leftovers would otherwise accumulate on disk for the whole run."""
        self._drops.drop(self.created, url)

    def drop_all(self) -> None:
        self._drops.drop_all(self.created)


class BackgroundDrops:
    """Drops the databases of finished tests in a thread of its own.

    A DROP DATABASE costs 0.1-0.2 s of the server's time (PostgreSQL
    checkpoints for it); a run creates hundreds, and dropping them in the
    tests' teardown, or all at the end, added one and a half minutes to it.
    The thread only waits on the server, which works meanwhile on its own
    core. What it failed to drop, ``finish`` returns for a last try.
    """

    def __init__(self, admin: Any, statement: str) -> None:
        self.admin = admin
        self.statement = statement
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._failed: list[str] = []

    def drop(self, created: list[str], url: str) -> None:
        """Take ``url``'s database off ``created`` and drop it in the background."""
        name = url.rsplit("/", 1)[1]
        created.remove(name)
        self.put(name)

    def drop_all(self, created: list[str]) -> None:
        """At the end of the run: drop ``created`` and what the thread failed
        to drop, then close the admin engine."""
        leftovers = self.finish()
        with self.admin.connect() as conn:
            for name in [*created, *leftovers]:
                conn.exec_driver_sql(self.statement.format(name))
        self.admin.dispose()

    def put(self, name: str) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._drop, name="test-db-drops", daemon=True)
            self._thread.start()
        self._queue.put(name)

    def finish(self) -> list[str]:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        failed, self._failed = self._failed, []
        return failed

    def _drop(self) -> None:
        while (name := self._queue.get()) is not None:
            try:
                with self.admin.connect() as conn:
                    conn.exec_driver_sql(self.statement.format(name))
            except Exception:
                self._failed.append(name)


class SQLiteTemplate:
    """A SQLite file migrated once per run; ``copy_to`` gives a test its own
    copy (a file copy, where the migrations take about 50 ms)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "migrated.db"
        migrate_and_close(f"sqlite:///{self.path}")
        # Everything in the main file: a copy must not need the WAL beside it.
        with sqlite3.connect(self.path) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()

    def copy_to(self, path: Path) -> None:
        shutil.copyfile(self.path, path)


def migrate_and_close(url: str) -> None:
    from celery_routines.store import Store

    store = Store.from_url(url)
    try:
        store.migrate()
    finally:
        store.dispose()


def free_redis_db() -> int:
    """An empty Redis database number for this run (flushed when it ends).

    Each pytest-xdist worker is a session of its own and claims its own
    number here (SET NX on an empty database: two workers never get the same
    one); the databases above are named at random per worker the same way."""
    import redis

    for number in range(15, 0, -1):
        client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=number)
        try:
            if client.dbsize() == 0 and client.set("celery_routines:test-owner", "1", nx=True):
                return number
        finally:
            client.close()
    raise RuntimeError("no empty Redis database among 1..15")
