"""The README and the docs pages its text moved to, true to the letter: what
they list is what the code has, and their example is what the commands
operate on."""

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

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
# The README is the front door; the rest lives in the docs site (mkdocs.yml).
README_MOST_LINES = 250


def page(name: str) -> str:
    return (ROOT / "docs" / name).read_text()


def section(title: str, document: str = README) -> str:
    start = document.index(f"\n{title}\n")
    end = document.find("\n## ", start + len(title) + 2)
    return document[start : end if end != -1 else None]


# The example project is shown twice: the README's smallest setup, and the
# user guide's full section. Both must hold.
EXAMPLE_SECTIONS = [
    ("README.md", "## The smallest real setup", README),
    ("docs/user-guide.md", "## Using it in your project", page("user-guide.md")),
]


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
    table = section("### Settings", page("user-guide.md"))
    names = [f"routines_{field}" for field in Settings.__dataclass_fields__]
    names += [PORT_SETTING, ADDRESS_SETTING]
    for name in names:
        assert f"| `{name}` |" in table, name


def test_the_metrics_list_names_every_metric() -> None:
    pytest.importorskip("prometheus_client")
    from celery_routines.observe.metrics import RoutineMetrics

    listed = section("## Metrics, Flower and Celery events", page("monitoring.md"))
    for family in RoutineMetrics().registry.collect():
        name = f"{family.name}_total" if family.type == "counter" else family.name
        assert f"`{name}" in listed, name
    assert "beat side only" in listed  # routines_duplicates_refused_total


@pytest.mark.parametrize("where", EXAMPLE_SECTIONS, ids=lambda where: where[0])
def test_the_command_block_shows_every_command_and_names_a_declared_routine(
    where: tuple[str, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, title, document = where
    command_section = section("## The `celery routines` command", page("cli.md"))
    [block] = [b for b in code_blocks(command_section) if "-A" in b]
    shown = re.findall(r"^celery -A proj routines (\S+)(?: (\S+))?", block, flags=re.MULTILINE)
    assert {command for command, _ in shown} == set(routines.commands)

    # The example project, imported as proj.py: the names the commands use
    # are the names its routines are stored under.
    [example] = code_blocks(section(title, document), "python")
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


@pytest.mark.parametrize("where", EXAMPLE_SECTIONS, ids=lambda where: where[0])
def test_worker_and_beat_commands_show_the_log_level(where: tuple[str, str, str]) -> None:
    _, title, document = where
    usage = section(title, document)
    commands = re.findall(r"^celery -A proj (?:beat|worker).*$", usage, flags=re.MULTILINE)
    assert len(commands) == 2
    assert all("--loglevel=INFO" in command for command in commands), commands


@pytest.mark.parametrize("where", EXAMPLE_SECTIONS, ids=lambda where: where[0])
def test_the_install_line_works_without_pypi_and_limitations_are_stated(
    where: tuple[str, str, str],
) -> None:
    _, title, document = where
    usage = section(title, document)
    assert "pip install './celery-routines[postgres,redis]'" in usage
    assert "not published on PyPI" in usage
    assert page("limitations.md").startswith("# Limitations\n")
    assert "(docs/limitations.md)" in README


def test_the_flower_section_says_what_its_api_needs() -> None:
    listed = section("## Metrics, Flower and Celery events", page("monitoring.md"))
    assert "answers 401" in listed and "FLOWER_UNAUTHENTICATED_API=true" in listed
    assert "FLOWER_BASIC_AUTH=user:password" in listed
    assert "/api/tasks?search=kwargs:routine=nightly" in listed


def test_the_readme_is_a_front_door() -> None:
    """At most 250 lines, no issue numbers, and every docs page it links exists."""
    assert README.count("\n") <= README_MOST_LINES, README.count("\n")
    assert not re.findall(r"\bissues? \d+", README, flags=re.IGNORECASE)
    for target in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / target).exists(), target
