"""Building real Celery apps and schedulers for tests.

Tick-level tests use kombu's filesystem transport (a real transport: each
published message is a file), so a test can count exactly what was sent
without a broker server; multi-beat tests use real Redis.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from celery import Celery
from sqlalchemy import MetaData, text

from celery_routines import Scheduler
from celery_routines.store import RunRecord, Store


def unclaimed_runs_wait_their_run_timeout(conf: dict[str, Any]) -> dict[str, Any]:
    """Beats in these tests mostly run with no worker to claim what they send
    while the injected clock moves on for hours: a sent run waits its run
    timeout, not the start timeout, unless the test sets
    ``routines_start_timeout`` itself (tests/tick/test_start_timeout.py)."""
    conf.setdefault("routines_start_timeout", conf.get("routines_run_timeout", 3600))
    return conf


def filesystem_app(folder: Path, database_url: str, **conf: Any) -> Celery:
    folder.mkdir(parents=True, exist_ok=True)
    unclaimed_runs_wait_their_run_timeout(conf)
    app = Celery("routines_test", set_as_current=False)
    app.conf.update(
        broker_url="filesystem://",
        broker_transport_options={
            "data_folder_in": str(folder),
            "data_folder_out": str(folder),
            "control_folder": str(folder / "control"),
        },
        **{"routines_database_url": database_url, "beat_max_loop_interval": 300, **conf},
    )
    return app


def redis_app(broker_url: str, database_url: str, **conf: Any) -> Celery:
    unclaimed_runs_wait_their_run_timeout(conf)
    app = Celery("routines_test", set_as_current=False)
    app.conf.update(
        broker_url=broker_url,
        **{"routines_database_url": database_url, "beat_max_loop_interval": 300, **conf},
    )
    return app


def published(folder: Path) -> list[dict[str, Any]]:
    """The task messages in a filesystem-transport folder, as header dicts."""
    messages = []
    for path in sorted(folder.glob("*.msg")):
        envelope = json.loads(path.read_text())
        messages.append(envelope["headers"])
    return messages


def migrated_store(url: str) -> Iterator[Store]:
    """A store on ``url`` with the schema at head, disposed when the caller is
    done (a fixture's body: ``yield from migrated_store(url)``)."""
    store = Store.from_url(url)
    store.migrate()
    yield store
    store.dispose()


def insert_routine(store: Store, name: str, **columns: Any) -> int:
    """A routine row inserted by plain SQL, as an operator would."""
    values = {"name": name, "task": "tasks.noop", **columns}
    with store.engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO routines ({', '.join(values)}) "
                f"VALUES ({', '.join(':' + k for k in values)})"
            ),
            values,
        )
        return conn.execute(
            text("SELECT id FROM routines WHERE name = :n"), {"n": name}
        ).scalar_one()


def runs_of(store: Store, name: str) -> list[dict[str, Any]]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT r.* FROM routine_runs r JOIN routines t ON t.id = r.routine_id "
                "WHERE t.name = :n ORDER BY r.scheduled_for, r.attempt"
            ),
            {"n": name},
        )
        return [dict(row._mapping) for row in rows]


def closing(scheduler: Scheduler) -> Iterator[Scheduler]:
    try:
        yield scheduler
    finally:
        scheduler.close()


def runs_for(store: Store, routine_id: int, limit: int = 100) -> list[RunRecord]:
    """A routine's run rows, newest first (the operator's listing query)."""
    return [named.run for named in store.admin.runs(routine_id=routine_id, limit=limit)]


def running(pid: int) -> bool:
    """The process exists and has not exited (a zombie, not yet reaped, has)."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    # The state is the first field after the command's closing ")".
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def recorded_changes(store: Store) -> int:
    """How many changes ``routine_changes`` holds (each operator change writes one)."""
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT COUNT(*) FROM routine_changes")).scalar_one())


def drop_every_table(url: str, *, migrate: bool = False) -> None:
    """What dropping and recreating the database leaves: no table at all
    (then, ``migrate``, the empty tables `celery routines migrate` creates)."""
    store = Store.from_url(url)
    try:
        tables = MetaData()
        tables.reflect(store.engine)
        tables.drop_all(store.engine)
        if migrate:
            store.migrate()
    finally:
        store.dispose()
