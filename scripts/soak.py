"""Soak run (not a CI test): three beats and three prefork workers for N
minutes against a throwaway PostgreSQL database, with random SIGKILLs of
beats and workers, a restart of each server, a beat whose clock is stepped an
hour back and forward again (libfaketime), and routines whose bodies last
longer than the run timeout; then prints what happened.

    python scripts/soak.py --minutes 30                        # everything (issue 18)
    python scripts/soak.py --minutes 5 --no-service-restarts   # kills and clocks only

The broker and the gate are two redis-servers of the soak's own (the broker
with an append-only file, so a restart keeps its queue), so restarting them
disturbs no one else. The PostgreSQL restart is of the machine's cluster
(``pg_ctlcluster --skip-systemctl-redirect VERSION main restart``): every
other user of that server sees it, so on a shared machine run with
``--no-service-restarts`` (or ``--no-postgres-restart``).

Routines are inserted by SQL: ``--routines`` short ones (interval 1-3 s,
``overlap="overlap"``, fast retries) and ``--long`` ones whose body lasts
2.5x ``routines_run_timeout`` (interval 40 s, ``overlap="skip"``): their
heartbeats must keep them from being declared lost. Every body appends a
line to a file, so doubles are counted from what ran, not from what beat
believes. Kills and restarts stop at the end; beats and workers then run on
for a drain period (longer than the run timeout plus a retry) so runs lost by
a kill are declared lost and retried. Only windows due before the kills
stopped are counted.

Prints windows expected, sent, succeeded, skipped, doubled (a body run twice,
or two attempts of one window both succeeding), lost (a window with no run
row, or none that succeeded), the worst start lateness of a first attempt,
and the long bodies' windows; exits 1 unless doubled and lost are 0. Needs
PostgreSQL (``ROUTINES_TEST_PG``), ``redis-server`` and Debian's ``faketime``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sqlalchemy import text  # noqa: E402

from celery_routines.store import Store  # noqa: E402
from tests.e2e.processes import CeleryProcess, environment  # noqa: E402
from tests.services import PostgresDatabases  # noqa: E402

RUN_TIMEOUT = 12
LOCK_TTL = 4
RETRY_BASE = 1.0
LONG_BODY = 2.5 * RUN_TIMEOUT
LONG_INTERVAL = 40.0
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
BEATS = ("beat-a", "beat-b", "beat-c")  # beat-c runs under libfaketime when it is installed
WORKERS = ("worker-a", "worker-b", "worker-c")
# When each disturbance happens, as a share of the soak's duration.
PLAN = (
    (0.15, "clock-back"),
    (0.30, "clock-forward"),
    (0.45, "gate-restart"),
    (0.60, "broker-restart"),
    (0.75, "postgres-restart"),
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """A redis-server of the soak's own, restartable on the same port."""

    def __init__(self, folder: Path, durable: bool) -> None:
        self.port, self.folder, self.durable = free_port(), folder, durable
        folder.mkdir(parents=True, exist_ok=True)
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        durable = ["--appendonly", "yes", "--appendfsync", "always"] if self.durable else []
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
            + (durable or ["--appendonly", "no"])
            + ["--dir", str(self.folder)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5),
            ):
                return
            time.sleep(0.05)
        self.stop()
        raise SystemExit(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def restart_postgres() -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True,
        timeout=120,
    )


@dataclass
class Soak:
    folder: Path
    database_url: str
    broker_url: str
    gate_url: str
    faketime: Path | None
    beats: dict[str, CeleryProcess] = field(default_factory=dict)
    workers: dict[str, CeleryProcess] = field(default_factory=dict)
    kills: Counter[str] = field(default_factory=Counter)
    starts: Counter[str] = field(default_factory=Counter)

    def env(self, label: str) -> dict[str, str]:
        extra = {}
        if label == BEATS[-1] and self.faketime is not None:
            extra = {
                "LD_PRELOAD": str(LIBFAKETIME),
                "FAKETIME_TIMESTAMP_FILE": str(self.faketime),
                "FAKETIME_NO_CACHE": "1",
            }
        return environment(
            self.broker_url,
            self.database_url,
            ROUTINES_REDIS_URL=self.gate_url,
            ROUTINES_LOCK_TTL=str(LOCK_TTL),
            ROUTINES_RUN_TIMEOUT=str(RUN_TIMEOUT),
            E2E_QUEUE="soak",
            **extra,
        )

    def start(self, label: str) -> None:
        self.starts[label] += 1
        log = self.folder / f"{label}-{self.starts[label]}.log"
        if label.startswith("beat"):
            args = ["beat", "-S", "celery_routines.Scheduler", "--loglevel", "INFO"]
            args += ["--max-interval", "1", "--schedule", str(self.folder / f"{label}-schedule")]
            self.beats[label] = CeleryProcess(args, self.env(label), log)
        else:
            args = ["worker", "-P", "prefork", "-c", "2", "-Q", "soak", "-n", f"{label}@%h"]
            args += ["--loglevel", "INFO", "--without-gossip", "--without-mingle"]
            self.workers[label] = CeleryProcess(args, self.env(label), log)

    def kill(self, label: str) -> None:
        process = (self.beats | self.workers)[label]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.process.pid, signal.SIGKILL)
        process.process.wait(timeout=10)
        process.handle.close()
        self.kills["beat" if label.startswith("beat") else "worker"] += 1

    def stop_all(self) -> None:
        for process in [*self.beats.values(), *self.workers.values()]:
            with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
                process.stop()

    def check_alive(self) -> None:
        for label, process in (self.beats | self.workers).items():
            code = process.process.poll()
            if code is not None and code != -signal.SIGKILL:
                tail = process.output()[-3000:]
                raise SystemExit(f"{label} exited by itself with {code}:\n{tail}")


def insert_routines(store: Store, count: int, long: int, ran_log: Path) -> None:
    never = str(ran_log) + ".never"  # hold runs until this file exists: it never does
    rows = [
        {
            "name": f"soak{i:03d}",
            "task": "e2e_app.record",
            "interval_seconds": float(1 + i % 3),
            "args": json.dumps([str(ran_log)]),
            "overlap": "overlap",
        }
        for i in range(count)
    ] + [
        {
            "name": f"long{i:03d}",
            "task": "e2e_app.hold",
            "interval_seconds": LONG_INTERVAL,
            "args": json.dumps([str(ran_log), never, LONG_BODY]),
            "overlap": "skip",
        }
        for i in range(long)
    ]
    for row in rows:
        row.update(enabled=True, max_retries=20, retry_base_seconds=RETRY_BASE)
    names = list(rows[0])
    with store.engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO routines ({', '.join(names)}) "
                f"VALUES ({', '.join(':' + n for n in names)})"
            ),
            rows,
        )


RUN_COLUMNS = (
    "t.name, t.interval_seconds, r.id, r.idempotency_key, r.attempt, r.state, r.reason, "
    "r.scheduled_for, r.skipped_count, r.skipped_first, r.started_at"
)


def load_runs(store: Store) -> list[Any]:
    with store.engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    f"SELECT {RUN_COLUMNS} FROM routine_runs r "
                    "JOIN routines t ON t.id = r.routine_id"
                )
            )
        )


def tally(rows: Sequence[Any], ran_lines: Iterable[str], cut: datetime) -> dict[str, Any]:
    """The soak's figures from its run rows and body log (pure: the smoke test
    feeds it rows it made). ``cut``: windows after it are not counted."""
    naive_cut = cut.astimezone(UTC).replace(tzinfo=None)
    # One "ran <id>" (record) or "start <id> <pid>" (hold) line per body run.
    ran = Counter(line.split()[1] for line in ran_lines if line.startswith(("ran ", "start ")))
    first: dict[str, datetime] = {}
    step: dict[str, timedelta] = {}
    covered: dict[str, set[datetime]] = defaultdict(set)
    by_window: dict[tuple[str, datetime], list[Any]] = defaultdict(list)
    skipped = 0
    for r in rows:
        step[r.name] = timedelta(seconds=r.interval_seconds)
        start = r.skipped_first if r.state == "skipped" else r.scheduled_for
        first[r.name] = min(first.get(r.name, start), start)
        if r.state == "skipped":
            for k in range(r.skipped_count or 1):
                instant = r.skipped_first + k * step[r.name]
                if instant <= naive_cut:
                    covered[r.name].add(instant)
                    skipped += 1
        elif r.scheduled_for <= naive_cut:
            by_window[(r.name, r.scheduled_for)].append(r)
    expected = missing = 0
    for name, start in first.items():
        instant = start
        while instant <= naive_cut:
            expected += 1
            if (name, instant) not in by_window and instant not in covered[name]:
                missing += 1
            instant += step[name]
    succeeded = unsucceeded = doubled_windows = 0
    for runs in by_window.values():
        wins = [r for r in runs if r.state == "succeeded"]
        succeeded += bool(wins)
        unsucceeded += not wins
        doubled_windows += len(wins) > 1
    keys = Counter((r.name, r.idempotency_key, r.attempt) for r in rows)
    late = [
        (r.started_at - r.scheduled_for).total_seconds()
        for runs in by_window.values()
        for r in runs
        if r.attempt == 1 and r.started_at is not None
    ]
    long_runs = [r for runs in by_window.values() for r in runs if r.name.startswith("long")]
    long_windows = {(r.name, r.scheduled_for) for r in long_runs}
    return {
        "expected": expected,
        "sent": len(by_window),
        "succeeded": succeeded,
        "skipped": skipped,
        "retried_attempts": sum(1 for r in rows if r.attempt > 1 and r.scheduled_for <= naive_cut),
        "lost_runs_recovered": sum(1 for r in rows if r.reason == "lost"),
        "doubled": sum(1 for n in ran.values() if n > 1)
        + doubled_windows
        + sum(1 for n in keys.values() if n > 1),
        "lost": missing + unsucceeded,
        "missing_windows": missing,
        "windows_without_success": unsucceeded,
        "worst_start_lateness_s": round(max(late, default=0.0), 3),
        "long_windows_sent": len(long_windows),
        "long_windows_succeeded": sum(
            any(r.state == "succeeded" for r in by_window[w]) for w in long_windows
        ),
        "long_bodies_run_twice": sum(1 for r in long_runs if ran[r.id] > 1),
        "body_runs_in_all": sum(ran.values()),  # windows after the cut too
    }


def disturb(what: str, soak: Soak, gate: RedisServer, broker: RedisServer) -> str:
    """One planned disturbance; returns what was done, for the log."""
    if what in ("clock-back", "clock-forward"):
        if soak.faketime is None:
            return f"{what} skipped (libfaketime is not installed)"
        soak.faketime.write_text("-1h\n" if what == "clock-back" else "+0\n")
        return f"{BEATS[-1]}'s clock stepped " + (
            "an hour back" if what == "clock-back" else "forward again"
        )
    if what == "postgres-restart":
        restart_postgres()
        return "PostgreSQL restarted"
    server = gate if what == "gate-restart" else broker
    server.stop()
    time.sleep(2.0)
    server.start()
    return f"{'gate' if server is gate else 'broker'} redis-server killed and restarted after 2 s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--routines", type=int, default=30, help="short routines (1-3 s)")
    parser.add_argument("--long", type=int, default=3, help="routines with a long body")
    parser.add_argument("--kill-every", type=float, default=8.0, help="mean seconds between kills")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--no-service-restarts",
        action="store_true",
        help="restart no server (neither the soak's redis-servers nor PostgreSQL)",
    )
    parser.add_argument(
        "--no-postgres-restart",
        action="store_true",
        help="restart the soak's own redis-servers but not the machine's PostgreSQL",
    )
    parser.add_argument("--keep", action="store_true", help="keep the logs' folder")
    options = parser.parse_args()
    rng = random.Random(options.seed)
    plan = [
        (share, what)
        for share, what in PLAN
        if not (what.endswith("-restart") and options.no_service_restarts)
        and not (what == "postgres-restart" and options.no_postgres_restart)
    ]

    folder = Path(tempfile.mkdtemp(prefix="routines-soak-"))
    databases = PostgresDatabases()
    database_url = databases.create()
    broker, gate = RedisServer(folder / "broker", durable=True), RedisServer(folder / "gate", False)
    ran_log = folder / "ran.log"
    ran_log.touch()
    faketime = folder / "faketime" if LIBFAKETIME.exists() else None
    if faketime is not None:
        faketime.write_text("+0\n")
    store = Store.from_url(database_url)
    store.migrate()
    insert_routines(store, options.routines, options.long, ran_log)
    soak = Soak(folder, database_url, broker.url, gate.url, faketime)
    started = time.monotonic()
    try:
        for label in (*WORKERS, *BEATS):
            soak.start(label)
        end = started + options.minutes * 60
        due_plan = [(started + share * (end - started), what) for share, what in plan]
        down: dict[str, float] = {}  # label -> when to restart it
        next_kill = time.monotonic() + rng.expovariate(1 / options.kill_every)
        while time.monotonic() < end:
            now = time.monotonic()
            for label, when in list(down.items()):
                if now >= when:
                    soak.start(label)
                    del down[label]
            while due_plan and now >= due_plan[0][0]:
                done = disturb(due_plan.pop(0)[1], soak, gate, broker)
                print(f"{now - started:7.1f}s {done}", flush=True)
            if now >= next_kill:
                # Keep at least one beat and one worker up: a kill of all is an
                # outage, which the catch-up policy (not this soak) is about.
                kind = rng.choice(("beat", "worker"))
                pool = soak.beats if kind == "beat" else soak.workers
                candidates = [label for label in pool if label not in down]
                if len(candidates) >= 2:
                    victim = rng.choice(candidates)
                    soak.kill(victim)
                    down[victim] = now + rng.uniform(1.0, 6.0)
                    print(f"{now - started:7.1f}s SIGKILL {victim}", flush=True)
                next_kill = now + rng.expovariate(1 / options.kill_every)
            soak.check_alive()
            time.sleep(0.2)
        for label in list(down):
            soak.start(label)
        if faketime is not None:
            faketime.write_text("+0\n")
        cut = datetime.now(UTC)
        drain = RUN_TIMEOUT + LONG_BODY + 15 + 8 * RETRY_BASE
        print(f"kills stopped; draining for {drain:.0f} s", flush=True)
        deadline = time.monotonic() + drain
        while time.monotonic() < deadline:
            soak.check_alive()
            time.sleep(0.5)
    finally:
        soak.stop_all()
        broker.stop()
        gate.stop()
    # A PostgreSQL restart left both pools holding dead connections.
    store.engine.dispose()
    databases.admin.dispose()
    try:
        result = tally(load_runs(store), ran_log.read_text().splitlines(), cut)
    finally:
        store.dispose()
        databases.drop_all()
    minutes = (time.monotonic() - started) / 60
    print(
        f"minutes run: {options.minutes:g} (+ drain; {minutes:.1f} in all), "
        f"routines: {options.routines} short, {options.long} long, "
        f"kills: {soak.kills['beat']} beat, {soak.kills['worker']} worker, "
        f"disturbances: {', '.join(what for _, what in plan) or 'none'}"
    )
    for key, value in result.items():
        print(f"{key:>26}: {value}")
    if options.keep:
        print(f"logs kept in {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if result["doubled"] or result["lost"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
