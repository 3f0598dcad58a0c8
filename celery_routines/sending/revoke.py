"""Stopping runs that are already out: ``overlap="replace"`` revokes the open run."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from celery import Celery

logger = logging.getLogger("celery_routines.beat")


class Revoker(Protocol):
    def revoke(self, run_ids: Sequence[str]) -> None:
        """Revoke these runs (their task ids), terminating any that started."""
        ...


class CeleryRevoker:
    """``app.control.revoke(..., terminate=True)``: a broadcast every worker
    hears; one that runs the task kills the process running it (prefork)."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def revoke(self, run_ids: Sequence[str]) -> None:
        if not run_ids:
            return
        try:
            self.app.control.revoke(list(run_ids), terminate=True)
        except Exception as exc:
            # The run rows already say "replaced"; a run that goes on anyway
            # finds its row closed and its outcome is not recorded.
            logger.error("could not revoke replaced run(s) %s: %s", ", ".join(run_ids), exc)


class NoRevoker:
    def revoke(self, run_ids: Sequence[str]) -> None:
        if run_ids:
            logger.warning("cannot revoke %s: this publisher has no Celery app", run_ids)
