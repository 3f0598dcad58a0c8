"""One table of options, tried at every door: the decorator, ``celery
routines add`` and ``edit``, the HTTP API's create, edit and validate, the
panel's new and edit forms, and ``import file``. A value is accepted at each
door exactly when the decorator accepts it, and refused with the
decorator's words (the door adds only where it says them)."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from celery_routines import routine
from celery_routines.errors import InvalidRoutine
from celery_routines.operator import cli
from celery_routines.operator.admin import Routines
from celery_routines.policy.routine import KEYWORDS
from celery_routines.store import Store
from tests.conftest import FakeClock
from tests.operators import cli_context, make_app

pytest.importorskip("starlette", reason="the API and panel doors need the web extra")

from starlette.testclient import TestClient

from tests.operator.web.conftest import BEARER, client_for
from tests.operator.web.test_routine_forms import csrf_of, prefilled

NAME = "doors"
TASK = "tasks.noop"
WEEKDAYS = "0 8 * * 1-5"
HOURLY = 3600


@dataclass(frozen=True)
class Case:
    """An option's value on a routine with a cron (``every`` unset) or an
    interval; ``refused``: whether the decorator refuses it."""

    option: str
    value: Any
    every: int | None = None
    refused: bool = False

    @property
    def id(self) -> str:
        schedule = "interval" if self.every else "cron"
        return f"{self.option}={self.value!r}-{schedule}-{'refused' if self.refused else 'ok'}"


CASES = (
    Case("shift", "next_business_day"),
    Case("shift", "previous_business_day"),
    Case("shift", "next_business_day", every=HOURLY, refused=True),
    Case("shift", "someday", refused=True),
    Case("exclude", ["holidays:IT"]),
    Case("exclude", ["2026-12-24..2026-12-26", "30 8 * * *"]),
    Case("exclude", ["holidays:XX"], refused=True),
    Case("exclude", ["2026-02-30"], refused=True),
    Case("exclude", ["holidays:IT"], every=HOURLY),
    Case("timezone", "Europe/Rome"),
    Case("timezone", "Mars/Olympus", refused=True),
    Case("max_retries", 0),
    Case("max_retries", 101, refused=True),
    Case("overlap", "queue"),
    Case("overlap", "sometimes", refused=True),
    Case("catch_up", "latest"),
    Case("catch_up", "sometimes", refused=True),
    Case("catch_up_cap", 0, refused=True),
    Case("jitter", 30),
    Case("jitter", 86401, refused=True),
    Case("pause_after_failures", 3),
    Case("pause_after_failures", 1001, refused=True),
    Case("pause_after_failures", -1, refused=True),
)


def decorator_problem(case: Case) -> str | None:
    """The decorator's answer: None (accepted) or its message without the
    routine's name, which every other door must say."""
    schedule: Any = timedelta(seconds=case.every) if case.every else WEEKDAYS
    value = tuple(case.value) if isinstance(case.value, list) else case.value
    try:
        routine(schedule, name=NAME, **{case.option: value})(TASK)
    except InvalidRoutine as exc:
        return exc.problem
    return None


def text_of(value: Any) -> str:
    """As typed into the form: a list one item a line."""
    return "\n".join(value) if isinstance(value, list) else str(value)


def flags_of(case: Case) -> list[str]:
    flag = KEYWORDS[case.option].cli_flag
    values = case.value if isinstance(case.value, list) else [case.value]
    return [part for value in values for part in (flag, str(value))]


# -- the doors: each answers None (accepted) or what it said ---------------------------


class Doors:
    def __init__(self, admin: Routines, tmp_path: Path) -> None:
        self.admin = admin
        self.tmp_path = tmp_path
        self.client: TestClient = client_for(admin)

    def stored(self) -> Any:
        return self.admin.store.routines.by_name(NAME)

    def store_plain(self, case: Case) -> None:
        """The routine the edit doors change: its schedule, no options."""
        schedule = {"every": case.every} if case.every else {"cron": WEEKDAYS}
        self.admin.add(NAME, TASK, **schedule)

    def cli(self, *argv: str) -> str | None:
        result = CliRunner().invoke(cli.routines, list(argv), obj=cli_context(self.admin.app))
        if result.exit_code == 0:
            return None
        assert result.output.count("\n") == 1 and "Traceback" not in result.output
        return result.output

    def cli_add(self, case: Case) -> str | None:
        schedule = ["--every", str(case.every)] if case.every else ["--cron", WEEKDAYS]
        return self.cli("add", NAME, TASK, *schedule, *flags_of(case))

    def cli_edit(self, case: Case) -> str | None:
        self.store_plain(case)
        return self.cli("edit", NAME, *flags_of(case))

    def api_body(self, case: Case) -> dict[str, Any]:
        schedule = {"interval_seconds": case.every} if case.every else {"cron": WEEKDAYS}
        return {"name": NAME, "task": TASK, **schedule, case.option: case.value}

    def answered(self, answer: Any, ok: int, case: Case) -> str | None:
        """None for ``ok``; else the error of a 422 that names the option's field."""
        assert answer.status_code in (ok, 422), answer.text
        if answer.status_code == ok:
            return None
        assert case.option in answer.json()["fields"], answer.json()
        return str(answer.json()["error"])

    def api_create(self, case: Case) -> str | None:
        answer = self.client.post("/api/routines", json=self.api_body(case), headers=BEARER)
        return self.answered(answer, 201, case)

    def api_edit(self, case: Case) -> str | None:
        self.store_plain(case)
        answer = self.client.patch(
            f"/api/routines/{NAME}", json={case.option: case.value}, headers=BEARER
        )
        return self.answered(answer, 200, case)

    def api_validate(self, case: Case) -> str | None:
        fields = {k: text_of(v) for k, v in self.api_body(case).items()}
        answer = self.client.post(
            "/api/routines/validate", json={"fields": fields}, headers=BEARER
        ).json()
        return None if answer["ok"] else " ".join(answer["fields"].values())

    def form_answer(self, answer: Any) -> str | None:
        if answer.status_code == 303:
            return None
        assert answer.status_code == 422, answer.text
        errors = re.findall(r'id="error-\w+"[^>]*>([^<]+)<', answer.text)
        assert errors, answer.text
        return html.unescape(" ".join(errors))

    def form_new(self, case: Case) -> str | None:
        page = self.client.get("/new").text
        texts = {k: text_of(v) for k, v in self.api_body(case).items()}
        answer = self.client.post(
            "/new", data={**texts, "csrf_token": csrf_of(page)}, follow_redirects=False
        )
        return self.form_answer(answer)

    def form_edit(self, case: Case) -> str | None:
        """The stored routine's form as the page fills it in, one input changed."""
        self.store_plain(case)
        page = self.client.get(f"/edit/{NAME}").text
        texts = {**prefilled(page), case.option: text_of(case.value)}
        answer = self.client.post(
            f"/edit/{NAME}", data={**texts, "csrf_token": csrf_of(page)}, follow_redirects=False
        )
        return self.form_answer(answer)

    def import_file(self, case: Case) -> str | None:
        schedule = {"every": case.every} if case.every else {"cron": WEEKDAYS}
        entry = {"task": TASK, **schedule, case.option: case.value}
        path = self.tmp_path / "routines.json"
        path.write_text(json.dumps({"version": 1, "routines": {NAME: entry}}))
        result = CliRunner().invoke(
            cli.routines, ["import", "file", str(path)], obj=cli_context(self.admin.app)
        )
        assert "Traceback" not in result.output
        return None if result.exit_code == 0 else result.output


DOORS: dict[str, Callable[[Doors, Case], str | None]] = {
    "cli add": Doors.cli_add,
    "cli edit": Doors.cli_edit,
    "api create": Doors.api_create,
    "api edit": Doors.api_edit,
    "api validate": Doors.api_validate,
    "form new": Doors.form_new,
    "form edit": Doors.form_edit,
    "import file": Doors.import_file,
}


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    """The doors are the same code on every store."""
    return sqlite_url


@pytest.fixture
def admin(store: Store, database_url: str, tmp_path: Path, clock: FakeClock) -> Iterator[Routines]:
    routines = Routines(make_app(tmp_path / "broker", database_url), clock=clock, store=store)
    yield routines
    routines.close()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@pytest.mark.parametrize("door", DOORS)
def test_every_door_accepts_an_option_when_the_decorator_does_with_its_words(
    admin: Routines, tmp_path: Path, case: Case, door: str
) -> None:
    problem = decorator_problem(case)
    assert (problem is not None) == case.refused, problem
    doors = Doors(admin, tmp_path)
    said = DOORS[door](doors, case)
    if problem is None:
        assert said is None, said
        stored = doors.stored()
        assert door == "api validate" or (stored is not None and stored.last_error is None)
    else:
        assert said is not None and problem in said, (said, problem)
        if door.endswith("edit"):  # nothing stored is lost
            stored = doors.stored()
            assert stored is not None and stored.cron == (None if case.every else WEEKDAYS)
        elif door != "api validate":
            assert doors.stored() is None


def test_a_routine_with_a_shift_is_edited_and_cloned_in_the_panel(admin: Routines) -> None:
    """Re-submitting its edit form with only max_retries changed saves it;
    its clone saves too; the docs' validate example reads."""
    admin.add(NAME, TASK, cron="0 9 25 * *", exclude=["holidays:IT"], shift="next_business_day")
    doors = Doors(admin, Path("."))
    client = doors.client
    page = client.get(f"/edit/{NAME}").text
    texts = {**prefilled(page), "max_retries": "1", "csrf_token": csrf_of(page)}
    edited = client.post(f"/edit/{NAME}", data=texts, follow_redirects=False)
    assert edited.status_code == 303, edited.text
    stored = doors.stored()
    assert (stored.max_retries, stored.shift) == (1, "next_business_day")
    clone = client.get(f"/clone/{NAME}").text
    texts = {**prefilled(clone), "csrf_token": csrf_of(clone)}
    cloned = client.post("/new", data=texts, follow_redirects=False)
    assert cloned.status_code == 303, cloned.text
    copy = admin.store.routines.by_name(f"{NAME}-copy")
    assert copy is not None and copy.shift == "next_business_day"
    patched = client.patch(
        f"/api/routines/{NAME}", json={"shift": "previous_business_day"}, headers=BEARER
    )
    assert patched.status_code == 200, patched.text
    fields = {"name": "pay", "task": TASK, "cron": "0 9 25 * *", "shift": "previous_business_day"}
    answer = client.post("/api/routines/validate", json={"fields": fields}, headers=BEARER).json()
    assert answer["ok"] and answer["fields"] == {} and answer["windows"], answer
