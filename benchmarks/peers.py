"""The four schedulers under test, each set up with the same routines.

Every peer gets ``size`` interval routines of the task ``bench.noop``:

* scenario ``steady``: ``HOT`` (10) routines every second, the rest once a day
  and not due for a day, so each measured tick has exactly 10 due;
* scenario ``burst``: ``BURST`` (10,000) routines once a day whose window fell
  due at the same past instant, the rest not due for a day.

Peers run on the real clock (their schedules decide what is due: the hot
entries come due one second after their last send); celery-routines runs on
an injected clock, advanced one second per measured tick.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from celery import Celery

from .common import BURST, DAY, HOT, TASK, declare_queue, log, naive_utc, redis_url


def _celery_app(db: int, **conf: Any) -> Celery:
    app = Celery("bench", set_as_current=False)
    app.conf.update(
        broker_url=redis_url(db),
        beat_max_loop_interval=300,
        timezone="UTC",
        enable_utc=True,
        result_expires=None,  # no backend_cleanup default entry for any peer
        **conf,
    )
    return app


class Peer:
    """One scheduler: ``load`` the routines, ``make`` a scheduler."""

    name = ""
    label = ""
    needs_postgres = False
    # A throwaway MariaDB/MySQL database instead (its URL also arrives as pg_url).
    needs_mysql = False
    injected_clock = False

    def __init__(self, size: int, scenario: str, db: int, pg_url: str | None) -> None:
        self.size = size
        self.scenario = scenario
        self.db = db
        self.pg_url = pg_url
        self.app: Celery | None = None

    def counts(self) -> tuple[int, int]:
        """(hot every-second routines, routines due at once)."""
        if self.scenario == "steady":
            return HOT, 0
        return 0, BURST

    def load(self) -> None:
        raise NotImplementedError

    def make(self) -> Any:
        raise NotImplementedError

    def after_start(self, scheduler: Any) -> None:
        pass

    def advance(self, scheduler: Any, seconds: float) -> None:
        """Injected-clock peers move their clock; real-clock peers wait."""
        raise NotImplementedError

    def between_ticks(self) -> None:
        """Untimed work between measured ticks (a stand-in worker)."""


# -- Celery's default beat -------------------------------------------------------


class CeleryDefault(Peer):
    name = "celery"
    label = "Celery beat (PersistentScheduler)"

    def load(self) -> None:
        from celery.schedules import schedule

        hot, due = self.counts()
        now = datetime.now(UTC)
        daily = schedule(timedelta(days=1))
        every_second = schedule(timedelta(seconds=1))
        entries: dict[str, dict[str, Any]] = {}
        for i in range(self.size):
            entry: dict[str, Any] = {"task": TASK, "schedule": daily}
            if i < hot:
                entry["schedule"] = every_second
            elif i < due:
                entry["last_run_at"] = now - timedelta(days=1)
            entries[f"bench-{i}"] = entry
        self.tmp = tempfile.mkdtemp(prefix="bench-celery-")
        self.app = _celery_app(self.db, beat_schedule=entries)
        declare_queue(self.app)

    def make(self) -> Any:
        from celery.beat import PersistentScheduler

        return PersistentScheduler(
            app=self.app, schedule_filename=str(Path(self.tmp) / "celerybeat-schedule")
        )


# -- RedBeat ---------------------------------------------------------------------


class RedBeat(Peer):
    name = "redbeat"
    label = "RedBeat"

    def load(self) -> None:
        from celery.schedules import schedule
        from redbeat.decoder import RedBeatJSONEncoder
        from redbeat.schedulers import RedBeatSchedulerEntry, ensure_conf, get_redis

        self.app = _celery_app(
            self.db, redbeat_redis_url=redis_url(self.db), redbeat_key_prefix="rb:"
        )
        ensure_conf(self.app)
        declare_queue(self.app)
        hot, due = self.counts()
        now = datetime.now(UTC)
        client = get_redis(self.app)
        schedule_key = self.app.redbeat_conf.schedule_key

        def template(every: timedelta, last_run_at: datetime) -> tuple[str, str, float]:
            # One real entry per kind gives RedBeat's own encoding and score.
            entry = RedBeatSchedulerEntry("__NAME__", TASK, schedule(every), app=self.app)
            entry.last_run_at = last_run_at
            definition = {
                "name": entry.name,
                "task": entry.task,
                "args": entry.args,
                "kwargs": entry.kwargs,
                "options": entry.options,
                "schedule": entry.schedule,
                "enabled": entry.enabled,
            }
            return (
                json.dumps(definition, cls=RedBeatJSONEncoder),
                json.dumps({"last_run_at": last_run_at}, cls=RedBeatJSONEncoder),
                entry.score,
            )

        rest = template(timedelta(days=1), now)
        burst = template(timedelta(days=1), now - timedelta(days=1))
        # Hot entries last: they fall due one second after they are written.
        groups = [(range(max(hot, due), self.size), rest), (range(hot, due), burst)]
        pipe = client.pipeline(transaction=False)
        pending = 0
        for numbers, (definition, meta, score) in groups:
            for i in numbers:
                key = f"rb:bench-{i}"
                pipe.hset(
                    key,
                    mapping={
                        "definition": definition.replace("__NAME__", f"bench-{i}"),
                        "meta": meta,
                    },
                )
                pipe.zadd(schedule_key, {key: score})
                pending += 1
                if pending >= 5000:
                    pipe.execute()
                    pending = 0
        pipe.execute()
        self._hot = hot
        self._template = template

    def load_hot(self) -> None:
        from redbeat.schedulers import get_redis

        if not self._hot:
            return
        definition, meta, score = self._template(timedelta(seconds=1), datetime.now(UTC))
        client = get_redis(self.app)
        pipe = client.pipeline(transaction=False)
        for i in range(self._hot):
            key = f"rb:bench-{i}"
            pipe.hset(
                key,
                mapping={"definition": definition.replace("__NAME__", f"bench-{i}"), "meta": meta},
            )
            pipe.zadd(self.app.redbeat_conf.schedule_key, {key: score})
        pipe.execute()

    def make(self) -> Any:
        from redbeat import RedBeatScheduler

        self.load_hot()
        return RedBeatScheduler(app=self.app)

    def after_start(self, scheduler: Any) -> None:
        # What RedBeat's beat_init handler does: take the single-beat lock.
        from redbeat.schedulers import acquire_distributed_beat_lock

        acquire_distributed_beat_lock(sender=SimpleNamespace(scheduler=scheduler))


# -- django-celery-beat ----------------------------------------------------------

DJANGO_SETTINGS = """\
SECRET_KEY = "benchmark-only"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_celery_beat"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {{
    "default": {{
        "ENGINE": "django.db.backends.postgresql",
        "NAME": {name!r},
        "USER": {user!r},
        "HOST": {host!r},
        "PORT": {port!r},
    }}
}}
"""


class DjangoBeat(Peer):
    name = "django"
    label = "django-celery-beat (DatabaseScheduler, PostgreSQL)"
    needs_postgres = True

    def _setup_django(self) -> None:
        from sqlalchemy.engine import make_url

        url = make_url(self.pg_url)
        folder = tempfile.mkdtemp(prefix="bench-django-")
        Path(folder, "bench_django_settings.py").write_text(
            DJANGO_SETTINGS.format(
                name=url.database,
                user=url.username or "postgres",
                host=url.host,
                port=str(url.port or 5432),
            )
        )
        sys.path.insert(0, folder)
        os.environ["DJANGO_SETTINGS_MODULE"] = "bench_django_settings"
        import django

        django.setup()

    def load(self) -> None:
        self._setup_django()
        from django.core.management import call_command
        from django.db import connection
        from django_celery_beat.models import IntervalSchedule, PeriodicTask

        call_command("migrate", verbosity=0)
        self.app = _celery_app(self.db)
        declare_queue(self.app)
        hot, due = self.counts()
        now = datetime.now(UTC)
        daily = IntervalSchedule.objects.create(every=1, period=IntervalSchedule.DAYS)
        every_second = IntervalSchedule.objects.create(every=1, period=IntervalSchedule.SECONDS)
        batch: list[Any] = []
        for i in range(self.size):
            if i < hot:
                continue  # written last, just before the scheduler starts
            last = now - timedelta(days=1) if i < due else now
            batch.append(
                PeriodicTask(name=f"bench-{i}", task=TASK, interval=daily, last_run_at=last)
            )
            if len(batch) >= 10_000:
                PeriodicTask.objects.bulk_create(batch)
                batch = []
        if batch:
            PeriodicTask.objects.bulk_create(batch)
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE django_celery_beat_periodictask")
        self._hot = hot
        self._every_second = every_second

    def make(self) -> Any:
        from django_celery_beat.models import PeriodicTask
        from django_celery_beat.schedulers import DatabaseScheduler

        now = datetime.now(UTC)
        PeriodicTask.objects.bulk_create(
            [
                PeriodicTask(
                    name=f"bench-{i}", task=TASK, interval=self._every_second, last_run_at=now
                )
                for i in range(self._hot)
            ]
        )
        return DatabaseScheduler(app=self.app)


# -- celery-routines ---------------------------------------------------------------


class InjectedClock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


class Routines(Peer):
    name = "routines"
    label = "celery-routines (PostgreSQL)"
    needs_postgres = True
    injected_clock = True

    def load(self) -> None:
        from sqlalchemy import text

        from celery_routines.store import Store

        # A whole second in the recent past: every window below is exact.
        self.t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
        store = Store.from_url(self.pg_url)
        store.migrate()
        hot, due = self.counts()
        params = {
            "n": self.size,
            "now": naive_utc(self.t0),
            "far": naive_utc(self.t0 + timedelta(days=1)),
            "t0": naive_utc(self.t0),
            "hot": hot,
            "due": due,
            "day": DAY,
        }
        with store.engine.begin() as conn:
            # One INSERT ... SELECT: no decorator, no per-row round trip.
            conn.execute(
                text(
                    "INSERT INTO routines (name, task, interval_seconds, next_run_at,"
                    " created_at, updated_at) "
                    "SELECT 'bench-' || (g - 1), :task,"
                    " CASE WHEN g <= :hot THEN 1 ELSE :day END,"
                    " CASE WHEN g <= :hot THEN CAST(:t0 AS timestamp) + interval '1 second'"
                    "      WHEN g <= :due THEN CAST(:t0 AS timestamp)"
                    "      ELSE CAST(:far AS timestamp) + make_interval(secs => (g % :day)) END,"
                    " :now, :now FROM generate_series(1, :n) AS g"
                ),
                {**params, "task": TASK},
            )
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE routines"))
        store.dispose()
        self.restore(self.t0.isoformat())
        declare_queue(self.app)

    def restore(self, t0: str) -> None:
        """The app and clock for routines loaded earlier (by another process)."""
        self.t0 = datetime.fromisoformat(t0)
        self.app = _celery_app(
            self.db,
            routines_database_url=self.pg_url,
            routines_redis_url=redis_url(self.db),
        )
        # Steady: nothing due at start; the hot windows fall at t0 + k s.
        # Burst: the 10,000 windows fell at t0.
        self.clock = InjectedClock(self.t0 + timedelta(milliseconds=500))

    def make(self) -> Any:
        from celery_routines import Scheduler

        return Scheduler(self.app, clock=self.clock)

    def advance(self, scheduler: Any, seconds: float) -> None:
        self.clock.now += timedelta(seconds=seconds)

    def between_ticks(self) -> None:
        """A stand-in worker: every run sent so far has finished. Without it the
        default ``overlap="skip"`` would (rightly) skip each later window of a
        hot routine whose previous run is still open."""
        from sqlalchemy import create_engine, text

        if getattr(self, "_worker_engine", None) is None:
            self._worker_engine = create_engine(self.pg_url, pool_size=1)
        with self._worker_engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE routine_runs SET state = 'succeeded', finished_at = :now"
                    " WHERE state IN ('pending', 'sent', 'running')"
                ),
                {"now": naive_utc(self.clock.now)},
            )


class RoutinesDirect(Routines):
    """celery-routines with ``routines_publish = "direct"`` (issue 19, item 2):
    the same store, routines and scenarios; each message built by Celery's
    ``create_task_message`` and published without ``send_task`` around it."""

    name = "routines-direct"
    label = "celery-routines (PostgreSQL, direct publish)"

    def restore(self, t0: str) -> None:
        super().restore(t0)
        assert self.app is not None
        self.app.conf.routines_publish = "direct"


class RoutinesProcesses(Routines):
    """celery-routines with ``routines_publish_processes`` (issue 19, item 1):
    the same store, routines and scenarios; each chunk of messages sent by a
    forked publishing process (``BENCH_PUBLISH_PROCESSES`` of them, 2 unset)."""

    name = "routines-processes"
    label = "celery-routines (PostgreSQL, publishing processes)"

    def restore(self, t0: str) -> None:
        super().restore(t0)
        assert self.app is not None
        self.app.conf.routines_publish_processes = int(
            os.environ.get("BENCH_PUBLISH_PROCESSES", "2")
        )


class RoutinesMariaDB(Routines):
    """celery-routines on MariaDB/MySQL: the same scheduler and scenarios,
    another store (``BENCH_MYSQL`` for the server)."""

    name = "routines-mariadb"
    label = "celery-routines (MariaDB)"
    needs_postgres = False
    needs_mysql = True

    def load(self) -> None:
        from sqlalchemy import text

        from celery_routines.store import Store

        self.t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
        store = Store.from_url(self.pg_url)
        store.migrate()
        hot, due = self.counts()
        params = {
            "n": self.size,
            "now": naive_utc(self.t0),
            "far": naive_utc(self.t0 + timedelta(days=1)),
            "t0": naive_utc(self.t0),
            "hot": hot,
            "due": due,
            "day": DAY,
            "task": TASK,
        }
        # g = 1..n from a cross join of seven digit tables (no generate_series;
        # works on MySQL 8 and MariaDB alike), one INSERT ... SELECT.
        digits = (
            "(SELECT 0 d UNION ALL " + " UNION ALL ".join(f"SELECT {i}" for i in range(1, 10)) + ")"
        )
        numbers = (
            "SELECT 1 + "
            + " + ".join(f"d{k}.d * {10**k}" for k in range(7))
            + " AS g FROM "
            + ", ".join(f"{digits} d{k}" for k in range(7))
        )
        with store.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO routines (name, task, interval_seconds, next_run_at,"
                    " created_at, updated_at) "
                    "SELECT CONCAT('bench-', g - 1), :task,"
                    " CASE WHEN g <= :hot THEN 1 ELSE :day END,"
                    " CASE WHEN g <= :hot THEN CAST(:t0 AS DATETIME(6)) + INTERVAL 1 SECOND"
                    "      WHEN g <= :due THEN CAST(:t0 AS DATETIME(6))"
                    "      ELSE CAST(:far AS DATETIME(6)) + INTERVAL (g % :day) SECOND END,"
                    f" :now, :now FROM ({numbers}) AS numbers WHERE g <= :n"
                ),
                params,
            )
            conn.execute(text("ANALYZE TABLE routines"))
        store.dispose()
        self.restore(self.t0.isoformat())
        declare_queue(self.app)


PEERS: dict[str, type[Peer]] = {
    cls.name: cls
    for cls in (
        Routines,
        RoutinesDirect,
        RoutinesProcesses,
        RoutinesMariaDB,
        CeleryDefault,
        RedBeat,
        DjangoBeat,
    )
}


def describe(name: str) -> str:
    return PEERS[name].label


__all__ = ["PEERS", "Peer", "describe", "log"]
