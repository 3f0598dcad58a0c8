"""100,000 routines a minute on the real clock (issue 19, item 5).

    python -m benchmarks.minutely [--size 100000] [--beats 2] [--seconds 180] [--jitter 0]

``--size`` routines ``* * * * *`` (every one due at the same second of each
minute; loaded by ``benchmarks.lateness.insert_routines``), ``--beats`` beat
processes (``benchmarks.many_beats``'s beat: Celery's service loop on the
real clock) and one consumer process that pops every message off the Redis
queue as it arrives, records ``arrival - send instant`` and marks the run
succeeded, as a worker would (``benchmarks.lateness``'s ``_finish``), so the
default ``overlap="skip"`` sees finished runs. With ``--jitter N`` every
routine has ``jitter=N``: its windows go out at the routine's own offset in
``[0, N)`` seconds and lateness is measured from that instant.

Prints lateness p50/p99/max per window, CPU seconds of the beats, the
consumer and PostgreSQL over the measured span, every window exactly once
(per window key and per task id: doubles and missing printed), and, in the
same run just before, Celery's floor: ``send_task`` in kombu's publish batch
for ``--size`` messages on one producer (``benchmarks.publish_floor``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .common import (
    QUEUE,
    claim_redis_db,
    clear_redis_db,
    create_database,
    declare_queue,
    drop_database,
    emit,
    log,
    redis_client,
    redis_url,
)
from .lateness import _finish, insert_routines
from .many_beats import cpu_between, finish, sample_cpu, start_beats, wait_ready
from .peers import _celery_app
from .publish_floor import send_tasks
from .run import Child

MINUTE = 60

# -- the consumer ----------------------------------------------------------------------


def consume(args: argparse.Namespace) -> None:
    """Pops messages until ``--stop-at``; lateness of the windows whose send
    instant is before ``--until``."""
    from sqlalchemy import create_engine

    from celery_routines.schedules.jitter import jitter_offset
    from celery_routines.schedules.keys import window_key

    client = redis_client(args.redis_db)
    engine = create_engine(args.pg_url, pool_size=1)
    offsets = {
        f"bench-{i}": jitter_offset(f"bench-{i}", args.jitter).total_seconds()
        for i in range(args.size)
    }
    print("READY", flush=True)
    lateness: dict[float, list[float]] = defaultdict(list)
    by_key: Counter[str] = Counter()
    by_id: Counter[str] = Counter()
    done: list[str] = []
    last_flush = time.monotonic()
    while time.time() < args.stop_at:
        batch = client.rpop(QUEUE, 500)
        if not batch:
            popped = client.brpop([QUEUE], timeout=0.2)
            batch = [popped[1]] if popped else []
        arrived = time.time()
        for raw in batch:
            headers = json.loads(raw)["headers"]
            key = headers["routine_window"]
            name, instant = key.split("@", 1)
            window = datetime.fromisoformat(instant).timestamp()
            send = window + offsets[name]
            by_key[key] += 1
            by_id[headers["id"]] += 1
            done.append(headers["id"])
            if send < args.until:
                lateness[window].append(arrived - send)
        if done and (time.monotonic() - last_flush > 0.5 or len(done) >= 5000):
            _finish(engine, done)
            done = []
            last_flush = time.monotonic()
    _finish(engine, done)
    engine.dispose()
    missing = []
    expected = 0
    for name, offset in offsets.items():
        window = args.t0
        while window + offset < args.until:
            expected += 1
            key = window_key(name, datetime.fromtimestamp(window, UTC), "UTC")
            if key not in by_key:
                missing.append(key)
            window += MINUTE
    windows = {}
    every: list[float] = []
    for window, found in sorted(lateness.items()):
        found.sort()
        every.extend(found)
        windows[datetime.fromtimestamp(window, UTC).strftime("%H:%M:%S")] = _summary(found)
    every.sort()
    emit(
        {
            "expected": expected,
            "received": sum(by_key.values()),
            "received_in_span": len(every),
            "windows": windows,
            "all": _summary(every),
            "doubles_by_key": {k: n for k, n in by_key.items() if n > 1},
            "doubles_by_id": {k: n for k, n in by_id.items() if n > 1},
            "missing": len(missing),
            "missing_first": missing[:50],
        }
    )


def _summary(sorted_seconds: list[float]) -> dict[str, Any]:
    if not sorted_seconds:
        return {"n": 0}

    def pct(p: float) -> float:
        return sorted_seconds[min(len(sorted_seconds) - 1, int(len(sorted_seconds) * p))]

    return {"n": len(sorted_seconds), "p50": pct(0.5), "p99": pct(0.99), "max": sorted_seconds[-1]}


# -- Celery's floor --------------------------------------------------------------------


def publish_floor_s(db: int, n: int) -> float:
    """Seconds to publish ``n`` messages by ``send_task`` in one kombu publish
    batch on one reused producer (warmed up with 1,000 first)."""
    from celery import Celery

    app = Celery("floor", set_as_current=False)
    app.conf.broker_url = redis_url(db)
    connection = app.connection_for_write()
    producer = app.amqp.Producer(connection, auto_declare=False)
    try:
        with producer.batch():
            send_tasks(app, producer, 1000, retry=False)
        started = time.perf_counter()
        with producer.batch():
            send_tasks(app, producer, n, retry=False)
        return time.perf_counter() - started
    finally:
        connection.release()
        clear_redis_db(db)


# -- one run ---------------------------------------------------------------------------


def steady(db: int, args: argparse.Namespace) -> dict[str, Any]:
    name, url = create_database(f"minutely_j{args.jitter}")
    clear_redis_db(db)
    stop_file = f"/tmp/minutely-stop-{os.getpid()}"
    Path(stop_file).unlink(missing_ok=True)
    children: list[Child] = []
    try:
        t0 = math.ceil((time.time() + args.lead) / MINUTE) * MINUTE
        started = time.time()
        insert_routines(
            url,
            args.size,
            datetime.fromtimestamp(t0, UTC),
            interval=None,
            spread=1,
            cron="* * * * *",
            jitter=args.jitter or None,
        )
        declare_queue(_celery_app(db))
        log(
            f"{args.size:,} routines loaded in {time.time() - started:.1f} s; first window"
            f" {datetime.fromtimestamp(t0, UTC):%H:%M:%S} (in {t0 - time.time():.0f} s)"
        )
        until = t0 + args.seconds
        stop_at = until + args.grace
        consumer = Child(
            [
                "consume",
                "--redis-db",
                str(db),
                "--pg-url",
                url,
                "--size",
                str(args.size),
                "--jitter",
                str(args.jitter),
                "--t0",
                str(t0),
                "--until",
                str(until),
                "--stop-at",
                str(stop_at),
            ],
            module="benchmarks.minutely",
        )
        children.append(consumer)
        beats = start_beats(args.beats, db, url, stop_at, stop_file)
        children.extend(beats)
        problem = wait_ready(children, t0 - 0.5)
        if problem:
            return {"error": problem}
        groups = {
            "beats": [child.proc.pid for child in beats],
            "consumer": [consumer.proc.pid],
        }
        time.sleep(max(0.0, t0 - time.time()))
        at_t0 = sample_cpu(groups, name)
        time.sleep(max(0.0, until - time.time()))
        at_until = sample_cpu(groups, name)
        consumed = finish(consumer, args.grace + 60)
        Path(stop_file).touch()
        per_beat = [finish(child, 60) for child in beats]
        return {
            "t0": t0,
            "consumed": consumed,
            "cpu": cpu_between(at_t0, at_until),
            "per_beat": per_beat,
            "rows": run_rows_by_reason(url),
            "left_in_queue": redis_client(db).llen(QUEUE),
            "gaps": window_gaps(url, t0),
            "missing_rows": missing_rows(url, consumed.get("missing_first", [])),
        }
    finally:
        Path(stop_file).touch()
        for child in children:
            if child.proc.poll() is None:
                child.kill()
        Path(stop_file).unlink(missing_ok=True)
        clear_redis_db(db)
        drop_database(name)


def run_rows_by_reason(url: str) -> dict[str, int]:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT state, coalesce(left(reason, 40), ''), count(*) FROM routine_runs"
                    " GROUP BY 1, 2 ORDER BY 1, 2"
                )
            ).all()
    finally:
        engine.dispose()
    return {f"{state} {reason}".strip(): int(n) for state, reason, n in rows}


def window_gaps(url: str, t0: float) -> dict[str, int]:
    """Routines whose run rows do not account for every window from ``t0`` up
    to their stored next window (none lost while beat is behind), and
    routines with two rows for one window key. A ``* * * * *`` routine's next
    window is its ``next_run_at`` to the minute (a jitter offset is under 60 s)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT count(*) FILTER (WHERE accounted <> expected),"
                    " count(*) FILTER (WHERE keys <> rows_), sum(expected) FROM ("
                    " SELECT CAST(extract(epoch FROM date_trunc('minute', r.next_run_at)"
                    "   - CAST(:t0 AS timestamp)) / 60 AS bigint) AS expected,"
                    " (SELECT coalesce(sum(CASE WHEN x.state = 'skipped'"
                    "   THEN coalesce(x.skipped_count, 1) ELSE 1 END), 0)"
                    "   FROM routine_runs x WHERE x.routine_id = r.id) AS accounted,"
                    " (SELECT count(DISTINCT x.idempotency_key) FROM routine_runs x"
                    "   WHERE x.routine_id = r.id) AS keys,"
                    " (SELECT count(*) FROM routine_runs x WHERE x.routine_id = r.id) AS rows_"
                    " FROM routines r) AS per_routine"
                ),
                {"t0": datetime.fromtimestamp(t0, UTC).replace(tzinfo=None)},
            ).one()
    finally:
        engine.dispose()
    return {
        "routines_with_gaps": int(row[0]),
        "routines_with_doubles": int(row[1]),
        "windows_before_next": int(row[2] or 0),
    }


def missing_rows(url: str, keys: list[str]) -> list[Any]:
    """The run rows (state, reason) of windows the consumer never received."""
    if not keys:
        return []
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT idempotency_key, state, reason FROM routine_runs"
                    " WHERE idempotency_key = ANY(:keys)"
                ),
                {"keys": keys},
            ).all()
    finally:
        engine.dispose()
    return [list(row) for row in rows]


def report(args: argparse.Namespace, floor_s: float, found: dict[str, Any]) -> None:
    jitter = f"jitter={args.jitter}" if args.jitter else "no jitter"
    print(
        f"{args.size:,} routines '* * * * *' ({jitter}), {args.beats} beats, a consumer that"
        f" acks and marks each run succeeded; {args.seconds:.0f} s on the real clock;"
        f" {os.cpu_count()} cores"
    )
    print(
        f"  Celery's floor, same run: send_task in a kombu publish batch for {args.size:,}"
        f" messages: {floor_s:.2f} s"
    )
    if "consumed" not in found or "all" not in found.get("consumed", {}):
        print(f"  FAILED: {found}")
        return
    consumed = found["consumed"]
    for window, stats in consumed["windows"].items():
        if stats["n"]:
            print(
                f"  window {window}: {stats['n']:,} messages, lateness p50 {stats['p50']:.2f} s,"
                f" p99 {stats['p99']:.2f} s, max {stats['max']:.2f} s"
            )
    total = consumed["all"]
    if total["n"]:
        print(
            f"  all windows: p50 {total['p50']:.2f} s, p99 {total['p99']:.2f} s"
            f" ({total['p99'] / floor_s:.2f}x the floor), max {total['max']:.2f} s"
        )
    once = not (consumed["doubles_by_key"] or consumed["doubles_by_id"] or consumed["missing"])
    print(
        f"  every window exactly once: {'yes' if once else 'NO'} (expected"
        f" {consumed['expected']:,} windows, received {consumed['received_in_span']:,} in the"
        f" span, {consumed['received']:,} in all; doubles by window key"
        f" {len(consumed['doubles_by_key'])}, by task id {len(consumed['doubles_by_id'])};"
        f" missing {consumed['missing']})"
    )
    if not once:
        print(f"    doubles: {list(consumed['doubles_by_key'].items())[:10]}")
        print(f"    missing (first): {consumed['missing_first'][:10]}")
        print(f"    their run rows: {found['missing_rows'][:10]}")
    gaps = found["gaps"]
    print(
        f"  run rows: {found['rows']}; messages still in Redis when the consumer stopped:"
        f" {found['left_in_queue']:,}; windows from the first up to each routine's stored"
        f" next window: {gaps['windows_before_next']:,}, routines whose run rows miss one of"
        f" them: {gaps['routines_with_gaps']}, with two rows for one window:"
        f" {gaps['routines_with_doubles']}"
    )
    cpu = found["cpu"]
    available = cpu["wall"] * cpu["cores"]
    print(
        f"  CPU over {cpu['wall']:.0f} s: beats {cpu['beats']:.1f} s, consumer"
        f" {cpu['consumer']:.1f} s, PostgreSQL {cpu['postgres']:.1f} s (this database's"
        f" backends {cpu['postgres_ours']:.1f} s), whole machine {cpu['machine']:.1f} s of"
        f" {available:.0f} available ({cpu['machine'] / available:.0%}; other processes"
        f" {cpu['machine'] - cpu['beats'] - cpu['consumer'] - cpu['postgres']:.1f} s)"
    )
    per_beat = found["per_beat"]
    print(
        f"  beats: claimed {[b.get('claimed') for b in per_beat]}, sent"
        f" {[b.get('sent') for b in per_beat]}, ticks {[b.get('ticks') for b in per_beat]},"
        f" conflicts {[b.get('conflicts') for b in per_beat]}, deferred"
        f" {[b.get('deferred') for b in per_beat]}, skipped windows"
        f" {[b.get('skipped_windows') for b in per_beat]}, tick errors"
        f" {[b.get('tick_errors') for b in per_beat]}, warnings"
        f" {[b.get('warnings') for b in per_beat]}"
    )
    for b in per_beat:
        for line in b.get("first_warnings") or []:
            print(f"    {line}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role")
    c = sub.add_parser("consume", help="the consumer process (started by this script)")
    c.add_argument("--redis-db", type=int, required=True)
    c.add_argument("--pg-url", required=True)
    c.add_argument("--t0", type=float, required=True)
    c.add_argument("--until", type=float, required=True)
    c.add_argument("--stop-at", type=float, required=True)
    c.add_argument("--size", type=int, default=100_000)
    c.add_argument("--jitter", type=int, default=0)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--beats", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=180.0, help="the measured span")
    parser.add_argument("--jitter", type=int, default=0, help="every routine's jitter (seconds)")
    parser.add_argument("--lead", type=float, default=30.0, help="least seconds to t0")
    parser.add_argument(
        "--grace", type=float, default=20.0, help="seconds to keep consuming after the span"
    )
    parser.add_argument("--json", default="/tmp/celery-routines-minutely.json")
    args = parser.parse_args(argv)
    if args.role == "consume":
        consume(args)
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    db = claim_redis_db()
    try:
        log(f"Celery's floor: send_task batched, {args.size:,} messages")
        floor_s = publish_floor_s(db, args.size)
        log(f"floor {floor_s:.2f} s; steady load, jitter {args.jitter}")
        found = steady(db, args)
    finally:
        clear_redis_db(db, keep_owner=False)
    Path(args.json).write_text(json.dumps({"floor_s": floor_s, **found}, indent=1, default=str))
    report(args, floor_s, found)


if __name__ == "__main__":
    main()
