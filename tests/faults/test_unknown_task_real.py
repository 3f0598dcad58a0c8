"""Issue 5, scenario 8, the unknown task name, with a real beat and worker.

Beat cannot know which tasks the workers have, so it sends the run. The
worker logs "Received unregistered task" and drops the message (it is acked,
not redelivered), so the run stays ``sent`` until its start deadline (here
``routines_run_timeout``, shorter than ``routines_start_timeout``), is
declared lost and retried under the routine's policy, and ends ``lost`` with
an error that says no worker claimed it. Other routines are not held up.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from tests.e2e.processes import CeleryProcess, environment, wait_until
from tests.faults.cluster import Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]


def states(cluster: Cluster, name: str) -> list[tuple[int, str, str | None]]:
    with cluster.store.engine.connect() as conn:
        return [
            tuple(row)
            for row in conn.execute(
                text(
                    "SELECT r.attempt, r.state, r.reason FROM routine_runs r "
                    "JOIN routines t ON t.id = r.routine_id WHERE t.name = :n "
                    "ORDER BY r.scheduled_for, r.attempt"
                ),
                {"n": name},
            )
        ]


def test_an_unknown_task_is_sent_dropped_by_the_worker_then_lost_and_retried(
    cluster: Cluster,
) -> None:
    timeout = "3"
    cluster.extra_env["ROUTINES_RUN_TIMEOUT"] = timeout
    with cluster.store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO routines (name, task, interval_seconds, enabled, max_retries, "
                "retry_base_seconds) VALUES "
                "('ghost', 'no.such.task', 3600, true, 1, 1), "
                "('alive', 'e2e_app.sql_inserted', 1, true, 4, 60)"
            )
        )
        # Due at once (no hour's wait for the first window).
        conn.execute(text("UPDATE routines SET next_run_at = now() WHERE name = 'ghost'"))
    worker = CeleryProcess(
        [
            "worker",
            "--pool",
            "solo",
            "--loglevel",
            "INFO",
            "--hostname",
            "ghosts@%h",
            "--without-heartbeat",
            "--without-mingle",
            "--without-gossip",
        ],
        environment(cluster.broker_url, cluster.database_url, ROUTINES_RUN_TIMEOUT=timeout),
        cluster.tmp_path / "worker.log",
    )
    cluster.processes.append(worker)
    beat = cluster.start_beat("beat")
    logs = [beat, worker]
    wait_until(
        lambda: "Received unregistered task of type 'no.such.task'" in worker.output(),
        30,
        "the worker to refuse the unknown task",
        logs,
    )
    # attempt 1 lost after the timeout, attempt 2 one second later, lost too.
    wait_until(
        lambda: states(cluster, "ghost") == [(1, "lost", "lost"), (2, "lost", "lost")],
        30,
        f"both attempts of ghost lost, now {states(cluster, 'ghost')}",
        logs,
    )
    cluster.stop_all()
    alive = states(cluster, "alive")
    assert len([s for s in alive if s[1] == "succeeded"]) >= 5, alive
    with cluster.store.engine.connect() as conn:
        error = conn.execute(
            text(
                "SELECT r.error FROM routine_runs r JOIN routines t ON t.id = r.routine_id "
                "WHERE t.name = 'ghost' AND r.attempt = 2"
            )
        ).scalar_one()
    assert "not started by" in error and "no worker claimed it" in error, error
