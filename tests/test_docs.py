"""The docs' code blocks are run, not only read.

Every ```python block of README.md and docs/*.md runs in a fresh Python
process, one process per document with the document's blocks in order and
in one namespace (a page's later block builds on its earlier ones). What a
page leaves to the reader (the project's ``app``, a ``build_report`` of
their own, the Django settings) is set up first, on a throwaway SQLite store
and an in-memory broker. Every ``celery ... routines`` command line of a
shell block names a command that exists, and each of its options appears in
that command's ``--help``.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import click
import pytest

from celery_routines.operator.cli import routines

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# A fenced block, indented or not (a block inside a list item is indented).
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<language>[a-z]*)\n(?P<body>.*?)^(?P=indent)```", re.M | re.S
)

# What the pages assume the reader's project has: the routine "nightly" is
# the user guide's, "etl-a" and "etl-b" those the bulk example pauses.
PROJECT = """
import django
from django.conf import settings
from celery import Celery
from celery_routines.operator.admin import Routines

settings.configure(DATABASES={{"default": {{
    "ENGINE": "django.db.backends.sqlite3", "NAME": {django_db!r}}}}})
django.setup()

app = Celery("proj", broker="memory://")
app.conf.routines_database_url = {database_url!r}


def build_report(day):
    return day


with Routines(app) as _routines:
    _routines.migrate()
    _routines.add("nightly", "proj.nightly", cron="30 2 * * *", timezone="Europe/Rome")
    _routines.add("etl-a", "proj.etl", every="1h")
    _routines.add("etl-b", "proj.etl", every="1h")
"""

RUNNER = """
import sys, traceback
blocks = {blocks!r}
namespace = {{"__name__": "docs_example"}}
exec(compile({project!r}, "project", "exec"), namespace)
for label, body in blocks:
    try:
        exec(compile(body, label, "exec"), namespace)
    except Exception:
        print(f"{{label}} failed:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
print(len(blocks), "ran")
"""


def blocks(document: Path, languages: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line number, dedented body) of each fenced block in ``languages``."""
    text = document.read_text()
    return [
        (text.count("\n", 0, match.start()) + 1, textwrap.dedent(match["body"]))
        for match in FENCE.finditer(text)
        if match["language"] in languages
    ]


def with_python() -> list[Path]:
    return [document for document in DOCUMENTS if blocks(document, ("python",))]


@pytest.mark.parametrize("document", with_python(), ids=lambda document: document.name)
def test_every_python_block_of_a_page_runs(document: Path, tmp_path: Path) -> None:
    found = [(f"{document.name}:{line}", body) for line, body in blocks(document, ("python",))]
    project = PROJECT.format(
        django_db=str(tmp_path / "django.db"), database_url=f"sqlite:///{tmp_path}/routines.db"
    )
    done = subprocess.run(
        [sys.executable, "-c", RUNNER.format(blocks=found, project=project)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == f"{len(found)} ran"  # every block, to the last


def command_lines() -> list[tuple[str, str]]:
    """Every ``celery [-A proj] routines ...`` line of a shell block, with
    its continuation lines joined and the prompt and comment dropped."""
    found = []
    for document in DOCUMENTS:
        for line, body in blocks(document, ("", "bash", "sh", "shell", "console")):
            joined = re.sub(r"\\\n\s*", " ", body)
            for number, text in enumerate(joined.splitlines()):
                text = text.removeprefix("$ ").strip()
                if re.match(r"celery (?:-A \S+ )?routines ", text):
                    found.append((f"{document.name}:{line + number + 1}", text))
    return found


def test_every_documented_command_and_option_is_in_the_clis_help() -> None:
    lines = command_lines()
    assert len(lines) >= 30
    failures = []
    for where, text in lines:
        # "[--dry-run]" shows an optional flag: the flag itself must exist.
        words = shlex.split(text.replace("[", " ").replace("]", " "), comments=True)
        words = words[words.index("routines") + 1 :]
        command: click.Command | None = routines
        # A group's sub-command ("import redbeat ...") has its own options.
        while isinstance(command, click.Group) and words:
            name, words = words[0], words[1:]
            command = command.commands.get(name)
            if command is None:
                failures.append(f"{where}: no command {name!r}")
        if command is None:
            continue
        with click.Context(command, info_name=command.name) as context:
            help_text = command.get_help(context)
        for word in words:
            option = word.split("=", 1)[0]
            if option.startswith("-") and not re.search(
                rf"(?<![\w-]){re.escape(option)}(?![\w-])", help_text
            ):
                failures.append(f"{where}: {command.name} has no option {option}")
    assert not failures, "\n".join(failures)
