"""Lateness under steady load: 10,000 routines every minute, on the real clock.

Routine ``i`` (its task gets ``args=[i]``) has its windows at
``t0 + (i % 60) s + k min``: about 167 windows a second, spread evenly. The
beat runs Celery's service loop (``tick``, sleep as told) for ``--duration``
seconds; a consumer process pops every message off the Redis queue as it
arrives and records ``arrival - window``. For celery-routines the consumer
also acts as the worker (marks the runs it received ``succeeded``), so the
default ``overlap="skip"`` sees finished runs, as with a real worker.

    python -m benchmarks.lateness beat PEER --size N --redis-db D [--pg-url U]
    python -m benchmarks.lateness consume --redis-db D --t0 EPOCH --until EPOCH [--pg-url U]
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from .common import QUEUE, TASK, cpu_seconds, declare_queue, emit, log, naive_utc, redis_client
from .common import redis_url as make_redis_url
from .peers import PEERS, DjangoBeat, _celery_app

PERIOD = 60
LEAD = 15.0  # seconds from the end of set-up to the first window


def _offset(i: int) -> int:
    return i % PERIOD


# -- set-up per peer ---------------------------------------------------------------


def load(peer: str, size: int, db: int, pg_url: str | None, t0: datetime) -> Any:
    """Write the routines; returns a factory for the scheduler."""
    if peer == "routines":
        return _load_routines(size, db, pg_url, t0)
    if peer == "celery":
        return _load_celery(size, db, t0)
    if peer == "redbeat":
        return _load_redbeat(size, db, t0)
    if peer == "django":
        return _load_django(size, db, pg_url, t0)
    raise ValueError(peer)


def _load_routines(size: int, db: int, pg_url: str | None, t0: datetime) -> Any:
    from celery_routines import Scheduler

    insert_routines(pg_url, size, t0)
    app = _celery_app(db, routines_database_url=pg_url, routines_redis_url=make_redis_url(db))
    declare_queue(app)
    return lambda: Scheduler(app)


def insert_routines(
    pg_url: str | None,
    size: int,
    t0: datetime,
    *,
    interval: float | None = PERIOD,
    spread: int = PERIOD,
    cron: str | None = None,
    jitter: int | None = None,
) -> None:
    """``size`` routines ``bench-0`` .. ``bench-{size-1}`` (task args ``[i]``) in
    one ``INSERT ... SELECT generate_series``: routine ``i``'s first window is
    ``t0 + (i % spread) s`` (``spread=1``: all at ``t0``), every ``interval``
    seconds or on ``cron``. With ``jitter`` its stored ``next_run_at`` is the
    window plus the routine's own offset, as beat itself would store it."""
    from sqlalchemy import text

    from celery_routines.schedules.jitter import jitter_offset
    from celery_routines.store import Store

    offsets = [0] * size
    if jitter:
        offsets = [int(jitter_offset(f"bench-{i}", jitter).total_seconds()) for i in range(size)]
    store = Store.from_url(pg_url)
    store.migrate()
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO routines (name, task, cron, interval_seconds, jitter_seconds, args,"
                " next_run_at, created_at, updated_at) "
                "SELECT 'bench-' || g, :task, :cron, :interval, :jitter, '[' || g || ']',"
                " CAST(:t0 AS timestamp)"
                " + make_interval(secs => (g % :spread) + (CAST(:offsets AS integer[]))[g + 1]),"
                " :now, :now FROM generate_series(0, :n - 1) AS g"
            ),
            {
                "task": TASK,
                "cron": cron,
                "interval": interval,
                "jitter": jitter,
                "spread": spread,
                "offsets": offsets,
                "t0": naive_utc(t0),
                "now": naive_utc(datetime.now(UTC)),
                "n": size,
            },
        )
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE routines"))
    store.dispose()


def _load_celery(size: int, db: int, t0: datetime) -> Any:
    import tempfile
    from pathlib import Path

    from celery.beat import PersistentScheduler
    from celery.schedules import schedule

    every = schedule(timedelta(seconds=PERIOD))
    entries = {
        f"bench-{i}": {
            "task": TASK,
            "schedule": every,
            "args": (i,),
            "last_run_at": t0 + timedelta(seconds=_offset(i) - PERIOD),
        }
        for i in range(size)
    }
    app = _celery_app(db, beat_schedule=entries)
    declare_queue(app)
    folder = tempfile.mkdtemp(prefix="bench-celery-")
    return lambda: PersistentScheduler(
        app=app, schedule_filename=str(Path(folder) / "celerybeat-schedule")
    )


def _load_redbeat(size: int, db: int, t0: datetime) -> Any:
    from types import SimpleNamespace

    from celery.schedules import schedule
    from redbeat import RedBeatScheduler
    from redbeat.decoder import RedBeatJSONEncoder
    from redbeat.schedulers import (
        RedBeatSchedulerEntry,
        acquire_distributed_beat_lock,
        ensure_conf,
        get_redis,
    )

    app = _celery_app(db, redbeat_redis_url=make_redis_url(db), redbeat_key_prefix="rb:")
    ensure_conf(app)
    declare_queue(app)
    every = schedule(timedelta(seconds=PERIOD))
    client = get_redis(app)
    pipe = client.pipeline(transaction=False)
    for i in range(size):
        entry = RedBeatSchedulerEntry(f"bench-{i}", TASK, every, args=[i], app=app)
        entry.last_run_at = t0 + timedelta(seconds=_offset(i) - PERIOD)
        definition = {
            "name": entry.name,
            "task": entry.task,
            "args": entry.args,
            "kwargs": entry.kwargs,
            "options": entry.options,
            "schedule": entry.schedule,
            "enabled": entry.enabled,
        }
        pipe.hset(
            entry.key,
            mapping={
                "definition": json.dumps(definition, cls=RedBeatJSONEncoder),
                "meta": json.dumps({"last_run_at": entry.last_run_at}, cls=RedBeatJSONEncoder),
            },
        )
        # The true due instant, as RedBeat scores an entry after each send
        # (its ``score`` of a last run not "just now" is off by that distance).
        due = (t0 + timedelta(seconds=_offset(i))).timestamp()
        pipe.zadd(app.redbeat_conf.schedule_key, {entry.key: due})
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()

    def make() -> Any:
        scheduler = RedBeatScheduler(app=app)
        acquire_distributed_beat_lock(sender=SimpleNamespace(scheduler=scheduler))
        return scheduler

    return make


def _load_django(size: int, db: int, pg_url: str | None, t0: datetime) -> Any:
    holder = DjangoBeat(size, "steady", db, pg_url)
    holder._setup_django()
    from django.core.management import call_command
    from django_celery_beat.models import IntervalSchedule, PeriodicTask
    from django_celery_beat.schedulers import DatabaseScheduler

    call_command("migrate", verbosity=0)
    app = _celery_app(db)
    declare_queue(app)
    every = IntervalSchedule.objects.create(every=PERIOD, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.bulk_create(
        [
            PeriodicTask(
                name=f"bench-{i}",
                task=TASK,
                interval=every,
                args=json.dumps([i]),
                last_run_at=t0 + timedelta(seconds=_offset(i) - PERIOD),
            )
            for i in range(size)
        ],
        batch_size=5000,
    )
    return lambda: DatabaseScheduler(app=app)


# -- the beat ----------------------------------------------------------------------


def beat(args: argparse.Namespace) -> None:
    started = time.time()
    # Whole second, LEAD after set-up is expected to end.
    t0 = datetime.fromtimestamp(math.ceil(started + LEAD), UTC)
    make = load(args.peer, args.size, args.redis_db, args.pg_url, t0)
    setup_s = time.time() - started
    scheduler = make()
    scheduler.tick()
    print(f"READY {t0.timestamp()}", flush=True)
    log(
        f"lateness {args.peer}: set-up {setup_s:.1f} s, "
        f"first window in {t0.timestamp() - time.time():.1f} s"
    )
    end = t0.timestamp() + args.duration
    idle_cpu0, idle_wall0 = cpu_seconds(), time.monotonic()
    idle_cpu = None
    busy_cpu0 = busy_wall0 = None
    while True:
        now = time.time()
        if busy_cpu0 is None and now >= t0.timestamp():
            idle_cpu = (cpu_seconds() - idle_cpu0) / max(1e-9, time.monotonic() - idle_wall0)
            busy_cpu0, busy_wall0 = cpu_seconds(), time.monotonic()
        if now >= end:
            break
        interval = scheduler.tick()
        if interval and interval > 0:
            time.sleep(max(0.0, min(interval, end - time.time())))
            if scheduler.should_sync():
                scheduler._do_sync()
    busy_cpu = (cpu_seconds() - busy_cpu0) / max(1e-9, time.monotonic() - busy_wall0)
    scheduler.close()
    emit(
        {
            "setup_s": setup_s,
            "t0": t0.timestamp(),
            "end": end,
            "idle_cpu": idle_cpu,
            "idle_seconds": t0.timestamp() - started - setup_s,
            "busy_cpu": busy_cpu,
        }
    )


# -- the consumer ------------------------------------------------------------------


def consume(args: argparse.Namespace) -> None:
    client = redis_client(args.redis_db)
    engine = None
    if args.pg_url:
        from sqlalchemy import create_engine

        engine = create_engine(args.pg_url, pool_size=1)
    lateness: list[float] = []
    done_ids: list[str] = []
    last_flush = time.monotonic()
    # Only windows this long before the end are expected to have arrived.
    cutoff = args.until - args.grace
    received = 0
    while time.time() < args.until + args.grace:
        popped = client.brpop([QUEUE], timeout=1)
        if popped is None:
            continue
        arrived = time.time()
        envelope = json.loads(popped[1])
        headers = envelope["headers"]
        # Protocol 2 body: [args, kwargs, embed]; routine i was given args [i].
        i = int(json.loads(base64.b64decode(envelope["body"]))[0][0])
        base = args.t0 + _offset(i)
        k = math.floor((arrived - base) / PERIOD)
        window = base + PERIOD * max(k, 0)
        if window <= cutoff:
            lateness.append(arrived - window)
            received += 1
        if engine is not None:
            done_ids.append(headers["id"])
            if time.monotonic() - last_flush > 0.5:
                _finish(engine, done_ids)
                done_ids = []
                last_flush = time.monotonic()
    expected = sum(
        max(0, math.floor((cutoff - (args.t0 + _offset(i))) / PERIOD) + 1) for i in range(args.size)
    )
    lateness.sort()

    def pct(p: float) -> float | None:
        if not lateness:
            return None
        return lateness[min(len(lateness) - 1, int(len(lateness) * p))]

    emit(
        {
            "received": received,
            "expected": expected,
            "p50_s": pct(0.50),
            "p99_s": pct(0.99),
            "max_s": lateness[-1] if lateness else None,
        }
    )


def _finish(engine: Any, run_ids: list[str]) -> None:
    from sqlalchemy import text
    from sqlalchemy.exc import OperationalError

    if not run_ids:
        return
    # Many runs at once, unlike a worker's one: this UPDATE and a beat's
    # marking of a chunk may lock the same rows in different orders, and
    # PostgreSQL then aborts one of them. The consumer tries again.
    for attempt in range(5):
        try:
            with engine.begin() as conn:
                conn.execute(
                    text(
                        "UPDATE routine_runs SET state = 'succeeded',"
                        " finished_at = now() AT TIME ZONE 'UTC'"
                        " WHERE id = ANY(:ids) AND state IN ('pending', 'sent', 'running')"
                    ),
                    {"ids": sorted(run_ids)},
                )
            return
        except OperationalError as exc:
            if "deadlock" not in str(exc) or attempt == 4:
                raise


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="role", required=True)
    b = sub.add_parser("beat")
    b.add_argument("peer", choices=sorted(PEERS))
    c = sub.add_parser("consume")
    for p in (b, c):
        p.add_argument("--size", type=int, default=10_000)
        p.add_argument("--redis-db", type=int, required=True)
        p.add_argument("--pg-url")
    b.add_argument("--duration", type=float, default=90.0)
    c.add_argument("--t0", type=float, required=True)
    c.add_argument("--until", type=float, required=True)
    c.add_argument("--grace", type=float, default=5.0)
    args = parser.parse_args(argv)
    if args.role == "beat":
        beat(args)
    else:
        consume(args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
