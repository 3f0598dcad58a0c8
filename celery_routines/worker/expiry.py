"""A run whose message expired before a worker started it: ``skipped``, reason ``expired``.

Beat sends a window of a routine with ``max_lateness`` carrying Celery's
``expires`` (the send instant plus ``max_lateness``). A worker that takes the
message after that instant (a backed-up queue) does not run it: Celery's
main process announces it through ``task_revoked`` with ``expired=True``
(the body, and so the run claim, never starts). The run is then closed as a
skip, like a window beat itself found too late, instead of staying ``sent``
until it is declared lost. Staleness is judged by Celery when the worker
would start the work, not when beat picked the window.
"""

from __future__ import annotations

import logging
from datetime import datetime

from celery_routines.policy.states import Reason, RunState
from celery_routines.store import Store

logger = logging.getLogger("celery_routines.worker")

# Only a run nobody started can expire: a running or finished run keeps its outcome.
EXPIRABLE_STATES = (RunState.PENDING.value, RunState.SENT.value)


def record_expired(store: Store, run_id: str, routine: str, now: datetime) -> bool:
    """Close ``run_id`` as ``skipped``/``expired``; False if it was no longer waiting."""
    closed = store.runs.settle(
        run_id,
        from_states=EXPIRABLE_STATES,
        state=RunState.SKIPPED,
        now=now,
        reason=Reason.EXPIRED,
        error="the message expired (window + max_lateness) before a worker started it",
    )
    if closed:
        logger.warning(
            "run %s of %s expired in the queue before a worker took it: skipped, not run",
            run_id,
            routine,
        )
    return closed
