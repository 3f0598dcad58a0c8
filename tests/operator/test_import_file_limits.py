"""``import file`` refuses what would cost far more than the file: YAML
anchors and aliases (an alias bomb), a file over the size limit, a value over
the value limit; every refusal names the entry and the field."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from celery_routines.operator.importers import files
from celery_routines.operator.importers.django_celery_beat import ImportSourceError

pytest.importorskip("yaml")

BOMB = """\
a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
routines:
  bomb: {task: tasks.ok, every: 60, args: *i}
"""


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    started = time.monotonic()
    with pytest.raises(ImportSourceError) as caught:
        files.read(str(path))
    assert time.monotonic() - started < 0.5
    assert str(caught.value) == (
        f"{path} does not parse: anchors and aliases (&, *) are not accepted (line 1)"
    )


def test_an_alias_alone_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "alias.yaml"
    path.write_text("routines:\n  a: {task: tasks.ok, every: 60}\n  b: *a\n")
    with pytest.raises(ImportSourceError, match=r"not accepted \(line 3\)"):
        files.read(str(path))


def test_a_file_over_the_limit_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"routines": {}}) + " " * 2000)
    monkeypatch.setattr(files, "MAX_FILE_BYTES", 1000)
    with pytest.raises(ImportSourceError) as caught:
        files.read(str(path))
    assert str(caught.value).startswith(f"{path} is too large: 2016 bytes, at most 1000")


def test_a_value_over_the_limit_names_its_entry_and_field(tmp_path: Path) -> None:
    path = tmp_path / "routines.json"
    big = "x" * (files.MAX_VALUE_BYTES + 1)
    path.write_text(
        json.dumps(
            {
                "routines": {
                    "long-task": {"task": big, "every": 60},
                    "long-arg": {"task": "tasks.ok", "every": 60, "kwargs": {"a": big}},
                    "huge-every": {"task": "tasks.ok", "every": 1e308},
                    "ok": {"task": "tasks.ok", "every": 60},
                }
            }
        )
    )
    plan = files.read(str(path))
    assert [p.definition.name for p in plan.routines] == ["ok"]
    problems = {u.name: u.reason for u in plan.unmappable}
    assert problems["long-task"] == f"task is too large: {len(big)} bytes, at most 65536"
    assert problems["long-arg"].startswith("kwargs is too large: ")
    assert problems["huge-every"] == (
        "every must be a number of seconds a timedelta holds, got 1e+308"
    )
