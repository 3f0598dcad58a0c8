"""Handing a delivery back to the broker when its claim cannot reach the
database: the same message, due again a little later, so a database blip
neither fails the task nor leaves its run ``sent``."""

from __future__ import annotations

import logging
from datetime import datetime

from celery.app.task import Context, Task
from celery.exceptions import Retry

from celery_routines.sending.publish import ROUTINE_HEADER, ROUTINE_HEADERS, header_of
from celery_routines.worker.outage import DatabaseUnreachable

logger = logging.getLogger("celery_routines.worker")

# A delivery handed back to the broker because its claim could not reach the
# database carries the claims it tried (worker and start instant): whichever
# of them landed unseen is taken over by the next delivery, whose body is the
# first to run.
RELEASED_HEADER = "routine_released_claims"
# How long a handed-back delivery waits in the broker before it comes again.
HAND_BACK_AFTER = 5.0


def released_claims_of(request: object) -> list[tuple[str, datetime]]:
    """The claims an earlier delivery of this run tried before it was handed
    back (see :data:`RELEASED_HEADER`)."""
    raw = header_of(request, RELEASED_HEADER)
    claims: list[tuple[str, datetime]] = []
    for item in raw if isinstance(raw, list) else []:
        try:
            worker, at = item
            claims.append((str(worker), datetime.fromisoformat(at)))
        except (TypeError, ValueError):
            continue  # not ours to read: this delivery claims as any other
    return claims


def hand_back(
    task: Task,
    request: Context,
    claims: list[tuple[str, datetime]],
    unreachable: DatabaseUnreachable,
) -> None:
    """Give the delivery back to the broker: the same run id and message,
    due again in :data:`HAND_BACK_AFTER` seconds. Raises Celery's ``Retry``,
    so the task shows RETRY (not FAILURE) in Flower and the result backend,
    and the body does not run. Not Celery's own ``self.retry()``: that would
    count against the task's ``max_retries``."""
    headers = {name: value for name in ROUTINE_HEADERS if (value := header_of(request, name))}
    headers.update(getattr(request, "headers", None) or {})
    headers[RELEASED_HEADER] = [[worker, at.isoformat()] for worker, at in claims[-8:]]
    request._routines_handed_back = True
    try:
        task.signature_from_request(
            request, request.args, request.kwargs, countdown=HAND_BACK_AFTER, headers=headers
        ).apply_async()
    except Exception:
        logger.exception(
            "could not hand run %s back to the broker either; it stays sent and is retried "
            "when its deadline passes",
            request.id,
        )
        raise unreachable from None
    logger.warning(
        "run %s of %s handed back to the broker, due again in %.0f s: %s",
        request.id,
        header_of(request, ROUTINE_HEADER),
        HAND_BACK_AFTER,
        unreachable,
    )
    raise Retry(f"the database is unreachable: {unreachable}", when=HAND_BACK_AFTER)
