"""Many beats against one PostgreSQL: 1, 2, 3 and 4 beats share a burst (issue 19, item 4).

    python -m benchmarks.many_beats [--beats 1,2,3,4] [--size 10000] [--idle-seconds 30]

For each beat count, on a fresh throwaway database: ``--size`` daily routines
whose windows all fall at one instant ``t0`` a few seconds ahead (loaded by
``benchmarks.lateness.insert_routines``), and that many beat processes
running Celery's service loop on the real clock (``tick``, sleep as told, as
``benchmarks.lateness``'s beat does). It prints:

* the burst: from ``t0`` until the last message is in Redis (``LLEN`` polled
  every 10 ms);
* every window exactly once: the messages in the broker counted per task id
  and per window key (``routine_window`` header), and the run rows;
* claim conflicts, as the beats' ``TickReport`` counts them (see ``report``);
* statements per second at idle, from ``pg_stat_database`` deltas for the
  database (``pg_stat_statements`` is not preloaded on this server):
  transactions (``xact_commit + xact_rollback``) and rows read;
* CPU seconds used during the burst by the beats, by every PostgreSQL process
  and by the whole machine (psutil), against wall seconds x cores.

The ``beat`` role (one beat process) is also what ``benchmarks.minutely`` runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .common import (
    DAY,
    QUEUE,
    claim_redis_db,
    clear_redis_db,
    create_database,
    declare_queue,
    drop_database,
    emit,
    log,
    pg_admin,
    queue_length,
    redis_client,
)
from .common import redis_url as make_redis_url
from .lateness import insert_routines
from .peers import _celery_app
from .run import Child

# -- one beat process ----------------------------------------------------------------


class _Warnings(logging.Handler):
    """Counts what beat logs at WARNING and above (a failed tick logs ERROR)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.first: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if len(self.first) < 5:
            self.first.append(f"{record.levelname} {record.name}: {record.getMessage()[:300]}")


def beat(args: argparse.Namespace) -> None:
    """Celery's service loop until ``--until`` or until ``--stop-file`` appears;
    prints ``READY`` after its first tick, then one ``RESULT`` line."""
    from celery_routines import Scheduler

    warnings = _Warnings()
    logging.getLogger().addHandler(warnings)
    app = _celery_app(
        args.redis_db,
        routines_database_url=args.pg_url,
        routines_redis_url=make_redis_url(args.redis_db),
    )
    scheduler = Scheduler(app)
    scheduler.tick()
    print("READY", flush=True)
    stop = Path(args.stop_file) if args.stop_file else None
    totals: Counter[str] = Counter()
    ticks: list[list[float]] = []  # [start, end, claimed, sent] of every tick
    tick_errors = 0
    while time.time() < args.until and not (stop and stop.exists()):
        started = time.time()
        before = scheduler.last_report
        interval = scheduler.tick()
        report = scheduler.last_report
        if report is before:  # beat caught the tick's exception and logged it
            tick_errors += 1
        else:
            totals.update(
                ticks=1,
                claimed=report.claimed,
                sent=report.sent,
                conflicts=report.conflicts,
                deferred=report.deferred,
                skipped_windows=report.skipped_windows,
                send_failures=report.send_failures,
                lost=report.lost,
            )
            ticks.append([started, time.time(), float(report.claimed), float(report.sent)])
        if interval and interval > 0:
            # Sleep as told, in slices, so a stop file is seen without extra ticks.
            wake = time.time() + interval
            while time.time() < min(wake, args.until) and not (stop and stop.exists()):
                time.sleep(min(0.2, max(0.0, wake - time.time())))
            if scheduler.should_sync():
                scheduler._do_sync()
    scheduler.close()
    emit(
        {
            **totals,
            "tick_errors": tick_errors,
            "warnings": warnings.count,
            "first_warnings": warnings.first,
            "ticks_seen": ticks,
        }
    )


# -- measuring from outside ----------------------------------------------------------


def cpu_of(pids: list[int]) -> float:
    """CPU seconds (user + system) used so far by these processes."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def postgres_cpu(database: str) -> tuple[dict[int, float], dict[int, float]]:
    """CPU seconds so far, by pid, of every PostgreSQL server process, and of
    the backends serving ``database`` (its name is in their process title).
    Key 0 holds what the postmaster's ended children used (backends, parallel
    query workers, autovacuum workers), so a process that ended is counted."""
    import psutil

    every, ours = {}, {}
    for proc in psutil.process_iter(["name", "cpu_times", "cmdline", "ppid"]):
        if proc.info["name"] == "postgres" and proc.info["cpu_times"] is not None:
            times = proc.info["cpu_times"]
            every[proc.pid] = times.user + times.system
            if database in " ".join(proc.info["cmdline"] or []):
                ours[proc.pid] = every[proc.pid]
            try:
                postmaster = psutil.Process(proc.info["ppid"]).name() != "postgres"
            except psutil.Error:
                postmaster = False
            if postmaster:
                every[0] = every.get(0, 0.0) + times.children_user + times.children_system
    return every, ours


def postgres_delta(before: dict[int, float], after: dict[int, float]) -> float:
    # Totals, not per pid: a process that ended moved its seconds into key 0.
    return sum(after.values()) - sum(before.values())


def machine_busy() -> float:
    import psutil

    times = psutil.cpu_times()
    return times.user + times.nice + times.system + times.irq + times.softirq + times.steal


@dataclass
class CpuSample:
    at: float
    processes: dict[str, float]
    postgres: dict[int, float]
    postgres_ours: dict[int, float]
    machine: float


def sample_cpu(groups: dict[str, list[int]], database: str) -> CpuSample:
    every, ours = postgres_cpu(database)
    return CpuSample(
        time.time(),
        {name: cpu_of(pids) for name, pids in groups.items()},
        every,
        ours,
        machine_busy(),
    )


def cpu_between(first: CpuSample, second: CpuSample) -> dict[str, float]:
    used = {name: second.processes[name] - first.processes[name] for name in first.processes}
    used["postgres"] = postgres_delta(first.postgres, second.postgres)
    # Live backends only: one that ended in between is not counted.
    used["postgres_ours"] = sum(
        seconds - first.postgres_ours.get(pid, 0.0) for pid, seconds in second.postgres_ours.items()
    )
    used["machine"] = second.machine - first.machine
    used["wall"] = second.at - first.at
    used["cores"] = float(os.cpu_count() or 1)
    return used


def database_activity(name: str) -> dict[str, float]:
    from sqlalchemy import text

    admin = pg_admin()
    try:
        with admin.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT xact_commit, xact_rollback, tup_returned, tup_fetched"
                    " FROM pg_stat_database WHERE datname = :name"
                ),
                {"name": name},
            ).one()
    finally:
        admin.dispose()
    return {
        "at": time.time(),
        "transactions": float(row[0] + row[1]),
        "rows_read": float(row[2] + row[3]),
    }


@dataclass
class Messages:
    """What the broker holds, counted per task id and per window key."""

    total: int = 0
    doubles_by_id: dict[str, int] = field(default_factory=dict)
    doubles_by_key: dict[str, int] = field(default_factory=dict)
    keys: set[str] = field(default_factory=set)


def count_messages(client: Any) -> Messages:
    """Reads the queue without consuming it."""
    by_id: Counter[str] = Counter()
    by_key: Counter[str] = Counter()
    for raw in client.lrange(QUEUE, 0, -1):
        headers = json.loads(raw)["headers"]
        by_id[headers["id"]] += 1
        by_key[headers["routine_window"]] += 1
    return Messages(
        total=sum(by_id.values()),
        doubles_by_id={k: n for k, n in by_id.items() if n > 1},
        doubles_by_key={k: n for k, n in by_key.items() if n > 1},
        keys=set(by_key),
    )


def run_rows(url: str) -> dict[str, Any]:
    """Run rows by state, and routines with other than exactly one run."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            states = dict(
                conn.execute(text("SELECT state, count(*) FROM routine_runs GROUP BY state")).all()
            )
            uneven = conn.execute(
                text(
                    "SELECT r.name, count(x.id) FROM routines r"
                    " LEFT JOIN routine_runs x ON x.routine_id = r.id"
                    " GROUP BY r.name HAVING count(x.id) <> 1 LIMIT 20"
                )
            ).all()
    finally:
        engine.dispose()
    return {"states": {str(k): int(v) for k, v in states.items()}, "not_once": uneven}


def start_beats(
    count: int, db: int, url: str, until: float, stop_file: str, extra: list[str] | None = None
) -> list[Child]:
    argv = ["beat", "--redis-db", str(db), "--pg-url", url, "--until", str(until)]
    argv += ["--stop-file", stop_file, *(extra or [])]
    return [Child(argv, module="benchmarks.many_beats") for _ in range(count)]


def finish(child: Child, seconds: float) -> dict[str, Any]:
    """The child's result, waiting at most ``seconds`` more (``Child.wait``
    counts its budgets from the child's start)."""
    budget = time.monotonic() - child.started + seconds
    return child.wait(budget, budget)


def wait_ready(children: list[Child], deadline: float) -> str | None:
    """None when every child printed READY before ``deadline``, else what went wrong."""
    for child in children:
        assert child.proc.stdout is not None
        line = child.proc.stdout.readline().strip()
        if line != "READY":
            return f"a process did not start: {line!r} {child.stderr_tail[-5:]}"
    if time.time() > deadline:
        return f"processes were ready {time.time() - deadline:.1f} s after the first window"
    return None


def one_count(beats: int, db: int, args: argparse.Namespace) -> dict[str, Any]:
    name, url = create_database(f"many_x{beats}")
    clear_redis_db(db)
    stop_file = f"/tmp/many-beats-stop-{os.getpid()}-{beats}"
    Path(stop_file).unlink(missing_ok=True)
    children: list[Child] = []
    try:
        started = time.time()
        t0 = math.ceil(started + args.lead)
        insert_routines(url, args.size, datetime.fromtimestamp(t0, UTC), interval=DAY, spread=1)
        declare_queue(_celery_app(db))
        until = t0 + args.burst_cap + args.idle_seconds + 30
        children = start_beats(beats, db, url, until, stop_file)
        problem = wait_ready(children, t0 - 0.2)
        if problem:
            return {"error": problem}
        groups = {"beats": [child.proc.pid for child in children]}
        client = redis_client(db)
        time.sleep(max(0.0, t0 - time.time()))
        at_t0 = sample_cpu(groups, name)
        published = 0
        while published < args.size and time.time() < t0 + args.burst_cap:
            time.sleep(0.01)
            published = queue_length(client)
        at_end = sample_cpu(groups, name)
        burst_s = at_end.at - t0
        log(f"{beats} beat(s): {published:,} published in {burst_s:.2f} s")
        time.sleep(args.settle)
        activity0 = database_activity(name)
        idle0 = sample_cpu(groups, name)
        time.sleep(args.idle_seconds)
        activity1 = database_activity(name)
        idle1 = sample_cpu(groups, name)
        Path(stop_file).touch()
        results = [finish(child, 60) for child in children]
        if any("ticks" not in r for r in results):
            return {"error": f"a beat failed: {results}"}
        messages = count_messages(client)
        client.close()
        seconds = activity1["at"] - activity0["at"]
        return {
            "beats": beats,
            "burst_s": burst_s,
            "published": published,
            "complete": published >= args.size,
            "cpu_burst": cpu_between(at_t0, at_end),
            "cpu_idle": cpu_between(idle0, idle1),
            "idle_transactions_per_s": (activity1["transactions"] - activity0["transactions"])
            / seconds,
            "idle_rows_read_per_s": (activity1["rows_read"] - activity0["rows_read"]) / seconds,
            "per_beat": [{k: v for k, v in r.items() if k != "ticks_seen"} for r in results],
            # Ticks that started during the burst and claimed nothing: every
            # due row they looked at was claimed (locked) by another beat.
            "empty_claims_in_burst": [
                sum(1 for t in r["ticks_seen"] if t0 <= t[0] < at_end.at and t[2] == 0)
                for r in results
            ],
            "ticks_in_burst": [
                sum(1 for t in r["ticks_seen"] if t0 <= t[0] < at_end.at) for r in results
            ],
            "last_sending_tick_end": max(
                (t[1] for r in results for t in r["ticks_seen"] if t[3] > 0), default=None
            ),
            "messages": messages.total,
            "doubles_by_id": messages.doubles_by_id,
            "doubles_by_key": messages.doubles_by_key,
            "windows": len(messages.keys),
            "rows": run_rows(url),
            "t0": t0,
        }
    finally:
        Path(stop_file).touch()
        for child in children:
            if child.proc.poll() is None:
                child.kill()
        Path(stop_file).unlink(missing_ok=True)
        clear_redis_db(db)
        drop_database(name)


def report(found: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"many beats, one PostgreSQL: a burst of {args.size:,} windows due at one instant"
        f" (PostgreSQL store, Redis broker and gate), {os.cpu_count()} cores"
    )
    first = next((r for r in found if "burst_s" in r), None)
    for result in found:
        if "burst_s" not in result:
            print(f"  {result}")
            continue
        beats, cpu = result["beats"], result["cpu_burst"]
        per_beat = result["per_beat"]
        ratio = first["burst_s"] / result["burst_s"] if first else 1.0
        print(f"{beats} beat(s):")
        print(
            f"  burst {result['burst_s']:.2f} s until the last message was in Redis"
            f" ({result['published']:,} messages; x{ratio:.2f} faster than 1 beat)"
            + ("" if result["complete"] else " INCOMPLETE")
        )
        once = (
            result["messages"] == args.size
            and result["windows"] == args.size
            and not result["doubles_by_id"]
            and not result["doubles_by_key"]
            and not result["rows"]["not_once"]
        )
        print(
            f"  every window exactly once: {'yes' if once else 'NO'} ({result['messages']:,}"
            f" messages, {result['windows']:,} distinct window keys, doubles by task id"
            f" {len(result['doubles_by_id'])}, by window {len(result['doubles_by_key'])},"
            f" run rows {result['rows']['states']}"
            + ("" if once else f", routines without exactly one run {result['rows']['not_once']}")
            + ")"
        )
        claimed = sum(b.get("claimed", 0) for b in per_beat)
        print(
            "  claims: routines claimed per beat"
            f" {[b.get('claimed', 0) for b in per_beat]} (total {claimed:,}; above"
            f" {args.size:,} = claimed twice: {max(0, claimed - args.size)}),"
            f" sent per beat {[b.get('sent', 0) for b in per_beat]};"
            f" conflicts (run row already written by another beat)"
            f" {sum(b.get('conflicts', 0) for b in per_beat)}, deferred (gate held, no row yet)"
            f" {sum(b.get('deferred', 0) for b in per_beat)}; ticks during the burst that"
            f" claimed nothing (all due rows locked by others) {result['empty_claims_in_burst']}"
            f" of {result.get('ticks_in_burst')}"
        )
        problems = sum(
            b.get("tick_errors", 0) + b.get("send_failures", 0) + b.get("warnings", 0)
            for b in per_beat
        )
        if problems:
            print(
                f"  PROBLEMS: tick errors {[b.get('tick_errors') for b in per_beat]}, send"
                f" failures {[b.get('send_failures') for b in per_beat]}, warnings"
                f" {[b.get('first_warnings') for b in per_beat]}"
            )
        busy = cpu["beats"] + cpu["postgres"]
        print(
            f"  CPU during the burst: beats {cpu['beats']:.2f} s,"
            f" PostgreSQL {cpu['postgres']:.2f} s"
            f" (its backends for this database {cpu['postgres_ours']:.2f} s),"
            f" whole machine {cpu['machine']:.2f} s of {cpu['wall'] * cpu['cores']:.2f} available"
            f" ({cpu['wall']:.2f} s x {cpu['cores']:.0f} cores); beats + PostgreSQL ="
            f" {busy / (cpu['wall'] * cpu['cores']):.0%}, machine"
            f" {cpu['machine'] / (cpu['wall'] * cpu['cores']):.0%} (other processes"
            f" {cpu['machine'] - busy:.2f} s)"
        )
        idle = result["cpu_idle"]
        print(
            f"  idle ({args.idle_seconds:.0f} s): {result['idle_transactions_per_s']:.1f}"
            f" transactions/s and {result['idle_rows_read_per_s']:.1f} rows read/s on the"
            f" database (pg_stat_database); CPU beats {idle['beats'] / idle['wall']:.1%} of a"
            f" core, this database's backends {idle['postgres_ours'] / idle['wall']:.1%}, all of"
            f" PostgreSQL {idle['postgres'] / idle['wall']:.1%}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role")
    b = sub.add_parser("beat", help="one beat process (started by this script)")
    b.add_argument("--redis-db", type=int, required=True)
    b.add_argument("--pg-url", required=True)
    b.add_argument("--until", type=float, required=True)
    b.add_argument("--stop-file")
    parser.add_argument("--beats", default="1,2,3,4")
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--lead", type=float, default=12.0, help="seconds from set-up to t0")
    parser.add_argument("--burst-cap", type=float, default=60.0)
    # PostgreSQL 15 flushes an idle backend's statistics up to 10 s late.
    parser.add_argument("--settle", type=float, default=12.0)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--json", default="/tmp/celery-routines-many-beats.json")
    args = parser.parse_args(argv)
    if args.role == "beat":
        beat(args)
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    db = claim_redis_db()
    found = []
    try:
        for count in [int(n) for n in args.beats.split(",")]:
            log(f"== {count} beat(s), burst of {args.size:,}")
            found.append(one_count(count, db, args))
    finally:
        clear_redis_db(db, keep_owner=False)
    Path(args.json).write_text(json.dumps(found, indent=1, default=str))
    report(found, args)


if __name__ == "__main__":
    main()
