"""Shared plumbing: throwaway databases, the Redis key space, timing, memory.

Every measurement runs in its own subprocess (``benchmarks.measure``) so that
RSS is that of one scheduler only; the orchestrator (``benchmarks.run``) owns
the throwaway PostgreSQL databases and the Redis database number.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

PG_ADMIN_URL = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
MYSQL_ADMIN_URL = os.environ.get("BENCH_MYSQL", "mysql+pymysql://root@127.0.0.1:3306/mysql")
REDIS_HOST = os.environ.get("BENCH_REDIS_HOST", "127.0.0.1")
REDIS_PORT = int(os.environ.get("BENCH_REDIS_PORT", "6379"))
# Keeps our Redis database non-empty while we own it, so the test suite's
# "first empty database" picker (tests/services.py) never takes it from us.
OWNER_KEY = "celery_routines:bench-owner"

TASK = "bench.noop"
QUEUE = "celery"
HOT = 10  # routines due at each measured tick
BURST = 10_000  # windows due at the same instant in the burst
DAY = 86_400


def log(message: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", file=sys.stderr, flush=True)


# -- PostgreSQL ----------------------------------------------------------------


def pg_admin() -> Any:
    import sqlalchemy

    return sqlalchemy.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")


def create_database(label: str, mysql: bool = False) -> tuple[str, str]:
    """A new empty database (PostgreSQL, or MariaDB/MySQL); returns (name, SQLAlchemy URL)."""
    name = f"routines_bench_{label}_{uuid.uuid4().hex[:8]}".lower().replace("-", "_")
    admin = mysql_admin() if mysql else pg_admin()
    quoted = f"`{name}`" if mysql else f'"{name}"'
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {quoted}")
    admin.dispose()
    base = MYSQL_ADMIN_URL if mysql else PG_ADMIN_URL
    return name, base.rsplit("/", 1)[0] + "/" + name


def drop_database(name: str, mysql: bool = False) -> None:
    admin = mysql_admin() if mysql else pg_admin()
    with admin.connect() as conn:
        if mysql:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        else:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


def mysql_admin() -> Any:
    import sqlalchemy

    return sqlalchemy.create_engine(MYSQL_ADMIN_URL, isolation_level="AUTOCOMMIT")


# -- Redis -----------------------------------------------------------------------


def redis_client(db: int) -> Any:
    import redis

    return redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=db)


def redis_url(db: int) -> str:
    return f"redis://{REDIS_HOST}:{REDIS_PORT}/{db}"


def claim_redis_db() -> int:
    """An empty Redis database number, marked as ours until released."""
    for number in range(15, 0, -1):
        client = redis_client(number)
        try:
            if client.dbsize() == 0 and client.set(OWNER_KEY, str(os.getpid()), nx=True):
                return number
        finally:
            client.close()
    raise RuntimeError("no empty Redis database among 1..15")


def clear_redis_db(db: int, keep_owner: bool = True) -> None:
    """Delete every key but our owner mark (no FLUSHDB: that would free the
    number for a concurrent test run to take while we still use it)."""
    client = redis_client(db)
    try:
        batch = []
        for key in client.scan_iter(count=5000):
            if keep_owner and key == OWNER_KEY.encode():
                continue
            batch.append(key)
            if len(batch) >= 5000:
                client.unlink(*batch)
                batch = []
        if batch:
            client.unlink(*batch)
        if not keep_owner:
            client.delete(OWNER_KEY)
    finally:
        client.close()


def declare_queue(app: Any) -> None:
    """Declare the default queue so the Redis transport keeps what is published."""
    with app.connection_for_write() as conn:
        app.amqp.queues[app.conf.task_default_queue](conn.default_channel).declare()


def queue_length(client: Any) -> int:
    return int(client.llen(QUEUE))


# -- measuring -------------------------------------------------------------------


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 1e6


def cpu_seconds() -> float:
    import psutil

    times = psutil.Process().cpu_times()
    return times.user + times.system


@dataclass
class Timed:
    seconds: float
    value: Any


def timed(fn: Callable[[], Any]) -> Timed:
    started = time.perf_counter()
    value = fn()
    return Timed(time.perf_counter() - started, value)


def summary_ms(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {
        "median_ms": statistics.median(ms),
        "p90_ms": ms[min(len(ms) - 1, int(len(ms) * 0.9))],
        "min_ms": ms[0],
        "n": len(ms),
    }


def emit(result: dict[str, Any]) -> None:
    """The measuring subprocess's answer: one JSON line on stdout."""
    print("RESULT " + json.dumps(result, default=str), flush=True)


def naive_utc(instant: datetime) -> datetime:
    return instant.astimezone(UTC).replace(tzinfo=None)
