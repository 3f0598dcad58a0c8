"""A bad routine declared in the app's code (an invalid cron, an unknown zone:
it fails when Celery imports ``-A``) as one ERROR line and exit 1 under every
``celery`` command, instead of Celery's 70-line double traceback."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import click

from celery_routines.errors import RoutinesError

# Frames inside the package are not the user's line.
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _routines_error_in(exc: BaseException) -> RoutinesError | None:
    """Our error behind ``exc``: kombu re-raises an import error as a
    ValueError whose context is the original."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, RoutinesError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _declared_at(exc: BaseException) -> str | None:
    """``proj.py, line 6``: the user's line that made the bad declaration
    (the innermost frame outside celery-routines and the import machinery)."""
    package = PACKAGE
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        path = os.path.abspath(frame.filename)
        if path.startswith(package + os.sep) or frame.filename.startswith("<frozen"):
            continue
        found = frame
    if found is None:
        return None
    return f"{os.path.basename(found.filename)}, line {found.lineno}"


def _debug_requested(argv: Sequence[str]) -> bool:
    """True when the command line asks for DEBUG logs (-l DEBUG, --loglevel=debug)."""
    for index, arg in enumerate(argv):
        value = None
        if arg.startswith("--loglevel="):
            value = arg.split("=", 1)[1]
        elif arg in ("-l", "--loglevel") and index + 1 < len(argv):
            value = argv[index + 1]
        elif arg.startswith("-l") and len(arg) > 2:
            value = arg[2:]
        if value is not None and value.strip().upper() == "DEBUG":
            return True
    return False


def _short_app_errors(find_app: Callable[..., Any]) -> Callable[..., Any]:
    def find_app_briefly(app: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return find_app(app, *args, **kwargs)
        except Exception as exc:
            ours = _routines_error_in(exc)
            if ours is None:
                raise
            where = _declared_at(ours)
            line = f"ERROR: celery-routines: cannot load {app!r}: {ours}"
            click.echo(line + (f" ({where})" if where else ""), err=True)
            if _debug_requested(sys.argv):
                click.echo("".join(traceback.format_exception(ours)), err=True, nl=False)
            # SystemExit, not an Exception: Celery would print the traceback
            # of any Exception twice, around the one line that matters.
            raise SystemExit(1) from None

    find_app_briefly.routines_wrapped = True  # type: ignore[attr-defined]
    return find_app_briefly


def install_short_app_errors() -> None:
    """Make a bad routine declared in the app's code (an invalid cron, an
    unknown zone: it fails at import) one ERROR line and exit 1 under every
    ``celery`` command, instead of Celery's 70-line double traceback.

    Celery imports this module through the ``celery.commands`` entry point
    before it loads ``-A``, so this is the one place that can do it. Only
    when the ``celery`` command is running: importing this module elsewhere
    changes nothing.
    """
    command = sys.modules.get("celery.bin.celery")
    find_app = getattr(command, "find_app", None)
    if find_app is None or getattr(find_app, "routines_wrapped", False):
        return
    command.find_app = _short_app_errors(find_app)  # type: ignore[union-attr]
