"""A routine removed from the code stops, with real ``celery beat`` processes
on PostgreSQL and Redis: a restart without the declaration retires it (one
WARNING, no more fires, shown as retired), declaring it again brings it back
with one skipped row (reason retired) instead of a burst."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from celery_routines.store import Store
from tests.e2e import test_lifecycle
from tests.e2e.processes import CeleryProcess, environment, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]


pg_store = test_lifecycle.pg_store  # the same fixture: a migrated PostgreSQL store


def legacy_rows(store: Store) -> list[tuple[str, str | None, int | None]]:
    with store.engine.connect() as conn:
        return [
            (row.state, row.reason, row.skipped_count)
            for row in conn.execute(
                text(
                    "SELECT r.state, r.reason, r.skipped_count FROM routine_runs r "
                    "JOIN routines t ON t.id = r.routine_id WHERE t.name = 'legacy-entry' "
                    "ORDER BY r.created_at"
                )
            )
        ]


def rows_of_tick(store: Store) -> int:
    """Run rows of the e2e app's own routine, which stays declared throughout."""
    with store.engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT count(*) FROM routine_runs r JOIN routines t ON t.id = r.routine_id "
                "WHERE t.name = 'tick'"
            )
        ).scalar_one()


def start_beat(tmp_path: Path, env: dict[str, str], label: str) -> CeleryProcess:
    return CeleryProcess(
        ["beat", "-S", "routines", "--loglevel", "INFO", "--schedule", str(tmp_path / "sched")],
        env,
        tmp_path / f"beat-{label}.log",
    )


def test_a_real_beat_retires_a_removed_entry_and_brings_it_back(
    tmp_path: Path, postgres_url: str, redis_url: str, pg_store: Store
) -> None:
    # The app's own routine every half second, the entry every second (its
    # 0.5 s comes in as 1 s: a beat_schedule interval is taken in whole
    # seconds): the checks below wait on windows going by, quicker than at 2 s.
    declared = environment(redis_url, postgres_url, E2E_INTERVAL="0.5", E2E_BEAT_SCHEDULE="0.5")
    removed = environment(redis_url, postgres_url, E2E_INTERVAL="0.5")
    first = start_beat(tmp_path, declared, "declared")
    try:
        wait_until(lambda: len(legacy_rows(pg_store)) >= 1, 60, "the entry to fire", [first])
    finally:
        first.stop()

    # The deploy without the entry.
    second = start_beat(tmp_path, removed, "removed")
    try:
        wait_until(
            lambda: "retired legacy-entry" in second.output(), 60, "the retirement", [second]
        )
        before, ticks = legacy_rows(pg_store), rows_of_tick(pg_store)
        # Beat goes on through six more windows of 'tick', three of the
        # entry's: none of them fires the entry.
        wait_until(lambda: rows_of_tick(pg_store) >= ticks + 6, 30, "six windows of tick", [second])
        assert legacy_rows(pg_store) == before
        log = second.output()
        assert log.count("retired legacy-entry") == 1
        assert "WARNING" in next(
            line for line in log.splitlines() if "retired legacy-entry" in line
        )
        with pg_store.engine.connect() as conn:
            retired_at = conn.execute(
                text("SELECT retired_at FROM routines WHERE name = 'legacy-entry'")
            ).scalar_one()
        assert retired_at is not None
    finally:
        second.stop()

    # Declared again (a rollback): back in service, the missed windows one skip.
    third = start_beat(tmp_path, declared, "again")
    try:
        wait_until(
            lambda: any(r == "retired" for _, r, _ in legacy_rows(pg_store)),
            60,
            "the retired skip row",
            [third],
        )
        skips = [row for row in legacy_rows(pg_store) if row[1] == "retired"]
        assert len(skips) == 1 and (skips[0][2] or 0) >= 3
        wait_until(
            lambda: len(legacy_rows(pg_store)) >= len(before) + 2,
            60,
            "the entry to fire again",
            [third],
        )
    finally:
        third.stop()
