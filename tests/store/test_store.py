"""The store against real SQLite, PostgreSQL and MariaDB databases."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import make_url

from celery_routines.store import Advance, NewRun, Store, migrate
from celery_routines.store.declarations import IMPORT_PAUSE_REASON
from celery_routines.store.dialects import MYSQL_INDEX_COLUMNS, binary_collation, is_mysql
from celery_routines.store.engine import postgres_driver
from celery_routines.store.models import metadata

T0 = datetime(2026, 10, 25, 0, 0, tzinfo=UTC)


def add_routine(store: Store, name: str, **columns: object) -> int:
    values = {"name": name, "task": "tasks.noop", "interval_seconds": 60.0, **columns}
    names = ", ".join(values)
    params = ", ".join(f":{k}" for k in values)
    with store.engine.begin() as conn:
        conn.execute(text(f"INSERT INTO routines ({names}) VALUES ({params})"), values)
        return conn.execute(
            text("SELECT id FROM routines WHERE name = :n"), {"n": name}
        ).scalar_one()


def new_run(routine_id: int, key: str, attempt: int = 1) -> NewRun:
    return NewRun(
        id=str(uuid.uuid4()),
        routine_id=routine_id,
        idempotency_key=key,
        attempt=attempt,
        scheduled_for=T0,
    )


def test_migrations_create_the_contract_tables_and_match_the_models(store: Store) -> None:
    inspector = inspect(store.engine)
    routine_columns = {c["name"] for c in inspector.get_columns("routines")}
    assert {
        "id",
        "name",
        "task",
        "cron",
        "interval_seconds",
        "timezone",
        "enabled",
        "next_run_at",
        "paused",
        "suspended_until",
        "suspended_reason",
        "last_error",
    } <= routine_columns
    run_columns = {c["name"] for c in inspector.get_columns("routine_runs")}
    assert {
        "id",
        "routine_id",
        "idempotency_key",
        "attempt",
        "scheduled_for",
        "state",
        "reason",
        "retry_at",
        "created_at",
        "started_at",
        "finished_at",
        "spend",
    } <= run_columns
    assert migrate.current_revision(store.engine) == migrate.head_revision()
    mysql = is_mysql(store.engine)
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn)
        diff = [
            d
            for d in compare_metadata(context, metadata)
            if not (isinstance(d, tuple) and "routines_alembic_version" in str(d))
            and not (mysql and _replaced_on_mysql(d))
        ]
    assert diff == []
    if mysql:
        # The partial indexes' replacements (see MYSQL_INDEX_COLUMNS), as created.
        found = {
            index["name"]: index["column_names"]
            for table in ("routines", "routine_runs")
            for index in inspector.get_indexes(table)
        }
        for name, columns in MYSQL_INDEX_COLUMNS.items():
            assert found.get(name) == columns, (name, found.get(name))
        # Names and keys compare byte for byte, as on PostgreSQL and SQLite.
        for table in ("routines", "routine_runs"):
            collation = binary_collation(store.engine.dialect)
            assert inspector.get_table_options(table)["mysql_collate"] == collation


def _replaced_on_mysql(difference: object) -> bool:
    return (
        isinstance(difference, tuple)
        and difference[0] in ("add_index", "remove_index")
        and difference[1].name in MYSQL_INDEX_COLUMNS
    )


def test_migrate_twice_is_a_no_op(store: Store) -> None:
    add_routine(store, "kept")
    store.migrate()
    assert store.routines.by_name("kept") is not None


def test_instants_round_trip_in_utc_across_a_fold(store: Store) -> None:
    # 02:30 CEST and 02:30 CET on 2026-10-25 are an hour apart; SQLite would
    # collapse them if offsets were stored as text.
    first = datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    second = datetime(2026, 10, 25, 1, 30, tzinfo=UTC)
    a = add_routine(store, "a")
    b = add_routine(store, "b")
    store.routines.adopt([Advance(a, first), Advance(b, second)], T0)
    assert store.routines.by_id(a).next_run_at == first
    assert store.routines.by_id(b).next_run_at == second
    assert store.routines.by_id(b).next_run_at.tzinfo is UTC
    claimed = store.routines.claim_due(first, "beat-1", 60, 10)
    assert [r.name for r in claimed] == ["a"]


def test_the_unique_window_key_lets_one_insert_win(store: Store) -> None:
    rid = add_routine(store, "nightly")
    first = new_run(rid, "nightly@2026-03-29T03:30:00+02:00")
    second = new_run(rid, "nightly@2026-03-29T03:30:00+02:00")
    assert store.runs.insert_new([first], T0) == {first.id}
    assert store.runs.insert_new([second], T0) == set()
    retry = new_run(rid, "nightly@2026-03-29T03:30:00+02:00", attempt=2)
    assert store.runs.insert_new([retry], T0) == {retry.id}
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM routine_runs")).scalar_one() == 2


def test_a_takeover_of_thousands_of_windows_finds_them_all(store: Store) -> None:
    """A beat taking over a thousand routines, 25 catch-up windows each, looks them
    up in one call; PostgreSQL refuses one row-value IN list that long."""
    rid = add_routine(store, "poll")
    runs = [new_run(rid, f"poll@{k}") for k in range(25_000)]
    store.runs.insert_new(runs, T0)
    wanted = [(rid, run.idempotency_key, 1) for run in runs] + [(rid, "poll@missing", 1)]
    found = store.runs.find_windows(wanted)
    assert sorted(r.id for r in found) == sorted(run.id for run in runs)


def test_every_field_of_a_new_run_is_stored_as_written(store: Store) -> None:
    """Both insert paths (PostgreSQL's unnest, SQLite's executemany) write
    every NewRun field, a skipped summary's included."""
    rid = add_routine(store, "nightly")
    run = NewRun(
        id=str(uuid.uuid4()),
        routine_id=rid,
        idempotency_key="nightly@2026-03-29T03:30:00+02:00",
        attempt=3,
        scheduled_for=T0,
        state="skipped",
        reason="catch_up",
        skipped_count=7,
        skipped_first=T0 - timedelta(hours=7),
        skipped_last=T0 - timedelta(hours=1),
        deadline_at=T0 + timedelta(hours=1),
    )
    assert store.runs.insert_new([run], T0 + timedelta(seconds=1)) == {run.id}
    stored = store.runs.get(run.id)
    assert stored is not None
    for field in NewRun.__dataclass_fields__:
        assert getattr(stored, field) == getattr(run, field), field
    assert stored.created_at == T0 + timedelta(seconds=1)


def test_a_claim_excludes_other_beats_until_its_ttl_expires(store: Store) -> None:
    rid = add_routine(store, "r")
    store.routines.adopt([Advance(rid, T0)], T0)
    assert [r.id for r in store.routines.claim_due(T0, "beat-1", 60, 10)] == [rid]
    assert store.routines.claim_due(T0, "beat-2", 60, 10) == []
    later = T0 + timedelta(seconds=59)
    assert store.routines.claim_due(later, "beat-2", 60, 10) == []
    expired = T0 + timedelta(seconds=61)
    assert [r.locked_by for r in store.routines.claim_due(expired, "beat-2", 60, 10)] == ["beat-2"]
    # The beat whose claim expired can no longer advance the routine.
    assert store.routines.advance([Advance(rid, T0 + timedelta(minutes=1))], "beat-1", T0) == 0
    assert store.routines.advance([Advance(rid, T0 + timedelta(minutes=1))], "beat-2", T0) == 1
    record = store.routines.by_id(rid)
    assert record.next_run_at == T0 + timedelta(minutes=1)
    assert record.locked_by is None


def test_a_claimed_row_reads_like_the_same_row_read_through_its_column_types(
    store: Store,
) -> None:
    """PostgreSQL runs the claim through the driver (store/compiled.py): its
    instants are bound and read as naive UTC by our code, not the column type."""
    rid = add_routine(
        store,
        "claimed",
        args="[1]",
        ceiling='[{"limit": 3, "per": "day", "unit": "fires"}]',
        suspended_until=datetime(2026, 10, 25, 1, 30),
        starts_at=datetime(2026, 10, 24, 23, 0),
        ends_at=datetime(2027, 1, 1),
        max_lateness=12.5,
    )
    store.routines.adopt([Advance(rid, T0)], T0)
    [claimed] = store.routines.claim_due(T0, "beat-1", 60, 10)
    stored = store.routines.by_id(rid)
    assert claimed == stored
    assert claimed.locked_until == T0 + timedelta(seconds=60)
    assert claimed.next_run_at == T0 and claimed.next_run_at.tzinfo is UTC
    assert claimed.suspended_until == datetime(2026, 10, 25, 1, 30, tzinfo=UTC)
    assert claimed.starts_at == datetime(2026, 10, 24, 23, 0, tzinfo=UTC)


def test_due_rows_come_oldest_first_and_at_most_the_batch(store: Store) -> None:
    ids = [add_routine(store, f"r{i}") for i in range(5)]
    store.routines.adopt([Advance(rid, T0 - timedelta(minutes=i)) for i, rid in enumerate(ids)], T0)
    claimed = store.routines.claim_due(T0, "beat", 60, 3)
    assert [r.name for r in claimed] == ["r4", "r3", "r2"]


def test_paused_disabled_and_future_rows_are_not_due(store: Store) -> None:
    due = add_routine(store, "due")
    paused = add_routine(store, "paused", paused=True)
    disabled = add_routine(store, "disabled", enabled=False)
    future = add_routine(store, "future")
    store.routines.adopt(
        [
            Advance(due, T0),
            Advance(paused, T0),
            Advance(disabled, T0),
            Advance(future, T0 + timedelta(seconds=1)),
        ],
        T0,
    )
    assert [r.name for r in store.routines.claim_due(T0, "beat", 60, 10)] == ["due"]


def test_adoption_is_conditional_on_the_row_still_being_unscheduled(store: Store) -> None:
    rid = add_routine(store, "sql-row")
    assert [r.name for r in store.routines.unscheduled(10)] == ["sql-row"]
    assert store.routines.adopt([Advance(rid, T0)], T0) == 1
    assert store.routines.adopt([Advance(rid, T0 + timedelta(hours=1))], T0) == 0
    assert store.routines.by_id(rid).next_run_at == T0
    assert store.routines.unscheduled(10) == []


def test_the_probe_wakes_for_the_next_window_or_another_beats_claim_expiry(store: Store) -> None:
    assert store.probe(T0, "this-beat").routine is None
    a = add_routine(store, "a")
    b = add_routine(store, "b")
    store.routines.adopt([Advance(a, T0 + timedelta(minutes=5)), Advance(b, T0)], T0)
    store.routines.claim_due(T0, "other-beat", 30, 10)
    assert store.probe(T0, "this-beat").routine == T0 + timedelta(seconds=30)
    store.routines.advance([Advance(b, T0 + timedelta(minutes=10))], "other-beat", T0)
    assert store.probe(T0, "this-beat").routine == T0 + timedelta(minutes=5)


def test_upsert_keeps_runtime_state_and_resets_a_changed_schedule(store: Store) -> None:
    definition = {
        "name": "poll",
        "task": "t.poll",
        "cron": None,
        "interval_seconds": 60.0,
        "timezone": None,
    }
    store.routines.upsert_definitions([definition], T0)
    rid = store.routines.by_name("poll").id
    store.routines.adopt([Advance(rid, T0 + timedelta(minutes=1))], T0)
    store.routines.upsert_definitions([{**definition, "task": "t.poll2"}], T0)
    record = store.routines.by_name("poll")
    assert (record.task, record.next_run_at) == ("t.poll2", T0 + timedelta(minutes=1))
    store.routines.upsert_definitions([{**definition, "interval_seconds": 30.0}], T0)
    assert store.routines.by_name("poll").next_run_at is None


def test_code_taking_over_ends_only_the_pause_an_import_made(store: Store) -> None:
    """``import --disabled`` pauses with its own reason; the code declaring
    the routine ends that pause, never an operator's (with a reason or not)."""
    for name, reason in [("imported", IMPORT_PAUSE_REASON), ("by-hand", "vendor down")]:
        add_routine(store, name, source="import", paused=True, paused_reason=reason)
    add_routine(store, "silent", source="import", paused=True)
    definitions = [
        {"name": n, "task": "t.x", "cron": "*/5 * * * *", "interval_seconds": None}
        for n in ("imported", "by-hand", "silent")
    ]
    declared = store.routines.upsert_definitions(definitions, T0, owner="proj")
    assert declared.resumed == ["imported"]
    stored = {r.name: r for r in store.routines.all()}
    assert {n: (r.source, r.paused, r.paused_reason) for n, r in stored.items()} == {
        "imported": ("code", False, None),
        "by-hand": ("code", True, "vendor down"),
        "silent": ("code", True, None),
    }
    # Declared again: nothing more to resume.
    assert store.routines.upsert_definitions(definitions, T0, owner="proj").resumed == []


def test_worker_claim_of_a_run_succeeds_once(store: Store) -> None:
    rid = add_routine(store, "r")
    run = new_run(rid, "r@2026-10-25T02:00:00+02:00")
    store.runs.insert_new([run], T0)
    store.runs.mark_sent([run.id], T0)
    assert store.outcomes.claim_start(run.id, "w1", T0) is True
    assert store.outcomes.claim_start(run.id, "w2", T0) is False
    assert store.outcomes.succeed(run.id, T0, spend={"fires": 1}).done is True
    assert store.outcomes.claim_start(run.id, "w3", T0) is False
    stored = store.runs.get(run.id)
    assert (stored.state, stored.worker, stored.spend) == ("succeeded", "w1", '{"fires": 1}')


def test_the_head_revision_constant_names_the_newest_shipped_script() -> None:
    # Beat skips importing Alembic when the schema is at HEAD_REVISION.
    assert migrate.head_revision() == migrate.HEAD_REVISION


def test_a_first_migration_logs_one_line_per_revision_and_no_alembic_chatter(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store.from_url(database_url)
    try:
        with caplog.at_level(logging.DEBUG):
            store.migrate()
    finally:
        store.dispose()
    chatter = [r.getMessage() for r in caplog.records if r.name.startswith("alembic")]
    assert chatter == []
    ours = [r.getMessage() for r in caplog.records if r.name == "celery_routines.store"]
    assert [line.split(" (")[0] for line in ours] == [
        "celery-routines schema: applied migration 0001_initial",
        "celery-routines schema: applied migration 0002_run_lifecycle",
        "celery-routines schema: applied migration 0003_run_listing_indexes",
        "celery-routines schema: applied migration 0004_lifecycle",
        "celery-routines schema: applied migration 0005_schedule_types",
        "celery-routines schema: applied migration 0006_run_timeout",
        "celery-routines schema: applied migration 0007_i31_pause_after_failures",
        "celery-routines schema: applied migration 0007_i34_calendars",
        "celery-routines schema: applied migration 0008_i31_notify_url",
        "celery-routines schema: applied migration 0009_i33_beats",
    ]
    assert ours[-1].startswith(f"celery-routines schema: applied migration {migrate.HEAD_REVISION}")
    assert logging.getLogger("alembic").level == logging.NOTSET  # left as it was


# -- the URL the user guide shows (issue 17) -------------------------------------


def test_a_bare_postgresql_url_means_psycopg_3_whatever_sqlalchemy_defaults_to() -> None:
    bare = make_url("postgresql://app:pw@db/app")
    # SQLAlchemy 2.0 maps the bare scheme to psycopg2; the postgres extra
    # installs psycopg 3 only.
    only_psycopg3 = postgres_driver(bare, importable=lambda module: module == "psycopg")
    assert only_psycopg3.drivername == "postgresql+psycopg"
    assert only_psycopg3.render_as_string(hide_password=False) == (
        "postgresql+psycopg://app:pw@db/app"
    )
    # Only psycopg2 installed: SQLAlchemy's own choice stands.
    only_psycopg2 = postgres_driver(bare, importable=lambda module: module == "psycopg2")
    assert only_psycopg2.drivername == "postgresql"
    # A URL that names its driver is left alone.
    named = make_url("postgresql+psycopg2://app@db/app")
    assert postgres_driver(named, importable=lambda module: True) is named


@pytest.mark.postgres
@pytest.mark.parametrize("scheme", ["postgresql", "postgresql+psycopg"])
def test_both_postgres_url_forms_work_with_the_postgres_extra(
    postgres_url: str, scheme: str
) -> None:
    url = f"{scheme}://{postgres_url.split('://', 1)[1]}"
    store = Store.from_url(url)
    try:
        store.migrate()
        assert store.engine.dialect.driver == "psycopg"
        assert store.routines.all() == []
    finally:
        store.dispose()
