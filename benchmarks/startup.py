"""Beat's start-up: from launching `celery beat` to its first message, ours beside Celery's.

    python -m benchmarks.startup [--sizes 1000,1000000] [--baseline DIR] [--restarts 1]

For each size, ``size`` routines are loaded once into a template PostgreSQL
database as ``benchmarks.memory`` loads them (10 due every second and due at
once, the rest once a day; rows inserted by SQL with their own
``next_run_at``, never fingerprinted), and each checkout (this tree, and
``--baseline DIR`` if given) gets a fresh copy of it. On that copy it launches
``celery -A memory_app beat -S celery_routines.Scheduler`` (Redis broker and
gate) and times the launch until the first message is in Redis (``LLEN``
polled every 10 ms), then stops it and starts it again ``--restarts`` times on
the same database (a restart: the rows were fingerprinted by the first start).
Celery's own beat runs the same routines from ``beat_schedule`` in the same
run, up to ``--celery-max`` entries; its first entry falls due one interval
(1 s) after it starts, so its figure carries that second. The launch of each
beat includes the interpreter and the ``celery`` command's imports, for both.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import (
    claim_redis_db,
    clear_redis_db,
    create_database,
    drop_database,
    log,
    pg_admin,
    queue_length,
    redis_client,
    redis_url,
)
from .memory import load

ROOT = Path(__file__).resolve().parent.parent
POLL = 0.01


def copy_database(template: str, label: str) -> tuple[str, str]:
    """A fresh copy of ``template`` (PostgreSQL copies the files: seconds at 1M)."""
    name, url = create_database(label)
    admin = pg_admin()
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE "{name}"')
        conn.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    admin.dispose()
    return name, url


def finish_open_runs(url: str) -> None:
    """Stand in for the worker: a run left ``sent`` by the previous start
    would make the hot routines' next windows overlap skips, not messages."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url, pool_size=1)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE routine_runs SET state = 'succeeded',"
                " finished_at = now() AT TIME ZONE 'utc'"
                " WHERE state IN ('pending', 'sent', 'running')"
            )
        )
    engine.dispose()


def first_send(
    root: Path, db: int, url: str | None, entries: int, give_up: float, keep: float = 0.0
) -> float | str:
    """Seconds from launching a beat until its first message is in Redis
    (or the error that stopped it); the beat runs ``keep`` seconds more."""
    workdir = tempfile.mkdtemp(prefix="startup-beat-")
    shutil.copy(Path(__file__).with_name("memory_app.py"), workdir)
    env = {
        **os.environ,
        "MEMORY_BROKER_URL": redis_url(db),
        "MEMORY_CELERY_ENTRIES": str(entries),
        "PYTHONPATH": os.pathsep.join([workdir, str(root)]),
    }
    argv = [sys.executable, "-m", "celery", "-A", "memory_app", "beat", "-l", "warning"]
    argv += ["--schedule", f"{workdir}/celerybeat-schedule", "--pidfile="]
    if url is not None:
        env["MEMORY_DATABASE_URL"] = url
        argv += ["-S", "celery_routines.Scheduler"]
    clear_redis_db(db)
    client = redis_client(db)
    # A file, not a pipe: a beat that logs more than a pipe holds (its overlap
    # skips, with no worker) would block on it and never see SIGTERM.
    stderr_path = Path(workdir) / "stderr.log"
    stderr = stderr_path.open("w")
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True
    )
    try:
        while queue_length(client) == 0:
            if proc.poll() is not None:
                return "exited: " + stderr_path.read_text()[-500:]
            if time.monotonic() - started > give_up:
                return f"sent nothing in {give_up:.0f} s"
            time.sleep(POLL)
        took = time.monotonic() - started
        time.sleep(keep)
        return took
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        client.close()
        stderr.close()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,1000000", help="routines stored, comma separated")
    parser.add_argument("--baseline", help="another checkout to measure in the same run")
    parser.add_argument("--restarts", type=int, default=1, help="starts again on the same rows")
    parser.add_argument("--rounds", type=int, default=1, help="trees alternate their order")
    parser.add_argument(
        "--keep",
        type=float,
        default=0.0,
        help="seconds a first start keeps running after its first message (so the restart"
        " finds every row fingerprinted: this tree fingerprints a million in slices, ~20 s)",
    )
    parser.add_argument("--celery-max", type=int, default=100_000, help="largest Celery beat")
    parser.add_argument("--give-up", type=float, default=300.0, help="seconds")
    args = parser.parse_args()

    trees = [("this tree", ROOT)]
    if args.baseline:
        trees.append(("baseline", Path(args.baseline).resolve()))
    db = claim_redis_db()
    rows: list[tuple[str, int, str, float | str]] = []
    try:
        for size in [int(s) for s in args.sizes.split(",")]:
            template, template_url = create_database(f"startup_{size}")
            try:
                log(f"loading {size:,} routines")
                load(template_url, size, ROOT)
                for round_ in range(args.rounds):
                    for label, root in trees[:: -1 if round_ % 2 else 1]:
                        name, url = copy_database(template, f"startup_{size}")
                        try:
                            for start in range(1 + args.restarts):
                                finish_open_runs(url)
                                kind = "first start" if start == 0 else f"restart {start}"
                                log(f"{label}: {kind} at {size:,} stored")
                                keep = args.keep if start == 0 else 0.0
                                took = first_send(root, db, url, 0, args.give_up, keep)
                                rows.append((label, size, kind, took))
                        finally:
                            drop_database(name)
            finally:
                drop_database(template)
            for _ in range(args.rounds if size <= args.celery_max else 0):
                log(f"Celery's beat, {size:,} entries")
                took = first_send(ROOT, db, None, size, args.give_up)
                rows.append(("Celery beat", size, "start", took))
    finally:
        clear_redis_db(db, keep_owner=False)

    rows.sort(key=lambda row: (row[1], row[0] == "Celery beat", row[0] != "this tree", row[2]))
    print("\nFrom launching `celery beat` to its first message in Redis, one run:")
    print(f"{'peer':14s} {'stored':>10s}  {'':12s} {'seconds':>8s}")
    for label, size, kind, took in rows:
        shown = f"{took:8.2f}" if isinstance(took, float) else f"  error: {took}"
        print(f"{label:14s} {size:10,d}  {kind:12s} {shown}")
    print("(Celery's beat sends its first entry 1 s after it starts: its figure includes it.)")


if __name__ == "__main__":
    main()
