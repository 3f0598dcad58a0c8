"""Helpers for the operator-surface tests (admin API and CLI): stored routines
and runs written through the store's own column types, a Celery app on the
filesystem broker, and the context Celery hands its sub-commands."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner, Result
from sqlalchemy import insert, update

from celery_routines.operator import commands
from celery_routines.operator.cli import routines
from celery_routines.store import NewRun, RoutineRecord, Store
from celery_routines.store.models import ROUTINE_RUNS, ROUTINES
from tests.harness import filesystem_app

Invoke = Callable[..., Result]


def make_app(folder: Path, database_url: str, **conf: Any) -> Celery:
    return filesystem_app(folder, database_url, **conf)


def add_routine(store: Store, name: str, **columns: Any) -> RoutineRecord:
    """A routine row (parametrised Core insert, so any name is just a name)."""
    values: dict[str, Any] = {"name": name, "task": "tasks.noop", **columns}
    if "cron" not in values and "interval_seconds" not in values:
        values["cron"] = "*/5 * * * *"
    with store.engine.begin() as conn:
        conn.execute(insert(ROUTINES).values(**values))
    record = store.routines.by_name(name)
    assert record is not None
    return record


def set_columns(store: Store, name: str, **values: Any) -> None:
    table = ROUTINES
    with store.engine.begin() as conn:
        conn.execute(update(table).where(table.c.name == name).values(**values))


def add_run(
    store: Store,
    routine: RoutineRecord,
    key: str,
    state: str,
    scheduled_for: datetime,
    created_at: datetime,
    *,
    attempt: int = 1,
    **extra: Any,
) -> str:
    """A stored run row in any state, as beat or a worker would leave it."""
    run_id = str(uuid.uuid4())
    skip_fields = {k: extra.pop(k) for k in list(extra) if k in ("reason", "skipped_count")}
    if state == "skipped":
        skip_fields.setdefault("skipped_count", 1)
        skip_fields.update(skipped_first=scheduled_for, skipped_last=scheduled_for)
    run = NewRun(
        id=run_id,
        routine_id=routine.id,
        idempotency_key=key,
        attempt=attempt,
        scheduled_for=scheduled_for,
        state=state,
        **skip_fields,
    )
    assert store.runs.insert_new([run], created_at) == {run_id}
    if extra:
        table = ROUTINE_RUNS
        with store.engine.begin() as conn:
            conn.execute(update(table).where(table.c.id == run_id).values(**extra))
    return run_id


def cli_context(app: Celery) -> CLIContext:
    """What ``celery -A proj`` puts in ``ctx.obj`` for its sub-commands."""
    return CLIContext(app=app, no_color=True, workdir=None)


def cli_invoker(
    app: Celery, clock: Callable[[], datetime], monkeypatch: pytest.MonkeyPatch
) -> Invoke:
    """Run a ``celery routines`` command as Celery would, with ``app`` in
    ctx.obj, the commands reading the time from ``clock``."""
    monkeypatch.setattr(commands, "CLOCK", clock)

    def run(*args: str) -> Result:
        # catch_exceptions=False: anything but a clean ClickException fails the test.
        return CliRunner().invoke(
            routines, list(args), obj=cli_context(app), catch_exceptions=False
        )

    return run


def ok(result: Result) -> str:
    """The output of a command that must have succeeded."""
    assert result.exit_code == 0, result.output
    return result.stdout


def one_error(result: Result) -> str:
    """The one line of a command that must have failed cleanly (no traceback)."""
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    return line
