"""Routines removed from the code stop: retirement, revival, owners and
rolling deploys, with real beats (Scheduler) on an injected clock."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from celery_routines import Scheduler, register
from celery_routines.declare import declare
from celery_routines.operator.admin import Routines
from celery_routines.registry import forget
from celery_routines.store import Store
from tests.conftest import FakeClock
from tests.harness import filesystem_app, published, runs_for


def beat(folder: Path, url: str, clock: FakeClock, **conf: Any) -> Scheduler:
    return Scheduler(filesystem_app(folder, url, **conf), clock=clock)


def keys(folder: Path) -> list[str]:
    return sorted(m["routine_window"] for m in published(folder))


class Recorded:
    """The events declare() sends."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, dict[str, Any]]] = []

    def retired(self, routine: str, **fields: Any) -> None:
        self.sent.append(("routine-retired", routine, fields))


def test_a_routine_removed_from_the_code_is_retired_never_fires_and_comes_back_once(
    database_url: str, tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "broker"
    register("tasks.keep", "*/5 * * * *", name="keep", overlap="overlap")
    register("tasks.gone", "*/5 * * * *", name="gone", overlap="overlap")
    first = beat(folder, database_url, clock)
    first.tick()
    clock.advance(minutes=5)
    first.tick()
    assert keys(folder) == ["gone@2026-11-30T12:05:00+00:00", "keep@2026-11-30T12:05:00+00:00"]
    first.close()

    # The deploy removes `gone`; the new beat retires it at start.
    forget("gone")
    with caplog.at_level(logging.WARNING, logger="celery_routines.beat"):
        second = beat(folder, database_url, clock)
    retired_lines = [r for r in caplog.records if "retired gone" in r.getMessage()]
    assert len(retired_lines) == 1 and retired_lines[0].levelno == logging.WARNING
    try:
        for _ in range(6):  # half an hour: six windows of each
            clock.advance(minutes=5)
            second.tick()
        fired = keys(folder)
        assert [k for k in fired if k.startswith("gone@")] == ["gone@2026-11-30T12:05:00+00:00"]
        assert len([k for k in fired if k.startswith("keep@")]) == 7
        with Routines(second.app, clock=clock) as admin:
            (summary,) = [s for s in admin.list() if s.name == "gone"]
            assert summary.state == "retired" and summary.retired_at is not None
            assert [c.action for c in admin.history("gone")] == ["retired"]
            # Its history is kept.
            assert len(admin.runs("gone")) == 1
    finally:
        second.close()

    # Declared again (e.g. a rollback): back from now, the missed windows one skip.
    register("tasks.gone", "*/5 * * * *", name="gone", overlap="overlap")
    clock.advance(minutes=2)  # 12:37
    third = beat(folder, database_url, clock)
    try:
        store = third.store
        record = store.routines.by_name("gone")
        assert record is not None and record.retired_at is None
        skips = [r for r in runs_for(store, record.id) if r.state == "skipped"]
        assert [(s.reason, s.skipped_count) for s in skips] == [("retired", 6)]
        third.tick()
        record = store.routines.by_name("gone")
        assert record is not None and record.next_run_at == clock.now.replace(minute=40, second=0)
        assert len([k for k in keys(folder) if k.startswith("gone@")]) == 1  # no burst
    finally:
        third.close()


def test_only_the_owner_retires_its_routines(store: Store, clock: FakeClock) -> None:
    ours = register("tasks.a", "* * * * *", name="a")
    theirs = register("tasks.b", "* * * * *", name="b")
    now = clock()
    declare(store, [ours], now, owner="billing", stamp="1", default_zone="UTC")
    declare(store, [theirs], now, owner="mailer", stamp="1", default_zone="UTC")
    # billing deploys without any routine: mailer's b is not billing's to retire.
    events = Recorded()
    result = declare(store, [], now, owner="billing", stamp="2", default_zone="UTC", events=events)
    assert result.retired == ["a"]
    assert events.sent == [("routine-retired", "a", {"since": now, "owner": "billing"})]
    a, b = store.routines.by_name("a"), store.routines.by_name("b")
    assert a is not None and a.retired_at == now and a.next_run_at is None
    assert b is not None and b.retired_at is None and b.owner == "mailer"


def test_a_rolling_deploy_never_flip_flops_the_newest_declaration_stamp_wins(
    database_url: str, tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "broker"
    register("tasks.keep", "*/5 * * * *", name="keep", overlap="overlap")
    register("tasks.old", "*/5 * * * *", name="old", overlap="overlap")
    old_code = beat(folder, database_url, clock, routines_code_version="41")
    # The new release (no `old`) starts while the old beat still runs.
    forget("old")
    clock.advance(seconds=1)
    new_code = beat(folder, database_url, clock, routines_code_version="42")
    # An old beat restarting during the rollout (a crash loop) has an older
    # stamp: it changes nothing, so `old` stays retired.
    register("tasks.old", "*/5 * * * *", name="old", overlap="overlap")
    clock.advance(seconds=1)
    with caplog.at_level(logging.WARNING, logger="celery_routines.beat"):
        old_again = beat(folder, database_url, clock, routines_code_version="41")
    assert any("written by newer code" in r.getMessage() for r in caplog.records)
    try:
        new_code.tick()  # adopts
        for _ in range(3):
            clock.advance(minutes=5)
            for scheduler in (old_code, new_code, old_again):
                scheduler.tick()
        record = new_code.store.routines.by_name("old")
        assert record is not None and record.retired_at is not None
        assert not [k for k in keys(folder) if k.startswith("old@")]
        assert len([k for k in keys(folder) if k.startswith("keep@")]) == 3
    finally:
        for scheduler in (old_code, new_code, old_again):
            scheduler.close()


def test_a_retired_routine_schedules_no_retries(store: Store, clock: FakeClock) -> None:
    from celery_routines.policy.runs import blocked_reason, policy_of

    gone = register("tasks.gone", "* * * * *", name="gone")
    declare(store, [gone], clock(), owner="app", stamp="1", default_zone="UTC")
    declare(store, [], clock(), owner="app", stamp="2", default_zone="UTC")
    record = store.routines.by_name("gone")
    assert record is not None
    assert blocked_reason(policy_of(record), clock()) == "retired"


def test_one_bad_beat_schedule_entry_becomes_an_invalid_routine_and_beat_starts(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    class Sunrise:  # a schedule type we do not support (as solar() is, for now)
        def __repr__(self) -> str:
            return "<solar: sunrise>"

    folder = tmp_path / "broker"
    conf = {
        "beat_schedule": {
            "sunrise": {"task": "tasks.lights", "schedule": Sunrise()},
            "typo": {"task": "tasks.x", "schedule": "61 * * * *"},
            "poll": {"task": "tasks.poll", "schedule": 60.0},
        }
    }
    scheduler = beat(folder, database_url, clock, **conf)
    try:
        store = scheduler.store
        bad = store.routines.by_name("sunrise")
        assert bad is not None and bad.task == "tasks.lights"
        assert bad.last_error is not None and "solar" in bad.last_error
        for _ in range(3):
            clock.advance(minutes=1)
            scheduler.tick()
        assert {m["routine_window"].split("@")[0] for m in published(folder)} == {"poll"}
        bad = store.routines.by_name("sunrise")
        assert bad is not None and "solar" in (bad.last_error or "")  # its own error kept
        with Routines(scheduler.app, clock=clock) as admin:
            states = {s.name: s.state for s in admin.list() if not s.name.startswith("celery.")}
        assert states == {"sunrise": "invalid", "typo": "invalid", "poll": "enabled"}
        typo = store.routines.by_name("typo")
        assert typo is not None and "61" in (typo.last_error or "")
    finally:
        scheduler.close()
