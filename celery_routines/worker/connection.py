"""The worker's database connection: pinged only after it sat idle, and a
statement cut by a connection that died meanwhile tried once more."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError

logger = logging.getLogger("celery_routines.worker")
T = TypeVar("T")

# A pooled connection idle this long is pinged before the worker uses it; one
# used more recently is not (a run's claim and outcome come back to back).
PING_AFTER_IDLE = 1.0


def once_more_if_cut(statement: Callable[[], T]) -> T:
    """Run a worker's statement; once more on a fresh connection if its pooled
    connection turned out to be cut (the pool pings only connections idle for
    :data:`PING_AFTER_IDLE`). Safe for the claim and the outcome: each is one
    conditional UPDATE, and a second try of one that did land changes nothing
    (a claim then refuses: the body does not run twice)."""
    try:
        return statement()
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        logger.warning("the worker's database connection was cut; trying once more: %s", exc)
        return statement()
