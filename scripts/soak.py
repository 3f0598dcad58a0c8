"""Soak run (not a CI test): two beats and two workers for N minutes against a
throwaway PostgreSQL database and a redis-server of its own (broker and gate),
with random SIGKILLs of beats and workers; then prints what happened.

    /tmp/venv/bin/python scripts/soak.py --minutes 5

Routines are inserted by SQL (interval 1-3 s, ``overlap="overlap"``, fast
retries); the task appends one line per body run to a file, so doubles are
counted from what ran, not from what beat believes. Kills stop at the end of
the soak; beats and workers then run on for a drain period (longer than
``routines_run_timeout`` plus a retry) so runs lost by a kill are declared
lost and retried. Only windows due before the kills stopped are counted.

Prints: windows expected, sent, succeeded, skipped (catch-up summaries),
doubled (a run body twice, or two attempts of one window both succeeding:
must be 0) and lost (a window with no run row, or none that succeeded: must
be 0). Exits 1 when doubled or lost is not 0.

Needs PostgreSQL (``ROUTINES_TEST_PG``, default
postgresql://postgres@127.0.0.1:5432/postgres) and ``redis-server`` on PATH.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sqlalchemy import text  # noqa: E402

from celery_routines.store import Store  # noqa: E402
from tests.e2e.processes import CeleryProcess, environment  # noqa: E402
from tests.services import PostgresDatabases  # noqa: E402

RUN_TIMEOUT = 12
LOCK_TTL = 4
RETRY_BASE = 1.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_redis(port: int, folder: Path) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(folder),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return server
        except OSError:
            time.sleep(0.05)
    server.kill()
    raise SystemExit(f"redis-server did not start on port {port}")


@dataclass
class Soak:
    folder: Path
    database_url: str
    broker_url: str
    gate_url: str
    ran_log: Path
    beats: dict[str, CeleryProcess] = field(default_factory=dict)
    workers: dict[str, CeleryProcess] = field(default_factory=dict)
    kills: Counter[str] = field(default_factory=Counter)
    starts: Counter[str] = field(default_factory=Counter)

    def env(self) -> dict[str, str]:
        return environment(
            self.broker_url,
            self.database_url,
            ROUTINES_REDIS_URL=self.gate_url,
            ROUTINES_LOCK_TTL=str(LOCK_TTL),
            ROUTINES_RUN_TIMEOUT=str(RUN_TIMEOUT),
            E2E_QUEUE="soak",
        )

    def start_beat(self, label: str) -> None:
        self.starts[label] += 1
        log = self.folder / f"{label}-{self.starts[label]}.log"
        self.beats[label] = CeleryProcess(
            [
                "beat",
                "-S",
                "celery_routines.Scheduler",
                "--loglevel",
                "INFO",
                "--max-interval",
                "1",
                "--schedule",
                str(self.folder / f"{label}-schedule"),
            ],
            self.env(),
            log,
        )

    def start_worker(self, label: str) -> None:
        self.starts[label] += 1
        log = self.folder / f"{label}-{self.starts[label]}.log"
        self.workers[label] = CeleryProcess(
            [
                "worker",
                "-P",
                "prefork",
                "-c",
                "2",
                "-Q",
                "soak",
                "-n",
                f"{label}@%h",
                "--loglevel",
                "INFO",
                "--without-gossip",
                "--without-mingle",
            ],
            self.env(),
            log,
        )

    def kill(self, label: str) -> None:
        process = (self.beats | self.workers)[label]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.process.pid, signal.SIGKILL)
        process.process.wait(timeout=10)
        process.handle.close()
        self.kills["beat" if label.startswith("beat") else "worker"] += 1

    def restart(self, label: str) -> None:
        if label.startswith("beat"):
            self.start_beat(label)
        else:
            self.start_worker(label)

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


def insert_routines(store: Store, count: int, ran_log: Path, task_seconds: float) -> None:
    import json

    if task_seconds > 0:
        # e2e_app.hold runs until a file that never appears, at most task_seconds:
        # a SIGKILLed worker then really loses runs in the middle of their body.
        task, args = "e2e_app.hold", [str(ran_log), str(ran_log) + ".never", task_seconds]
    else:
        task, args = "e2e_app.record", [str(ran_log)]
    rows = [
        {
            "name": f"soak{i:03d}",
            "task": task,
            "interval_seconds": float(1 + i % 3),
            "enabled": True,
            "args": json.dumps(args),
            "overlap": "overlap",
            "max_retries": 20,
            "retry_base_seconds": RETRY_BASE,
        }
        for i in range(count)
    ]
    names = list(rows[0])
    with store.engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO routines ({', '.join(names)}) "
                f"VALUES ({', '.join(':' + n for n in names)})"
            ),
            rows,
        )


def figures(store: Store, ran_log: Path, cut: datetime) -> dict[str, int]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT t.name, t.interval_seconds, r.id, r.idempotency_key, r.attempt, "
                "r.state, r.reason, r.scheduled_for, r.skipped_count, r.skipped_first "
                "FROM routine_runs r JOIN routines t ON t.id = r.routine_id "
                "WHERE t.name LIKE 'soak%'"
            )
        ).all()
    naive_cut = cut.astimezone(UTC).replace(tzinfo=None)
    # One "ran <id>" (record) or "start <id> <pid>" (hold) line per body run.
    ran = Counter(
        line.split()[1]
        for line in ran_log.read_text().splitlines()
        if line.startswith(("ran ", "start "))
    )
    first: dict[str, datetime] = {}
    step: dict[str, timedelta] = {}
    covered: dict[str, set[datetime]] = defaultdict(set)
    by_window: dict[tuple[str, datetime], list] = defaultdict(list)
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
    doubled_runs = sum(1 for n in ran.values() if n > 1)
    keys = Counter((r.name, r.idempotency_key, r.attempt) for r in rows)
    return {
        "expected": expected,
        "sent": len(by_window),
        "succeeded": succeeded,
        "skipped": skipped,
        "retried_attempts": sum(1 for r in rows if r.attempt > 1 and r.scheduled_for <= naive_cut),
        "lost_runs_recovered": sum(1 for r in rows if r.reason == "lost"),
        "doubled": doubled_runs + doubled_windows + sum(1 for n in keys.values() if n > 1),
        "lost": missing + unsucceeded,
        "missing_windows": missing,
        "windows_without_success": unsucceeded,
        "body_runs_in_all": sum(ran.values()),  # windows after the cut too
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--routines", type=int, default=30)
    parser.add_argument("--kill-every", type=float, default=8.0, help="mean seconds between kills")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--task-seconds", type=float, default=0.0, help="how long each task body runs"
    )
    parser.add_argument("--keep", action="store_true", help="keep the logs' folder")
    options = parser.parse_args()
    rng = random.Random(options.seed)

    folder = Path(tempfile.mkdtemp(prefix="routines-soak-"))
    databases = PostgresDatabases()
    database_url = databases.create()
    port = free_port()
    redis = start_redis(port, folder)
    ran_log = folder / "ran.log"
    ran_log.touch()
    store = Store.from_url(database_url)
    store.migrate()
    insert_routines(store, options.routines, ran_log, options.task_seconds)
    soak = Soak(
        folder,
        database_url,
        f"redis://127.0.0.1:{port}/0",
        f"redis://127.0.0.1:{port}/1",
        ran_log,
    )
    started = time.monotonic()
    try:
        for label in ("worker-a", "worker-b"):
            soak.start_worker(label)
        for label in ("beat-a", "beat-b"):
            soak.start_beat(label)
        end = started + options.minutes * 60
        down: dict[str, float] = {}  # label -> when to restart it
        next_kill = time.monotonic() + rng.expovariate(1 / options.kill_every)
        while time.monotonic() < end:
            now = time.monotonic()
            for label, when in list(down.items()):
                if now >= when:
                    soak.restart(label)
                    del down[label]
            if now >= next_kill:
                # Keep one beat and one worker up: a kill of both is an outage,
                # which the catch-up policy (not this soak) is about.
                kind = rng.choice(("beat", "worker"))
                candidates = [
                    label
                    for label in (soak.beats if kind == "beat" else soak.workers)
                    if label not in down
                ]
                if len(candidates) == 2:
                    victim = rng.choice(candidates)
                    soak.kill(victim)
                    down[victim] = now + rng.uniform(1.0, 6.0)
                    print(f"{now - started:7.1f}s SIGKILL {victim}", flush=True)
                next_kill = now + rng.expovariate(1 / options.kill_every)
            soak.check_alive()
            time.sleep(0.2)
        for label in list(down):
            soak.restart(label)
        cut = datetime.now(UTC)
        drain = RUN_TIMEOUT + 15 + 8 * RETRY_BASE
        print(f"kills stopped; draining for {drain:.0f} s", flush=True)
        deadline = time.monotonic() + drain
        while time.monotonic() < deadline:
            soak.check_alive()
            time.sleep(0.5)
    finally:
        soak.stop_all()
        redis.kill()
        redis.wait()
    try:
        result = figures(store, ran_log, cut)
    finally:
        store.dispose()
        databases.drop_all()
    minutes = (time.monotonic() - started) / 60
    print(
        f"minutes run: {options.minutes:g} (+ drain; {minutes:.1f} in all), "
        f"routines: {options.routines}, kills: {soak.kills['beat']} beat, "
        f"{soak.kills['worker']} worker"
    )
    for key, value in result.items():
        print(f"{key:>26}: {value}")
    if options.keep:
        print(f"logs kept in {folder}")
    else:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    return 1 if result["doubled"] or result["lost"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
