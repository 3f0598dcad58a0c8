"""A routine's record (issue 33, item 5) on SQLite, PostgreSQL and MariaDB:
known runs give known numbers, every field, in one statement."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
from sqlalchemy import event

from celery_routines.config import Settings
from celery_routines.operator.routine_stats import RoutineRecords
from celery_routines.policy.run_stats import RoutineStats, Spread
from celery_routines.store import RoutineRecord, Store
from tests.operators import add_routine, add_run

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class Source:
    """The admin API as the record sees it: the store, settings, a clock."""

    def __init__(self, store: Store, now: datetime = NOW) -> None:
        self.store = store
        self.settings = Settings(database_url=str(store.engine.url))
        self.now = now

    def clock(self) -> datetime:
        return self.now


def window(
    store: Store, routine: RoutineRecord, key: str, state: str, at: datetime,
    sent: float | None = None, started: float | None = None, finished: float | None = None,
    *, created: datetime | None = None, attempt: int = 1, **extra: object,
) -> str:  # fmt: skip
    """A run of the window ``at``; sent/started/finished in seconds after
    ``created`` (default: the window)."""
    written = created or at
    times = {
        column: written + timedelta(seconds=offset)
        for column, offset in (
            ("sent_at", sent),
            ("started_at", started),
            ("finished_at", finished),
        )
        if offset is not None
    }
    return add_run(store, routine, key, state, at, written, attempt=attempt, **times, **extra)


def known_history(store: Store) -> RoutineRecord:
    """The runs the expected figures below are worked out from (by hand)."""
    r = add_routine(store, "nightly", timezone="Europe/Rome")
    other = add_routine(store, "other")
    at = lambda d, h, m=0: datetime(2026, 11, d, h, m, tzinfo=UTC)  # noqa: E731
    window(store, r, "n@1", "succeeded", at(30, 10), 2, 5, 15)  # duration 10
    window(store, r, "n@2", "succeeded", at(29, 10), 4, 9, 39)  # 30
    # A failed attempt retried, then its retry succeeded (twice redelivered
    # by Celery's self.retry()): the window ended once, in success.
    window(store, r, "n@3", "failed", at(28, 10), 6, 7, 17, retry_at=at(28, 10, 5))  # 10
    window(
        store, r, "n@3", "succeeded", at(28, 10), 0, 1, 21, created=at(28, 10, 5), attempt=2,
        celery_retries=2,
    )  # fmt: skip  # 20, no lateness: not a first attempt
    window(store, r, "n@4", "failed", at(27, 10), 8, 11, 51)  # 40, ended in failure
    window(store, r, "n@5", "lost", at(26, 10), 10)
    # A retry cancelled by a pause: the window ended there, in failure.
    window(store, r, "n@10", "failed", at(26, 11), 3, retry_at=at(26, 12), reason="no_retry:paused")
    window(store, r, "n@6", "skipped", at(25, 10), reason="catch_up_cap", skipped_count=5)
    window(store, r, "n@7", "skipped", at(25, 11), reason="late")
    window(store, r, "n@8", "skipped", at(24, 10), reason="overlap")
    # 23:30 UTC on the 29th is 00:30 on the 30th in Rome: that day's strip.
    window(store, r, "n@9", "running", at(29, 23, 30), 1, 3)
    # A trigger has a duration, not a lateness.
    window(store, r, "nightly@manual:x", "succeeded", at(30, 11), 0, 0, 50)  # 50
    # In the strip, before the 7 days; before the strip; another routine.
    window(store, r, "n@old", "succeeded", at(10, 10), 1, 1, 101)
    window(store, r, "n@older", "succeeded", datetime(2026, 10, 20, 10, tzinfo=UTC), 1, 1, 2)
    window(store, other, "o@1", "failed", at(30, 10), 1, 1, 1000)
    return r


def test_known_runs_give_known_figures_in_one_statement(store: Store) -> None:
    known_history(store)
    statements: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    stats = RoutineRecords(Source(store)).of("nightly", 7)
    assert len([s for s in statements if "routine_runs" in s]) == 1
    assert_known(stats)


def assert_known(stats: RoutineStats) -> None:
    assert (stats.routine, stats.timezone, stats.days) == ("nightly", "Europe/Rome", 7)
    assert (stats.since, stats.until) == (NOW - timedelta(days=7), NOW)
    assert stats.counts == {"failed": 3, "lost": 1, "running": 1, "skipped": 3, "succeeded": 4}
    # Ended windows: 4 succeeded, n@4 and n@10 failed, n@5 lost (n@3's
    # failure was retried).
    assert stats.ended == 7
    assert stats.success_rate == pytest.approx(4 / 7)
    # Durations 10, 10, 20, 30, 40, 50: p50 at rank 2.5, p95 at rank 4.75.
    assert stats.duration == Spread(25.0, 47.5, 6)
    # Sends 1, 2, 3, 4, 6, 8, 10 s after their windows (first attempts, no
    # trigger): p50 at rank 3, p95 at rank 5.7.
    assert stats.send_lateness == Spread(4.0, 9.4, 7)
    # Starts 3, 5, 7, 9, 11: p95 at rank 3.8.
    assert stats.start_lateness == Spread(7.0, 10.6, 5)
    assert (stats.retry_attempts, stats.celery_retries) == (1, 2)
    assert stats.skips_by_reason == {"catch_up_cap": 5, "late": 1, "overlap": 1}
    assert stats.skipped_windows == 7
    assert (stats.dropped_by_catch_up, stats.missed_late) == (5, 1)
    assert len(stats.strip) == 30
    assert (stats.strip[0].day, stats.strip[-1].day) == (date(2026, 11, 1), date(2026, 11, 30))
    shown = {d.day.day: d.counts for d in stats.strip if d.counts}
    assert shown == {
        10: {"succeeded": 1},
        24: {"skipped": 1},
        25: {"skipped": 6},
        26: {"failed": 1, "lost": 1},
        27: {"failed": 1},
        28: {"failed": 1, "succeeded": 1},
        29: {"succeeded": 1},
        30: {"running": 1, "succeeded": 2},
    }
    assert stats.strip[29].words == "2026-11-30: 1 running, 2 succeeded"
    assert stats.strip[0].words == "2026-11-01: no runs"


def test_a_routine_without_runs_has_an_empty_record(store: Store) -> None:
    add_routine(store, "quiet")
    stats = RoutineRecords(Source(store)).of("quiet", 90)
    assert stats.counts == {} and stats.success_rate is None and stats.ended == 0
    assert stats.duration == stats.send_lateness == stats.start_lateness == Spread()
    assert [d.counts for d in stats.strip] == [{}] * 30
    assert stats.skips_by_reason == {} and stats.retry_attempts == 0


def test_a_single_measure_is_its_own_percentiles(store: Store) -> None:
    r = add_routine(store, "once")
    window(store, r, "o@1", "succeeded", NOW - timedelta(hours=1), 0.25, 1.5, 4)
    stats = RoutineRecords(Source(store)).of("once", 1)
    assert stats.duration == Spread(2.5, 2.5, 1)
    assert stats.send_lateness == Spread(0.25, 0.25, 1)
    assert stats.success_rate == 1.0


def sorted_history(store: Store) -> None:
    """Six routines whose failure rates and lateness over the last 7 days
    are known: d 100% failed, a 50%, b and c 0% (c's failure was retried
    into a success), e no runs, f only a run 10 days old."""
    ago = lambda hours: NOW - timedelta(hours=hours)  # noqa: E731
    a, b, c, d = (add_routine(store, name) for name in "abcd")
    add_routine(store, "e")
    f = add_routine(store, "f")
    window(store, a, "a@1", "succeeded", ago(2), 10, 11, 12)
    window(store, a, "a@2", "failed", ago(1), 30, 31, 32)
    window(store, b, "b@1", "succeeded", ago(2), 100, 101, 102)
    window(store, b, "b@2", "succeeded", ago(1), 100, 101, 102)
    window(store, c, "c@1", "failed", ago(3), 1, 2, 3, retry_at=ago(2))
    window(store, c, "c@1", "succeeded", ago(3), 0, 1, 2, created=ago(2), attempt=2)
    window(store, d, "d@1", "lost", ago(1), 5)
    window(store, f, "f@1", "failed", ago(240), 1000, 1001, 1002)


def test_the_list_sorts_by_failure_rate_and_lateness_in_one_statement(store: Store) -> None:
    sorted_history(store)
    since = NOW - timedelta(days=7)
    statements: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    page = store.panel.routine_page(now=NOW, sort="failure_rate", sort_since=since)
    assert len([s for s in statements if "routine_runs" in s]) == 1
    assert [r.name for r in page.records] == ["d", "a", "b", "c", "e", "f"]
    by_name = {r.name: page.figures[r.id] for r in page.records}
    assert by_name["d"] == (1.0, 5.0)
    assert by_name["a"] == (0.5, pytest.approx(20.0))
    assert by_name["b"] == (0.0, pytest.approx(100.0))
    assert by_name["c"] == (0.0, pytest.approx(1.0))
    assert by_name["e"] == by_name["f"] == (None, None)

    late = store.panel.routine_page(now=NOW, sort="lateness", sort_since=since)
    assert [r.name for r in late.records] == ["b", "a", "d", "c", "e", "f"]
    # Sorted, filtered and paged like the list by name.
    second = store.panel.routine_page(
        now=NOW, sort="lateness", sort_since=since, offset=2, limit=2, name="d"
    )
    assert ([r.name for r in second.records], second.total) == ([], 1)
    paged = store.panel.routine_page(now=NOW, sort="lateness", sort_since=since, offset=1, limit=2)
    assert [r.name for r in paged.records] == ["a", "d"] and paged.total == 6
    with pytest.raises(ValueError, match="sort 'speed' is unknown; sort by failure_rate or "):
        store.panel.routine_page(now=NOW, sort="speed", sort_since=since)


def test_the_strip_days_are_local_days_across_a_dst_night(store: Store) -> None:
    """Rome springs forward on 2026-03-29 (a 23-hour day): a run belongs to
    the local day it was written in, before and after the change."""
    r = add_routine(store, "spring", timezone="Europe/Rome")
    utc = lambda d, h, m: datetime(2026, 3, d, h, m, tzinfo=UTC)  # noqa: E731
    for key, written in (
        ("s@1", utc(28, 22, 59)),  # 23:59 CET on the 28th
        ("s@2", utc(28, 23, 30)),  # 00:30 CET on the 29th
        ("s@3", utc(29, 21, 30)),  # 23:30 CEST on the 29th: 23 h after its midnight
        ("s@4", utc(29, 22, 30)),  # 00:30 CEST on the 30th
    ):
        window(store, r, key, "succeeded", written, 1, 2, 3)
    stats = RoutineRecords(Source(store, utc(30, 12, 0))).of("spring", 7)
    shown = {d.day.isoformat(): d.counts for d in stats.strip if d.counts}
    assert shown == {
        "2026-03-28": {"succeeded": 1},
        "2026-03-29": {"succeeded": 2},
        "2026-03-30": {"succeeded": 1},
    }
