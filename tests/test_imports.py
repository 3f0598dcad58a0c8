"""What a running beat imports, pinned (issue 19, beat's memory).

Each heavy module below is imported only at its point of use: a beat that
imports one of them again pays its memory in every process for nothing (the
performance page, docs/performance.md, has the figures). These tests run real
processes in a fresh interpreter, because the test process itself has
imported everything long ago. RSS is not asserted here (too noisy): it is
measured by ``python -m benchmarks.memory``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from celery_routines.store import Store

ROOT = Path(__file__).resolve().parent.parent

# Module -> who needs it instead of a running beat.
NOT_IN_BEAT = {
    "sqlalchemy.orm": "nobody: the tables are Core Table objects",
    "alembic": "migrations, only when the schema must be upgraded",
    "mako": "Alembic's templates",
    "celery_routines.operator.commands": "the `celery routines` command",
    "celery_routines.operator.admin": "the command and the panel",
    "celery_routines.operator.web": "the panel",
    "starlette": "the panel",
    "jinja2": "the panel",
    "uvicorn": "the panel",
    "ephem": "solar schedules",
    "dateutil.rrule": "rrule schedules",
    "prometheus_client": "routines_metrics_port",
    "sentry_sdk": "an application that uses Sentry (it imports it itself)",
    "celery_routines.integrations.sentry": "an application that imported sentry_sdk",
}

APP = """
from celery import Celery

from celery_routines import register

app = Celery("imports_app", broker="memory://")
app.conf.routines_database_url = {url!r}


@app.task(name="imports_app.noop")
def noop():
    return None


register(noop, 1.0)
"""

# Runs `celery -A imports_app beat -S celery_routines.Scheduler` in this
# interpreter and writes its sys.modules when beat exits (SIGTERM).
BEAT = """
import atexit, json, sys

def dump():
    with open({out!r}, "w") as f:
        json.dump(sorted(sys.modules), f)

atexit.register(dump)

# Only our celery.commands plugin: Flower's (installed with the test extras)
# brings prometheus_client into every celery process, not a beat host's need.
import importlib.metadata as metadata
all_entry_points = metadata.entry_points

def ours_only(**selection):
    found = all_entry_points(**selection)
    if selection.get("group") != "celery.commands":
        return found
    return metadata.EntryPoints(e for e in found if e.value.startswith("celery_routines."))

metadata.entry_points = ours_only
sys.argv = ["celery", "-A", "imports_app", "beat", "-S", "celery_routines.Scheduler",
            "-l", "info", "--max-interval", "1", "-s", {schedule!r}, "--pidfile="]
from celery.__main__ import main
main()
"""


def run_python(code: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), str(ROOT)])}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def heavy_in(modules: list[str]) -> dict[str, str]:
    loaded = set(modules)
    return {
        name: why
        for name, why in NOT_IN_BEAT.items()
        if name in loaded or any(m.startswith(name + ".") for m in loaded)
    }


def test_a_running_beat_imports_none_of_the_heavy_modules(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'routines.db'}"
    # Migrated beforehand, as on any start but the first: Alembic is then not needed.
    store = Store.from_url(url)
    store.migrate()
    store.dispose()
    (tmp_path / "imports_app.py").write_text(APP.format(url=url))
    out = tmp_path / "modules.json"
    code = BEAT.format(out=str(out), schedule=str(tmp_path / "celerybeat-schedule"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    beat = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    store = Store.from_url(url)
    try:
        # A few ticks: the routine fires every second.
        for _ in range(200):
            if beat.poll() is not None or _runs(store) >= 3:
                break
            time.sleep(0.1)
        sent = _runs(store)
    finally:
        store.dispose()
        beat.terminate()
        output = beat.communicate(timeout=30)[0]
    assert sent >= 3, output[-3000:]
    modules = json.loads(out.read_text())
    assert "celery_routines.beat" in modules and "sqlalchemy" in modules
    assert heavy_in(modules) == {}, output[-2000:]


def _runs(store: Store) -> int:
    from sqlalchemy import func, select

    from celery_routines.store.models import ROUTINE_RUNS

    with store.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(ROUTINE_RUNS)).scalar_one()


@pytest.mark.parametrize(
    "statement",
    [
        pytest.param("import celery_routines", id="the_package"),
        # What every `celery` process does: load the celery.commands plugins.
        pytest.param("import celery.bin.celery", id="the_celery_command"),
    ],
)
def test_the_package_and_the_command_plugin_import_no_store(tmp_path: Path, statement: str) -> None:
    """Celery imports our command's entry point in every process it starts
    (workers, Celery's own beat): it must not bring the scheduler, the store
    or SQLAlchemy along."""
    done = run_python(
        f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))", tmp_path
    )
    assert done.returncode == 0, done.stderr
    modules = set(json.loads(done.stdout.splitlines()[-1]))
    assert "celery_routines.operator.cli" in modules or statement == "import celery_routines"
    store_side = sorted(
        m
        for m in modules
        if m == "sqlalchemy" or m.startswith(("celery_routines.store", "celery_routines.beat"))
    )
    assert store_side == []


def test_importing_the_package_alone_still_connects_the_worker_side(tmp_path: Path) -> None:
    """A worker of an app that imports only the package (its routines are in
    beat_schedule or inserted by SQL) still claims runs: the handlers are
    connected, and the claim installed on its tasks, when the worker starts."""
    done = run_python(
        """
        import celery_routines
        from celery import Celery, signals

        app = Celery("worker_side", broker="memory://")

        @app.task(name="worker_side.noop")
        def noop():
            return None

        class Worker:  # what worker_init is sent by: something with the app
            pass

        worker = Worker()
        worker.app = app
        signals.worker_init.send(sender=worker)
        from celery_routines.worker import hooks
        task = app.tasks["worker_side.noop"]
        print(hooks._connected, getattr(type(task).before_start, hooks.HOOK_MARK, False))
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]
