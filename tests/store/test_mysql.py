"""What only MySQL/MariaDB could get wrong, against the real server.

The rest of the store's guarantees run on MariaDB through the ``database_url``
fixture like on SQLite and PostgreSQL; these pin the MySQL family's own
traps: case-insensitive and padding collations, three-byte "utf8", whole
seconds, DDL that commits by itself, errors that INSERT IGNORE would hide.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, IntegrityError

from celery_routines.errors import ConfigurationError
from celery_routines.store import NewRun, Store, migrate
from celery_routines.store.engine import explain_database_error, make_engine
from celery_routines.store.models import NAME_MAX_LENGTH
from tests import services
from tests.store.test_store import add_routine

T0 = datetime(2026, 10, 25, 0, 30, 0, 123456, tzinfo=UTC)


@pytest.fixture
def mariadb(mariadb_url: str) -> Store:
    store = Store.from_url(mariadb_url)
    store.migrate()
    yield store
    store.dispose()


def run(routine_id: int, key: str, attempt: int = 1) -> NewRun:
    return NewRun(str(uuid.uuid4()), routine_id, key, attempt, T0)


def test_a_bare_mysql_url_uses_the_extras_driver_in_utf8mb4_utc_strict_read_committed(
    mariadb_url: str,
) -> None:
    bare = mariadb_url.replace("mysql+pymysql://", "mysql://")
    engine = make_engine(bare)
    try:
        assert engine.dialect.driver == "pymysql"
        with engine.connect() as conn:
            charset, zone, mode, isolation = conn.execute(
                text("SELECT @@character_set_connection, @@time_zone, @@sql_mode, @@tx_isolation")
            ).one()
        assert (charset, zone, isolation) == ("utf8mb4", "+00:00", "READ-COMMITTED")
        assert "STRICT_ALL_TABLES" in mode
    finally:
        engine.dispose()


def test_mariadb_urls_are_accepted_and_a_missing_driver_says_which_extra() -> None:
    make_engine("mariadb+pymysql://root@127.0.0.1:3306/x").dispose()
    with pytest.raises(ConfigurationError, match=r"celery-routines\[mysql\]"):
        make_engine("mysql+mysqlconnector://root@127.0.0.1:3306/x")


def test_names_compare_byte_for_byte_like_on_postgresql(mariadb: Store) -> None:
    # The server's default collation would make these one name (and "a" equal "a ").
    for name in ("Nightly", "nightly", "nightly "):
        add_routine(mariadb, name)
    assert mariadb.routines.by_name("nightly").name == "nightly"
    assert mariadb.routines.by_name("nightly ").name == "nightly "
    assert mariadb.routines.by_name("NIGHTLY") is None


def test_the_longest_name_fits_in_four_byte_characters_and_its_keys_are_unique(
    mariadb: Store,
) -> None:
    # 200 characters of four bytes each: 800 bytes in the unique name index,
    # and a key of name + "@" + instant in the window's unique key.
    name = "🌙" * NAME_MAX_LENGTH
    rid = add_routine(mariadb, name)
    assert mariadb.routines.by_id(rid).name == name
    key = f"{name}@2026-10-25T02:30:00+01:00"
    first, again = run(rid, key), run(rid, key)
    assert mariadb.runs.insert_new([first], T0) == {first.id}
    assert mariadb.runs.insert_new([again], T0) == set()
    with pytest.raises(DBAPIError, match="too long"):
        add_routine(mariadb, "x" * (NAME_MAX_LENGTH + 1))


def test_instants_keep_their_microseconds(mariadb: Store) -> None:
    rid = add_routine(mariadb, "precise")
    first = run(rid, "precise@1")
    mariadb.runs.insert_new([first], T0)
    assert mariadb.runs.get(first.id).scheduled_for == T0
    assert mariadb.runs.get(first.id).created_at == T0


def test_a_duplicate_window_is_refused_quietly_but_any_other_error_raises(
    mariadb: Store,
) -> None:
    rid = add_routine(mariadb, "strict")
    kept = run(rid, "strict@1")
    assert mariadb.runs.insert_new([kept], T0) == {kept.id}
    # Same window, another beat's id: not inserted, nothing raised.
    clash, fresh = run(rid, "strict@1"), run(rid, "strict@2")
    assert mariadb.runs.insert_new([clash, fresh], T0) == {fresh.id}
    # A routine that does not exist: INSERT IGNORE would have made this a warning.
    with pytest.raises(IntegrityError):
        mariadb.runs.insert_new([run(rid + 1000, "ghost@1")], T0)
    # A key too long for its column: an error, never a cut-down key that collides.
    with pytest.raises(DBAPIError, match="too long"):
        mariadb.runs.insert_new([run(rid, "k" * 501)], T0)
    assert mariadb.runs.get(kept.id).idempotency_key == "strict@1"


def test_three_beats_migrating_at_once_migrate_once(
    mysql_databases: services.MySQLDatabases,
) -> None:
    """DDL commits by itself on MySQL: only the GET_LOCK keeps the second
    process from creating the tables the first is creating."""
    url = mysql_databases.create()
    # Imports first, then all three migrate at the same instant.
    script = (
        "import sys, time; from celery_routines.store import Store; "
        "store = Store.from_url(sys.argv[1]); "
        "time.sleep(max(0, float(sys.argv[2]) - time.time())); store.migrate()"
    )
    at = str(time.time() + 6)
    starts = [
        subprocess.Popen([sys.executable, "-c", script, url, at], stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    try:
        for start in starts:
            _, err = start.communicate(timeout=120)
            assert start.returncode == 0, err.decode()
        store = Store.from_url(url)
        assert migrate.current_revision(store.engine) == migrate.HEAD_REVISION
        store.dispose()
    finally:
        mysql_databases.drop(url)


def test_a_claim_skips_rows_another_beat_has_locked(mariadb: Store) -> None:
    for i in range(4):
        rid = add_routine(mariadb, f"due-{i}")
        with mariadb.engine.begin() as conn:
            conn.execute(
                text("UPDATE routines SET next_run_at = :at WHERE id = :id"),
                {"at": (T0 - timedelta(minutes=i)).replace(tzinfo=None), "id": rid},
            )
    other = Store.from_url(mariadb.engine.url.render_as_string(hide_password=False))
    try:
        with other.transaction():
            # Another beat in the middle of its claim holds the two oldest rows.
            held = other.routines.claim_due(T0, "beat-b", 60, 2)
            assert {r.name for r in held} == {"due-3", "due-2"}
            mine = mariadb.routines.claim_due(T0, "beat-a", 60, 10)
            assert {r.name for r in mine} == {"due-1", "due-0"}
            assert all(r.locked_by == "beat-a" for r in mine)
    finally:
        other.dispose()


def test_mysql_errors_are_explained_in_one_line(mariadb_url: str) -> None:
    base = mariadb_url.rsplit("/", 1)[0]
    cases = {
        f"{base}/routines_never_created": "CREATE DATABASE routines_never_created",
        base.replace("root@", "nobody:pw@") + "/mysql": "refused the login",
        "mysql+pymysql://root@127.0.0.1:1/x": "cannot connect to the database server at",
    }
    for url, expected in cases.items():
        engine = make_engine(url)
        try:
            with pytest.raises(DBAPIError) as caught, engine.connect():
                pass
        finally:
            engine.dispose()
        line = explain_database_error(caught.value, url)
        assert expected in line, line
        assert ":pw@" not in line


def test_the_idle_probe_reads_a_few_index_entries_not_every_routine(mariadb: Store) -> None:
    """MySQL computes MIN() under conditions on other columns by reading
    every row; the probe's earliest window is the first entry of the due
    index that passes them instead. ANALYZE runs the probe and counts rows."""
    stored = 20_000
    start = T0.replace(tzinfo=None) + timedelta(days=1)
    with mariadb.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO routines (name, task, interval_seconds, next_run_at, paused)"
                " VALUES (:n, 't', 60, :at, :paused)"
            ),
            [
                {"n": f"r{i}", "at": start + timedelta(seconds=i), "paused": i % 10 == 0}
                for i in range(stored)
            ],
        )
        conn.execute(text("ANALYZE TABLE routines"))
    compiled = mariadb._probe.compile(mariadb.engine)
    params = {
        k: v.replace(tzinfo=None) if isinstance(v, datetime) else v
        for k, v in compiled.construct_params({"now": T0, "arb": T0, "holder": "beat-a"}).items()
    }
    with mariadb.engine.connect() as conn:
        plan = json.loads(
            conn.exec_driver_sql("ANALYZE FORMAT=JSON " + str(compiled), params).scalar()
        )
    read = [step.get("r_rows", 0) for step in _tables(plan) if step["table_name"] == "routines"]
    assert read and max(read) <= 10, read  # not 20,000
    assert mariadb.probe(T0, "beat-a").window == start.replace(tzinfo=UTC) + timedelta(seconds=1)


def _tables(plan: object) -> list[dict[str, Any]]:
    """Every table access in MariaDB's JSON plan, however deeply nested."""
    found: list[dict[str, Any]] = []
    if isinstance(plan, dict):
        if "table_name" in plan:
            found.append(plan)
        for value in plan.values():
            found.extend(_tables(value))
    elif isinstance(plan, list):
        for value in plan:
            found.extend(_tables(value))
    return found
