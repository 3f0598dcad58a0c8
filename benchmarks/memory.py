"""Beat's memory: RSS of a real ``celery beat`` process, ours beside Celery's.

    python -m benchmarks.memory [--sizes 1000,1000000] [--baseline DIR] [--seconds 20]

For each size, each checkout (this tree, and ``--baseline DIR`` if given) runs
``celery -A memory_app beat -S celery_routines.Scheduler`` (``memory_app.py``) against
a PostgreSQL store holding that many routines (10 due every second, the rest
once a day) and a Redis broker; this process stands in for the worker (it
marks every sent run finished, so the hot routines keep firing). Celery's own
beat runs the same routines from ``beat_schedule`` in the same run, up to
``--celery-max`` entries (its in-memory heap of a million entries is not a
beat anyone runs), once per checkout: the ``celery`` command imports our
command plugin from that checkout in Celery's own beat too. RSS is read from
``/proc/PID/status`` after the beat has sent for ``--seconds``; then the
import breakdown: RSS after each piece a beat imports, in a fresh
interpreter, for each checkout.

Run it from a virtualenv with only ``pip install -e '.[postgres,redis]'
psutil``, as on a beat host: the ``celery`` command imports every installed
``celery.commands`` plugin (Flower's, ours) in every process, so a venv with
the test extras adds Flower to both peers. The plugins found are printed.
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
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from .common import (
    DAY,
    HOT,
    TASK,
    claim_redis_db,
    clear_redis_db,
    create_database,
    drop_database,
    log,
    naive_utc,
    queue_length,
    redis_client,
    redis_url,
)

ROOT = Path(__file__).resolve().parent.parent
# What a beat imports, in order; each step's RSS is cumulative.
IMPORT_STEPS = [
    ("Celery's beat", ["celery", "celery.beat", "celery.apps.beat"]),
    ("kombu's Redis transport (redis-py)", ["kombu.transport.redis"]),
    ("SQLAlchemy (Core)", ["sqlalchemy"]),
    (
        "psycopg and SQLAlchemy's psycopg dialect",
        ["psycopg", "sqlalchemy.dialects.postgresql.psycopg"],
    ),
    ("croniter", ["croniter"]),
    ("celery_routines (package)", ["celery_routines"]),
    ("celery_routines.Scheduler (beat)", ["celery_routines.beat"]),
    ("the celery command (celery.bin.celery, plugins)", ["celery.bin.celery"]),
]
# Heavy modules a running beat should not have imported (tests/test_imports.py pins them).
WATCHED = [
    "sqlalchemy.orm",
    "alembic",
    "prometheus_client",
    "ephem",
    "dateutil.rrule",
    "starlette",
    "celery_routines.operator.admin",
]

BREAKDOWN = """
import importlib, json, sys
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
steps = json.loads(sys.argv[1])
out = [["interpreter", rss()]]
for label, modules in steps:
    for name in modules:
        importlib.import_module(name)
    out.append([label, rss()])
print(json.dumps(out))
"""


def load(url: str, size: int, root: Path) -> None:
    """Schema by the checkout's own migrations, then ``size`` routines in one INSERT."""
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"from celery_routines.store import Store; Store.from_url({url!r}).migrate()",
        ],
        cwd=root,
        check=True,
    )
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import create_engine, text

    now = datetime.now(UTC).replace(microsecond=0)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO routines (name, task, interval_seconds, next_run_at,"
                " created_at, updated_at) "
                "SELECT 'bench-' || (g - 1), :task,"
                " CASE WHEN g <= :hot THEN 1 ELSE :day END,"
                " CASE WHEN g <= :hot THEN CAST(:now AS timestamp)"
                "      ELSE CAST(:far AS timestamp) + make_interval(secs => (g % :day)) END,"
                " :now, :now FROM generate_series(1, :n) AS g"
            ),
            {
                "task": TASK,
                "hot": HOT,
                "day": DAY,
                "n": size,
                "now": naive_utc(now),
                "far": naive_utc(now + timedelta(days=1)),
            },
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE routines"))
    engine.dispose()


def rss_of(pid: int) -> dict[str, float]:
    fields: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "Threads"):
                number = int(value.split()[0])
                fields[key] = number if key == "Threads" else round(number / 1024, 1)
    return fields


def run_beat(
    root: Path, db: int, seconds: float, url: str | None, entries: int, startup: float
) -> dict[str, Any]:
    """One real beat process: RSS once it has sent for ``seconds``."""
    workdir = tempfile.mkdtemp(prefix="memory-beat-")
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
    client = redis_client(db)
    worker = None
    if url is not None:
        from sqlalchemy import create_engine, text

        worker = create_engine(url, pool_size=1)
        finish = text(
            "UPDATE routine_runs SET state = 'succeeded', finished_at = now() AT TIME ZONE 'utc'"
            " WHERE state IN ('pending', 'sent', 'running')"
        )
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        first_sent = None
        while True:
            time.sleep(0.5)
            if proc.poll() is not None:
                return {"error": (proc.stderr.read() if proc.stderr else "")[-2000:]}
            if worker is not None:
                with worker.begin() as conn:
                    conn.execute(finish)
            if first_sent is None and queue_length(client) > 0:
                first_sent = time.monotonic()
            if first_sent is None and time.monotonic() - started > startup:
                return {"error": f"sent nothing in {startup:.0f} s"}
            if first_sent is not None and time.monotonic() - first_sent >= seconds:
                break
        found = rss_of(proc.pid)
        found.update(
            startup_s=round(first_sent - started, 1), sent=queue_length(client), seconds=seconds
        )
        return found
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if worker is not None:
            worker.dispose()
        client.close()


def breakdown(root: Path) -> list[tuple[str, float]]:
    import json

    out = subprocess.run(
        [sys.executable, "-c", BREAKDOWN, json.dumps(IMPORT_STEPS)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        check=True,
    )
    return [tuple(step) for step in json.loads(out.stdout)]  # type: ignore[misc]


def watched_after_beat(root: Path) -> list[str]:
    """The watched heavy modules a constructed beat (lazy instance) imported."""
    code = (
        "import sys, celery.beat, celery_routines.beat; "
        f"print(','.join(m for m in {WATCHED!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    return [m for m in out.stdout.strip().split(",") if m]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000", help="routines stored, comma separated")
    parser.add_argument("--baseline", help="another checkout to measure in the same run")
    parser.add_argument("--seconds", type=float, default=20.0, help="sending before RSS is read")
    parser.add_argument("--startup", type=float, default=600.0, help="give up on a start-up")
    parser.add_argument("--celery-max", type=int, default=100_000, help="largest Celery beat")
    args = parser.parse_args()

    trees = [("this tree", ROOT)]
    if args.baseline:
        trees.append(("baseline", Path(args.baseline).resolve()))
    plugins = sorted(ep.value for ep in entry_points(group="celery.commands"))
    print(f"celery.commands plugins loaded by every celery process: {plugins or 'none'}")
    db = claim_redis_db()
    rows: list[tuple[str, int, dict[str, Any]]] = []
    try:
        for size in [int(s) for s in args.sizes.split(",")]:
            for label, root in trees:
                name, url = create_database(f"memory_{size}")
                try:
                    log(f"{label}: loading {size:,} routines")
                    load(url, size, root)
                    clear_redis_db(db)
                    log(f"{label}: beat at {size:,} stored")
                    rows.append(
                        (label, size, run_beat(root, db, args.seconds, url, 0, args.startup))
                    )
                finally:
                    clear_redis_db(db)
                    drop_database(name)
            if size > args.celery_max:
                continue
            # Per checkout: the `celery` command imports our command plugin
            # from it in Celery's own beat too.
            for label, root in trees:
                log(f"Celery's beat at {size:,} entries, our plugin from {label}")
                found = run_beat(root, db, args.seconds, None, size, args.startup)
                rows.append((f"Celery beat ({label})", size, found))
                clear_redis_db(db)
    finally:
        clear_redis_db(db, keep_owner=False)

    print("\nRSS of a real `celery beat` (MB, /proc/PID/status), one run:")
    print(f"{'peer':24s} {'stored':>9s} {'VmRSS':>7s} {'VmHWM':>7s} {'anon':>6s} {'file':>6s} sent")
    for label, size, found in rows:
        if "error" in found:
            print(f"{label:24s} {size:9,d}  error: {found['error'][-300:]}")
            continue
        print(
            f"{label:24s} {size:9,d} {found['VmRSS']:7.1f} {found['VmHWM']:7.1f}"
            f" {found['RssAnon']:6.1f} {found['RssFile']:6.1f} {found['sent']}"
            f" (in {found['seconds']:.0f} s; threads {found['Threads']})"
        )
    for label, root in trees:
        print(f"\nImports, {label} (RSS after each piece, fresh interpreter):")
        previous = None
        for step, rss in breakdown(root):
            added = "" if previous is None else f"+{rss - previous:5.1f}"
            print(f"  {step:50s} {added:>6s}  {rss:6.1f}")
            previous = rss
        print(f"  heavy modules a beat imports: {', '.join(watched_after_beat(root)) or 'none'}")


if __name__ == "__main__":
    main()
