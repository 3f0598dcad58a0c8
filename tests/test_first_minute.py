"""What a new user meets in the first minute (issue 27): a base install
imports, a path chosen without its extra is one line naming the extra, the
documented imports work, and the small things the first hour showed.

The install itself (a brand-new virtualenv per extra, the README's first
command run verbatim) is ``scripts/check_fresh_install.py``, run by
``.ci/run``; these tests pin the pieces in the suite's environment by
hiding a module (``sys.modules[name] = None`` makes importing it fail as a
missing package does).
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from celery import Celery
from click.testing import CliRunner

from celery_routines import Scheduler, register
from celery_routines.config import settings_from
from celery_routines.extras import MissingExtra, check_extras
from celery_routines.store.engine import app_argument, explain_database_error
from tests.conftest import FakeClock
from tests.harness import filesystem_app

ROOT = Path(__file__).resolve().parent.parent

# What a base install lacks: every extra's top-level modules.
EXTRA_MODULES = [
    "redis",
    "packaging",
    "kombu.transport.redis",
    "psycopg",
    "pymysql",
    "prometheus_client",
    "starlette",
    "uvicorn",
    "jinja2",
    "ephem",
]


def run_without_extras(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = "import sys\n"
    script += "".join(f"sys.modules[{name!r}] = None\n" for name in EXTRA_MODULES)
    script += textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )


def test_the_package_beat_and_every_command_import_without_any_extra(tmp_path: Path) -> None:
    # kombu.transport.redis imported at module level made all of these fail.
    done = run_without_extras(
        """
        import celery_routines, celery_routines.beat, celery_routines.operator.commands
        import celery_routines.sending.direct, celery_routines.sending.offload
        from celery_routines import Routines, Scheduler, routine, register, spend, Ceiling
        print("imported")
        """,
        tmp_path,
    )
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr


def test_beat_runs_on_sqlite_with_a_non_redis_broker_and_no_extra(tmp_path: Path) -> None:
    done = run_without_extras(
        f"""
        from datetime import UTC, datetime, timedelta
        from celery import Celery
        from celery_routines import Scheduler, register
        app = Celery("base", broker="memory://")
        app.conf.routines_database_url = "sqlite:///{tmp_path / "base.db"}"
        app.conf.routines_publish = "direct"
        register("base.ping", timedelta(seconds=10), name="ping")
        now = [datetime(2026, 12, 2, 12, tzinfo=UTC)]
        beat = Scheduler(app, clock=lambda: now[0])
        beat.tick()
        now[0] += timedelta(seconds=10)
        beat.tick()
        print("sent", beat.last_report.sent)
        beat.close()
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "sent 1" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("conf", "extra", "hidden"),
    [
        ({"routines_redis_url": "redis://127.0.0.1:6379/0"}, "redis", "redis"),
        (
            {"broker_url": "redis://127.0.0.1:6379/0", "routines_publish": "direct"},
            "redis",
            "packaging",
        ),
        ({"routines_database_url": "postgresql://u@127.0.0.1/db"}, "postgres", "psycopg"),
        ({"routines_database_url": "mysql+pymysql://u@127.0.0.1/db"}, "mysql", "pymysql"),
        ({"routines_metrics_port": 9999}, "metrics", "prometheus_client"),
    ],
    ids=["redis-gate", "redis-broker", "postgres", "mysql", "metrics"],
)
def test_a_path_chosen_without_its_extra_is_one_line_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, conf: dict, extra: str, hidden: str
) -> None:
    monkeypatch.setitem(sys.modules, hidden, None)
    if hidden == "packaging":
        monkeypatch.setitem(sys.modules, "kombu.transport.redis", None)
    app = Celery("missing", broker=conf.pop("broker_url", "memory://"))
    app.conf.routines_database_url = f"sqlite:///{tmp_path / 'r.db'}"
    app.conf.update(conf)
    with pytest.raises(MissingExtra) as raised:
        check_extras(app, settings_from(app))
    message = str(raised.value)
    assert f"the {extra!r} extra" in message and "\n" not in message
    assert f"celery-routines[{extra}]" in message


def test_beat_started_without_an_extra_ends_with_one_error_line(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)
    app = filesystem_app(tmp_path / "broker", f"sqlite:///{tmp_path / 'r.db'}")
    app.conf.routines_redis_url = "redis://127.0.0.1:6379/0"
    with (
        caplog.at_level(logging.ERROR, logger="celery_routines.beat"),
        pytest.raises(SystemExit) as stopped,
    ):
        Scheduler(app, clock=clock)
    assert stopped.value.code == 1
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("celery-routines beat cannot start: routines_redis_url (redis://)")
    assert "'redis' extra" in line


def test_routines_web_without_the_web_extra_is_one_line(tmp_path: Path) -> None:
    done = run_without_extras(
        """
        import sys
        from celery import Celery
        from click.testing import CliRunner
        from celery_routines.operator.commands import routines
        class Obj: app = Celery("web", broker="memory://")
        result = CliRunner().invoke(routines, ["web"], obj=Obj())
        print(result.exit_code, repr(result.output))
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    code, output = done.stdout.split(" ", 1)
    assert code == "1"
    lines = eval(output).strip().splitlines()  # the repr printed above
    assert len(lines) == 1 and "the 'web' extra" in lines[0], lines


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


IMPORT_STATEMENT = (
    r"^(?:from celery_routines[\w.]* import (?:\([^)]*\)|[^\n]+)|import celery_routines[\w.]*)"
)


def documented_imports() -> list[tuple[str, str]]:
    """Every ``from celery_routines... import ...`` / ``import celery_routines...``
    statement of the README's and docs/'s Python blocks (parenthesised ones whole)."""
    found = []
    for document in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in python_blocks(document.read_text()):
            for statement in re.findall(IMPORT_STATEMENT, block, flags=re.MULTILINE):
                found.append((document.name, statement.split("#", 1)[0].strip()))
    return found


def test_every_import_the_docs_show_is_executed() -> None:
    imports = documented_imports()
    assert len(imports) >= 5  # the README's own examples at least
    failures = []
    for document, statement in imports:
        try:
            exec(statement, {})
        except Exception as exc:
            failures.append(f"{document}: {statement!r}: {type(exc).__name__}: {exc}")
    assert not failures, "\n".join(failures)


def test_routines_is_importable_from_the_package_and_the_package_is_typed() -> None:
    from celery_routines import Routines
    from celery_routines.operator.admin import Routines as Admin

    assert Routines is Admin
    assert (ROOT / "celery_routines" / "py.typed").exists()
    assert '"py.typed"' in (ROOT / "pyproject.toml").read_text()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["celery", "-A", "proj", "routines", "list"], "proj"),
        (["celery", "--app=proj.celery", "beat"], "proj.celery"),
        (["celery", "-Aproj", "beat"], "proj"),
        (["python", "script.py"], "<app>"),
    ],
)
def test_the_schema_error_names_the_app_the_command_was_given(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], expected: str
) -> None:
    monkeypatch.delenv("CELERY_APP", raising=False)
    assert app_argument(argv) == expected
    monkeypatch.setattr(sys, "argv", argv)
    from sqlalchemy.exc import OperationalError

    error = OperationalError("SELECT", {}, Exception('relation "routines" does not exist'))
    assert f"run `celery -A {expected} routines migrate`" in explain_database_error(
        error, "postgresql://u@h/db"
    )


def test_the_adopted_line_names_the_window_in_the_routines_zone(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    register("tasks.rome", "*/5 * * * *", name="rome", timezone="Europe/Rome")
    app = filesystem_app(tmp_path / "broker", f"sqlite:///{tmp_path / 'r.db'}")
    scheduler = Scheduler(app, clock=clock)
    try:
        with caplog.at_level(logging.INFO, logger="celery_routines.beat"):
            scheduler.tick()
    finally:
        scheduler.close()
    [line] = [r.getMessage() for r in caplog.records if "adopted rome" in r.getMessage()]
    # As the "sent" lines and the idempotency keys write it: local, with the offset.
    assert line.endswith("first window 2026-11-30T13:05:00+01:00"), line


def test_a_stopping_beat_says_it_stopped_and_what_it_handed_back(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    register("tasks.report", "*/5 * * * *", name="report")
    app = filesystem_app(tmp_path / "broker", f"sqlite:///{tmp_path / 'r.db'}")
    scheduler = Scheduler(app, clock=clock)
    scheduler.tick()
    scheduler._stopped_by = "SIGTERM"  # what the stop handler records before closing
    with caplog.at_level(logging.INFO, logger="celery_routines.beat"):
        scheduler.close()
    lines = [r.getMessage() for r in caplog.records]
    assert "beat stopped (SIGTERM): handed 0 routine claim(s) back to the other beats" in lines


def test_the_banner_says_what_wakes_beat(tmp_path: Path) -> None:
    app = filesystem_app(tmp_path / "broker", f"sqlite:///{tmp_path / 'r.db'}")
    banner_instance = Scheduler(app, lazy=True)
    assert (
        ". wake-up -> at each due instant, and every 5 s (routines_refresh_seconds)"
        in banner_instance.info
    )


def test_runs_show_no_attempt_for_a_skipped_window_and_show_names_utc_once(
    tmp_path: Path, clock: FakeClock
) -> None:
    from celery_routines.operator.commands import routines

    register("tasks.slow", "* * * * *", name="slow")  # UTC, the default zone
    app = filesystem_app(tmp_path / "broker", f"sqlite:///{tmp_path / 'r.db'}")
    scheduler = Scheduler(app, clock=clock)
    try:
        scheduler.tick()
        for _ in range(2):  # no worker: the second window is an overlap skip
            clock.advance(minutes=1)
            scheduler.tick()
    finally:
        scheduler.close()

    class Obj:
        pass

    Obj.app = app
    runner = CliRunner()
    table = runner.invoke(routines, ["runs", "slow"], obj=Obj()).output
    [skipped] = [line for line in table.splitlines() if " skipped " in line]
    [sent] = [line for line in table.splitlines() if " sent " in line]
    # WINDOW, then ATTEMPT: "-" for the skip (it was never attempted), "1 of 5" sent.
    assert re.search(r"\+00:00\s+-\s+skipped", skipped), skipped
    assert re.search(r"\+00:00\s+1 of 5\s+sent", sent), sent
    shown = runner.invoke(routines, ["show", "slow"], obj=Obj()).output
    assert "windows (UTC):" in shown and "then UTC" not in shown
