"""The beat tick against real databases, with an injected clock."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from celery_routines import Scheduler, register
from celery_routines.sending.publish import Publisher
from celery_routines.store import Store
from celery_routines.store.dialects import is_mysql
from tests.conftest import FakeClock
from tests.harness import filesystem_app, insert_routine, published, runs_for


@pytest.fixture
def broker_folder(tmp_path: Path) -> Path:
    return tmp_path / "broker"


def make_scheduler(broker_folder: Path, database_url: str, clock: FakeClock, **conf) -> Scheduler:
    return Scheduler(filesystem_app(broker_folder, database_url, **conf), clock=clock)


def states(store: Store, name: str) -> list[tuple[str, str]]:
    record = store.routines.by_name(name)
    return [(r.idempotency_key, r.state) for r in reversed(runs_for(store, record.id))]


def test_a_declared_routine_fires_each_window_once_with_the_run_id_as_task_id(
    database_url: str, broker_folder: Path, clock: FakeClock
) -> None:
    register("tasks.report", "*/5 * * * *", name="report", timezone="Europe/Rome")
    scheduler = make_scheduler(broker_folder, database_url, clock)
    try:
        scheduler.tick()  # adopts: first window 12:05 UTC
        assert published(broker_folder) == []
        clock.advance(minutes=5)
        scheduler.tick()
        scheduler.tick()  # a second tick at the same instant sends nothing more
        messages = published(broker_folder)
        assert [m["task"] for m in messages] == ["tasks.report"]
        assert messages[0]["routine"] == "report"
        assert messages[0]["routine_window"] == "report@2026-11-30T13:05:00+01:00"
        store = scheduler.store
        run = store.runs.get(messages[0]["id"])
        assert run is not None and run.state == "sent"
        assert run.scheduled_for == datetime(2026, 11, 30, 12, 5, tzinfo=UTC)
        assert store.routines.by_name("report").next_run_at == datetime(
            2026, 11, 30, 12, 10, tzinfo=UTC
        )
    finally:
        scheduler.close()


def test_due_is_a_query_so_a_late_tick_finds_what_fell_due(
    database_url: str, broker_folder: Path, clock: FakeClock
) -> None:
    register("tasks.poll", timedelta(minutes=1), name="poll")
    scheduler = make_scheduler(broker_folder, database_url, clock)
    try:
        scheduler.tick()
        # Beat was away for 90 seconds; the 12:01 window did not "match the
        # current minute" when it looked, but it is due, and it goes out.
        clock.advance(seconds=90)
        scheduler.tick()
        # (Message files of one instant come back in no particular order.)
        assert sorted(m["routine_window"] for m in published(broker_folder)) == [
            "poll@2026-11-30T12:01:00+00:00"
        ]
    finally:
        scheduler.close()


def test_a_routine_inserted_by_sql_is_adopted_and_fires_without_a_restart(
    database_url: str, broker_folder: Path, clock: FakeClock
) -> None:
    scheduler = make_scheduler(broker_folder, database_url, clock)
    try:
        scheduler.tick()
        insert_routine(scheduler.store, "from-sql", cron="* * * * *", enabled=True)
        clock.advance(seconds=1)
        scheduler.tick()
        assert scheduler.store.routines.by_name("from-sql").next_run_at == datetime(
            2026, 11, 30, 12, 1, tzinfo=UTC
        )
        clock.advance(minutes=1)
        scheduler.tick()
        assert [m["routine"] for m in published(broker_folder)] == ["from-sql"]
    finally:
        scheduler.close()


def test_an_invalid_sql_row_gets_last_error_is_retried_once_a_minute_and_blocks_nothing(
    database_url: str, broker_folder: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    # No worker: overlap="overlap" so every window is sent although runs stay open.
    register("tasks.ok", timedelta(seconds=30), name="healthy", overlap="overlap")
    scheduler = make_scheduler(broker_folder, database_url, clock)
    try:
        store = scheduler.store
        insert_routine(store, "broken", cron="61 * * * *")
        insert_routine(store, "nowhere", cron="0 3 * * *", timezone="Mars/Olympus_Mons")
        with caplog.at_level(logging.ERROR, logger="celery_routines.beat"):
            for _ in range(5 * 6):  # five minutes of ticks every 10 s
                scheduler.tick()
                clock.advance(seconds=10)
        broken = store.routines.by_name("broken")
        assert "broken" in broken.last_error and "61 * * * *" in broken.last_error
        nowhere = store.routines.by_name("nowhere")
        assert "Mars/Olympus_Mons" in nowhere.last_error
        complaints = [r for r in caplog.records if "'broken'" in r.getMessage()]
        assert 4 <= len(complaints) <= 6  # once a minute, not once a tick
        assert (
            len([m for m in published(broker_folder) if m["routine"] == "healthy"]) == 9
        )  # 12:00:30 .. 12:04:30
        # Fixed by the operator: it resumes from now, with no burst.
        with store.engine.begin() as conn:
            conn.execute(text("UPDATE routines SET cron = '*/5 * * * *' WHERE name = 'broken'"))
        for _ in range(7):
            clock.advance(seconds=10)
            scheduler.tick()
        fixed = store.routines.by_name("broken")
        assert fixed.last_error is None
        assert fixed.next_run_at > clock.now
    finally:
        scheduler.close()


def test_an_invalid_cron_in_code_is_refused_at_declaration_naming_routine_and_value() -> None:
    from celery_routines import InvalidRoutine

    with pytest.raises(InvalidRoutine) as excinfo:
        register("tasks.nightly", "30 25 * * *", name="nightly")
    assert "nightly" in str(excinfo.value) and "30 25 * * *" in str(excinfo.value)


def test_a_failed_send_is_recorded_and_the_schedule_still_advances(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    register("tasks.poll", timedelta(minutes=1), name="poll")
    app = filesystem_app(tmp_path / "broker", database_url)
    # A broker that cannot be reached: the send fails fast.
    app.conf.broker_url = "redis://127.0.0.1:1/0"
    app.conf.broker_connection_retry = False
    app.conf.broker_connection_max_retries = 0
    scheduler = Scheduler(app, clock=clock)
    try:
        scheduler.tick()
        clock.advance(minutes=1)
        scheduler.tick()
        store = scheduler.store
        record = store.routines.by_name("poll")
        assert record.next_run_at == datetime(2026, 11, 30, 12, 2, tzinfo=UTC)
        [run] = runs_for(store, record.id)
        # Failed with the broker's error, and retried a minute later (issue #3).
        assert run.state == "retrying" and run.reason == "send_failed" and run.error
        assert run.retry_at == datetime(2026, 11, 30, 12, 2, tzinfo=UTC)
    finally:
        scheduler.close()


def test_downtime_recovery_writes_one_summary_row_not_one_per_window(
    database_url: str, broker_folder: Path, clock: FakeClock
) -> None:
    register("tasks.poll", "*/5 * * * *", name="poll", catch_up_cap=3, overlap="overlap")
    scheduler = make_scheduler(broker_folder, database_url, clock)
    try:
        scheduler.tick()  # first window 12:05
        clock.advance(hours=1, minutes=2)  # 13:02: 12 windows missed (12:05 .. 13:00)
        scheduler.tick()
        sent = sorted(m["routine_window"] for m in published(broker_folder))
        assert sent == [
            "poll@2026-11-30T12:50:00+00:00",
            "poll@2026-11-30T12:55:00+00:00",
            "poll@2026-11-30T13:00:00+00:00",
        ]
        record = scheduler.store.routines.by_name("poll")
        skipped = [r for r in runs_for(scheduler.store, record.id) if r.state == "skipped"]
        assert [(r.reason, r.skipped_count) for r in skipped] == [("catch_up_cap", 9)]
        assert record.next_run_at == datetime(2026, 11, 30, 13, 5, tzinfo=UTC)
    finally:
        scheduler.close()


@pytest.mark.parametrize(
    ("overlap", "sent", "skipped"),
    [
        ("skip", ["13:00"], [("catch_up_cap", 9), ("latest", 2)]),
        ("queue", ["12:50"], [("catch_up_cap", 9)]),
        ("replace", ["13:00"], [("catch_up_cap", 9), ("replaced", 2)]),
        ("overlap", ["12:50", "12:55", "13:00"], [("catch_up_cap", 9)]),
    ],
)
def test_a_recovery_sends_what_its_overlap_policy_allows_at_once(
    overlap: str,
    sent: list[str],
    skipped: list[tuple[str, int]],
    database_url: str,
    broker_folder: Path,
    clock: FakeClock,
) -> None:
    register("tasks.poll", "*/5 * * * *", name="poll", catch_up_cap=3, overlap=overlap)
    scheduler = make_scheduler(broker_folder, database_url, clock)
    try:
        scheduler.tick()  # first window 12:05
        clock.advance(hours=1, minutes=2)  # 13:02: 12 windows missed, the newest 3 replayed
        scheduler.tick()
        scheduler.tick()  # no worker: what went out is still open
        windows = sorted(m["routine_window"] for m in published(broker_folder))
        assert windows == [f"poll@2026-11-30T{hhmm}:00+00:00" for hhmm in sent]
        record = scheduler.store.routines.by_name("poll")
        rows = runs_for(scheduler.store, record.id)
        skips = sorted(
            ((r.reason, r.skipped_count) for r in rows if r.state == "skipped"),
            key=lambda s: s[0] != "catch_up_cap",
        )
        assert skips == skipped
        # queue: the other two replayed windows stay due, behind the open run.
        due = (12, 55) if overlap == "queue" else (13, 5)
        assert record.next_run_at == datetime(2026, 11, 30, *due, tzinfo=UTC)
    finally:
        scheduler.close()


def test_a_large_catch_up_goes_out_over_ticks_beside_another_routines_window(
    database_url: str, broker_folder: Path, clock: FakeClock
) -> None:
    # 13 windows to replay, at most 5 a tick; "live" falls due meanwhile.
    register("tasks.poll", timedelta(minutes=1), name="backlog", overlap="overlap", catch_up_cap=50)
    register("tasks.poll", timedelta(minutes=14), name="live")
    scheduler = make_scheduler(broker_folder, database_url, clock, routines_catch_up_per_tick=5)

    def sent(prefix: str) -> list[str]:
        return sorted(
            m["routine_window"].split("T")[1][:5]
            for m in published(broker_folder)
            if m["routine_window"].startswith(prefix)
        )

    try:
        scheduler.tick()  # adopts both: first windows 12:01 and 12:14
        clock.advance(minutes=13)  # 12:13: 13 windows of backlog due
        scheduler.tick()
        assert sent("backlog@") == ["12:01", "12:02", "12:03", "12:04", "12:05"]
        record = scheduler.store.routines.by_name("backlog")
        assert record.next_run_at == datetime(2026, 11, 30, 12, 6, tzinfo=UTC)  # still due
        scheduler.tick()  # the next five
        assert len(sent("backlog@")) == 10
        clock.advance(minutes=1)  # 12:14: live falls due during the recovery
        scheduler.tick()
        assert sent("live@") == ["12:14"]  # in the first tick at which it was due
        assert sent("backlog@") == [f"12:{m:02d}" for m in range(1, 15)]
        assert not [r for r in runs_for(scheduler.store, record.id) if r.state == "skipped"]
    finally:
        scheduler.close()


def test_tick_sleeps_until_the_next_due_instant_capped_by_max_interval(
    database_url: str, broker_folder: Path, clock: FakeClock
) -> None:
    register("tasks.poll", timedelta(seconds=40), name="poll")
    scheduler = make_scheduler(
        broker_folder,
        database_url,
        clock,
        beat_max_loop_interval=30,
        routines_refresh_seconds=60,
    )
    try:
        assert scheduler.tick() == pytest.approx(30)  # next window 40 s away, capped
        clock.advance(seconds=25)
        assert scheduler.tick() == pytest.approx(15, abs=0.01)
    finally:
        scheduler.close()


def test_an_idle_beat_sleeps_no_longer_than_routines_refresh_seconds(
    database_url: str, broker_folder: Path, clock: FakeClock
) -> None:
    # A change made outside the code is seen within routines_refresh_seconds,
    # not beat_max_loop_interval (300 s) later.
    register("tasks.poll", timedelta(hours=1), name="poll")
    scheduler = make_scheduler(broker_folder, database_url, clock)
    try:
        assert scheduler.tick() == pytest.approx(5)
    finally:
        scheduler.close()


def test_a_pending_row_orphaned_by_a_dead_beat_is_sent_by_the_next(
    database_url: str, broker_folder: Path, clock: FakeClock
) -> None:
    register("tasks.poll", timedelta(minutes=1), name="poll")
    first = make_scheduler(broker_folder, database_url, clock, routines_lock_ttl=30)
    second = make_scheduler(broker_folder, database_url, clock, routines_lock_ttl=30)
    try:
        first.tick()
        clock.advance(minutes=1)
        store = first.store
        # The first beat claims, writes the run row, and dies before sending.
        [record] = store.routines.claim_due(clock.now, first.holder, 30, 10)
        from celery_routines.store import NewRun

        orphan = NewRun(
            id="orphan-run",
            routine_id=record.id,
            idempotency_key="poll@2026-11-30T12:01:00+00:00",
            attempt=1,
            scheduled_for=record.next_run_at,
        )
        store.runs.insert_new([orphan], clock.now)
        second.tick()
        assert published(broker_folder) == []  # the claim is still alive
        clock.advance(seconds=31)
        second.tick()
        assert [m["id"] for m in published(broker_folder)] == ["orphan-run"]
        assert store.runs.get("orphan-run").state == "sent"
    finally:
        first.close()
        second.close()


def test_close_is_idempotent(database_url: str, broker_folder: Path, clock: FakeClock) -> None:
    scheduler = make_scheduler(broker_folder, database_url, clock)
    scheduler.close()
    scheduler.close()


def test_the_lazy_banner_instance_touches_no_database(tmp_path: Path, clock: FakeClock) -> None:
    url = f"sqlite:///{tmp_path / 'never.db'}"
    Scheduler(filesystem_app(tmp_path / "b", url), clock=clock, lazy=True)
    assert not (tmp_path / "never.db").exists()


def test_an_idle_tick_asks_the_database_one_question_and_a_due_one_transaction(
    database_url: str, broker_folder: Path, clock: FakeClock
) -> None:
    from sqlalchemy import event

    register("tasks.report", "*/5 * * * *", name="report")
    scheduler = make_scheduler(broker_folder, database_url, clock)
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:
        statements.append(statement.split(None, 1)[0].upper())

    try:
        scheduler.tick()  # adopts
        event.listen(scheduler.store.engine, "before_cursor_execute", record)
        scheduler.tick()  # nothing due
        # (SQLite's engine issues its own BEGIN IMMEDIATE, seen here too.)
        assert [s for s in statements if s not in ("BEGIN", "COMMIT")] == ["SELECT"]
        statements.clear()
        clock.advance(minutes=5)
        scheduler.tick()
        assert len(published(broker_folder)) == 1
        if scheduler.store.engine.dialect.name == "postgresql":
            # Probes autocommit; the one transaction is explicit. Marking the
            # run sent and advancing the routine are one atomic statement
            # after the message (a WITH of both UPDATEs): a failure writes
            # neither and the ledger replays both (issue 11, issue 19).
            assert statements == [
                "SELECT",
                "BEGIN", "WITH", "SELECT", "INSERT", "COMMIT",
                "WITH",
                "SELECT",
            ]  # fmt: skip
        elif is_mysql(scheduler.store.engine):
            # As on PostgreSQL, but MySQL has no RETURNING: the claim locks
            # then updates, and the rows written are read back.
            assert statements == [
                "SELECT",
                "BEGIN", "SELECT", "UPDATE", "SELECT", "INSERT", "SELECT", "COMMIT",
                "UPDATE", "UPDATE",
                "SELECT",
            ]  # fmt: skip
        else:
            # Probe; claim, overlap check, rows (one transaction); sent, then
            # advanced (a statement each); the next probe.
            assert [s for s in statements if s != "BEGIN"] == [
                "SELECT", "UPDATE", "SELECT", "INSERT", "UPDATE", "UPDATE", "SELECT"
            ]  # fmt: skip
    finally:
        event.remove(scheduler.store.engine, "before_cursor_execute", record)
        scheduler.close()


def test_a_run_is_published_only_after_its_row_is_committed(
    database_url: str, broker_folder: Path, clock: FakeClock
) -> None:
    """A worker claims a run from its row: the row must be visible to other
    connections before the message exists."""
    from sqlalchemy import create_engine

    register("tasks.report", "*/5 * * * *", name="report")
    scheduler = make_scheduler(broker_folder, database_url, clock)
    outside = create_engine(database_url)
    seen: list[list[str]] = []

    class CheckingPublisher(Publisher):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def publish_many(self, runs: Any) -> Any:
            with outside.connect() as conn:
                ids = {r.run_id for r in runs}
                states = conn.execute(text("SELECT id, state FROM routine_runs")).all()
                seen.append(sorted(state for run_id, state in states if run_id in ids))
            return self.inner.publish_many(runs)

        def publish(self, run: Any) -> None:
            self.inner.publish(run)

        def close(self) -> None:
            self.inner.close()

    try:
        scheduler.tick()  # adopts
        engine = scheduler.engine
        engine.sender.publisher = CheckingPublisher(engine.sender.publisher)
        clock.advance(minutes=5)
        scheduler.tick()
        assert len(published(broker_folder)) == 1
        assert seen == [["pending"]]
    finally:
        outside.dispose()
        scheduler.close()


def test_the_engine_built_directly_reads_decides_writes_then_sends(
    database_url: str, broker_folder: Path, clock: FakeClock
) -> None:
    """No Celery beat around it: a store, a publisher, a gate, settings and a clock."""
    from celery_routines.config import Settings
    from celery_routines.sending.gate import OpenGate
    from celery_routines.sending.publish import CeleryPublisher
    from celery_routines.store.models import ROUTINES
    from celery_routines.tick.engine import TickEngine

    store = Store.from_url(database_url)
    store.migrate()
    app = filesystem_app(broker_folder, database_url)
    publisher = CeleryPublisher(app)
    settings = Settings(database_url=database_url)
    engine = TickEngine(store, publisher, OpenGate(), settings, "beat-1", clock)
    try:
        insert_routine(store, "direct", cron="*/5 * * * *", catch_up_cap=2, overlap="overlap")
        first = engine.tick()
        assert first.adopted == 1 and first.next_wakeup == datetime(2026, 11, 30, 12, 5, tzinfo=UTC)
        clock.advance(minutes=21)  # 12:05 .. 12:20 due: four windows, cap 2
        report = engine.tick()
        assert (report.claimed, report.sent, report.skipped_windows) == (1, 2, 2)
        assert report.skipped_by_reason == {"catch_up_cap": 2}
        # (Message files of one instant come back in no particular order.)
        assert sorted(m["routine_window"] for m in published(broker_folder)) == [
            "direct@2026-11-30T12:15:00+00:00",
            "direct@2026-11-30T12:20:00+00:00",
        ]
        record = store.routines.by_name("direct")
        assert record.next_run_at == datetime(2026, 11, 30, 12, 25, tzinfo=UTC)
        assert record.locked_by is None
        assert sorted(r.state for r in runs_for(store, record.id)) == ["sent", "sent", "skipped"]
        assert ROUTINES.name == "routines"
    finally:
        publisher.close()
        store.dispose()


def test_each_skip_is_logged_once_with_its_windows_written_like_keys(
    database_url: str, broker_folder: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    # No worker: the first run stays open, so the next window is an overlap skip.
    register("tasks.slow", "* * * * *", name="app.slow", timezone="Europe/Rome")
    register("tasks.poll", "*/5 * * * *", name="poll", catch_up_cap=3, timezone="Europe/Rome")
    scheduler = make_scheduler(broker_folder, database_url, clock)
    try:
        scheduler.tick()  # adopts both
        clock.advance(minutes=1)
        scheduler.tick()  # app.slow 12:01 UTC is sent
        clock.advance(minutes=1)
        with caplog.at_level(logging.INFO, logger="celery_routines"):
            scheduler.tick()  # app.slow 12:02 UTC: its 12:01 run is still open
        overlap = [
            (r.levelname, r.getMessage()) for r in caplog.records if "skipped" in r.getMessage()
        ]
        # The routine's own policy at work: INFO, not a warning every other window.
        assert overlap == [
            (
                "INFO",
                "skipped app.slow@2026-11-30T13:02:00+01:00: overlap (previous run still open: "
                "app.slow@2026-11-30T13:01:00+01:00 (sent))",
            )
        ]
        caplog.clear()
        clock.advance(hours=1)  # 13:02 UTC: poll missed 12 windows, 9 over its cap
        with caplog.at_level(logging.INFO, logger="celery_routines"):
            scheduler.tick()
        recovery = [
            (r.levelname, r.getMessage()) for r in caplog.records if "of poll" in r.getMessage()
        ]
        # Windows dropped past the cap: something went wrong, WARNING.
        assert recovery == [
            (
                "WARNING",
                "skipped 9 windows of poll from 2026-11-30T13:05:00+01:00 "
                "to 2026-11-30T13:45:00+01:00: catch_up_cap",
            ),
            # The routine's own overlap policy within the recovery: INFO.
            (
                "INFO",
                "skipped 2 windows of poll from 2026-11-30T13:50:00+01:00 "
                "to 2026-11-30T13:55:00+01:00: latest (a recovery under overlap=skip sends "
                "only its newest window, poll@2026-11-30T14:00:00+01:00)",
            ),
        ]
    finally:
        scheduler.close()


@pytest.mark.parametrize("result_expires", [None, 3600])
def test_the_start_up_line_says_why_celery_backend_cleanup_is_there(
    sqlite_url: str,
    broker_folder: Path,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
    result_expires: int | None,
) -> None:
    register("tasks.report", "0 9 * * *", name="report")
    with caplog.at_level(logging.INFO, logger="celery_routines.beat"):
        scheduler = make_scheduler(broker_folder, sqlite_url, clock, result_expires=result_expires)
    try:
        names = {r.name for r in scheduler.store.routines.all()}
    finally:
        scheduler.close()
    [line] = [r.getMessage() for r in caplog.records if "celery-routines: wrote" in r.getMessage()]
    # Celery's own rule: its beat adds the clean-up when results expire and
    # the backend does not expire them by itself (no backend here: it does not).
    if result_expires:
        assert names == {"report", "celery.backend_cleanup"}
        assert line.startswith(
            "celery-routines: wrote 1 routine(s) declared in code and celery.backend_cleanup "
            f"to {sqlite_url} (celery.backend_cleanup is Celery's own: its beat adds it too, "
            "because result_expires is set"
        )
    else:
        assert names == {"report"}
        assert line == f"celery-routines: wrote 1 routine(s) declared in code to {sqlite_url}"


def test_a_tick_that_acts_defers_cyclic_collection_until_it_ends(
    database_url: str, broker_folder: Path, clock: FakeClock
) -> None:
    import gc

    # No worker: overlap="overlap" sends each window although the last is open.
    register("tasks.report", "*/5 * * * *", name="report", overlap="overlap")
    scheduler = make_scheduler(broker_folder, database_url, clock)
    seen: list[bool] = []
    publisher = scheduler.engine.publisher
    inner = publisher.publish_many

    def publish_many(runs):  # type: ignore[no-untyped-def]
        seen.append(gc.isenabled())
        return inner(runs)

    publisher.publish_many = publish_many  # type: ignore[method-assign]
    try:
        scheduler.tick()
        clock.advance(minutes=5)
        assert gc.isenabled()
        scheduler.tick()
        assert seen == [False]
        assert gc.isenabled()
        gc.disable()  # a host that turned collection off keeps it off
        try:
            clock.advance(minutes=5)
            scheduler.tick()
            assert not gc.isenabled()
        finally:
            gc.enable()
        assert len(published(broker_folder)) == 2
    finally:
        scheduler.close()


def test_a_tick_that_leaves_more_due_does_not_probe_again_before_the_next(
    tmp_path: Path, database_url: str, clock: FakeClock
) -> None:
    for n in range(3):
        register("tasks.report", "*/5 * * * *", name=f"report-{n}")
    folder = tmp_path / "broker"
    scheduler = Scheduler(filesystem_app(folder, database_url, routines_batch_size=2), clock=clock)
    store = scheduler.store
    probes: list[int] = []
    inner = store.probe

    def probe(*args, **kwargs):  # type: ignore[no-untyped-def]
        probes.append(1)
        return inner(*args, **kwargs)

    store.probe = probe  # type: ignore[method-assign]
    try:
        scheduler.tick()  # adopts two at a time (and Celery's backend_cleanup)
        scheduler.tick()
        clock.advance(minutes=5)
        probes.clear()
        assert scheduler.tick() == 0.0  # claims 2 of 3: more due, tick again at once
        assert scheduler.last_report.more_due and probes == [1]
        assert scheduler.tick() > 0  # the last one; then the next wake-up is probed
        assert not scheduler.last_report.more_due and probes == [1, 1, 1]
        assert scheduler.last_report.next_wakeup == clock.now + timedelta(minutes=5)
        assert len(published(folder)) == 3
    finally:
        scheduler.close()
