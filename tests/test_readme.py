"""The README, true to the letter (issue 17): what it lists is what the code
has, and its example is what its commands operate on."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest
from celery import _state

from celery_routines import registry
from celery_routines.config import Settings
from celery_routines.observe.metrics import ADDRESS_SETTING, PORT_SETTING
from celery_routines.operator.cli import routines

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def section(title: str) -> str:
    start = README.index(f"\n{title}\n")
    end = README.find("\n## ", start + len(title) + 2)
    return README[start : end if end != -1 else None]


def code_blocks(text: str, language: str = "") -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def test_no_document_holds_a_merge_conflict() -> None:
    root = Path(__file__).resolve().parent.parent
    for document in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        markers = re.findall(r"^(?:<{7}|>{7}) ", document.read_text(), flags=re.MULTILINE)
        assert not markers, f"{document.name} holds conflict markers"


def test_exactly_two_set_up_commands() -> None:
    blocks = code_blocks(section("## The two commands"))
    assert [block.strip() for block in blocks] == [
        "pip install -e . && celery --workdir examples -A quickstart worker -B --loglevel=INFO",
        "pip install -e '.[tests]' && pytest",
    ]


def test_the_settings_table_lists_every_setting() -> None:
    table = section("### Settings")
    names = [f"routines_{field}" for field in Settings.__dataclass_fields__]
    names += [PORT_SETTING, ADDRESS_SETTING]
    for name in names:
        assert f"| `{name}` |" in table, name


def test_the_metrics_list_names_every_metric() -> None:
    pytest.importorskip("prometheus_client")
    from celery_routines.observe.metrics import RoutineMetrics

    listed = section("## Metrics, Flower and Celery events")
    for family in RoutineMetrics().registry.collect():
        name = f"{family.name}_total" if family.type == "counter" else family.name
        assert f"`{name}" in listed, name
    assert "beat side only" in listed  # routines_duplicates_refused_total


def test_the_command_block_shows_every_command_and_names_a_declared_routine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    [block] = [b for b in code_blocks(section("## The `celery routines` command")) if "-A" in b]
    shown = re.findall(r"^celery -A proj routines (\S+)(?: (\S+))?", block, flags=re.MULTILINE)
    assert {command for command, _ in shown} == set(routines.commands)

    # The example project of "Using it in your project", imported as proj.py:
    # the names the commands use are the names its routines are stored under.
    [example] = code_blocks(section("## Using it in your project"), "python")
    (tmp_path / "proj.py").write_text(example)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("proj", None)
    previous = _state.get_current_app()
    try:
        importlib.import_module("proj")
    finally:
        # Its Celery("proj") made itself the current app: later tests' shared
        # tasks would land in it, next to its own proj.* tasks.
        _state._set_current_app(previous)
    declared = {d.name for d in registry.declared()}
    named = {
        arg
        for command, arg in shown
        if arg
        and not arg.isupper()
        and not arg.startswith("-")
        and command not in ("preview", "import")  # a cron; a source
    }
    assert named and named <= declared, (named, declared)
    sys.modules.pop("proj", None)


def test_worker_and_beat_commands_show_the_log_level() -> None:
    usage = section("## Using it in your project")
    commands = re.findall(r"^celery -A proj (?:beat|worker).*$", usage, flags=re.MULTILINE)
    assert len(commands) == 2
    assert all("--loglevel=INFO" in command for command in commands), commands


def test_the_install_line_works_without_pypi_and_limitations_are_stated() -> None:
    usage = section("## Using it in your project")
    assert "pip install './celery-routines[postgres,redis]'" in usage
    assert "not published on PyPI" in usage
    assert "## Limitations" in README


def test_the_flower_section_says_what_its_api_needs() -> None:
    listed = section("## Metrics, Flower and Celery events")
    assert "answers 401" in listed and "FLOWER_UNAUTHENTICATED_API=true" in listed
    assert "FLOWER_BASIC_AUTH=user:password" in listed
    assert "/api/tasks?search=kwargs:routine=nightly" in listed
