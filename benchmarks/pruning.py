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

ROUTINES = 1000
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class MemoryPublisher:
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


def ticks_with_10_due(url: str, count: int, phase: int) -> list[float]:
    """``count`` ticks of the real engine, each with 10 routines due (each
    ``phase`` on its own hours, so no window repeats an earlier phase's)."""
    from celery_routines.config import Settings
    from celery_routines.sending.gate import OpenGate
    from celery_routines.store import Store
    from celery_routines.tick.engine import TickEngine

    store = Store.from_url(url)
    base = T0 + timedelta(hours=phase)
    clock = [base]
    # Runs stay open for the whole benchmark: no lost sweep in the measured ticks.
    settings = Settings(database_url=url, refresh_seconds=86_400, run_timeout=30 * 86_400)
    engine = TickEngine(store, MemoryPublisher(), OpenGate(), settings, "bench", lambda: clock[0])
    engine.tick()
    samples = []
    for i in range(count):
        clock[0] = base + timedelta(minutes=i + 1)
        due = clock[0] - timedelta(seconds=1)
        with store.engine.begin() as conn:
            conn.exec_driver_sql(
                "UPDATE routines SET next_run_at = %(due)s WHERE id IN "
                "(SELECT id FROM routines ORDER BY random() LIMIT %(hot)s)",
                {"due": due.replace(tzinfo=None), "hot": HOT},
            )
        started = time.perf_counter()
        report = engine.tick()
        samples.append(time.perf_counter() - started)
        assert report.sent == HOT, report
    store.dispose()
    return samples


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

    name, url = create_database("pruning")
    try:
        store = Store.from_url(url)
        store.migrate()
        store.dispose()
        load_routines(url)
        empty = summary_ms(ticks_with_10_due(url, args.ticks, 0))
        log(f"tick with 10 due, empty run table: {empty}")
        log(f"filling {args.rows:,} old runs")
        fill = fill_runs(url, args.rows)
        full = summary_ms(ticks_with_10_due(url, args.ticks, 1))
        log(f"tick with 10 due, {args.rows:,} old runs, no pruning: {full}")
        stop, passes = multiprocessing.Event(), multiprocessing.Queue()
        pruner = multiprocessing.Process(target=prune_forever, args=(url, args.batch, stop, passes))
        started = time.perf_counter()
        pruner.start()
        time.sleep(2)  # let the pruner get going
        during = summary_ms(ticks_with_10_due(url, args.ticks, 2))
        log(f"tick with 10 due while pruning back to back: {during}")
        pruner.join()
        drained = time.perf_counter() - started
        stop.set()
        durations, deleted = [], 0
        while not passes.empty():
            seconds, rows = passes.get()
            durations.append(seconds)
            deleted += rows
        per_pass = statistics.median(durations) if durations else 0.0
        minutes_at_beat_rate = deleted / args.batch if args.batch else 0
        print(f"rows: {args.rows:,} old finished runs (filled in {fill:.0f} s); batch {args.batch}")
        print(f"tick with 10 due, empty table:         median {empty['median_ms']:.1f} ms"
              f"  p90 {empty['p90_ms']:.1f} ms")  # fmt: skip
        print(f"tick with 10 due, full, no pruning:    median {full['median_ms']:.1f} ms"
              f"  p90 {full['p90_ms']:.1f} ms")  # fmt: skip
        print(f"tick with 10 due, while pruning:       median {during['median_ms']:.1f} ms"
              f"  p90 {during['p90_ms']:.1f} ms"
              f"  ({during['median_ms'] / empty['median_ms']:.2f}x empty)")  # fmt: skip
        print(f"prune pass of {args.batch}: median {per_pass * 1000:.0f} ms over {len(durations)} "
              f"passes; {deleted:,} rows deleted")  # fmt: skip
        print(f"drain back to back: {drained:.0f} s; at beat's one pass a minute: "
              f"{minutes_at_beat_rate / 60:.1f} h")  # fmt: skip
    finally:
        drop_database(name)


if __name__ == "__main__":
    main()
