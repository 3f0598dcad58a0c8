"""The panel's queries on SQLite, PostgreSQL and MariaDB: the state filter
agrees with the state the admin API shows, and a page's strips are the newest
runs of each routine in one query."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import event

from celery_routines.operator.views import routine_state
from celery_routines.store import Store
from celery_routines.store.panel_queries import ROUTINE_STATES
from tests.operators import add_routine, add_run

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_the_state_filter_is_the_state_the_admin_api_shows(store: Store) -> None:
    add_routine(store, "a-active")
    add_routine(store, "b-paused", paused=True)
    add_routine(store, "c-disabled", enabled=False, paused=True)
    add_routine(store, "d-invalid", last_error="bad cron", paused=True)
    add_routine(store, "e-suspended", suspended_until=NOW + timedelta(hours=1))
    add_routine(store, "f-suspension-over", suspended_until=NOW - timedelta(hours=1))
    add_routine(store, "g-paused-and-suspended", paused=True, suspended_until=NOW + timedelta(1))
    add_routine(store, "h-retired", retired_at=NOW, last_error="bad cron", source="code")
    shown = {r.name: routine_state(r, NOW) for r in store.routines.all()}
    for state in ROUTINE_STATES:
        page = store.panel.routine_page(now=NOW, state=state, limit=100)
        expected = {n for n, s in shown.items() if {"enabled": "active"}.get(s, s) == state}
        assert {r.name for r in page.records} == expected, state
        assert page.total == len(expected)
    assert store.panel.routine_page(now=NOW, limit=100).total == len(shown)


def test_the_strips_of_a_page_are_one_query_of_the_newest_runs(store: Store) -> None:
    ids = []
    for i in range(3):
        routine = add_routine(store, f"r{i}")
        ids.append(routine.id)
        for k in range(5 + i):
            at = NOW + timedelta(minutes=k)
            add_run(store, routine, f"r{i}@{k}", "succeeded", at, at)
    statements: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    found = store.panel.recent_runs(ids, per=4)
    assert len([s for s in statements if "routine_runs" in s]) == 1
    for i, routine_id in enumerate(ids):
        minutes = [(run.scheduled_for - NOW) // timedelta(minutes=1) for run in found[routine_id]]
        newest = 5 + i - 1
        assert minutes == list(range(newest, newest - 4, -1))
    assert store.panel.recent_runs([], per=4) == {}


def test_the_name_filter_is_a_literal_part_of_the_name(store: Store) -> None:
    for name in ("100%_done", "1000-done", "back\\slash", "report.daily"):
        add_routine(store, name)
    for part, expected in (
        ("0%_", ["100%_done"]),
        ("00", ["1000-done", "100%_done"]),
        ("k\\s", ["back\\slash"]),
        ("_", ["100%_done"]),
        ("T.D", ["report.daily"]),  # case is ignored on every database
    ):
        page = store.panel.routine_page(now=NOW, name=part, limit=10)
        assert sorted(r.name for r in page.records) == sorted(expected), part
