"""Where a tick with 10 routines due spends its time, beside its floors, one run.

    python -m benchmarks.tick_breakdown [--size 1000000] [--ticks 40]

Issue 19, item 1 asks for a tick with 10 due under 1 ms above Celery's cost of
publishing 10 messages. This prints, for the median tick (PostgreSQL store,
Redis broker and gate, every guarantee on; ``--size`` routines stored):

- the SQL: statements and the time spent in the driver for them, recorded at
  the cursor (SQLAlchemy's ``before/after_cursor_execute``), COMMITs apart;
- publishing (the publisher's ``publish_many``) and the Redis gate;
- what is left: Python (deciding, building rows, logging).

and, measured in the same run, the floors under them: ``send_task`` batched
for 10 messages (``benchmarks.publish_floor``) and one durable single-row
``UPDATE`` through psycopg alone (``benchmarks.worker_cost``). A tick with
something due must commit twice (the run rows before any message goes out,
so a worker finds the row it claims; the bookkeeping after, so a failure never
republishes): two durable commits are part of its floor.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import event

from .common import HOT, claim_redis_db, clear_redis_db, create_database, drop_database, log
from .measure import one_pass
from .peers import Routines
from .publish_floor import send_task_batched_ms
from .worker_cost import durable_commit_ms


class Timed:
    """Wall time and calls of one callable attribute, wrapped in place."""

    def __init__(self, owner: Any, name: str) -> None:
        self.seconds = 0.0
        self.calls = 0
        inner: Callable[..., Any] = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
                self.calls += 1

        setattr(owner, name, wrapper)


class CursorClock:
    """Statements and driver time at the cursor; COMMITs counted apart."""

    def __init__(self, engine: Any) -> None:
        self.statements = self.commits = 0
        self.sql_s = self.commit_s = 0.0
        self._started = 0.0
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)
        event.listen(engine, "commit", self._commit_before)

    def _before(self, *_: Any) -> None:
        self._started = time.perf_counter()

    def _after(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        spent = time.perf_counter() - self._started
        if statement.strip().upper() == "COMMIT":
            self.commits += 1
            self.commit_s += spent
        else:
            self.statements += 1
            self.sql_s += spent

    def _commit_before(self, *_: Any) -> None:
        # A commit through SQLAlchemy's Transaction (not a COMMIT statement) is
        # not a cursor execute: count it; its time stays in the "rest".
        self.commits += 1

    def reset(self) -> None:
        self.statements = self.commits = 0
        self.sql_s = self.commit_s = 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--ticks", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()

    db = claim_redis_db()
    name, pg_url = create_database("breakdown")
    try:
        peer = Routines(args.size, "steady", db, pg_url)
        log(f"loading {args.size:,} routines")
        peer.load()
        scheduler = peer.make()
        scheduler.tick()
        engine = scheduler.engine
        cursor = CursorClock(engine.store.engine)
        publish = Timed(engine.publisher, "publish_many")
        gate = Timed(engine.gate, "acquire")
        rows: list[dict[str, float]] = []
        for i in range(args.warmup + args.ticks):
            peer.advance(scheduler, 1.0)
            cursor.reset()
            publish.seconds = gate.seconds = 0.0
            started = time.perf_counter()
            one_pass(scheduler)
            total = time.perf_counter() - started
            sent = scheduler.last_report.sent if scheduler.last_report else 0
            if i >= args.warmup:
                rows.append(
                    {
                        "total": total,
                        "sql": cursor.sql_s,
                        "commit": cursor.commit_s,
                        "statements": cursor.statements,
                        "commits": cursor.commits,
                        "publish": publish.seconds,
                        "gate": gate.seconds,
                        "sent": sent,
                    }
                )
            peer.between_ticks()
        scheduler.close()
        log("floors")
        floor_publish = send_task_batched_ms(db, HOT, 200)
        floor_commit = durable_commit_ms(pg_url)
    finally:
        clear_redis_db(db, keep_owner=False)
        drop_database(name)
    report(args, rows, floor_publish, floor_commit)


def report(
    args: argparse.Namespace, rows: list[dict[str, float]], floor_publish: float, commit: float
) -> None:
    def median(key: str) -> float:
        return statistics.median(row[key] for row in rows)

    total, sql, commits_s = median("total") * 1e3, median("sql") * 1e3, median("commit") * 1e3
    publish, gate = median("publish") * 1e3, median("gate") * 1e3
    rest = total - sql - commits_s - publish - gate
    print(
        f"A tick with {HOT} due at {args.size:,} stored (PostgreSQL, Redis; median of"
        f" {len(rows)} ticks, each sent {sorted({int(r['sent']) for r in rows})})"
    )
    print(f"  whole tick                          {total:8.2f} ms")
    print(f"  SQL statements ({median('statements'):.0f}, driver time)       {sql:8.2f} ms")
    print(f"  COMMITs ({median('commits'):.0f})                         {commits_s:8.2f} ms")
    print(f"  publishing {HOT} messages               {publish:8.2f} ms")
    print(f"  Redis gate                          {gate:8.2f} ms")
    print(f"  the rest (Python)                   {rest:8.2f} ms")
    print("Floors measured in the same run:")
    print(f"  send_task batched for {HOT}             {floor_publish:8.2f} ms")
    print(
        f"  one durable single-row UPDATE       {commit:8.2f} ms (two per tick: {2 * commit:.2f})"
    )
    print(
        f"  tick minus the publishing floor     {total - floor_publish:8.2f} ms"
        f" (target: under 1 ms); minus two durable commits too:"
        f" {total - floor_publish - 2 * commit:.2f} ms"
    )


if __name__ == "__main__":
    main()
