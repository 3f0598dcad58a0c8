"""Beat prunes the workers' events with the run history: older than
``routines_keep_runs_days``, one batch a pass, the newest kept."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from celery_routines.store import Store
from celery_routines.store.models import ROUTINE_WORKER_EVENTS
from celery_routines.store.run_metrics import DUPLICATE, SUSPENDED
from celery_routines.tick.prune import PRUNE_EVERY, Pruner

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def runs_noted(store: Store) -> list[str]:
    table = ROUTINE_WORKER_EVENTS
    with store.engine.connect() as conn:
        return list(conn.scalars(select(table.c.run_id).order_by(table.c.id)))


def test_old_worker_events_go_one_batch_a_pass_and_recent_ones_stay(store: Store) -> None:
    for day in (40, 35, 31):
        store.run_metrics.note(f"old-{day}", DUPLICATE, NOW - timedelta(days=day))
    store.run_metrics.note("recent-29", SUSPENDED, NOW - timedelta(days=29))
    store.run_metrics.note("recent-1", DUPLICATE, NOW - timedelta(days=1))
    newest_id = store.run_metrics.last_event_id()
    seconds = [0.0]
    pruner = Pruner(store, keep_days=30, batch=2, default_zone="UTC", monotonic=lambda: seconds[0])

    pruner.maybe_prune(NOW)  # a starting beat does not prune in its first minute
    assert runs_noted(store) == ["old-40", "old-35", "old-31", "recent-29", "recent-1"]
    seconds[0] += PRUNE_EVERY
    pruner.maybe_prune(NOW)
    assert runs_noted(store) == ["old-31", "recent-29", "recent-1"]
    seconds[0] += PRUNE_EVERY
    pruner.maybe_prune(NOW)
    seconds[0] += PRUNE_EVERY
    pruner.maybe_prune(NOW)
    assert runs_noted(store) == ["recent-29", "recent-1"]
    # A starting beat reads events past the newest id: pruning never moves it back.
    assert store.run_metrics.last_event_id() == newest_id
