"""args, kwargs and options are capped in depth and size at the one check
every door uses: a body nested hundreds deep is refused naming the field and
nothing is stored; a row SQL wrote with such args is an invalid routine, and
the API and ``show --json`` answer for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import update

from celery_routines.errors import InvalidRoutine
from celery_routines.operator.admin import Routines
from celery_routines.policy.option_values import JSON_BYTES_LIMIT, JSON_DEPTH_LIMIT
from celery_routines.policy.routine import define
from celery_routines.policy.routine_rows import from_columns
from celery_routines.store import Store
from celery_routines.store.models import ROUTINES
from tests.conftest import FakeClock
from tests.operator.web.conftest import BEARER, client_for
from tests.operators import add_routine, cli_invoker, make_app, ok, one_error

DEEP = "[" * 900 + "]" * 900


def nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_define_caps_depth_and_size_naming_the_routine_and_field() -> None:
    define("tasks.ok", 60, name="at-limit", args=nested(JSON_DEPTH_LIMIT))
    with pytest.raises(InvalidRoutine) as deep:
        define("tasks.ok", 60, name="deep", args=nested(JSON_DEPTH_LIMIT + 1))
    assert str(deep.value) == (
        f"routine 'deep': args is nested too deep: more than {JSON_DEPTH_LIMIT} levels"
    )
    with pytest.raises(InvalidRoutine, match="routine 'big': kwargs is too large: "):
        define("tasks.ok", 60, name="big", kwargs={"a": "x" * JSON_BYTES_LIMIT})
    with pytest.raises(InvalidRoutine, match="routine 'many': options is too large: "):
        define("tasks.ok", 60, name="many", options={"a": [0] * JSON_BYTES_LIMIT})


def test_a_deep_body_is_refused_and_nothing_is_stored(admin: Routines, store: Store) -> None:
    client = client_for(admin)
    body = '{"name": "deep", "task": "tasks.ok", "every": 60, "args": ' + DEEP + "}"
    answer = client.post(
        "/api/routines", content=body, headers={**BEARER, "Content-Type": "application/json"}
    )
    assert 400 <= answer.status_code < 500
    assert "args is nested too deep" in answer.text
    assert store.routines.by_name("deep") is None
    too_deep = client.post(
        "/api/routines",
        content="[" * 100_000 + "]" * 100_000,
        headers={**BEARER, "Content-Type": "application/json"},
    )
    assert too_deep.status_code == 400
    assert "nested too deep" in too_deep.text


def test_a_row_sql_wrote_with_deep_args_is_invalid_and_every_view_answers(
    admin: Routines,
    store: Store,
    database_url: str,
    tmp_path: Path,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    add_routine(store, "deep")
    with store.engine.begin() as conn:
        conn.execute(update(ROUTINES).where(ROUTINES.c.name == "deep").values(args=DEEP))
    record = store.routines.by_name("deep")
    with pytest.raises(InvalidRoutine, match="args is nested too deep"):
        from_columns(record)
    client = client_for(admin)
    answer = client.get("/api/routines/deep")
    assert answer.status_code == 200
    assert answer.json()["definition"]["args"] == DEEP
    assert client.get("/api/routines").status_code == 200
    assert client.get("/routines/deep").status_code == 200
    invoke = cli_invoker(make_app(tmp_path / "broker", database_url), clock, monkeypatch)
    shown = json.loads(ok(invoke("show", "deep", "--json")))
    assert shown["definition"]["args"] == DEEP
    ok(invoke("show", "deep"))


def test_the_cli_refuses_deep_args_in_one_line(
    store: Store, database_url: str, tmp_path: Path, clock: FakeClock, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    invoke = cli_invoker(make_app(tmp_path / "broker", database_url), clock, monkeypatch)
    deep = one_error(invoke("add", "deep", "tasks.ok", "--every", "60", "--args", DEEP))
    assert "routine 'deep': args is nested too deep: more than 32 levels" in deep
    deeper = "[" * 100_000 + "]" * 100_000
    line = one_error(invoke("add", "deeper", "tasks.ok", "--every", "60", "--args", deeper))
    assert "--args is nested too deep" in line
    assert store.routines.by_name("deep") is None and store.routines.by_name("deeper") is None
