"""Throwaway PostgreSQL and MariaDB/MySQL databases and Redis key spaces for the test run.

Locally a missing server skips its tests with the reason; with
ROUTINES_REQUIRE_SERVICES=1 (set by .ci/run) it fails them instead, so CI can
never go green by skipping.
"""

from __future__ import annotations

import os
import socket
import uuid

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
    """Creates databases named routines_test_<random> and drops them after."""

    def __init__(self) -> None:
        import sqlalchemy

        self.admin = sqlalchemy.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with self.admin.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        self.created: list[str] = []

    def create(self) -> str:
        name = f"routines_test_{uuid.uuid4().hex[:12]}"
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name

    def drop_all(self) -> None:
        with self.admin.connect() as conn:
            for name in self.created:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.admin.dispose()


class MySQLDatabases:
    """MariaDB/MySQL: creates databases named routines_test_<random> and
    drops them after."""

    def __init__(self) -> None:
        import sqlalchemy

        self.admin = sqlalchemy.create_engine(MYSQL_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with self.admin.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        self.created: list[str] = []

    def create(self) -> str:
        name = f"routines_test_{uuid.uuid4().hex[:12]}"
        with self.admin.connect() as conn:
            conn.exec_driver_sql(
                f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci"
            )
        self.created.append(name)
        return MYSQL_ADMIN_URL.rsplit("/", 1)[0] + "/" + name

    def drop(self, url: str) -> None:
        """Drop one database now: a test's leftovers would otherwise
        accumulate on disk for the whole run."""
        name = url.rsplit("/", 1)[1]
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        if name in self.created:
            self.created.remove(name)

    def drop_all(self) -> None:
        with self.admin.connect() as conn:
            for name in self.created:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        self.admin.dispose()


def free_redis_db() -> int:
    """An empty Redis database number for this run (flushed when it ends)."""
    import redis

    for number in range(15, 0, -1):
        client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=number)
        try:
            if client.dbsize() == 0 and client.set("celery_routines:test-owner", "1", nx=True):
                return number
        finally:
            client.close()
    raise RuntimeError("no empty Redis database among 1..15")
