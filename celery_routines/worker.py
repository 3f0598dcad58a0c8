"""The worker side of a run: claim the row before the body, record the outcome.

Handlers are thin, connected explicitly by :func:`connect`, act only on
messages beat marked as routine runs, and never raise into Celery (a database
hiccup is logged; the task itself still runs and reports to Celery as usual).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery, signals

from .clock import utc_now
from .config import settings_from
from .publish import ROUTINE_HEADER
from .spend import begin_run, end_run
from .store import Store

logger = logging.getLogger("celery_routines.worker")

_stores: dict[int, Store] = {}
_stores_lock = threading.Lock()
_connected = False


def store_for(app: Celery) -> Store:
    """One store per app per process (engines are not shared across a fork)."""
    key = id(app)
    store = _stores.get(key)
    if store is None:
        with _stores_lock:
            store = _stores.get(key)
            if store is None:
                store = Store.from_url(settings_from(app).database_url)
                _stores[key] = store
    return store


def routine_name_of(task: Any) -> str | None:
    """The routine a task message was sent for, or None for ordinary calls."""
    request = getattr(task, "request", None)
    if request is None:
        return None
    headers = getattr(request, "headers", None) or {}
    name = headers.get(ROUTINE_HEADER) if isinstance(headers, dict) else None
    return name or getattr(request, ROUTINE_HEADER, None)


def _on_prerun(sender: Any = None, task_id: str | None = None, task: Any = None, **_: Any) -> None:
    if task is None or task_id is None or routine_name_of(task) is None:
        return
    begin_run()
    try:
        claimed = store_for(task.app).runs.claim_start(task_id, task.request.hostname, utc_now())
    except Exception:
        logger.exception("could not mark run %s running", task_id)
        return
    if not claimed:
        logger.warning(
            "run %s of %s was already started, finished or unknown when this delivery began",
            task_id,
            routine_name_of(task),
        )


def _on_success(sender: Any = None, result: Any = None, **_: Any) -> None:
    if sender is None or routine_name_of(sender) is None:
        return
    _finish(sender, sender.request.id, "succeeded", None)


def _on_failure(
    sender: Any = None, task_id: str | None = None, exception: BaseException | None = None, **_: Any
) -> None:
    if sender is None or task_id is None:
        return
    error = f"{type(exception).__name__}: {exception}" if exception is not None else None
    _finish(sender, task_id, "failed", error)


def _on_retry(sender: Any = None, request: Any = None, **_: Any) -> None:
    if sender is None or request is None or routine_name_of(sender) is None:
        return
    end_run()
    try:
        store_for(sender.app).runs.requeue(request.id)
    except Exception:
        logger.exception("could not put run %s back to sent for Celery's retry", request.id)


def _finish(task: Any, run_id: str, state: str, error: str | None) -> None:
    ledger = end_run()
    try:
        store_for(task.app).runs.finish(run_id, state, utc_now(), error=error, spend=ledger)
    except Exception:
        logger.exception("could not record outcome %s of run %s", state, run_id)


def _after_fork(**_: Any) -> None:
    # Connections inherited from the parent must not be used in the child.
    with _stores_lock:
        for store in _stores.values():
            store.engine.dispose(close=False)


def connect() -> None:
    """Connect the worker signal handlers (idempotent)."""
    global _connected
    if _connected:
        return
    signals.task_prerun.connect(_on_prerun, weak=False)
    signals.task_success.connect(_on_success, weak=False)
    signals.task_failure.connect(_on_failure, weak=False)
    signals.task_retry.connect(_on_retry, weak=False)
    signals.worker_process_init.connect(_after_fork, weak=False)
    _connected = True
