"""Start-up errors of real ``celery`` processes: one ERROR line that says what
is wrong and how to fix it, a non-zero exit, and the traceback only at DEBUG
(issue 17: a missing database printed 1,901 lines, a bad cron 74)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.e2e import processes

pytestmark = pytest.mark.e2e


def celery(cwd: Path, app: str, *args: str, database_url: str) -> subprocess.CompletedProcess[str]:
    env = processes.environment("memory://", database_url)
    env["PYTHONPATH"] = f"{cwd}:{env['PYTHONPATH']}"
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", app, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "ERROR" in line or "CRITICAL" in line]


def bad_app(folder: Path, declaration: str) -> str:
    (folder / "badapp.py").write_text(
        textwrap.dedent(
            f"""
            from celery import Celery
            from celery_routines import routine

            app = Celery("badapp")

            {declaration}
            @app.task
            def nightly(): ...
            """
        )
    )
    return "badapp"


@pytest.mark.postgres
def test_beat_on_a_missing_database_says_create_it_in_one_line(
    postgres_url: str, tmp_path: Path
) -> None:
    missing = postgres_url.rsplit("/", 1)[0] + "/routines_never_created"
    done = celery(
        processes.HERE,
        "e2e_app",
        "beat",
        "-S",
        "routines",
        "--loglevel=INFO",
        database_url=missing,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    [line] = error_lines(output)
    assert "celery-routines beat cannot start: the database 'routines_never_created'" in line
    assert "createdb" in line
    assert "Traceback" not in output
    assert len(output.splitlines()) < 30, output

    debug = celery(
        processes.HERE,
        "e2e_app",
        "beat",
        "-S",
        "routines",
        "--loglevel=DEBUG",
        database_url=missing,
    )
    assert debug.returncode != 0
    assert "Traceback" in debug.stdout + debug.stderr


@pytest.mark.parametrize(
    ("declaration", "message"),
    [
        ('@routine("61 * * * *")', "minute field '61' is out of range 0-59"),
        ('@routine("0 9 * * *", timezone="Mars/Olympus")', "unknown timezone 'Mars/Olympus'"),
    ],
    ids=["bad-cron", "unknown-zone"],
)
@pytest.mark.parametrize("command", [["beat", "-S", "routines"], ["routines", "list"]])
def test_a_bad_routine_in_code_is_one_error_line_naming_the_line(
    tmp_path: Path, declaration: str, message: str, command: list[str]
) -> None:
    app = bad_app(tmp_path, declaration)
    done = celery(tmp_path, app, *command, database_url=f"sqlite:///{tmp_path}/r.db")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Traceback" not in output
    [line] = [line for line in output.splitlines() if line.strip()]
    assert line.startswith("ERROR: celery-routines: cannot load 'badapp': routine 'badapp.nightly'")
    # The declaration is line 7 of badapp.py (after the imports and the app).
    assert message in line and line.endswith("(badapp.py, line 7)")

    if command[0] == "beat":
        debug = celery(
            tmp_path, app, *command, "--loglevel=DEBUG", database_url=f"sqlite:///{tmp_path}/r.db"
        )
        assert debug.returncode == 1
        assert "Traceback" in debug.stderr
