"""Bad input at every door of the operator's surface: values past
datetime's or C's range, NaN and Infinity in JSON, a ceiling limit in
exponent form, and a delete that asks. Each refusal is a 4xx naming the field, or
one CLI line and a non-zero exit, and nothing stored changes."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from celery_routines import InvalidRoutine, register
from celery_routines.operator import cli
from celery_routines.operator.admin import Routines
from celery_routines.policy.routine import define
from celery_routines.store import Store
from tests.conftest import FakeClock
from tests.e2e.processes import HERE, environment
from tests.harness import filesystem_app, insert_routine
from tests.operators import add_routine, cli_context, make_app

pytest.importorskip("starlette", reason="the API doors need the web extra")

from tests.operator.web.conftest import client_for


@pytest.fixture
def admin(store: Store, database_url: str, tmp_path: Path, clock: FakeClock) -> Routines:
    routines = Routines(make_app(tmp_path / "broker", database_url), clock=clock, store=store)
    yield routines  # type: ignore[misc]
    routines.close()


def _cli(app, *argv: str, stdin: str | None = None):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli.routines, list(argv), obj=cli_context(app), input=stdin)


def _snapshot(store: Store) -> list[tuple]:
    routines = sorted((r.name, r.next_run_at, r.paused, r.args) for r in store.routines.all())
    return routines


# -- 6. overflow --------------------------------------------------------------------

OVERFLOWING_INSTANTS = ("99999999999d", "800000d", "9999-12-31T23:59:59-14:00")


@pytest.mark.parametrize("value", OVERFLOWING_INSTANTS)
def test_an_instant_past_the_calendar_is_a_400_naming_the_field(
    admin: Routines, store: Store, value: str
) -> None:
    add_routine(store, "nightly", interval_seconds=3600)
    client = client_for(admin)
    for path in ("/api/runs", "/api/skips", "/api/routines/nightly/runs"):
        answer = client.get(path, params={"since": value})
        assert answer.status_code == 400, (path, answer.text)
        assert answer.json()["error"].startswith(f"--since {value!r} is out of range")
    until = client.get("/api/runs", params={"until": value})
    assert until.status_code == 400 and "--until" in until.json()["error"]
    for page in ("/runs", "/skips"):
        shown = client.get(page, params={"since": value})
        assert shown.status_code == 400 and "is out of range" in shown.text
    before = _snapshot(store)
    backfill = client.post(
        "/api/routines/nightly/backfill",
        json={"from": value, "to": "now", "preview": True},
        headers={"Authorization": "Bearer test-token-0123456789"},
    )
    assert backfill.status_code == 400 and "--from" in backfill.json()["error"]
    assert _snapshot(store) == before


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (("backfill", "nightly", "--from", "0001-01-01", "--to", "now"),
         "Error: --from '0001-01-01' is out of range"),
        (("add", "x", "t", "--every", "1e308"), "Error: --every must be at most 36525d"),
        (("add", "x", "t", "--at", "9999-12-31T23:59:59-14:00"),
         "Error: routine 'x': at '9999-12-31T23:59:59-14:00': out of the calendar's range"),
        (("add", "x", "t", "--cron", "* * * * *", "--max-lateness", "1e308"),
         "Error: max_lateness must be at most 36525d"),
        (("add", "x", "t", "--every", "60", "--ceiling", "1e308/day"),
         "Error: --ceiling '1e308/day': write the limit as a plain number"),
        (("edit", "nightly", "--ceiling", "2E+3 /day"),
         "Error: --ceiling '2E+3 /day': write the limit as a plain number"),
        (("edit", "nightly", "--every", "99999999999d"), "Error: --every must be at most"),
        (("prune", "--older-than", "99999999999d"), "Error: --older-than must be at most"),
        (("preview", "* * * * *", "--from", "9999-12-31T23:58"),
         "Error: --from '9999-12-31T23:58' is out of range"),
        (("preview", "* * * * *", "--from", "9998-12-30T23:58", "-n", "1000"), None),
        (("runs", "--since", "99999999999d"), "Error: --since '99999999999d' is out of range"),
        (("web", "--port", "99999"), "Error: --port must be a whole number from 1 to 65535"),
        (("web", "--port", "-1"), "Error: --port must be a whole number from 1 to 65535"),
    ],
)  # fmt: skip
def test_overflow_on_the_command_line_is_one_line_and_changes_nothing(
    admin: Routines, store: Store, argv: tuple[str, ...], line: str | None
) -> None:
    add_routine(store, "nightly", interval_seconds=3600, next_run_at=admin.clock())
    before = _snapshot(store)
    result = _cli(admin.app, *argv)
    assert result.exit_code == (0 if line is None else 1), result.output
    if line is not None:
        assert result.output.count("\n") == 1 and result.output.startswith(line), result.output
    assert _snapshot(store) == before


def test_an_iteration_count_past_the_limit_is_refused_at_start_without_the_hash(
    tmp_path: Path, sqlite_url: str
) -> None:
    from celery_routines.errors import ConfigurationError
    from celery_routines.operator.web.auth import parse_web_auth

    huge = "alice:pbkdf2_sha256$999999999999$c2FsdA$aGFzaA"
    with pytest.raises(ConfigurationError, match="iteration count of '999999999999'") as exc:
        parse_web_auth(huge, {})
    assert "aGFzaA" not in str(exc.value)
    for bad in ("alice:pbkdf2_sha256$12$c2FsdA$aGFzaA", "alice:pbkdf2_sha256$x$c2FsdA$aGFzaA"):
        with pytest.raises(ConfigurationError, match="must be a whole number from 1,000"):
            parse_web_auth(bad, {})
    app = make_app(tmp_path / "broker", sqlite_url, routines_web_auth=huge)
    result = _cli(app, "web")
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert "iteration count" in result.output


def test_an_auth_entry_without_a_colon_is_not_echoed() -> None:
    from celery_routines.errors import ConfigurationError
    from celery_routines.operator.web.auth import parse_web_auth

    pasted = "s3cr3t-t0ken-pasted-here"
    with pytest.raises(ConfigurationError) as exc:
        parse_web_auth(f"bearer:X {pasted}", {"X": "x"})
    assert pasted not in str(exc.value) and "entry 2 (24 characters)" in str(exc.value)


# -- 8. NaN and Infinity --------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "text"),
    [
        ("--args", "[NaN]"),
        ("--kwargs", '{"a": Infinity}'),
        ("--options", '{"priority": -Infinity}'),
    ],
)
def test_nan_and_infinity_are_refused_on_the_command_line(
    admin: Routines, store: Store, option: str, text: str
) -> None:
    add_routine(store, "nightly", interval_seconds=3600)
    before = _snapshot(store)
    for argv in (("add", "x", "t", "--cron", "* * * * *"), ("edit", "nightly")):
        result = _cli(admin.app, *argv, option, text)
        assert result.exit_code == 1
        assert result.output.startswith(f"Error: {option} must be JSON (")
        assert "is not a JSON number" in result.output
    assert _snapshot(store) == before


def test_nan_and_infinity_are_refused_by_the_decorator_and_the_admin_api(
    admin: Routines, store: Store
) -> None:
    for options in ({"args": [float("nan")]}, {"kwargs": {"a": float("inf")}},
                    {"options": {"priority": float("-inf")}}):  # fmt: skip
        with pytest.raises(InvalidRoutine, match="must be JSON-serialisable"):
            define("tasks.noop", 60, name="nan", **options)
        with pytest.raises(InvalidRoutine, match="must be JSON-serialisable"):
            register("tasks.noop", 60, name="nan", **options)
        with pytest.raises(InvalidRoutine, match="must be JSON-serialisable"):
            admin.add("nan", "tasks.noop", cron="* * * * *", **options)
    assert store.routines.by_name("nan") is None


def test_a_sql_row_with_nan_becomes_invalid_with_its_error(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    from celery_routines import Scheduler

    scheduler = Scheduler(filesystem_app(tmp_path / "broker", database_url), clock=clock)
    try:
        store = scheduler.store
        insert_routine(store, "nan-args", cron="* * * * *", args="[NaN]")
        insert_routine(store, "inf-kwargs", cron="* * * * *", kwargs='{"a": Infinity}')
        for _ in range(3):
            scheduler.tick()
            clock.advance(seconds=30)
        for name, constant in (("nan-args", "NaN"), ("inf-kwargs", "Infinity")):
            record = store.routines.by_name(name)
            assert record.last_error and f"{constant} is not a JSON number" in record.last_error
        admin = Routines(scheduler.app, clock=clock, store=store)
        shown = client_for(admin).get("/api/routines/nan-args")
        assert shown.status_code == 200, shown.text
        assert shown.json()["summary"]["state"] == "invalid"
    finally:
        scheduler.close()


# -- 7. delete asks -----------------------------------------------------------------


def test_delete_without_a_terminal_needs_yes_and_dry_run_says_what_would_go(
    admin: Routines, store: Store, clock: FakeClock
) -> None:
    from tests.operators import add_run

    routine = add_routine(store, "adhoc")
    add_run(store, routine, "adhoc@1", "succeeded", clock.now, clock.now)
    add_run(store, routine, "adhoc@2", "running", clock.now, clock.now)
    refused = _cli(admin.app, "delete", "adhoc")
    assert refused.exit_code == 1
    assert refused.output == (
        "Error: not deleting adhoc and its 2 run(s) (1 running, 1 succeeded): pass --yes to "
        "delete without a terminal to ask on (--dry-run shows what would go)\n"
    )
    dry = _cli(admin.app, "delete", "adhoc", "--dry-run")
    assert dry.exit_code == 0
    assert dry.output == "would delete adhoc and its 2 run(s) (1 running, 1 succeeded)\n"
    assert store.routines.by_name("adhoc") is not None and len(admin.runs("adhoc")) == 2
    assert [c.action for c in admin.history("adhoc")] == []
    done = _cli(admin.app, "delete", "adhoc", "--yes")
    assert done.exit_code == 0 and done.output == "deleted adhoc and its 2 run(s)\n"
    assert store.routines.by_name("adhoc") is None


def _on_a_terminal(argv: list[str], env: dict[str, str], answer: bytes) -> tuple[int, str]:
    """Run ``celery -A e2e_app routines ...`` with a pseudo-terminal as its
    stdin and stdout, answer its question, return (exit status, output)."""
    main, child = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "e2e_app", "routines", *argv],
        cwd=HERE, env=env, stdin=child, stdout=child, stderr=child, close_fds=True,
    )  # fmt: skip
    os.close(child)
    output, answered = b"", False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(main, 4096)
            except OSError:
                break  # the child closed the terminal
            if not chunk:
                break
            output += chunk
            if not answered and b"[y/N]" in output:
                os.write(main, answer)
                answered = True
        elif process.poll() is not None:
            break
    os.close(main)
    return process.wait(timeout=30), output.decode(errors="replace")


def test_delete_on_a_terminal_asks_first(tmp_path: Path, sqlite_url: str) -> None:
    store = Store.from_url(sqlite_url)
    store.migrate()
    add_routine(store, "adhoc")
    env = environment("memory://", sqlite_url)
    status, output = _on_a_terminal(["delete", "adhoc"], env, b"n\n")
    assert "delete adhoc and its 0 run(s)? [y/N]" in output, output
    assert status == 1 and "nothing deleted: adhoc is still stored" in output
    assert store.routines.by_name("adhoc") is not None
    status, output = _on_a_terminal(["delete", "adhoc"], env, b"y\n")
    assert status == 0 and "deleted adhoc and its 0 run(s)" in output, output
    assert store.routines.by_name("adhoc") is None
    store.dispose()


def test_the_longest_duration_accepted_is_a_hundred_years() -> None:
    from celery_routines.operator.texts import duration

    assert duration("36525d", "--every") == timedelta(days=36525)
