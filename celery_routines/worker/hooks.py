"""The worker side of a run: claim the row before the body, record the outcome.

Signal handlers cannot stop a task (Celery swallows their exceptions), so the
claim lives in ``Task.before_start``, which Celery calls right before the body
and which may raise ``Ignore``. Celery calls ``before_start`` only when the
task's class overrides it, and builds each task's tracer once (in the pool
child, before ``worker_process_init``), so :func:`install` puts the hook on the
task classes in the main process: from ``routine()``/``register()`` for tasks
declared with them, and from ``worker_init`` for every registered task (tasks
of ``beat_schedule`` entries and of rows inserted by SQL were never declared).

A refused claim raises ``Ignore``: the body does not run, no result is stored
and no final event is sent, so the result backend and Flower keep what the
delivery that did run reported under the same task id (``Reject`` would store
a FAILURE over it and fire ``task_failure``).

Handlers are thin, connected explicitly by :func:`connect`, act only on
messages beat marked as routine runs, and never raise into Celery.
"""

from __future__ import annotations

import logging
import socket
import threading
from datetime import timedelta
from functools import partial

from celery import Celery, signals
from celery.app.task import Context, Task
from celery.exceptions import Ignore, WorkerLostError
from celery.worker.request import Request as WorkerRequest  # task_revoked's, not a Context
from sqlalchemy import Connection

from celery_routines.clock import Clock, utc_now
from celery_routines.observe.notify import forget_all as forget_notifiers
from celery_routines.policy.runs import (
    celery_retry_wait,
    lost_after,
    lost_deadline,
    unstarted_timeout,
)
from celery_routines.policy.states import OPEN_STATES, RunState
from celery_routines.sending.publish import ROUTINE_HEADER
from celery_routines.store import Store
from celery_routines.store.faults import cause_of
from celery_routines.worker import counting, heartbeat, outcomes
from celery_routines.worker.connection import run_statement
from celery_routines.worker.expiry import record_expired
from celery_routines.worker.hand_back import hand_back, released_claims_of
from celery_routines.worker.outage import (
    Attempts,
    DatabaseUnreachable,
    is_connection_fault,
    log_failure,
)
from celery_routines.worker.pending import (
    PendingOutcome,
)
from celery_routines.worker.spend import begin_run, end_run
from celery_routines.worker.stores import (
    forget_inherited_connections,
    settings_for,
    store_for,
)
from celery_routines.worker.timeouts import hard_time_limit, run_timeout_of

logger = logging.getLogger("celery_routines.worker")

# The worker's clock seam: tests running an in-thread worker replace it with
# the injected clock their beat uses.
clock: Clock = utc_now

HOOK_MARK = "_celery_routines_claim"

_refused_lock = threading.Lock()
_connected = False
_refused = 0
_unhooked_warned: set[str] = set()


def refused_deliveries() -> int:
    """Deliveries this process refused to run because their run had already
    started or finished (each is also counted on the run row's ``duplicates``)."""
    return _refused


def routine_name_of(task: object) -> str | None:
    """The routine a task message was sent for, or None for ordinary calls."""
    return routine_of_request(getattr(task, "request", None))


def routine_of_request(request: object) -> str | None:
    if request is None:
        return None
    headers = getattr(request, "headers", None) or {}
    name = headers.get(ROUTINE_HEADER) if isinstance(headers, dict) else None
    return name or getattr(request, ROUTINE_HEADER, None)


# -- the claim hook --------------------------------------------------------------


def install(task: object) -> bool:
    """Put the run claim in front of ``task``'s body (idempotent).

    Wraps a ``before_start`` the user defined (it runs after a granted claim).
    Returns True if the hook was installed now.
    """
    target = task._get_current_object() if hasattr(task, "_get_current_object") else task
    if not isinstance(target, Task):
        return False
    cls = type(target)
    if cls is Task:
        return False  # never patch Celery's base class for every app
    current = cls.before_start
    if getattr(current, HOOK_MARK, False):
        return False  # this class or a base already has it
    user_hook = None if current is Task.before_start else current

    def before_start(self: Task, task_id: str, args: object, kwargs: object) -> None:
        claim_or_refuse(self, task_id)
        if user_hook is not None:
            user_hook(self, task_id, args, kwargs)

    setattr(before_start, HOOK_MARK, True)
    before_start.__wrapped__ = current  # type: ignore[attr-defined]
    cls.before_start = before_start
    return True


def install_all(app: Celery) -> int:
    """Install the hook on every task registered with ``app``."""
    return sum(install(task) for task in list(app.tasks.values()))


def claim_or_refuse(task: Task, task_id: str) -> None:
    """Claim the run before the body; raise ``Ignore`` if it is not ours to run."""
    request = task.request  # one lookup: each goes through Celery's request stack
    name = routine_of_request(request)
    if name is None:
        return  # called directly, or sent by something other than beat: untouched
    if getattr(request, "_routines_claimed", None) == task_id:
        return  # a subclass hook calling a base class hook: claimed once already
    begin_run()
    hostname = getattr(request, "hostname", None) or socket.gethostname()
    retries = int(getattr(request, "retries", 0) or 0)
    now = clock()
    released = released_claims_of(request)
    try:
        app = task.app
        store = store_for(app)
        settings = settings_for(app)
        timeout = run_timeout_of(request, settings.run_timeout)
        arbiter = arbitration_clock(store)
        after = lost_after(timeout, hard_time_limit(task, request))
        # One statement claims and starts the run and stamps its deadline on
        # the database's clock (the injected clock of a test that replaced it).
        deadline = None if clock is utc_now else now + timedelta(seconds=after)
        claim = partial(store.outcomes.claim_start, task_id, hostname, now, celery_retries=retries)

        def claim_once(on: Connection | None, attempts: Attempts) -> bool:
            # After a try cut mid-way, that try may have claimed the run for
            # this very delivery: take over what it may have left.
            mine = [(hostname, now)] if attempts.uncertain else []
            return claim(
                deadline_at=deadline,
                lost_after=after,
                released=(released + mine) or None,
                on=on,
            )

        claimed = run_statement(
            store, claim_once, what=f"claim run {task_id} of {name}",
            patience=settings.database_patience,
        )  # fmt: skip
    except DatabaseUnreachable as unreachable:
        end_run()
        hand_back(task, request, [*released, (hostname, now)], unreachable)
    except Exception:
        end_run()
        # Fail closed: without a claim the body could run twice. The row stays
        # sent; the lost sweep retries it under the routine's policy.
        logger.exception("could not claim run %s of %s; not running its body", task_id, name)
        raise
    if claimed:
        request._routines_claimed = task_id
        heartbeat.start(task_id, timeout, store.outcomes.heartbeat, arbiter)
        return
    end_run()
    global _refused
    with _refused_lock:
        _refused += 1
    counting.refused(store, task_id, now)
    try:
        state = store.outcomes.count_duplicate(task_id)
    except Exception as error:
        state = "unreadable (database error)"
        log_failure(f"count the refused delivery of run {task_id}", error)
    if state is None:
        # Not a duplicate: the row is gone (its routine deleted, the run
        # pruned) or was never written to this store.
        logger.warning(
            "refused a delivery of run %s of routine %s: no such run row in the store (its "
            "routine deleted, or the message sent to another store?); its body does not run",
            task_id,
            name,
        )
        raise Ignore(f"run {task_id} of {name}: no such run row")
    logger.warning(
        "refused a delivery of run %s of routine %s: the run is already %s; its body does not "
        "run again (duplicate delivery)",
        task_id,
        name,
        state,
    )
    raise Ignore(f"run {task_id} of {name} is already {state}")


def arbitration_clock(store: Store) -> Clock:
    """The clock run deadlines are written on: the database's (beat compares
    them on it), or the injected clock of a test that replaced :data:`clock`."""
    return store.db_now if clock is utc_now else clock


def _on_prerun(
    sender: Task | None = None, task_id: str | None = None, task: Task | None = None, **_: object
) -> None:
    # Only a fallback: a routine task whose class never got the hook (created
    # after the worker started) still gets its run marked running, although
    # nothing can stop a duplicate delivery's body here.
    if task is None or task_id is None or getattr(type(task).before_start, HOOK_MARK, False):
        return  # no task, or its claim hook does the work (checked first: no request lookup)
    if routine_name_of(task) is None:
        return
    if task.name not in _unhooked_warned:
        _unhooked_warned.add(task.name)
        logger.warning(
            "task %s runs routine runs but has no claim hook (registered after the worker "
            "started?); duplicate deliveries of it are not refused",
            task.name,
        )
    begin_run()
    try:
        store_for(task.app).outcomes.claim_start(task_id, task.request.hostname, clock())
    except Exception as error:
        log_failure(f"mark run {task_id} running", error)


def _on_success(sender: Task | None = None, result: object = None, **_: object) -> None:
    request = getattr(sender, "request", None)
    if sender is None or request is None or routine_of_request(request) is None:
        return
    heartbeat.stop(request.id)
    outcome = PendingOutcome(
        request.id, routine_of_request(request) or "", succeeded=True, finished_at=clock(),
        spend=end_run(),
    )  # fmt: skip
    outcomes.write_or_keep(sender.app, outcome)


def _on_failure(
    sender: Task | None = None,
    task_id: str | None = None,
    exception: BaseException | None = None,
    **_: object,
) -> None:
    if sender is None or task_id is None or routine_name_of(sender) is None:
        # A hard time limit is reported without the request: the run's
        # deadline (the limit plus a margin) covers it.
        return
    heartbeat.stop(task_id)
    outcome = PendingOutcome(
        task_id, routine_name_of(sender) or "", succeeded=False, finished_at=clock(),
        error=f"{type(exception).__name__}: {exception}" if exception is not None else "unknown",
        lost=isinstance(exception, WorkerLostError), spend=end_run(),
    )  # fmt: skip
    outcomes.write_or_keep(sender.app, outcome)


def _on_retry(
    sender: Task | None = None, request: Context | None = None, reason: object = None, **_: object
) -> None:
    """Celery's own ``self.retry()``/``autoretry_for``: the same run comes back,
    so it goes back to ``sent``; it is not one of our retries."""
    if sender is None or request is None or routine_name_of(sender) is None:
        return
    if getattr(request, "_routines_handed_back", False):
        return  # our hand-back (the claim could not reach the database): the row is as it was
    heartbeat.stop(request.id)
    end_run()
    now = clock()
    wait = celery_retry_wait(getattr(reason, "when", None), now)
    settings = settings_for(sender.app)
    # Back to sent: the redelivery must be claimed within the start timeout.
    waits = unstarted_timeout(run_timeout_of(request, settings.run_timeout), settings.start_timeout)
    deadline = lost_deadline(now + wait, waits)
    try:
        store_for(sender.app).outcomes.requeue(
            request.id, celery_retries=int(request.retries or 0), deadline_at=deadline
        )
    except Exception as error:
        if not is_connection_fault(error):
            logger.exception("could not put run %s back to sent for Celery's retry", request.id)
            return
        # Harmless: the redelivery carries a higher retry count, which takes
        # over the row this delivery left running.
        logger.warning(
            "could not put run %s back to sent for Celery's retry (%s); its redelivery "
            "claims it all the same",
            request.id,
            cause_of(error),
        )


def _on_postrun(task_id: str | None = None, **_: object) -> None:
    # Whatever ended the body (success, failure, Ignore, a retry), its heartbeat ends too.
    heartbeat.stop(task_id)


def _on_revoked(
    sender: Task | None = None,
    request: WorkerRequest | None = None,
    terminated: bool = False,
    expired: bool = False,
    **_: object,
) -> None:
    """A run revoked by someone (Flower, ``celery control revoke``) is closed
    as ``failed``, not left open to be declared lost and retried; an expired
    message is a skip (:mod:`celery_routines.worker.expiry`).
    A run beat replaced was closed before beat revoked it: left as it is."""
    routine = None if request is None else routine_of_request(request)
    if sender is None or request is None or routine is None:
        return
    if expired:
        try:
            record_expired(store_for(sender.app), request.id, routine, clock())
        except Exception as failure:
            log_failure(f"record the expiry of run {request.id}", failure)
        return
    reason = "revoked"
    error = "revoked and terminated" if terminated else "revoked before it ran"
    try:
        closed = store_for(sender.app).runs.settle(
            request.id,
            from_states=OPEN_STATES,
            state=RunState.FAILED,
            now=clock(),
            reason=reason,
            error=error,
        )
    except Exception as failure:
        log_failure(f"record the revocation of run {request.id}", failure)
        return
    if closed:
        logger.warning("run %s %s: closed as failed, not retried", request.id, error)


def on_worker_init(sender: object = None, **_: object) -> None:
    app = getattr(sender, "app", None)
    if app is None:
        return
    try:
        count = install_all(app)
    except Exception:
        logger.exception("could not install the run claim on the worker's tasks")
        return
    logger.debug("run claim installed on %d task class(es)", count)


def on_worker_ready(sender: object = None, **_: object) -> None:
    """Write the outcomes a previous worker on this host kept for the database."""
    app = getattr(sender, "app", None)
    if app is None:
        return
    try:
        outcomes.pending_for(app).recover()
    except Exception as error:
        log_failure("write the outcomes kept by a previous worker", error)


def after_fork(**_: object) -> None:
    outcomes.forget_pending()
    forget_inherited_connections()
    heartbeat.forget_all()
    counting.forget_all()
    forget_notifiers()
    install_in_pool_process()


def install_in_pool_process() -> None:
    """A pool process started fresh (spawn) re-created its task classes without
    the hook and built their tracers already: install and rebuild those. After
    a fork the classes are the parent's, hooked, and nothing is rebuilt."""
    from celery import current_app
    from celery.app.trace import build_tracer

    try:
        app = current_app._get_current_object()
        for name, task in list(app.tasks.items()):
            if install(task):
                task.__trace__ = build_tracer(name, task, app.loader, app=app)
    except Exception:
        logger.exception("could not install the run claim in this pool process")


def connect() -> bool:
    """Connect the worker signal handlers (idempotent); True when connected now."""
    global _connected
    if _connected:
        return False
    signals.worker_init.connect(on_worker_init, weak=False)
    signals.worker_ready.connect(on_worker_ready, weak=False)
    signals.task_prerun.connect(_on_prerun, weak=False)
    signals.task_success.connect(_on_success, weak=False)
    signals.task_failure.connect(_on_failure, weak=False)
    signals.task_retry.connect(_on_retry, weak=False)
    signals.task_postrun.connect(_on_postrun, weak=False)
    signals.task_revoked.connect(_on_revoked, weak=False)
    signals.worker_process_init.connect(after_fork, weak=False)
    _connected = True
    return True
