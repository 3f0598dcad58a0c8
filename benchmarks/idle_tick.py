"""The idle tick, ours beside RedBeat's, in one run (issue 36, item 3).

    python -m benchmarks.idle_tick [--size 1000] [--ticks 200] [--rounds 5]

Three schedulers, each with ``size`` daily routines of which none is due:

* ``routines``: celery-routines as a user runs it (PostgreSQL, the real clock,
  so claims arbitrate on the database's clock, every setting at its default);
* ``routines-ping``: the same, with the pool pinging every connection at
  checkout, as beat did before issue 36 (SQLAlchemy's ``pool_pre_ping``);
* ``redbeat``: RedBeat on the same Redis server as the tests, holding its
  single-beat lock as its ``beat_init`` handler does.

Each round measures ``ticks`` idle ``tick()`` calls of each, in alternating
order, with a 20 ms pause between ticks (well under beat's longest sleep,
``routines_refresh_seconds``, as an idle beat's ticks are). Also counted: the
round trips per idle tick (PostgreSQL: libpq's protocol trace; Redis: the
commands redis-py sent). Prints a table and the ratios against RedBeat.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

from .common import (
    claim_redis_db,
    clear_redis_db,
    create_database,
    drop_database,
    log,
)
from .peers import RedBeat, Routines

PAUSE = 0.02


class IdleRoutines(Routines):
    def counts(self) -> tuple[int, int]:
        return 0, 0


class IdleRedBeat(RedBeat):
    def counts(self) -> tuple[int, int]:
        return 0, 0


class PgRoundTrips:
    """Counts what beat's connections send, from libpq's protocol trace: a
    ``Query`` (simple protocol: the ping) or a ``Sync`` (one statement)."""

    def __init__(self, engine: Any) -> None:
        from sqlalchemy import event

        self.handle = tempfile.TemporaryFile()  # noqa: SIM115 - read as ticks go
        self.traced: set[int] = set()
        event.listen(engine, "checkout", self._trace)

    def _trace(self, dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        import psycopg

        if id(dbapi_connection) not in self.traced:
            self.traced.add(id(dbapi_connection))
            dbapi_connection.pgconn.trace(self.handle.fileno())
            dbapi_connection.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)

    def mark(self) -> int:
        self.handle.flush()
        self.handle.seek(0, 2)
        return self.handle.tell()

    def since(self, start: int) -> int:
        self.handle.flush()
        self.handle.seek(start)
        sent = 0
        for line in self.handle.read().decode(errors="replace").splitlines():
            fields = line.split("\t")
            if (
                len(fields) >= 3
                and fields[0] == "F"
                and fields[2].split(" ")[0] in ("Query", "Sync")
            ):
                sent += 1
        return sent


class RedisRoundTrips:
    """Counts the packed commands redis-py sends (a pipeline is one)."""

    def __init__(self) -> None:
        from redis.connection import Connection

        self.sent = 0
        original = Connection.send_packed_command

        def counting(connection: Any, command: Any, check_health: bool = True) -> None:
            self.sent += 1
            original(connection, command, check_health)

        Connection.send_packed_command = counting  # type: ignore[method-assign]


def _routines_scheduler(peer: IdleRoutines, pre_ping: bool) -> Any:
    from celery_routines import Scheduler

    assert peer.app is not None
    peer.app.conf.routines_redis_url = None  # defaults: no gate (an idle tick never uses it)
    scheduler = Scheduler(peer.app)  # the real clock: arbitrates on the database's
    if pre_ping:
        scheduler.store.engine.pool._pre_ping = True  # as make_engine had it before
    scheduler.tick()  # adopts nothing, baselines the refresher
    scheduler.tick()
    return scheduler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--ticks", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    db = claim_redis_db()
    names: list[str] = []
    schedulers: dict[str, Any] = {}
    try:
        peers: dict[str, Any] = {}
        for variant in ("routines", "routines-ping"):
            name, url = create_database(f"idle_{variant}")
            names.append(name)
            peer = IdleRoutines(args.size, "idle", db, url)
            peer.load()
            peers[variant] = peer
            schedulers[variant] = _routines_scheduler(peer, pre_ping=variant == "routines-ping")
        redbeat = IdleRedBeat(args.size, "idle", db, None)
        redbeat.load()
        schedulers["redbeat"] = scheduler = redbeat.make()
        redbeat.after_start(scheduler)
        scheduler.tick()

        pg_trips = {v: PgRoundTrips(schedulers[v].store.engine) for v in peers}
        for variant in peers:
            schedulers[variant].tick()  # checks its connection out: traced from now on
        redis_trips = RedisRoundTrips()
        samples: dict[str, list[float]] = {v: [] for v in schedulers}
        trips: dict[str, list[int]] = {v: [] for v in schedulers}
        order = list(schedulers)
        for round_number in range(args.rounds):
            for variant in order if round_number % 2 == 0 else reversed(order):
                scheduler = schedulers[variant]
                start = pg_trips[variant].mark() if variant in pg_trips else redis_trips.sent
                for _ in range(args.ticks):
                    time.sleep(PAUSE)
                    started = time.perf_counter()
                    interval = scheduler.tick()
                    samples[variant].append(time.perf_counter() - started)
                    assert interval > 0, f"{variant}: a tick found work; not idle"
                if variant in pg_trips:
                    trips[variant].append(pg_trips[variant].since(start))
                else:
                    trips[variant].append(redis_trips.sent - start)
            log(f"round {round_number + 1}/{args.rounds} done")
        _report(samples, trips, args)
    finally:
        for scheduler in schedulers.values():
            scheduler.close()
        for name in names:
            drop_database(name)
        clear_redis_db(db, keep_owner=False)


def _report(samples: dict[str, list[float]], trips: dict[str, list[int]], args: Any) -> None:
    ticks = args.ticks * args.rounds
    print(
        f"\nidle tick, {args.size} routines stored, none due; {args.rounds} rounds x "
        f"{args.ticks} ticks each, alternating ({time.strftime('%Y-%m-%d %H:%M', time.gmtime())}"
        " UTC)\n"
    )
    print("| scheduler | median | p90 | min | round trips per tick |")
    print("|---|---|---|---|---|")
    medians = {}
    for variant, values in samples.items():
        ms = sorted(v * 1000 for v in values)
        medians[variant] = statistics.median(ms)
        per_tick = sum(trips[variant]) / ticks
        print(
            f"| {variant} | {medians[variant]:.3f} ms | {ms[int(len(ms) * 0.9)]:.3f} ms "
            f"| {ms[0]:.3f} ms | {per_tick:.2f} |"
        )
    print()
    for variant in ("routines", "routines-ping"):
        print(f"{variant} / redbeat (median): {medians[variant] / medians['redbeat']:.2f}x")
    print(
        f"routines-ping / routines (median): {medians['routines-ping'] / medians['routines']:.2f}x"
    )
    per_round = {
        v: [
            statistics.median(s[i * args.ticks : (i + 1) * args.ticks]) * 1000
            for i in range(args.rounds)
        ]
        for v, s in samples.items()
    }
    print(
        "\nmedian per round (ms): "
        + "; ".join(f"{v} " + ", ".join(f"{m:.3f}" for m in ms) for v, ms in per_round.items())
    )


if __name__ == "__main__":
    main()
