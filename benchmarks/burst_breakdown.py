"""Where a one-beat burst of 10,000 goes, phase by phase, in one process.

    python -m benchmarks.burst_breakdown [--rounds 1]

Issue 19, item 1. The burst scenario of ``benchmarks.measure`` (PostgreSQL
store, Redis broker and gate, every guarantee on), run in this process with
wall-time wrappers around the tick's phases: the claim, deciding (with the
overlap check's query), the Redis gate, the run rows, publishing, the
bookkeeping, the probes; statements and driver time at the cursor; and the
cyclic garbage collector's time (``gc.callbacks``). Every phase is timed on
whichever thread runs it, so on PostgreSQL the shares add up to more than the
whole: a chunk is marked sent on its own thread while the next is published,
and from the second tick of the burst on, the claim, deciding and the run
rows are the next batch's, written on its own thread while this one publishes
(tick/ahead.py), their time stretched by sharing the interpreter with it.
Run it under the exclusive benchmark lock on a shared machine.
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

from sqlalchemy import event

from .common import (
    BURST,
    claim_redis_db,
    clear_redis_db,
    create_database,
    drop_database,
    log,
    queue_length,
    redis_client,
)
from .peers import PEERS
from .tick_breakdown import Timed


class GcClock:
    """Seconds spent in cyclic collections, and how many per generation."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._started = 0.0
        gc.callbacks.append(self._observe)

    def _observe(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.collections[info["generation"]] += 1

    def close(self) -> None:
        gc.callbacks.remove(self._observe)


def one_burst(db: int) -> None:
    database, url = create_database("routines_burst_breakdown")
    try:
        clear_redis_db(db)
        peer = PEERS["routines"](BURST, "burst", db, url)
        peer.load()
        client = redis_client(db)
        scheduler = peer.make()
        engine = scheduler.engine
        store = engine.store
        cursor = {"statements": 0, "seconds": 0.0}

        def before(conn: Any, *_: Any) -> None:
            conn.info["breakdown_started"] = time.perf_counter()

        def after(conn: Any, *_: Any) -> None:
            cursor["statements"] += 1
            cursor["seconds"] += time.perf_counter() - conn.info["breakdown_started"]

        event.listen(store.engine, "before_cursor_execute", before)
        event.listen(store.engine, "after_cursor_execute", after)
        timers = {
            "claim": Timed(store.routines, "claim_due"),
            "decide (with the overlap check)": Timed(engine, "_decide"),
            "  the overlap check's query": Timed(store.runs, "open_runs"),
            "write (gate, run rows)": Timed(engine, "_write"),
            "  Redis gate": Timed(engine.gate, "acquire"),
            "  run rows INSERT": Timed(store.runs, "insert_new"),
            "send (publishing and between chunks)": Timed(engine, "_send"),
            "  publish_many": Timed(engine.publisher, "publish_many"),
            "mark sent (any thread)": Timed(store.runs, "mark_sent"),
            "bookkeeping (mark sent + advance)": Timed(store.bookkeeping, "record_published"),
            "probe": Timed(store, "probe"),
        }
        collector = GcClock()
        started, cpu = time.perf_counter(), time.process_time()
        ticks = 0
        try:
            while True:
                interval = scheduler.tick()
                ticks += 1
                if queue_length(client) >= BURST:
                    break
                if interval and interval > 0:
                    time.sleep(min(interval, 0.5))
        finally:
            collector.close()
        wall = time.perf_counter() - started
        print(
            f"burst of {BURST:,}: {wall:.2f} s wall, {time.process_time() - cpu:.2f} s CPU,"
            f" {ticks} ticks, {cursor['statements']} statements,"
            f" {cursor['seconds']:.2f} s at the cursor"
        )
        for label, timer in timers.items():
            share = timer.seconds / wall if wall else 0.0
            print(f"  {label:40s} {timer.seconds:6.3f} s {share:5.1%}  ({timer.calls} calls)")
        print(
            f"  {'cyclic GC':40s} {collector.seconds:6.3f} s"
            f"        (collections by generation: {collector.collections})"
        )
        scheduler.close()
    finally:
        clear_redis_db(db)
        drop_database(database)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    db = claim_redis_db()
    try:
        for round_number in range(1, args.rounds + 1):
            log(f"round {round_number}")
            one_burst(db)
    finally:
        clear_redis_db(db, keep_owner=False)


if __name__ == "__main__":
    main()
