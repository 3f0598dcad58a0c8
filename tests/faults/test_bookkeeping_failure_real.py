"""Issue 11: a beat whose bookkeeping fails after it published never
publishes the same run again.

The failure is injected by PostgreSQL itself: a trigger raises
``deadlock_detected`` (SQLSTATE 40P01) on the first statements that mark runs
sent or advance routines, exactly as a real deadlock or a failover would
surface to the beat after its messages went out. A sequence counts the
failures (``nextval`` is not undone by the rollback the error causes).
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from tests.faults.cluster import Cluster, all_moved_past, check_every_window_once, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

FAILURES = 4


def install_failing_trigger(cluster: Cluster, table: str, when: str) -> None:
    """The first ``FAILURES`` UPDATEs of ``table`` matching ``when`` fail."""
    statements = [
        f"CREATE SEQUENCE fault_{table}",
        f"""
        CREATE FUNCTION fault_{table}() RETURNS trigger AS $$
        BEGIN
            IF ({when}) AND nextval('fault_{table}') <= {FAILURES} THEN
                RAISE EXCEPTION 'injected deadlock on {table}' USING ERRCODE = '40P01';
            END IF;
            RETURN NEW;
        END $$ LANGUAGE plpgsql
        """,
        f"CREATE TRIGGER fault_{table} BEFORE UPDATE ON {table} "
        f"FOR EACH ROW EXECUTE FUNCTION fault_{table}()",
    ]
    with cluster.store.engine.begin() as conn:
        for statement in statements:
            conn.execute(text(statement))


def failures_injected(cluster: Cluster, table: str) -> int:
    with cluster.store.engine.connect() as conn:
        return conn.execute(text(f"SELECT last_value FROM fault_{table}")).scalar_one()


def assert_no_task_id_published_twice(cluster: Cluster) -> None:
    counts = Counter(cluster.broker_task_ids())
    repeated = {task_id: n for task_id, n in counts.items() if n > 1}
    sample = dict(list(repeated.items())[:5])
    assert not repeated, f"{len(repeated)} run id(s) published more than once, e.g. {sample}"


@pytest.mark.parametrize(
    ("table", "when"),
    [
        # The advance: a claimed routine moves to its next window and is released.
        ("routines", "OLD.locked_by IS NOT NULL AND NEW.locked_by IS NULL"),
        # Marking published runs sent.
        ("routine_runs", "OLD.state = 'pending' AND NEW.state = 'sent'"),
    ],
    ids=["advance_fails", "mark_sent_fails"],
)
def test_a_failed_bookkeeping_statement_after_publishing_never_republishes(
    cluster: Cluster, table: str, when: str
) -> None:
    cluster.add_interval_routines(40, intervals=(1.0, 2.0))
    install_failing_trigger(cluster, table, when)
    beat = cluster.start_beat("beat", ROUTINES_LOCK_TTL="30")
    wait_for(
        cluster,
        lambda: failures_injected(cluster, table) >= FAILURES,
        60,
        f"{FAILURES} injected failures",
    )
    # Then the beat recovers: every routine goes on past the failures.
    recovered = datetime.now(UTC).replace(tzinfo=None) + timedelta(seconds=3)
    wait_for(cluster, lambda: all_moved_past(cluster, recovered), 60, "the beat to carry on")
    cluster.stop_all()
    output = beat.output()
    assert failures_injected(cluster, table) >= FAILURES, output[-3000:]
    assert "injected deadlock" in output
    assert_no_task_id_published_twice(cluster)
    figures = check_every_window_once(cluster, until=datetime.now(UTC).replace(tzinfo=None))
    assert figures["repeats"] == 0
    with cluster.store.engine.connect() as conn:
        stuck = conn.execute(
            text("SELECT count(*) FROM routine_runs WHERE state = 'pending'")
        ).scalar_one()
    assert stuck == 0, "published runs left pending after the bookkeeping recovered"
