"""Moving in from django-celery-beat at scale: import N tasks, then run a
real beat and count the windows fired twice.

    python -m benchmarks.import_dcb [--tasks 1000] [--beat-seconds 75]

A throwaway PostgreSQL database gets django-celery-beat's tables from its
own migrations and N periodic tasks written through its models (intervals
of 10-30 s, every-minute crontabs in four zones, daily crontabs), each with
``last_run_at`` set as django-celery-beat leaves it after sending its most
recent window. ``celery -A e2e_app routines import django-celery-beat URL``
(a real process) imports them into another throwaway database; then a real
``celery -A e2e_app beat -S routines`` runs for ``--beat-seconds`` against it.

Reported: the import's wall time, and for the imported routines
- fired twice: runs sent for a window at or before the task's last_run_at
  (django-celery-beat already sent it): must be 0;
- first window: each routine's earliest window recorded (sent or skipped)
  is the first one after its last_run_at: none lost, none repeated.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from sqlalchemy import text

ZONES = ("UTC", "Europe/Rome", "America/New_York", "Asia/Kolkata")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--beat-seconds", type=float, default=75.0)
    args = parser.parse_args()

    from tests import services
    from tests.e2e.processes import HERE, CeleryProcess, environment
    from tests.operator.dcb import configure_django

    databases = services.PostgresDatabases()
    redis_db = services.free_redis_db()
    folder = Path(tempfile.mkdtemp(prefix="import-dcb-"))
    try:
        source_url, routines_url = databases.create(), databases.create()
        configure_django(folder / "django.db", source_url)
        started = datetime.now(UTC)
        last_runs = write_tasks(args.tasks, started)
        env = environment(
            f"redis://{services.REDIS_HOST}:{services.REDIS_PORT}/{redis_db}",
            routines_url,
            E2E_QUEUE=f"import-dcb-{redis_db}",
        )
        celery = [sys.executable, "-m", "celery", "-A", "e2e_app", "routines"]
        t0 = time.monotonic()
        subprocess.run([*celery, "migrate"], cwd=HERE, env=env, check=True, capture_output=True)
        migrate_seconds = time.monotonic() - t0
        t0 = time.monotonic()
        imported = subprocess.run(
            [*celery, "import", "django-celery-beat", source_url],
            cwd=HERE,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        import_seconds = time.monotonic() - t0
        print(imported.stdout.splitlines()[-1] if imported.stdout else imported.stderr)
        print(
            f"import of {args.tasks} tasks: {import_seconds:.2f} s (the whole command, "
            f"Celery's start included; `routines migrate` before it: {migrate_seconds:.2f} s)"
        )
        if imported.returncode != 0:
            raise SystemExit(imported.stderr)
        beat = CeleryProcess(
            ["beat", "-S", "routines", "--loglevel", "INFO"], env, folder / "beat.log"
        )
        try:
            time.sleep(args.beat_seconds)  # a real beat, running on the real clock
        finally:
            beat.stop()
        report(routines_url, last_runs)
    finally:
        from django.db import connections

        connections.close_all()
        databases.drop_all()
        import redis

        redis.Redis(host=services.REDIS_HOST, port=services.REDIS_PORT, db=redis_db).flushdb()


def write_tasks(count: int, now: datetime) -> dict[str, datetime]:
    """``count`` periodic tasks through django-celery-beat's models; the
    ``last_run_at`` of each, by name."""
    from django_celery_beat import models

    rng = random.Random(32)
    alias = "postgresql"
    intervals = {
        every: models.IntervalSchedule.objects.using(alias).create(every=every, period="seconds")
        for every in (10, 15, 20, 30)
    }
    minutely = {
        zone: models.CrontabSchedule.objects.using(alias).create(minute="*", timezone=zone)
        for zone in ZONES
    }
    daily = {
        zone: models.CrontabSchedule.objects.using(alias).create(
            minute="0", hour="3", timezone=zone
        )
        for zone in ZONES
    }
    rows, last_runs = [], {}
    for n in range(count):
        name = f"dcb-{n:04d}"
        kind = n % 5
        if kind in (0, 1):  # an interval, sent some time within its last period
            every = (10, 15, 20, 30)[n % 4]
            last = now - timedelta(seconds=rng.uniform(0.5, every - 0.5))
            fields = {"interval": intervals[every]}
        elif kind in (2, 3):  # every minute: sent at the start of this minute
            zone = ZONES[n % 4]
            last = now.replace(second=0, microsecond=0) + timedelta(milliseconds=300)
            if last > now:
                last -= timedelta(minutes=1)
            fields = {"crontab": minutely[zone]}
        else:  # daily at 03:00 local: sent at its most recent 03:00
            zone = ZONES[n % 4]
            local = now.astimezone(ZoneInfo(zone))
            three = local.replace(hour=3, minute=0, second=0, microsecond=0)
            if three > local:
                three -= timedelta(days=1)
            last = three.astimezone(UTC) + timedelta(milliseconds=500)
            fields = {"crontab": daily[zone]}
        last_runs[name] = last
        rows.append(
            models.PeriodicTask(
                name=name,
                task="e2e_app.sql_inserted",
                kwargs='{"word": "imported"}',
                last_run_at=last,
                total_run_count=rng.randint(1, 500),
                **fields,
            )
        )
    models.PeriodicTask.objects.using(alias).bulk_create(rows, batch_size=500)
    return last_runs


def report(routines_url: str, last_runs: dict[str, datetime]) -> None:
    from celery_routines.schedules.parse import schedule_of
    from celery_routines.store import Store

    store = Store.from_url(routines_url)
    try:
        records = {r.name: r for r in store.routines.all() if r.name in last_runs}
        with store.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT t.name, r.state, r.scheduled_for, r.skipped_first "
                    "FROM routine_runs r JOIN routines t ON t.id = r.routine_id"
                )
            ).all()
    finally:
        store.dispose()
    sent = twice = 0
    earliest: dict[str, datetime] = {}
    rows = [row for row in rows if row[0] in last_runs]  # not the app's own routine
    for name, state, scheduled_for, skipped_first in rows:
        scheduled_for = _utc(scheduled_for)
        first = _utc(skipped_first) if skipped_first is not None else scheduled_for
        earliest[name] = min(earliest.get(name, first), first)
        if state != "skipped":
            sent += 1
            if scheduled_for <= last_runs[name]:
                twice += 1
    wrong_first = [
        name
        for name, first in earliest.items()
        if first
        != schedule_of(records[name], records[name].timezone or "UTC").next_after(last_runs[name])
    ]
    print(
        f"routines imported: {len(records)}; with a window in the beat run: {len(earliest)}; "
        f"runs sent: {sent}; skip rows: {len(rows) - sent}"
    )
    print(f"windows fired twice (sent at or before django-celery-beat's last_run_at): {twice}")
    print(
        f"routines whose first recorded window is not the one after last_run_at: "
        f"{len(wrong_first)} {wrong_first[:5]}"
    )


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


if __name__ == "__main__":
    main()
