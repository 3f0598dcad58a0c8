"""The Celery app of ``benchmarks.worker_cost``'s real prefork worker.

Configured from the environment: ``CELERY_BROKER_URL`` (read by Celery),
``BENCH_QUEUE``, ``BENCH_ROUTINES`` ("1": import celery-routines, which hooks
the worker; anything else: plain Celery), ``ROUTINES_DATABASE_URL`` and
``BENCH_TIMINGS`` (the Redis list each pool process appends its timings to).

Each pool process times every task from ``task_prerun`` to ``task_postrun``:
that span holds celery-routines' claim (``before_start``), the body and the
outcome (``task_success``), so with and without celery-routines it differs by
exactly what celery-routines adds to a run. It also counts the statements its
SQLAlchemy engines ran, and the CPU time the process used for its tasks
after the first one (every thread: what the work costs the 2 cores,
whatever the scheduler does with the waits; the first task also pays the
process's one-time set-up, such as connecting). Timings are buffered and pushed to Redis in
batches and when the pool process shuts down, outside the timed span.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Celery, signals

app = Celery("bench_worker")
app.conf.update(
    task_default_queue=os.environ.get("BENCH_QUEUE", "celery"),
    worker_prefetch_multiplier=16,
    broker_connection_retry_on_startup=True,
    task_ignore_result=True,
)

if os.environ.get("BENCH_ROUTINES") == "1":
    import celery_routines  # noqa: F401  (connects the worker hooks)

    app.conf.routines_database_url = os.environ["ROUTINES_DATABASE_URL"]


@app.task(name="bench.noop")
def noop() -> None:
    return None


_started: dict[str, float] = {}
_done: list[tuple[float, float]] = []
_statements = [0]
# Process CPU time (seconds) when the first task ended, and tasks since.
_cpu_from: list[float] = []
_cpu_runs = [0]
FLUSH_EVERY = 500


def _count_statements() -> None:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    def count(*_: Any) -> None:
        _statements[0] += 1

    event.listen(Engine, "before_cursor_execute", count)


def _flush() -> None:
    if not _done and not _statements[0]:
        return
    import redis

    client = redis.Redis.from_url(os.environ["CELERY_BROKER_URL"])
    cpu = time.process_time() - _cpu_from[0] if _cpu_from else 0.0
    payload = json.dumps(
        {
            "spans": _done,
            "statements": _statements[0],
            "pid": os.getpid(),
            "cpu": [cpu, _cpu_runs[0]],
        }
    )
    client.rpush(os.environ["BENCH_TIMINGS"], payload)
    client.close()
    _done.clear()
    _statements[0] = 0


@signals.worker_process_init.connect
def _child_init(**_: Any) -> None:
    _count_statements()


@signals.task_prerun.connect
def _prerun(task_id: str | None = None, **_: Any) -> None:
    _started[task_id or ""] = time.time()


@signals.task_postrun.connect
def _postrun(task_id: str | None = None, **_: Any) -> None:
    ended = time.time()
    started = _started.pop(task_id or "", None)
    if started is not None:
        _done.append((started, ended))
    if _cpu_from:
        _cpu_runs[0] += 1
    else:
        _cpu_from.append(time.process_time())
    if len(_done) >= FLUSH_EVERY:
        _flush()


@signals.worker_process_shutdown.connect
def _child_shutdown(**_: Any) -> None:
    _flush()
