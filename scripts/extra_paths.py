"""Exercise the path one extra enables, in a venv that has that extra alone.

Run by ``check_fresh_install.py`` as ``python extra_paths.py EXTRA`` (``base``
for no extra). Each check uses the real thing on loopback (SQLite, the memory
broker, PostgreSQL, MariaDB, Redis); it prints one line and exits 0 when the
path works, and fails loudly otherwise. ``base`` also checks that a path
chosen without its extra is one line naming the extra.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from celery import Celery

HERE = Path(tempfile.mkdtemp(prefix="routines-extra-"))
POSTGRES = os.environ.get("ROUTINES_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
MYSQL = os.environ.get("ROUTINES_TEST_MYSQL", "mysql+pymysql://root@127.0.0.1:3306/mysql")
REDIS = "redis://127.0.0.1:6379"


def tick_once(app: Celery) -> int:
    """Declare one routine, let a real Scheduler tick at a clock one minute
    on, and return how many runs it sent."""
    from celery_routines import Scheduler, register

    @app.task(name="extra.ping")
    def ping() -> str:
        return "pong"

    register("extra.ping", timedelta(seconds=10), name="extra-ping")
    now = [datetime.now(UTC)]
    scheduler = Scheduler(app, clock=lambda: now[0])  # declares the routine at now
    try:
        scheduler.tick()  # adopts it: its first window is 10 s on
        now[0] += timedelta(minutes=1)
        scheduler.tick()
        with scheduler.store.engine.connect() as conn:
            from sqlalchemy import text

            return int(
                conn.execute(
                    text("SELECT count(*) FROM routine_runs WHERE state = 'sent'")
                ).scalar_one()
            )
    finally:
        scheduler.close()


def one_line_error(app: Celery, needed: str) -> None:
    """Beat's start-up check refuses the path in one line naming ``needed``."""
    from celery_routines.config import settings_from
    from celery_routines.extras import MissingExtra, check_extras

    try:
        check_extras(app, settings_from(app))
    except MissingExtra as exc:
        message = str(exc)
        assert f"'{needed}' extra" in message and "\n" not in message, message
        return
    raise AssertionError(f"no error for a path needing [{needed}]")


def base() -> str:
    app = Celery("extra_base", broker="memory://")
    app.conf.routines_database_url = f"sqlite:///{HERE / 'base.db'}"
    sent = tick_once(app)
    assert sent >= 1, f"beat on SQLite with the memory broker sent {sent}"
    for conf, needed in (
        ({"routines_redis_url": REDIS}, "redis"),
        ({"broker_url": REDIS, "routines_publish": "direct"}, "redis"),
        ({"routines_database_url": "postgresql://u@localhost/db"}, "postgres"),
        ({"routines_database_url": "mysql+pymysql://u@localhost/db"}, "mysql"),
        ({"routines_metrics_port": 9999}, "metrics"),
    ):
        other = Celery("extra_missing", broker=conf.pop("broker_url", "memory://"))
        other.conf.routines_database_url = f"sqlite:///{HERE / 'other.db'}"
        other.conf.update(conf)
        one_line_error(other, needed)
    web = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "extra_paths:web_app", "routines", "web"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
        timeout=60,
    )
    lines = web.stderr.strip().splitlines()
    assert web.returncode != 0 and len(lines) == 1 and "'web' extra" in lines[0], web.stderr
    return f"beat on SQLite + memory broker sent {sent}; missing extras are one line each"


def postgres() -> str:
    return _database(POSTGRES, "CREATE DATABASE {}", "DROP DATABASE {} WITH (FORCE)")


def mysql() -> str:
    return _database(MYSQL, "CREATE DATABASE {}", "DROP DATABASE {}")


def _database(admin_url: str, create: str, drop: str) -> str:
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    name = f"routines_extra_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(create.format(name))
    try:
        app = Celery("extra_db", broker="memory://")
        app.conf.routines_database_url = (
            make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        )
        sent = tick_once(app)
        assert sent >= 1, sent
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(drop.format(name))
        admin.dispose()
    return f"beat on {make_url(admin_url).get_backend_name()} sent {sent}"


def redis() -> str:
    import redis as redis_py

    number = _free_redis_db(redis_py)
    client = redis_py.Redis(host="127.0.0.1", port=6379, db=number)
    try:
        url = f"{REDIS}/{number}"
        app = Celery("extra_redis", broker=url)
        app.conf.routines_database_url = f"sqlite:///{HERE / 'redis.db'}"
        app.conf.routines_redis_url = url
        app.conf.routines_publish = "direct"
        sent = tick_once(app)
        queued = client.llen("celery")
        assert sent >= 1 and queued == sent, (sent, queued)
    finally:
        client.flushdb()
        client.close()
    return f"direct publish on Redis with the Redis gate: {sent} sent, {queued} queued"


def _free_redis_db(redis_py: object) -> int:
    for number in range(15, 0, -1):
        client = redis_py.Redis(host="127.0.0.1", port=6379, db=number)  # type: ignore[attr-defined]
        try:
            if client.dbsize() == 0 and client.set("celery_routines:test-owner", "1", nx=True):
                return number
        finally:
            client.close()
    raise RuntimeError("no empty Redis database among 1..15")


def metrics() -> str:
    port = _free_port()
    app = Celery("extra_metrics", broker="memory://")
    app.conf.routines_database_url = f"sqlite:///{HERE / 'metrics.db'}"
    app.conf.routines_metrics_port = port
    app.conf.routines_metrics_address = "127.0.0.1"
    tick_once_and_scrape = tick_once(app)
    # The scheduler served /metrics while it lived; a new one serves it again.
    from celery_routines import Scheduler

    scheduler = Scheduler(app)
    try:
        scheduler.tick()
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    finally:
        scheduler.close()
    assert b"routines_ticks_total" in body, body[:300]
    return f"metrics served on :{port} after {tick_once_and_scrape} sent"


def web() -> str:
    """`routines migrate`, then `routines web`: the panel answers /healthz 200.

    Every wait has a deadline and the panel is killed before its output is
    read, so a panel that never turns healthy fails this check instead of
    hanging it (a 503 is an HTTPError, an OSError: it used to be retried until
    the deadline and then `communicate()` waited on a live process forever).
    """
    port = _free_port()
    env = {**os.environ, "ROUTINES_DATABASE_URL": f"sqlite:///{HERE / 'web.db'}"}
    celery = [sys.executable, "-m", "celery", "-A", "extra_paths:web_app", "routines"]
    here = Path(__file__).parent
    migrated = subprocess.run(
        [*celery, "migrate"], cwd=here, env=env, capture_output=True, text=True, timeout=60
    )
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    log = HERE / "web.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [*celery, "web", "--port", str(port)],
            cwd=here,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        try:
            status = _wait_for_health(port, process, deadline=time.monotonic() + 60)
        finally:
            process.kill()
            process.wait(timeout=30)
    assert status == 200, f"/healthz answered {status}:\n{log.read_text(errors='replace')}"
    return f"panel answered /healthz 200 on :{port}"


def _wait_for_health(port: int, process: subprocess.Popen[bytes], deadline: float) -> int | str:
    """/healthz's status once it is 200, else the last answer at the deadline."""
    last: int | str = "no answer"
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as error:
            last = error.code
        except OSError as error:
            last = str(error)
        time.sleep(0.3)
    return last if process.poll() is None else f"panel exited with status {process.returncode}"


def solar() -> str:
    from celery.schedules import solar as celery_solar

    app = Celery("extra_solar", broker="memory://")
    app.conf.routines_database_url = f"sqlite:///{HERE / 'solar.db'}"
    from celery_routines import Routines, register

    @app.task(name="extra.lights")
    def lights() -> None: ...

    register("extra.lights", celery_solar("sunset", 45.46, 9.19), name="lights")
    from celery_routines import Scheduler

    scheduler = Scheduler(app)
    scheduler.close()
    with Routines(app) as routines:
        detail = routines.show("lights", windows=2)
    assert detail.next_windows, detail
    return f"solar routine's next sunset in Milan: {detail.next_windows[0]}"


def holidays() -> str:
    """A calendar exclusion names the holiday it skips."""
    from datetime import date

    from celery_routines.schedules.exclusions import Exclusions

    name = Exclusions(("holidays:IT",)).day_name(date(2026, 12, 25))
    assert name == "Christmas Day", name
    return "holidays:IT names 2026-12-25 Christmas Day"


def yaml() -> str:
    """`routines export --format yaml --output FILE`, then `import file FILE --dry-run`."""
    env = {**os.environ, "ROUTINES_DATABASE_URL": f"sqlite:///{HERE / 'yaml.db'}"}
    celery = [sys.executable, "-m", "celery", "-A", "extra_paths:web_app", "routines"]
    here = Path(__file__).parent
    exported = HERE / "routines.yaml"
    for step in (
        ["migrate"],
        ["add", "nightly", "extra.nightly", "--cron", "30 2 * * *"],
        ["export", "--format", "yaml", "--output", str(exported)],
        ["import", "file", str(exported), "--dry-run"],
    ):
        done = subprocess.run(
            [*celery, *step], cwd=here, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, f"{step}: {done.stdout}{done.stderr}"
    assert "nightly" in exported.read_text(), exported.read_text()
    return "export --format yaml wrote nightly and import file read it back"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# `celery -A extra_paths:web_app routines web` in the web and base checks.
web_app = Celery("extra_web", broker="memory://")

if __name__ == "__main__":
    which = sys.argv[1]
    print(f"[{which}] {globals()[which]()}")
