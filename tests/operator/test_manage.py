"""Managing routines without code through the admin API (add, edit, enable,
disable, delete, history), on every store, with an injected clock."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from celery_routines import InvalidRoutine, UnknownRoutine, register
from celery_routines.operator.admin import Routines
from celery_routines.operator.texts import BadOption
from celery_routines.store import Store
from tests.conftest import FakeClock
from tests.operators import make_app


@pytest.fixture
def admin(store: Store, database_url: str, tmp_path: Path, clock: FakeClock) -> Iterator[Routines]:
    routines = Routines(make_app(tmp_path / "broker", database_url), clock=clock)
    yield routines
    routines.close()


def test_add_stores_a_cli_routine_validated_like_a_declaration(
    admin: Routines, store: Store
) -> None:
    result = admin.add(
        "poll",
        "tasks.poll",
        every="5m",
        timezone="Europe/Rome",
        args=[1, 2],
        kwargs={"x": 1},
        options={"queue": "slow"},
        catch_up="latest",
        overlap="queue",
        max_lateness="10m",
        ceilings=["100/day", "2.5 eur/month"],
        by="ana@desk",
    )
    assert result.changed and result.action == "added" and result.by == "ana@desk"
    record = store.routines.by_name("poll")
    assert record is not None
    assert (record.source, record.interval_seconds, record.timezone) == (
        "cli",
        300.0,
        "Europe/Rome",
    )
    assert (record.catch_up, record.overlap, record.max_lateness) == ("latest", "queue", 600.0)
    assert '"eur"' in (record.ceiling or "") and record.options == '{"queue": "slow"}'
    # The same words as @routine("61 * * * *") would get.
    with pytest.raises(InvalidRoutine) as bad_cron:
        admin.add("bad", "tasks.x", cron="61 * * * *")
    with pytest.raises(InvalidRoutine) as declared:
        register("tasks.x", "61 * * * *", name="bad")
    assert str(bad_cron.value) == str(declared.value)
    with pytest.raises(InvalidRoutine, match="catch_up must be"):
        admin.add("bad", "tasks.x", cron="* * * * *", catch_up="sometimes")
    with pytest.raises(BadOption, match="--every"):
        admin.add("bad", "tasks.x", every="often")
    with pytest.raises(InvalidRoutine, match="already stored"):
        admin.add("poll", "tasks.poll", cron="* * * * *")
    assert store.routines.by_name("bad") is None


def test_edit_of_the_schedule_recomputes_from_now_and_other_fields_keep_the_window(
    admin: Routines, store: Store, clock: FakeClock
) -> None:
    admin.add("poll", "tasks.poll", cron="0 * * * *")
    with store.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE routines SET next_run_at = '2026-11-30 13:00:00' WHERE name = 'poll'"
        )
    kept = admin.edit("poll", kwargs={"x": 2}, by="bo")
    assert kept.fields == {"kwargs": {"x": 2}} and kept.next_run_at is not None
    assert store.routines.by_name("poll").next_run_at == kept.next_run_at  # type: ignore[union-attr]
    moved = admin.edit("poll", every=90)
    assert moved.fields == {"cron": None, "interval_seconds": 90.0}
    record = store.routines.by_name("poll")
    assert record is not None and record.next_run_at is None  # beat adopts it from now
    assert not admin.edit("poll", every="90s").changed
    actions = [(c.action, c.changed_by) for c in admin.history("poll")]
    assert (
        actions[0][0] == "edited" and actions[1] == ("edited", "bo") and actions[-1][0] == "added"
    )


def test_enable_records_the_windows_missed_while_disabled_as_one_skip(
    admin: Routines, store: Store, clock: FakeClock
) -> None:
    admin.add("poll", "tasks.poll", cron="*/5 * * * *")
    with store.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE routines SET next_run_at = '2026-11-30 12:05:00' WHERE name = 'poll'"
        )
    assert admin.disable("poll").changed
    assert not admin.disable("poll").changed
    clock.advance(hours=1)  # 13:00: windows 12:05 .. 13:00 fell due while disabled
    result = admin.enable("poll")
    assert result.skipped_windows == 12
    assert result.next_run_at == clock.now + timedelta(minutes=5)
    (skip,) = admin.skips()
    assert (skip.reason, skip.skipped_count) == ("disabled", 12)
    record = store.routines.by_name("poll")
    assert record is not None and record.enabled and not record.schedule_changed


def test_code_routines_are_refused_naming_where_they_are_declared(
    admin: Routines, store: Store
) -> None:
    definition = register("tasks.nightly", "0 3 * * *", name="nightly")
    store.routines.upsert_definitions([definition.columns()], admin.clock(), owner="proj")
    for attempt in (
        lambda: admin.edit("nightly", cron="0 4 * * *"),
        lambda: admin.disable("nightly"),
        lambda: admin.delete("nightly"),
    ):
        with pytest.raises(
            InvalidRoutine, match=r"declared in the code of app 'proj'.*tasks.nightly"
        ):
            attempt()


def test_delete_removes_the_routine_and_its_runs_and_keeps_its_history(
    admin: Routines, store: Store
) -> None:
    admin.add("once", "tasks.x", cron="* * * * *")
    admin.pause("once", by="cy")
    assert admin.delete("once", by="cy").runs_deleted == 0
    assert store.routines.by_name("once") is None
    assert [c.action for c in admin.history("once")] == ["deleted", "paused", "added"]
    with pytest.raises(UnknownRoutine):
        admin.history("never")
