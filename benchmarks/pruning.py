"""Pruning the run history under load, on PostgreSQL.

Fills ``routine_runs`` with ``--rows`` old finished runs (10 million by
default: one ``INSERT ... SELECT generate_series`` per million), then measures
in one run, on one throwaway database:

- the tick with 10 due on an empty run table (the peer figure);
- the same tick on the full table with no pruning;
- the same tick while another process prunes back to back (batches of
  ``--batch`` rows with no pause: harder than beat's one batch a minute);
- how long one prune pass takes, and how long the backlog takes to drain:
  back to back, and at beat's rate of one pass a minute.

The tick runs the real engine (claim, decide, write, mark sent, advance) on an
injected clock; messages go to an in-memory publisher, so the figures are the
scheduler's database work, not a broker's.

    python -m benchmarks.pruning --rows 10000000
    python -m benchmarks.pruning --rows 500000 --batch 5000   # a busy machine
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks.common import HOT, create_database, drop_database, log, summary_ms
from celery_routines.sending.publish import Publisher

ROUTINES = 1000
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class MemoryPublisher(Publisher):
    def __init__(self) -> None:
        self.sent = 0

    def publish(self, run: Any) -> None:
        self.sent += 1

    def publish_many(self, runs: Sequence[Any]) -> list[Exception | None]:
        self.sent += len(runs)
        return [None] * len(runs)

    def close(self) -> None:
        pass


def load_routines(url: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO routines (name, task, interval_seconds, next_run_at, overlap, source,"
                " created_at, updated_at)"
                " SELECT 'r' || g, 'bench.noop', 86400, :far, 'overlap', 'sql', :t0, :t0"
                " FROM generate_series(1, :n) g"
            ),
            {"far": (T0 + timedelta(days=1)).replace(tzinfo=None), "t0": T0.replace(tzinfo=None),
             "n": ROUTINES},
        )  # fmt: skip
    engine.dispose()


def fill_runs(url: str, rows: int) -> float:
    """``rows`` finished runs 60 days old, spread over the routines; seconds taken."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    started = time.perf_counter()
    done, chunk = 0, 1_000_000
    while done < rows:
        n = min(chunk, rows - done)
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO routine_runs (id, routine_id, idempotency_key, attempt,"
                    " scheduled_for, state, created_at, finished_at)"
                    " SELECT 'old-' || g, 1 + g % :routines,"
                    " 'r' || (1 + g % :routines) || '@' || g,"
                    " 1, :old + g * interval '1 millisecond',"
                    " CASE WHEN g % 10 = 0 THEN 'skipped' WHEN g % 17 = 0 THEN 'failed'"
                    " ELSE 'succeeded' END,"
                    " :old + g * interval '1 millisecond', :old + g * interval '1 millisecond'"
                    " FROM generate_series(:lo, :hi) g"
                ),
                {"routines": ROUTINES, "old": (T0 - timedelta(days=60)).replace(tzinfo=None),
                 "lo": done + 1, "hi": done + n},
            )  # fmt: skip
        done += n
        log(f"  {done:,} rows")
    engine.dispose()
    # What autovacuum does to a freshly loaded table (statistics, visibility map).
    vacuum = create_engine(url, isolation_level="AUTOCOMMIT")
    with vacuum.connect() as conn:
        conn.exec_driver_sql("VACUUM ANALYZE routine_runs")
    vacuum.dispose()
    return time.perf_counter() - started


class Ticker:
    """The real engine on one database, on an injected clock, ticking with
    10 routines due each time."""

    def __init__(self, url: str) -> None:
        from celery_routines.config import Settings
        from celery_routines.sending.gate import OpenGate
        from celery_routines.store import Store
        from celery_routines.tick.engine import TickEngine

        self.store = Store.from_url(url)
        self.now = T0
        # Runs stay open for the whole benchmark: no lost sweep in the measured ticks.
        settings = Settings(database_url=url, refresh_seconds=86_400, run_timeout=30 * 86_400)
        self.engine = TickEngine(
            self.store, MemoryPublisher(), OpenGate(), settings, "bench", lambda: self.now
        )
        self.engine.tick()

    def tick(self) -> float:
        self.now += timedelta(minutes=1)
        with self.store.engine.begin() as conn:
            conn.exec_driver_sql(
                "UPDATE routines SET next_run_at = %(due)s WHERE id IN "
                "(SELECT id FROM routines ORDER BY random() LIMIT %(hot)s)",
                {"due": (self.now - timedelta(seconds=1)).replace(tzinfo=None), "hot": HOT},
            )
        started = time.perf_counter()
        report = self.engine.tick()
        took = time.perf_counter() - started
        assert report.sent == HOT, report
        return took

    def close(self) -> None:
        self.store.dispose()


def side_by_side(a: Ticker, b: Ticker, count: int) -> tuple[list[float], list[float]]:
    """``count`` ticks of each, alternating, so both see the same machine load."""
    first, second = [], []
    for _ in range(count):
        first.append(a.tick())
        second.append(b.tick())
    return first, second


def prune_forever(url: str, batch: int, stop: Any, passes: Any) -> None:
    from celery_routines.store import Store
    from celery_routines.tick.prune import prune_once

    store = Store.from_url(url)
    while not stop.is_set():
        started = time.perf_counter()
        _, _, deleted = prune_once(store, T0, timedelta(days=30), batch, "UTC")
        passes.put((time.perf_counter() - started, sum(deleted.values())))
        if not deleted:
            break
    store.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--ticks", type=int, default=25)
    args = parser.parse_args(argv)
    from celery_routines.store import Store

    databases = [create_database("pruning_empty"), create_database("pruning_full")]
    tickers: list[Ticker] = []
    try:
        for _, url in databases:
            store = Store.from_url(url)
            store.migrate()
            store.dispose()
            load_routines(url)
        (_, empty_url), (_, full_url) = databases
        log(f"filling {args.rows:,} old runs")
        fill = fill_runs(full_url, args.rows)
        empty, full = Ticker(empty_url), Ticker(full_url)
        tickers = [empty, full]
        base_empty, base_full = side_by_side(empty, full, args.ticks)
        stop, passes = multiprocessing.Event(), multiprocessing.Queue()
        pruner = multiprocessing.Process(
            target=prune_forever, args=(full_url, args.batch, stop, passes)
        )
        started = time.perf_counter()
        pruner.start()
        time.sleep(1)  # the pruner is under way
        during_empty, during_full = side_by_side(empty, full, args.ticks)
        pruner.join()
        drained = time.perf_counter() - started
        durations, deleted = [], 0
        while not passes.empty():
            seconds, rows = passes.get()
            durations.append(seconds)
            deleted += rows
        rows = [
            ("empty run table", summary_ms(base_empty)),
            (f"{args.rows:,} old runs, no pruning", summary_ms(base_full)),
            ("empty run table (while the other prunes)", summary_ms(during_empty)),
            (f"{args.rows:,} old runs, pruning back to back", summary_ms(during_full)),
        ]
        print(f"rows: {args.rows:,} old finished runs (filled in {fill:.0f} s); batch {args.batch}")
        for label, figures in rows:
            print(
                f"tick with 10 due, {label:<45} median {figures['median_ms']:6.1f} ms"
                f"  p90 {figures['p90_ms']:6.1f} ms"
            )
        ratio = rows[3][1]["median_ms"] / rows[2][1]["median_ms"]
        print(f"pruning / empty, same window: {ratio:.2f}x (median)")
        per_pass = statistics.median(durations) if durations else 0.0
        print(
            f"prune pass of {args.batch}: median {per_pass * 1000:.0f} ms over {len(durations)} "
            f"passes; {deleted:,} rows deleted"
        )
        print(
            f"drain back to back: {drained:.0f} s; at beat's one pass a minute: "
            f"{deleted / args.batch / 60:.1f} h"
        )
    finally:
        for ticker in tickers:
            ticker.close()
        for name, _ in databases:
            drop_database(name)


if __name__ == "__main__":
    main()
