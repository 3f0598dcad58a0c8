"""Text the CLI prints cannot drive the terminal nor forge a line: names and
task names refuse control characters; any other stored text (a pause reason
written by SQL, an import's entry name) is printed with them escaped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import update

from celery_routines.errors import InvalidRoutine
from celery_routines.policy.routine import define
from celery_routines.store import Store
from celery_routines.store.models import ROUTINES
from tests.conftest import FakeClock
from tests.operators import add_routine, cli_invoker, make_app, ok

TITLE = "\x1b]0;owned\x07"
FLIP = "\u202e"
FORGED = "tasks.ok\nnightly  running  tasks.evil"


@pytest.fixture
def invoke(store: Store, database_url: str, tmp_path: Path, clock: FakeClock, monkeypatch):  # type: ignore[no-untyped-def]
    return cli_invoker(make_app(tmp_path / "broker", database_url), clock, monkeypatch)


def test_a_task_name_with_a_control_character_is_refused() -> None:
    for task in (FORGED, f"tasks.{FLIP}ok", f"tasks.{TITLE}"):
        with pytest.raises(InvalidRoutine) as caught:
            define(task, 60, name="nightly")
        assert str(caught.value).startswith(
            "routine 'nightly': task name must not contain control characters or line breaks"
        )
        assert "\n" not in str(caught.value) and "\x1b" not in str(caught.value)


def test_show_and_list_escape_what_sql_stored(invoke, store: Store) -> None:  # type: ignore[no-untyped-def]
    add_routine(store, "nightly")
    add_routine(store, "forged")
    with store.engine.begin() as conn:
        conn.execute(
            update(ROUTINES)
            .where(ROUTINES.c.name == "nightly")
            .values(paused=True, paused_reason=f"{TITLE}maintenance {FLIP}gnp.exe")
        )
        conn.execute(update(ROUTINES).where(ROUTINES.c.name == "forged").values(task=FORGED))
    for out in (ok(invoke("show", "nightly")), ok(invoke("show", "forged")), ok(invoke("list"))):
        assert "\x1b" not in out and "\x07" not in out and FLIP not in out
        assert "tasks.evil" not in out or "\\ntasks.evil" in out.replace("nightly  running  ", "")
        assert not any(line.startswith("nightly  running") for line in out.splitlines())
    shown = ok(invoke("show", "nightly"))
    assert "\\x1b]0;owned\\x07maintenance \\u202egnp.exe" in shown
    # Beat marks it invalid (the model refuses the task name); show prints it escaped.
    assert "tasks.ok\\nnightly  running  tasks.evil" in ok(invoke("show", "forged"))


def test_the_import_report_escapes_entry_names(invoke, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "routines.json"
    forged = "x\nadded         evil"
    path.write_text(json.dumps({"routines": {forged: {"task": "tasks.ok", "every": 60}}}))
    result = invoke("import", "file", str(path))
    lines = result.stdout.splitlines()
    assert not any(line.startswith("added") for line in lines)
    assert lines[0].startswith("not imported  x\\nadded         evil: name must not contain")
