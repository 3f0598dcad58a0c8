"""Prometheus metrics served by beat: scraped over HTTP from a Scheduler driven
by an injected clock (filesystem broker, SQLite and PostgreSQL)."""

from __future__ import annotations

import logging
import re
import sys
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery

from celery_routines import Scheduler, register
from celery_routines.errors import ConfigurationError
from celery_routines.observe.metrics import RoutineMetrics, metrics_port
from celery_routines.sending.publish import OutgoingRun
from celery_routines.tick.report import TickReport
from tests.conftest import FakeClock
from tests.harness import filesystem_app, insert_routine, published
from tests.services import services_required

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # CI (ROUTINES_REQUIRE_SERVICES=1) fails instead of skipping
    if services_required():
        raise
    pytest.skip(
        "prometheus-client is not installed (pip install 'celery-routines[metrics]')",
        allow_module_level=True,
    )

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
        body = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def serving_scheduler(folder: Path, database_url: str, clock: FakeClock, **conf) -> Scheduler:
    app = filesystem_app(
        folder,
        database_url,
        routines_metrics_port=0,  # a free port, read back from scheduler.metrics.port
        routines_metrics_address="127.0.0.1",
        **conf,
    )
    return Scheduler(app, clock=clock)


def test_scraped_metrics_count_sends_skips_by_reason_lateness_ticks_and_suspended(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    register("tasks.every", timedelta(minutes=1), name="every", overlap="overlap")
    # No worker runs here: its 12:01 run stays open, so 12:02 is an overlap skip.
    register("tasks.polled", timedelta(minutes=1), name="polled", overlap="skip")
    register("tasks.strict", timedelta(minutes=1), name="strict", max_lateness=10)
    folder = tmp_path / "broker"
    scheduler = serving_scheduler(folder, database_url, clock)
    try:
        assert scheduler.metrics is not None and scheduler.metrics.port
        store = scheduler.store
        capped = insert_routine(store, "capped", cron="0 3 * * *")
        store.spend.suspend(capped, clock.now + timedelta(days=1), "ceiling", clock.now)

        scheduler.tick()  # 12:00:00 adopts; first windows at 12:01
        clock.advance(seconds=90)
        scheduler.tick()  # 12:01:30: every + polled sent 30 s late, strict too late
        clock.advance(seconds=60)
        scheduler.tick()  # 12:02:30: every sent, polled overlap-skipped, strict too late

        assert len(published(folder)) == 3
        samples = scrape(scheduler.metrics.port)
        assert value(samples, "routines_windows_sent_total") == 3
        assert value(samples, "routines_windows_skipped_total", reason="late") == 2
        assert value(samples, "routines_windows_skipped_total", reason="overlap") == 1
        assert value(samples, "routines_send_failures_total") == 0
        assert value(samples, "routines_runs_lost_total") == 0
        assert value(samples, "routines_duplicates_refused_total") == 0
        assert value(samples, "routines_lateness_seconds_count") == 3
        assert value(samples, "routines_lateness_seconds_sum") == pytest.approx(90.0)
        assert value(samples, "routines_lateness_seconds_bucket", le="10.0") == 0
        assert value(samples, "routines_lateness_seconds_bucket", le="30.0") == 3
        assert value(samples, "routines_ticks_total") == 3
        assert value(samples, "routines_tick_errors_total") == 0
        assert value(samples, "routines_tick_duration_seconds_count") == 3
        assert value(samples, "routines_tick_duration_seconds_sum") > 0
        assert value(samples, "routines_due_claimed") == 3
        assert value(samples, "routines_due_more") == 0
        assert value(samples, "routines_suspended_routines") == 1
        assert value(samples, "routines_due_routines") == 0
    finally:
        scheduler.close()


def test_a_full_batch_shows_as_more_due_and_the_due_count(
    sqlite_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    for n in range(3):
        register(f"tasks.t{n}", timedelta(minutes=1), name=f"r{n}", overlap="overlap")
    scheduler = serving_scheduler(tmp_path / "broker", sqlite_url, clock, routines_batch_size=2)
    try:
        scheduler.tick()
        scheduler.tick()  # adoption too goes by batches of two
        clock.advance(minutes=1)
        assert scheduler.tick() == 0.0  # a full batch: tick again at once
        assert scheduler.metrics is not None
        samples = scrape(scheduler.metrics.port)
        assert value(samples, "routines_due_claimed") == 2
        assert value(samples, "routines_due_more") == 1
        assert value(samples, "routines_due_routines") == 1  # the one left for the next tick
    finally:
        scheduler.close()


def test_the_database_gauges_are_read_at_most_every_refresh_interval(
    sqlite_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    scheduler = serving_scheduler(tmp_path / "broker", sqlite_url, clock)
    try:
        metrics = scheduler.metrics
        assert metrics is not None
        scheduler.tick()
        routine_id = insert_routine(scheduler.store, "capped", cron="0 3 * * *")
        scheduler.store.spend.suspend(routine_id, clock.now + timedelta(days=1), "x", clock.now)
        clock.advance(seconds=10)
        scheduler.tick()
        assert value(scrape(metrics.port), "routines_suspended_routines") == 0  # not re-read
        clock.advance(seconds=metrics.refresh_every.total_seconds())
        scheduler.tick()
        assert value(scrape(metrics.port), "routines_suspended_routines") == 1
    finally:
        scheduler.close()


def test_every_report_field_feeds_its_metric() -> None:
    metrics = RoutineMetrics()
    report = TickReport(
        claimed=7, sent=4, send_failures=2, lost=1, conflicts=3, retries_sent=5, replaced=1,
        deferred=1, queued=2, more_due=True, duration=0.2,
        skipped_by_reason={"catch_up_cap": 10, "late": 1},
    )  # fmt: skip
    metrics.observe_tick(report)
    metrics.observe_tick(TickReport(sent=1, skipped_by_reason={"late": 2}))
    metrics.observe_tick_error()
    text = metrics.render().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert value(samples, "routines_windows_sent_total") == 5
    assert value(samples, "routines_send_failures_total") == 2
    assert value(samples, "routines_runs_lost_total") == 1
    assert value(samples, "routines_duplicates_refused_total") == 3
    assert value(samples, "routines_retries_sent_total") == 5
    assert value(samples, "routines_runs_replaced_total") == 1
    assert value(samples, "routines_windows_skipped_total", reason="catch_up_cap") == 10
    assert value(samples, "routines_windows_skipped_total", reason="late") == 3
    assert value(samples, "routines_tick_errors_total") == 1
    assert value(samples, "routines_ticks_total") == 2
    # Gauges show the last tick.
    assert value(samples, "routines_due_claimed") == 0
    assert value(samples, "routines_due_more") == 0


def test_lateness_counts_first_attempts_only(clock: FakeClock) -> None:
    metrics = RoutineMetrics(clock)
    window = clock.now

    def run(attempt: int) -> OutgoingRun:
        return OutgoingRun(
            run_id="r", routine_name="n", task="t", args=[], kwargs={}, options={},
            window=window, idempotency_key="n@w", attempt=attempt,
        )  # fmt: skip

    metrics.observe_sent(run(1), window + timedelta(seconds=2))
    metrics.observe_sent(run(2), window + timedelta(hours=1))  # a retry: not lateness
    samples = {s.name: s.value for s in metrics.lateness.collect()[0].samples if not s.labels}
    assert samples["routines_lateness_seconds_count"] == 1
    assert samples["routines_lateness_seconds_sum"] == pytest.approx(2.0)


def test_metrics_are_off_by_default_and_read_from_the_environment(
    sqlite_url: str, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ROUTINES_METRICS_PORT", raising=False)
    app = filesystem_app(tmp_path / "broker", sqlite_url)
    assert metrics_port(app) is None
    scheduler = Scheduler(app, clock=clock)
    try:
        assert scheduler.metrics is None
        scheduler.tick()
    finally:
        scheduler.close()
    monkeypatch.setenv("ROUTINES_METRICS_PORT", "9808")
    assert metrics_port(app) == 9808
    app.conf.routines_metrics_port = 9100  # the Celery setting wins
    assert metrics_port(app) == 9100


@pytest.mark.parametrize("raw", ["http", "-1", "70000", True])
def test_a_bad_port_is_one_clear_error(raw: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROUTINES_METRICS_PORT", raising=False)
    app = Celery("bad", set_as_current=False)
    app.conf.routines_metrics_port = raw
    with pytest.raises(ConfigurationError, match="routines_metrics_port"):
        metrics_port(app)


def assert_one_start_error(caplog: pytest.LogCaptureFixture, pattern: str) -> None:
    """Beat ended with one ERROR line matching ``pattern`` (the traceback only at DEBUG)."""
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert errors[0].getMessage().startswith("celery-routines beat cannot start: ")
    assert re.search(pattern, errors[0].getMessage()), errors[0].getMessage()
    assert errors[0].exc_info is None


def test_a_set_port_without_prometheus_client_names_the_extra(
    sqlite_url: str,
    tmp_path: Path,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    with pytest.raises(SystemExit):
        serving_scheduler(tmp_path / "broker", sqlite_url, clock)
    assert_one_start_error(caplog, r"celery-routines\[metrics\]")
    # Without the port, beat does not need the package.
    scheduler = Scheduler(filesystem_app(tmp_path / "broker", sqlite_url), clock=clock)
    try:
        scheduler.tick()
    finally:
        scheduler.close()


def test_two_schedulers_in_one_process_have_their_own_registries_and_close_their_port(
    sqlite_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    register("tasks.every", timedelta(minutes=1), name="every", overlap="overlap")
    first = serving_scheduler(tmp_path / "a", sqlite_url, clock)
    second = serving_scheduler(tmp_path / "b", f"sqlite:///{tmp_path / 'other.db'}", clock)
    try:
        assert first.metrics is not None and second.metrics is not None
        first.tick()
        second.tick()
        clock.advance(minutes=1)
        first.tick()
        assert value(scrape(first.metrics.port), "routines_windows_sent_total") == 1
        assert value(scrape(second.metrics.port), "routines_windows_sent_total") == 0
    finally:
        port = first.metrics.port if first.metrics else None
        first.close()
        first.close()  # beat calls close() twice on SIGTERM
        second.close()
    assert port is not None
    with pytest.raises(urllib.error.URLError):
        scrape(port)


def test_the_lazy_banner_instance_serves_nothing(sqlite_url: str, tmp_path: Path) -> None:
    app = filesystem_app(tmp_path / "broker", sqlite_url, routines_metrics_port=0)
    scheduler = Scheduler(app, lazy=True)
    assert scheduler.metrics is None
    scheduler.close()


def test_a_failing_tick_is_counted(
    sqlite_url: str, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = serving_scheduler(tmp_path / "broker", sqlite_url, clock)
    try:
        assert scheduler.metrics is not None

        def broken() -> TickReport:
            raise RuntimeError("database is down")

        monkeypatch.setattr(scheduler.engine, "tick", broken)
        assert scheduler.tick() == 1.0  # the first back-off
        samples = scrape(scheduler.metrics.port)
        assert value(samples, "routines_tick_errors_total") == 1
        assert value(samples, "routines_ticks_total") == 0
    finally:
        scheduler.close()


def test_a_port_in_use_is_one_clear_error(
    sqlite_url: str, tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    first = serving_scheduler(tmp_path / "broker", sqlite_url, clock)
    try:
        assert first.metrics is not None
        app = filesystem_app(
            tmp_path / "broker",
            sqlite_url,
            routines_metrics_port=first.metrics.port,
            routines_metrics_address="127.0.0.1",
        )
        with pytest.raises(SystemExit):
            Scheduler(app, clock=clock)
        assert_one_start_error(caplog, r"cannot serve metrics on 127\.0\.0\.1:")
    finally:
        first.close()


def test_beat_prunes_one_batch_a_minute_at_most_and_counts_the_rows(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    from celery_routines.store.models import ROUTINE_RUNS
    from tests.operators import add_run

    folder = tmp_path / "broker"
    scheduler = serving_scheduler(
        folder, database_url, clock, routines_keep_runs_days=7, routines_prune_batch=2
    )
    try:
        store = scheduler.store
        routine_id = insert_routine(store, "old", cron="0 0 1 1 *")
        record = store.routines.by_id(routine_id)
        old = clock.now - timedelta(days=30)
        for i in range(6):
            at = old + timedelta(minutes=i)
            add_run(store, record, f"old@{i}", "succeeded", at, at)
        seconds = [1000.0]
        scheduler.tick()
        assert scheduler._pruner is not None
        scheduler._pruner.monotonic = lambda: seconds[0]
        scheduler._pruner.next_pass = 1000.0 + 60

        def count() -> list[object]:
            with store.engine.connect() as conn:
                return list(conn.execute(ROUTINE_RUNS.select()).all())

        scheduler.tick()  # within the first minute: nothing
        assert len(count()) == 6
        seconds[0] += 61
        scheduler.tick()
        scheduler.tick()  # the same minute: no second pass
        assert len(count()) == 4
        seconds[0] += 61
        scheduler.tick()
        assert len(count()) == 2
        samples = scrape(scheduler.metrics.port)
        assert value(samples, "routines_runs_pruned_total", state="succeeded") == 4
    finally:
        scheduler.close()
