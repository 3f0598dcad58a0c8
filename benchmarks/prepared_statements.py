"""What psycopg 3's server-side prepared statements save on a bare PostgreSQL.

    python -m benchmarks.prepared_statements [--routines 200] [--ticks 15] [--rounds 3]

celery-routines prepares statements only on a connection that reaches the
server directly (``routines_prepared_statements = "auto"``,
``store/prepared.py::prepare_unless_pooled``), so that it works behind PgBouncer
in transaction pooling. This measures, on a bare PostgreSQL, in alternating
rounds, ``auto`` against ``off`` (what every connection did before):

* ``tick``: a beat's tick sending ``--routines`` due runs (claim, write the
  runs, publish to an in-memory broker, mark them sent, advance), through
  ``Scheduler.tick()`` with an injected clock one interval on each time;
* ``worker``: the worker's two statements per run, the claim-and-start and
  the outcome (``outcomes.claim_start`` then ``outcomes.succeed``), on every run the
  ticks sent;
* ``probe``: an idle tick's one-statement probe, 500 times.

Prints the median of each per mode and the difference.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime, timedelta

from celery import Celery
from sqlalchemy import text

from .common import create_database, drop_database, log, naive_utc

INTERVAL = 60
# routines_prepared_statements: "auto" (the default: prepared on a
# connection that reaches the server directly, as here), and "off" (never,
# what every connection did before the detection).
MODES = {"auto (default)": "auto", "off": "off"}


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def one_round(mode: str, routines: int, ticks: int) -> dict[str, float]:
    from celery_routines import Scheduler
    from celery_routines.store import Store

    name, url = create_database("prepared")
    try:
        t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(days=1)
        store = Store.from_url(url, prepared_statements=MODES[mode])
        store.migrate()
        with store.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO routines (name, task, interval_seconds, overlap,"
                    " next_run_at, created_at, updated_at) "
                    "SELECT 'bench-' || g, 'bench.noop', :interval, 'overlap', :t0, :t0, :t0"
                    " FROM generate_series(1, :n) AS g"
                ),
                {"interval": INTERVAL, "t0": naive_utc(t0), "n": routines},
            )
        store.dispose()
        app = Celery("bench_prepared", set_as_current=False)
        app.conf.update(
            broker_url="memory://",
            routines_database_url=url,
            routines_prepared_statements=MODES[mode],
            # No worker claims during the ticks: runs stay sent, not lost.
            routines_start_timeout=86_400,
        )
        clock = Clock(t0 + timedelta(seconds=1))
        scheduler = Scheduler(app, clock=clock)
        try:
            scheduler.tick()  # connections opened, routines read once
            tick_times = []
            for _ in range(ticks):
                clock.now += timedelta(seconds=INTERVAL)
                started = time.perf_counter()
                scheduler.tick()
                tick_times.append(time.perf_counter() - started)
            store = scheduler.store
            with store.engine.connect() as conn:
                sent = [
                    row[0]
                    for row in conn.execute(
                        text("SELECT id FROM routine_runs WHERE state = 'sent' ORDER BY id")
                    )
                ]
            started = time.perf_counter()
            for run_id in sent:
                store.outcomes.claim_start(run_id, "w1", clock.now, lost_after=60)
                store.outcomes.succeed(run_id, clock.now, spend=None)
            worker = (time.perf_counter() - started) / max(len(sent), 1)
            probe_times = []
            for _ in range(500):
                started = time.perf_counter()
                scheduler.tick()  # nothing due: the probe alone
                probe_times.append(time.perf_counter() - started)
        finally:
            scheduler.close()
    finally:
        drop_database(name)
    return {
        "tick_ms": statistics.median(tick_times) * 1000,
        "worker_run_ms": worker * 1000,
        "idle_tick_ms": statistics.median(probe_times) * 1000,
        "runs": len(sent),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--routines", type=int, default=200)
    parser.add_argument("--ticks", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for number in range(args.rounds):
        order = list(MODES) if number % 2 == 0 else list(reversed(MODES))
        for mode in order:
            log(f"round {number + 1}: {mode}")
            results[mode].append(one_round(mode, args.routines, args.ticks))
    keys = ("tick_ms", "worker_run_ms", "idle_tick_ms")
    medians = {
        mode: {key: statistics.median(r[key] for r in rounds) for key in keys}
        for mode, rounds in results.items()
    }
    print(f"{'mode':<26}" + "".join(f"{key:>16}" for key in keys))
    for mode, values in medians.items():
        print(f"{mode:<26}" + "".join(f"{values[key]:>16.3f}" for key in keys))
    ours, default = (medians[mode] for mode in MODES)
    print(
        f"{'difference':<26}"
        + "".join(f"{(ours[key] / default[key] - 1) * 100:>15.1f}%" for key in keys)
    )
    print(f"runs per round: {results[next(iter(MODES))][0]['runs']}")


if __name__ == "__main__":
    main()
