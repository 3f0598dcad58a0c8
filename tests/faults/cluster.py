"""Starting, killing and checking real beat processes for the fault tests."""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import redis
from sqlalchemy import text

from celery_routines.store import Store
from tests.e2e.processes import CeleryProcess, environment


@dataclass
class Cluster:
    tmp_path: Path
    database_url: str
    broker_url: str
    store: Store
    processes: list[CeleryProcess] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)

    def add_interval_routines(self, count: int, intervals: tuple[float, ...], **columns) -> None:
        """Routines inserted by plain SQL, as an operator would."""
        rows = [
            {
                "name": f"r{i:04d}",
                "task": "e2e_app.sql_inserted",
                "interval_seconds": intervals[i % len(intervals)],
                "enabled": True,
                # Fault tests watch beat alone; no worker closes the runs.
                "overlap": "overlap",
                **columns,
            }
            for i in range(count)
        ]
        names = list(rows[0])
        with self.store.engine.begin() as conn:
            conn.execute(
                text(
                    f"INSERT INTO routines ({', '.join(names)}) "
                    f"VALUES ({', '.join(':' + n for n in names)})"
                ),
                rows,
            )

    def start_beat(self, label: str, max_interval: float = 1, **env: str) -> CeleryProcess:
        full_env = environment(
            self.broker_url,
            self.database_url,
            **{"ROUTINES_LOCK_TTL": "4", **self.extra_env, **env},
        )
        beat = CeleryProcess(
            [
                "beat",
                "-S",
                "celery_routines.Scheduler",
                "--loglevel",
                "INFO",
                "--max-interval",
                str(max_interval),
                "--schedule",
                str(self.tmp_path / f"{label}-schedule"),
            ],
            full_env,
            self.tmp_path / f"{label}.log",
        )
        self.processes.append(beat)
        return beat

    def kill(self, process: CeleryProcess) -> None:
        os.killpg(process.process.pid, signal.SIGKILL)
        process.process.wait(timeout=10)

    def kill_all(self) -> None:
        """SIGKILL every process at once: none outlives another long enough to
        take its routines over (a SIGTERM one by one lets the last beat send
        again what the first was cut off from marking sent)."""
        running = [p for p in self.processes if p.process.poll() is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.process.pid, signal.SIGKILL)
        for process in running:
            process.process.wait(timeout=10)

    def stop_all(self) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
                process.stop()

    def assert_alive(self) -> None:
        for process in self.processes:
            if process.process.poll() is None:
                continue
            if process.process.returncode in (-signal.SIGKILL, -signal.SIGTERM):
                continue
            raise AssertionError(f"{process.log.name} died:\n{process.output()[-4000:]}")

    def run_rows(self) -> list:
        with self.store.engine.connect() as conn:
            return conn.execute(
                text(
                    "SELECT t.name, t.interval_seconds, t.next_run_at, r.idempotency_key, "
                    "r.state, r.scheduled_for, r.skipped_count, r.skipped_first, "
                    "r.skipped_last, r.id, r.attempt, r.reason, r.created_at "
                    "FROM routine_runs r JOIN routines t ON t.id = r.routine_id"
                )
            ).all()

    def broker_task_ids(self) -> list[str]:
        """The task id of every message waiting on the broker's default queue."""
        client = redis.Redis.from_url(self.broker_url)
        try:
            raw = client.lrange("celery", 0, -1)
        finally:
            client.close()
        return [json.loads(message)["headers"]["id"] for message in raw]


def check_every_window_once(cluster: Cluster, until: datetime) -> dict[str, int]:
    """Every routine's windows form an unbroken grid from its first window to
    ``until`` (sent, or covered by a skipped summary), none twice; one broker
    message per sent run."""
    by_routine: dict[str, list] = {}
    for row in cluster.run_rows():
        by_routine.setdefault(row.name, []).append(row)
    keys = [(row.name, row.idempotency_key) for rows in by_routine.values() for row in rows]
    twice = {key for key, count in collections.Counter(keys).items() if count > 1}
    if twice:
        rows_twice = [
            str(tuple(row))
            for rows in by_routine.values()
            for row in rows
            if (row.name, row.idempotency_key) in twice
        ]
        said = [
            line
            for process in cluster.processes
            for line in process.output().splitlines()
            if any(key in line for _, key in twice)
        ]
        raise AssertionError("a window has two run rows:\n" + "\n".join(rows_twice + said))
    sent = covered = 0
    for name, rows in by_routine.items():
        if rows[0].interval_seconds is None:
            # Not a grid under test: Celery's own cron entry (celery.backend_cleanup,
            # daily at 04:00 with a result backend), fired when the clock crosses
            # 04:00; its runs still count in the broker check below.
            sent += len(rows)
            continue
        step = timedelta(seconds=rows[0].interval_seconds)
        instants: list[datetime] = []
        for row in rows:
            if row.state == "skipped":
                first, last = row.skipped_first, row.skipped_last
                count = row.skipped_count or 1
                assert first + (count - 1) * step == last, f"{name}: bad summary {row}"
                instants += [first + k * step for k in range(count)]
                covered += count
            else:
                instants.append(row.scheduled_for)
                sent += 1
        instants.sort()
        assert len(instants) == len(set(instants)), f"{name}: a window twice: " + "\n".join(
            str(tuple(row)) for row in sorted(rows, key=lambda r: r.scheduled_for)
        )
        for earlier, later in itertools.pairwise(instants):
            assert later - earlier == step, f"{name}: gap or drift between {earlier} and {later}"
        assert instants[-1] >= until - 3 * step, f"{name}: fell behind, last {instants[-1]}"
    # Stopping beat (SIGTERM) can cut a tick between writing its rows and
    # publishing them. Such a row is not lost: its routine was not advanced,
    # so the window is still due and the next beat sends that same row.
    in_flight = {
        row.id
        for rows in by_routine.values()
        for row in rows
        if row.state == "pending" and row.next_run_at <= row.scheduled_for
    }
    sent_ids = {
        row.id
        for rows in by_routine.values()
        for row in rows
        if row.state != "skipped" and row.id not in in_flight
    }
    published = [task_id for task_id in cluster.broker_task_ids() if task_id not in in_flight]
    unpublished = sent_ids - set(published)
    states = sorted({r.state for rs in by_routine.values() for r in rs if r.id in unpublished})
    assert set(published) == sent_ids, (
        f"{len(unpublished)} run(s) never published (states {states}), "
        f"{len(set(published) - sent_ids)} message(s) without a run row"
    )
    # A beat killed between publishing and marking a run sent leaves it
    # pending; the beat that takes over publishes that same run id again, and
    # the worker's claim on the run row runs it once. Nothing else may repeat.
    repeats = len(published) - len(set(published))
    return {"routines": len(by_routine), "sent": sent, "skipped": covered, "repeats": repeats}


def wait_until_settled(cluster: Cluster, timeout: float = 30) -> None:
    """Let the beats finish what a fault interrupted: no run row may stay
    ``pending`` (written, not yet sent) once they have recovered."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cluster.assert_alive()
        with cluster.store.engine.connect() as conn:
            pending = conn.execute(
                text("SELECT count(*) FROM routine_runs WHERE state = 'pending'")
            ).scalar_one()
        if pending == 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"{pending} run(s) still pending {timeout} s after the fault")


def wait_seconds(cluster: Cluster, seconds: float) -> None:
    """Let real processes run for a while, failing fast if one dies. Only for
    a span whose length is the point (an outage, a clock held back); to wait
    for something to happen, use :func:`wait_for`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        cluster.assert_alive()
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def wait_for(cluster: Cluster, condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Until ``condition`` holds (polled every 0.2 s), failing fast if a
    process dies and with every beat's log after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        cluster.assert_alive()
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.log.name}\n{p.output()[-2000:]}" for p in cluster.processes)
            raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{tails}")
        time.sleep(0.2)


def count(cluster: Cluster, sql: str, **params: object) -> int:
    with cluster.store.engine.connect() as conn:
        return conn.execute(text(sql), params).scalar_one()


def runs_written(cluster: Cluster) -> int:
    """Run rows of the inserted routines (``r0000``...), in any state."""
    return count(
        cluster,
        "SELECT count(*) FROM routine_runs r JOIN routines t ON t.id = r.routine_id "
        "WHERE t.name LIKE 'r%'",
    )


def all_moved_past(cluster: Cluster, instant: datetime) -> bool:
    """Every inserted routine has a window after ``instant`` (naive UTC)
    written: whatever beat is running has each of them in hand."""
    behind = count(
        cluster,
        "SELECT count(*) FROM routines t WHERE t.name LIKE 'r%' AND NOT EXISTS ("
        "SELECT 1 FROM routine_runs r WHERE r.routine_id = t.id AND r.scheduled_for > :at)",
        at=instant,
    )
    return behind == 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class BrokerServer:
    """A throwaway redis-server of the test's own (broker or gate): never the
    shared one, so stopping it hurts nobody; no persistence, so a restart
    starts empty."""

    def __init__(self, tmp_path: Path, *extra: str) -> None:
        self.port = free_port()
        self.dir = tmp_path
        # More redis-server options (a replica's --replicaof, tests/topology).
        self.extra = list(extra)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"redis-server did not listen on {self.port}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


class MariaDBServer:
    """A throwaway MariaDB server of the test's own, in ``tmp_path``: never
    the shared one, so killing it hurts nobody. Its data directory outlives a
    kill, so a restart is a crash recovery of the same database."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        self.dir = tmp_path / "mariadb"
        self.process: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> str | None:
        """Why it cannot run here, or None."""
        for program in ("mariadb-install-db", "/usr/sbin/mariadbd"):
            if not shutil.which(program):
                return f"{program} is not installed (apt-get install mariadb-server)"
        return None

    def url(self, database: str) -> str:
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/{database}"

    def install(self) -> None:
        subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={self.dir / 'data'}",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            check=True,
            capture_output=True,
        )

    def start(self) -> None:
        log = open(self.dir / "server.log", "ab")  # noqa: SIM115 - owned by the process
        self.process = subprocess.Popen(
            [
                "/usr/sbin/mariadbd",
                "--no-defaults",
                f"--datadir={self.dir / 'data'}",
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                f"--socket={self.dir / 'mariadb.sock'}",
                "--user=root",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=32M",
            ],
            stdout=log,
            stderr=log,
        )
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"mariadbd exited: {(self.dir / 'server.log').read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"mariadbd did not listen on {self.port}")

    def kill(self) -> None:
        """SIGKILL, as a crash or a pulled plug: no clean shutdown."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
