"""What the beat heartbeat costs a tick (issue 33, item 4).

    python -m benchmarks.heartbeat [--size 1000] [--ticks 200] [--rounds 5] [--mysql]

A real ``celery_routines.Scheduler`` (the real clock, so claims arbitrate on
the database's clock, every setting at its default) over ``size`` yearly
routines of which none is due: the idle tick, the one an idle beat runs every
``routines_refresh_seconds`` and the one where one more statement weighs most.
On PostgreSQL and SQLite (and MariaDB with ``--mysql``), three ways, in
alternating order with a 20 ms pause between ticks:

* ``without``: no heartbeat at all (the tick before issue 33);
* ``every tick``: the heartbeat's upsert forced on every tick, the worst case
  (an idle beat with the defaults is close to it: it ticks about every 5 s
  and writes at most every 5 s);
* ``as shipped``: at most one write every ``routines_refresh_seconds``, as a
  busy beat ticking back to back sees it (the ticks between writes pay nothing).

Prints the median tick of each, the heartbeat's own statement (its median
added cost), and the ratios against the tick without it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import create_database, drop_database, log

PAUSE = 0.02
VARIANTS = ("without", "every tick", "as shipped")


def _app(folder: Path, url: str) -> Any:
    from celery import Celery

    folder.mkdir(parents=True, exist_ok=True)
    app = Celery("bench_heartbeat", set_as_current=False)
    app.conf.update(
        broker_url="filesystem://",
        broker_transport_options={"data_folder_in": str(folder), "data_folder_out": str(folder)},
        routines_database_url=url,
        beat_max_loop_interval=300,
    )
    return app


def _scheduler(url: str, size: int, folder: Path) -> Any:
    from sqlalchemy import insert

    from celery_routines import Scheduler
    from celery_routines.store.models import ROUTINES

    scheduler = Scheduler(_app(folder, url))
    rows = [
        {"name": f"yearly-{i}", "task": "bench.noop", "cron": "0 0 1 1 *", "enabled": True}
        for i in range(size)
    ]
    with scheduler.store.engine.begin() as conn:
        conn.execute(insert(ROUTINES), rows)
    for _ in range(size // 1000 + 3):  # adopts them, baselines the refresher
        scheduler.tick()
    return scheduler


def measure(scheduler: Any, ticks: int, rounds: int) -> dict[str, list[float]]:
    heartbeat = scheduler._beat_heartbeat
    assert heartbeat is not None
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for round_number in range(rounds):
        order = VARIANTS if round_number % 2 == 0 else tuple(reversed(VARIANTS))
        for variant in order:
            scheduler._beat_heartbeat = None if variant == "without" else heartbeat
            for _ in range(ticks):
                time.sleep(PAUSE)
                if variant == "every tick":
                    heartbeat.next_write = 0.0
                started = time.perf_counter()
                interval = scheduler.tick()
                samples[variant].append(time.perf_counter() - started)
                assert interval > 0, "a tick found work; not idle"
    scheduler._beat_heartbeat = heartbeat
    return samples


def report(database: str, size: int, samples: dict[str, list[float]]) -> None:
    medians = {v: statistics.median(s) * 1000 for v, s in samples.items()}
    p90 = {v: sorted(s)[int(len(s) * 0.9)] * 1000 for v, s in samples.items()}
    print(f"\n{database}: idle tick, {size} routines stored, none due")
    print("| tick | median | p90 | ratio to without (median) |")
    print("|---|---|---|---|")
    for variant in VARIANTS:
        ratio = medians[variant] / medians["without"]
        print(f"| {variant} | {medians[variant]:.3f} ms | {p90[variant]:.3f} ms | {ratio:.2f}x |")
    added = medians["every tick"] - medians["without"]
    print(f"heartbeat upsert: +{added:.3f} ms per write")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--ticks", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mysql", action="store_true", help="MariaDB/MySQL too")
    args = parser.parse_args()
    print(
        f"beat heartbeat cost; {args.rounds} rounds x {args.ticks} ticks per variant, "
        f"alternating ({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC)"
    )
    with tempfile.TemporaryDirectory() as folder:
        targets: list[tuple[str, str, str | None, bool]] = []
        name, url = create_database("heartbeat")
        targets.append(("PostgreSQL", url, name, False))
        targets.append(("SQLite", f"sqlite:///{folder}/routines.db", None, False))
        if args.mysql:
            name, url = create_database("heartbeat", mysql=True)
            targets.append(("MariaDB", url, name, True))
        try:
            for database, url, _, _ in targets:
                log(f"{database}: loading {args.size} routines")
                scheduler = _scheduler(url, args.size, Path(folder) / database)
                try:
                    report(database, args.size, measure(scheduler, args.ticks, args.rounds))
                finally:
                    scheduler.close()
        finally:
            for _, _, name, mysql in targets:
                if name is not None:
                    drop_database(name, mysql=mysql)


if __name__ == "__main__":
    main()
