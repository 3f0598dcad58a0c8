"""Declaring routines: the decorator, register(), beat_schedule, and bad input."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from celery import Celery, shared_task
from celery.schedules import crontab, schedule

from celery_routines import Ceiling, InvalidRoutine, register, routine
from celery_routines.registry import declared, definitions_for, from_beat_schedule


@pytest.fixture
def app() -> Celery:
    return Celery("registry_test", set_as_current=False)


def test_routine_returns_the_same_task_and_declares_it(app: Celery) -> None:
    @app.task(name="proj.nightly")
    def nightly() -> None: ...

    decorated = routine("30 2 * * *", timezone="Europe/Rome", catch_up="skip_to_next")(nightly)
    assert decorated is nightly
    [definition] = declared()
    assert (definition.name, definition.task, definition.cron, definition.timezone) == (
        "proj.nightly",
        "proj.nightly",
        "30 2 * * *",
        "Europe/Rome",
    )
    assert definition.catch_up == "skip_to_next"


def test_routine_on_a_shared_task() -> None:
    @routine(timedelta(minutes=5), name="poller", overlap="skip", ceiling=Ceiling(100))
    @shared_task(name="proj.poll")
    def poll() -> None: ...

    [definition] = declared()
    assert (definition.name, definition.task, definition.interval_seconds) == (
        "poller",
        "proj.poll",
        300.0,
    )
    assert json.loads(definition.columns()["ceiling"]) == [
        {"limit": 100, "per": "day", "unit": "fires"}
    ]


def test_register_by_task_name_with_arguments() -> None:
    definition = register("billing.invoice", 90, name="invoices", args=["eu"], kwargs={"n": 1})
    columns = definition.columns()
    assert columns["interval_seconds"] == 90.0
    assert json.loads(columns["args"]) == ["eu"] and json.loads(columns["kwargs"]) == {"n": 1}


def test_beat_schedule_entries_keep_their_meaning(app: Celery) -> None:
    app.conf.timezone = "Europe/Rome"
    app.conf.beat_schedule = {
        "morning": {"task": "proj.morning", "schedule": crontab(minute=0, hour=7)},
        "every-10s": {"task": "proj.ping", "schedule": 10.0, "args": (1,)},
        "every-2m": {"task": "proj.pong", "schedule": schedule(timedelta(minutes=2))},
        "delta": {"task": "proj.delta", "schedule": timedelta(hours=1), "options": {"queue": "q"}},
    }
    by_name = {d.name: d for d in definitions_for(app)}
    assert by_name["morning"].cron == "0 7 * * *"
    # No zone of its own: it is read in routines_timezone (the app's timezone), as Celery does.
    assert by_name["morning"].timezone is None
    assert by_name["every-10s"].interval_seconds == 10.0
    assert by_name["every-10s"].args == (1,)
    assert by_name["every-2m"].interval_seconds == 120.0
    assert by_name["delta"].options == {"queue": "q"}


def test_beat_schedule_intervals_are_whole_seconds_and_never_0(app: Celery) -> None:
    """Windows and their keys are on a whole-second grid: a fractional
    interval is rounded to the nearest second, one under a second is 1 s."""
    app.conf.beat_schedule = {
        "ms": {"task": "proj.a", "schedule": timedelta(milliseconds=1500)},
        "tiny": {"task": "proj.b", "schedule": 0.3},
        "celery": {"task": "proj.c", "schedule": schedule(timedelta(seconds=2.4))},
        "float": {"task": "proj.d", "schedule": 90.0},
    }
    by_name = {d.name: d.interval_seconds for d in from_beat_schedule(app.conf.beat_schedule)}
    assert by_name == {"ms": 2.0, "tiny": 1.0, "celery": 2.0, "float": 90.0}
    with pytest.raises(InvalidRoutine, match="interval must be positive, got 0 seconds"):
        from_beat_schedule({"zero": {"task": "proj.e", "schedule": 0}})


def test_beat_schedule_entries_keep_celery_beats_retries_and_overlap_unless_asked(
    app: Celery,
) -> None:
    """Celery beat never re-sends a failed task nor holds a send back while
    the previous run goes on; ``routines_beat_schedule_defaults = "routines"``
    asks for ours; anything else is refused naming the setting."""
    app.conf.beat_schedule = {"poll": {"task": "proj.poll", "schedule": 60}}
    [entry] = [d for d in definitions_for(app) if d.name == "poll"]
    assert (entry.max_retries, entry.overlap) == (0, "overlap")
    app.conf.routines_beat_schedule_defaults = "routines"
    [entry] = [d for d in definitions_for(app) if d.name == "poll"]
    assert (entry.max_retries, entry.retry_base_seconds, entry.overlap) == (4, 60, "skip")
    app.conf.routines_beat_schedule_defaults = "ours"
    with pytest.raises(ValueError, match="routines_beat_schedule_defaults must be 'celery'"):
        definitions_for(app)


def test_code_declarations_win_over_beat_schedule_of_the_same_name(app: Celery) -> None:
    app.conf.beat_schedule = {"poll": {"task": "proj.poll", "schedule": 60}}
    register("proj.poll", 30, name="poll")
    [definition] = [d for d in definitions_for(app) if d.name == "poll"]
    assert definition.interval_seconds == 30.0


@pytest.mark.parametrize(
    ("schedule_value", "options", "expected"),
    [
        ("30 25 * * *", {}, "30 25 * * *"),
        ("* * * *", {}, "* * * *"),
        ("0 3 * * *", {"timezone": "Mars/Olympus"}, "Mars/Olympus"),
        (-5, {}, "-5"),
        (timedelta(0), {}, "0"),
        ("0 3 * * *", {"catch_up": "sometimes"}, "sometimes"),
        ("0 3 * * *", {"overlap": "maybe"}, "maybe"),
        ("0 3 * * *", {"catch_up_cap": -1}, "-1"),
        ("0 3 * * *", {"max_retries": 10**9}, str(10**9)),
        ("0 3 * * *", {"retry_base_seconds": float("nan")}, "nan"),
        ("0 3 * * *", {"max_lateness": 0}, "0"),
        ("0 3 * * *", {"args": [object()]}, "args"),
        ("0 3 * * *", {"kwargs": ["not", "a", "dict"]}, "kwargs"),
        ("0 3 * * *", {"colour": "blue"}, "colour"),
        ("0 3 * * *", {"ceiling": Ceiling(5, unit="eur") and [Ceiling(5), Ceiling(6)]}, "fires"),
        (object(), {}, "object"),
    ],
)
def test_bad_input_is_refused_at_declaration_naming_routine_and_value(
    schedule_value: object, options: dict, expected: str
) -> None:
    with pytest.raises(InvalidRoutine) as excinfo:
        register("proj.task", schedule_value, name="the-routine", **options)
    message = str(excinfo.value)
    assert "the-routine" in message and expected in message, message
    assert declared() == []


@pytest.mark.parametrize("per", ["fortnight", "Day"])
def test_a_bad_ceiling_period_names_the_value(per: str) -> None:
    with pytest.raises(ValueError, match=per):
        Ceiling(10, per=per)


def test_a_ten_thousand_character_name_is_refused_with_its_length() -> None:
    with pytest.raises(InvalidRoutine, match="10000 characters"):
        register("proj.task", 60, name="n" * 10_000)


def test_a_beat_schedule_entry_without_a_schedule_names_the_entry() -> None:
    with pytest.raises(InvalidRoutine, match="broken-entry"):
        from_beat_schedule({"broken-entry": {"task": "proj.x"}})


def test_a_code_routine_notifying_inside_the_network_is_stored_invalid_at_beat_start(
    app: Celery,
) -> None:
    """The decorator cannot know the settings; beat's start-up refuses the
    routine with add's words (stored as an invalid routine, beat starts)."""
    register("proj.pay", 60, name="pay", notify_url="http://169.254.169.254/latest/meta-data/")
    invalid: list = []
    assert "pay" not in [d.name for d in definitions_for(app, invalid)]
    [(error, task)] = invalid
    assert task == "proj.pay" and str(error).startswith(
        "routine 'pay': notify_url 'http://169.254.169.254/latest/***' is refused: "
        "169.254.169.254 is a cloud metadata address"
    )
    app.conf.routines_notify_allowed_hosts = "169.254.169.254"
    invalid.clear()
    assert "pay" in [d.name for d in definitions_for(app, invalid)] and invalid == []
