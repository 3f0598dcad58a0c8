"""The beats' heartbeat rows (issue 33, item 4), on every supported database:
one upsert per heartbeat, the database's clock and the claims counted by that
statement, the listing of the last hour, pruning."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import event, update

from celery_routines.store import Store
from celery_routines.store.beats import BeatPulse
from celery_routines.store.models import ROUTINES
from tests.harness import insert_routine


def pulse(beat_id: str = "host-a:101:abcd", **changes: Any) -> BeatPulse:
    values: dict[str, Any] = {
        "beat_id": beat_id,
        "host": "host-a",
        "pid": 101,
        "started_at": datetime(2026, 12, 1, 8, 0, tzinfo=UTC),
        "tick_p50_ms": 1.5,
        "tick_p99_ms": 12.25,
        "ticks_measured": 40,
        "publish_processes": 2,
        "version": "0.1.0",
        "stale_after_seconds": 30.0,
        **changes,
    }
    return BeatPulse(**values)


def two_beats(store: Store) -> None:
    """A live beat on host-a, and one on host-b silent for 45 s (over its 30 s)."""
    now = datetime.now(UTC)
    store.beats.beat(pulse("host-a:101:live"), now)
    store.beats.beat(pulse("host-b:202:dead", host="host-b", pid=202), now)
    table = store.beats.table
    with store.engine.begin() as conn:
        conn.execute(
            update(table)
            .where(table.c.beat_id == "host-b:202:dead")
            .values(
                last_tick_at=now - timedelta(seconds=45), beat_clock_at=now - timedelta(seconds=45)
            )
        )


def statements_of(store: Store, call: Any) -> list[str]:
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        call()
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    verbs = [s.split(None, 1)[0].upper() for s in seen]
    return [verb for verb in verbs if verb not in ("BEGIN", "COMMIT")]


def test_a_heartbeat_is_one_upsert_that_inserts_then_updates_one_row(store: Store) -> None:
    beat_clock = datetime.now(UTC)
    assert statements_of(store, lambda: store.beats.beat(pulse(), beat_clock)) == ["INSERT"]
    later = pulse(tick_p50_ms=2.0, tick_p99_ms=20.0, ticks_measured=41, publish_processes=0)
    assert statements_of(store, lambda: store.beats.beat(later, beat_clock)) == ["INSERT"]
    [row] = store.beats.recent()
    assert (row.beat_id, row.host, row.pid) == ("host-a:101:abcd", "host-a", 101)
    assert row.started_at == datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    assert (row.tick_p50_ms, row.tick_p99_ms, row.ticks_measured) == (2.0, 20.0, 41)
    assert (row.publish_processes, row.version, row.stale_after_seconds) == (0, "0.1.0", 30.0)
    # Stamped with the database's clock (the process clock on SQLite).
    assert abs(row.last_tick_at - datetime.now(UTC)) < timedelta(seconds=5)
    assert row.seconds_since_tick < 5
    assert row.stale is False


def test_the_clock_skew_is_the_beats_clock_minus_the_databases_in_that_statement(
    store: Store,
) -> None:
    store.beats.beat(pulse(), datetime.now(UTC) + timedelta(minutes=3))
    [row] = store.beats.recent()
    assert abs(row.clock_skew_seconds - 180) < 2, row.clock_skew_seconds


def test_the_upsert_counts_the_live_claims_this_beat_holds_on_due_routines(
    store: Store,
) -> None:
    now = datetime.now(UTC)
    table = ROUTINES
    claims = {
        "held-1": ("host-a:101:abcd", now + timedelta(minutes=1)),
        "held-2": ("host-a:101:abcd", now + timedelta(minutes=1)),
        "expired": ("host-a:101:abcd", now - timedelta(minutes=1)),
        "other-beat": ("host-b:202:ef01", now + timedelta(minutes=1)),
    }
    for name, (holder, until) in claims.items():
        insert_routine(store, name, interval_seconds=60)
        with store.engine.begin() as conn:
            conn.execute(
                update(table)
                .where(table.c.name == name)
                .values(
                    next_run_at=now - timedelta(seconds=5), locked_by=holder, locked_until=until
                )
            )
    store.beats.beat(pulse(), now)
    [row] = store.beats.recent()
    assert row.claims_held == 2


def test_a_beat_silent_past_its_threshold_is_stale_with_how_long_ago_it_ticked(
    store: Store,
) -> None:
    store.beats.beat(pulse(stale_after_seconds=30.0), datetime.now(UTC))
    [row] = store.beats.recent()
    # The panel asked 29 s, then 45 s after that tick (an injected clock).
    [soon] = store.beats.recent(now=row.last_tick_at + timedelta(seconds=29))
    assert (soon.stale, soon.seconds_since_tick) == (False, 29.0)
    [late] = store.beats.recent(now=row.last_tick_at + timedelta(seconds=45))
    assert (late.stale, late.seconds_since_tick) == (True, 45.0)
    # Beyond the hour it is no longer listed.
    assert store.beats.recent(now=row.last_tick_at + timedelta(hours=1, seconds=1)) == []


def test_rows_of_beats_gone_for_a_day_are_pruned_and_live_ones_kept(store: Store) -> None:
    now = datetime.now(UTC)
    store.beats.beat(pulse("gone:1:aaaa"), now)
    store.beats.beat(pulse("live:2:bbbb"), now)
    table = store.beats.table
    with store.engine.begin() as conn:
        conn.execute(
            update(table)
            .where(table.c.beat_id == "gone:1:aaaa")
            .values(last_tick_at=now - timedelta(days=1, minutes=1))
        )
    assert store.beats.prune(now - timedelta(days=1)) == 1
    assert [row.beat_id for row in store.beats.recent()] == ["live:2:bbbb"]
