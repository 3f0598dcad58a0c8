"""PyMySQL against mysqlclient on the store's own work: the idle tick (the
probe, one SELECT), a tick with 10 due, and a burst of 10,000 due windows
(claim, overlap check, run rows, marked sent, routines advanced).

    python -m benchmarks.mysql_drivers [--admin mysql+pymysql://root@127.0.0.1/mysql]

Needs both drivers (``pip install pymysql mysqlclient``; mysqlclient builds
against the MariaDB/MySQL client headers). Each driver gets its own throwaway
database with the same rows; the drivers alternate round by round so that a
busy machine slows both alike. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import create_engine, text

from celery_routines.store import Advance, NewRun, Store

DRIVERS = ("pymysql", "mysqldb")
STORED = 1000
HOT = 10
BURST = 10_000


def _load(store: Store, t0: datetime, due: int) -> None:
    naive = t0.replace(tzinfo=None)
    far = naive + timedelta(days=1)
    rows = [
        {"n": f"bench-{i}", "at": naive if i < due else far + timedelta(seconds=i)}
        for i in range(max(STORED, due))
    ]
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO routines (name, task, interval_seconds, next_run_at)"
                " VALUES (:n, 'bench.noop', 60, :at)"
            ),
            rows,
        )


def _work(store: Store, now: datetime) -> int:
    """The database side of one tick with work: what tick.py does around its messages."""
    with store.session():
        store.probe(now, "bench")
        with store.transaction():
            claimed = store.routines.claim_due(now, "bench", 60, BURST)
            store.runs.open_runs([r.id for r in claimed])
            runs = [
                NewRun(str(uuid.uuid4()), r.id, f"{r.name}@{r.next_run_at.isoformat()}", 1, now)
                for r in claimed
            ]
            inserted = store.runs.insert_new(runs, now)
        store.runs.mark_sent(list(inserted), now)
        store.routines.advance(
            [Advance(r.id, now + timedelta(days=2)) for r in claimed], "bench", now
        )
        store.probe(now, "bench")
    return len(inserted)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--admin", default="mysql+pymysql://root@127.0.0.1:3306/mysql")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--probes", type=int, default=300)
    args = parser.parse_args()
    admin = create_engine(args.admin, isolation_level="AUTOCOMMIT")
    base = args.admin.rsplit("/", 1)[0].split("://", 1)[1]
    samples: dict[str, dict[str, list[float]]] = {
        d: {"idle_ms": [], "ten_due_ms": [], "burst_s": []} for d in DRIVERS
    }
    t0 = datetime(2026, 11, 30, 12, tzinfo=UTC)
    for _ in range(args.rounds):
        for driver in DRIVERS:
            for scenario, due in (("ten_due_ms", HOT), ("burst_s", BURST)):
                name = f"routines_drivers_{uuid.uuid4().hex[:8]}"
                with admin.connect() as conn:
                    conn.exec_driver_sql(f"CREATE DATABASE `{name}`")
                store = Store.from_url(f"mysql+{driver}://{base}/{name}")
                try:
                    store.migrate()
                    _load(store, t0, due)
                    if scenario == "ten_due_ms":
                        with store.session():
                            started = time.perf_counter()
                            for _ in range(args.probes):
                                store.probe(t0 - timedelta(seconds=1), "bench")
                            idle = (time.perf_counter() - started) / args.probes
                        samples[driver]["idle_ms"].append(idle * 1000)
                    started = time.perf_counter()
                    sent = _work(store, t0)
                    elapsed = time.perf_counter() - started
                    assert sent == due, (sent, due)
                    samples[driver][scenario].append(
                        elapsed * 1000 if scenario == "ten_due_ms" else elapsed
                    )
                finally:
                    store.dispose()
                    with admin.connect() as conn:
                        conn.exec_driver_sql(f"DROP DATABASE `{name}`")
    print(
        json.dumps(
            {
                driver: {k: round(statistics.median(v), 3) for k, v in figures.items()}
                for driver, figures in samples.items()
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
