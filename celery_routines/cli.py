"""``celery -A proj routines ...``: the operator's command.

Registered as a Celery 5 sub-command (entry point group ``celery.commands``),
so it runs with the app Celery loaded from ``-A``. This module only parses
arguments and prints; :mod:`celery_routines.admin` decides. Every error is one
line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
from sqlalchemy.exc import SQLAlchemyError

from .admin import (
    MAX_BACKFILL,
    BackfillResult,
    PauseResult,
    RoutineDetail,
    Routines,
    RunView,
    SendResult,
    WindowView,
    preview,
)
from .admin_views import RoutineSummary, attempt_text
from .clock import Clock, utc_now
from .config import settings_from
from .dispatch import SEND_FAILED
from .errors import RoutinesError
from .store.engine import explain_database_error
from .store.models import RUN_STATES

F = TypeVar("F", bound=Callable[..., Any])

# The clock the commands read "now" from; tests replace it (never sleep).
CLOCK: Clock = utc_now

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _errors(command: F) -> F:
    """Our errors and bad values become one clean line and exit code 1."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (RoutinesError, ValueError, LookupError) as exc:
            raise click.ClickException(_one_line(exc)) from None
        except SQLAlchemyError as exc:
            # "Does not exist" alone could be the database, a user or a table:
            # each has its own fix, so the message tells them apart.
            raise click.ClickException(explain_database_error(exc, _database_url())) from None

    return wrapper  # type: ignore[return-value]


def _database_url() -> str | None:
    """The store URL of the app being operated (for naming it in errors)."""
    ctx = click.get_current_context(silent=True)
    app = getattr(getattr(ctx, "obj", None), "app", None) if ctx is not None else None
    try:
        return settings_from(app).database_url
    except RoutinesError:
        return None


def _admin(ctx: click.Context) -> Routines:
    app = getattr(ctx.obj, "app", None)
    if app is None:
        from celery import current_app

        app = current_app._get_current_object()
    admin = Routines(app, clock=CLOCK)
    ctx.call_on_close(admin.close)
    return admin


# -- printing ------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        data = {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, BackfillResult):
            data.update(sent=value.sent, existing=value.existing, failed=value.failed)
        return data
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _print_json(value: Any) -> None:
    click.echo(json.dumps(_jsonable(value), indent=2))


def _utc(instant: datetime | None) -> str:
    return instant.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if instant else "-"


def _local(instant: datetime | None) -> str:
    # The zone abbreviation (CET/CEST) shows which side of a transition it is.
    return instant.strftime("%Y-%m-%d %H:%M:%S %Z") if instant else "-"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for row in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _windows(windows: Sequence[WindowView]) -> None:
    for w in windows:
        note = f"  ({w.note})" if w.note else ""
        click.echo(f"  {_utc(w.utc)}   {_local(w.local)}{note}")


def _runs_table(runs: Sequence[RunView]) -> None:
    if not runs:
        click.echo("no runs")
        return
    _table(
        ["RUN ID", "ROUTINE", "WINDOW", "ATTEMPT", "STATE", "RETRY AT", "REASON", "WRITTEN"],
        [
            (
                r.id,
                r.routine,
                r.idempotency_key.split("@", 1)[-1],
                attempt_text(r.attempt, r.max_attempts),
                r.state,
                _utc(r.retry_at),
                r.reason or r.error,
                _utc(r.created_at),
            )
            for r in runs
        ],
    )


def _next_run_cells(s: RoutineSummary) -> tuple[str, str]:
    """The NEXT RUN cells of ``list``. A bare time would read as "it fires
    then": for an invalid routine the stored instant is only when beat looks
    at it again, and a paused or disabled routine fires nothing."""
    if s.next_run_utc is None:
        return "-", "-"
    if s.state == "invalid":
        return f"invalid, re-checked at {_utc(s.next_run_utc)}", "-"
    if s.state in ("paused", "disabled"):
        return (
            f"{s.state} (would be next: {_utc(s.next_run_utc)})",
            f"(would be next: {_local(s.next_run_local)})",
        )
    return _utc(s.next_run_utc), _local(s.next_run_local)


def _send_line(result: SendResult) -> str:
    if result.outcome == SEND_FAILED:
        return f"NOT SENT {result.idempotency_key} (run {result.run_id}): {result.error}"
    if result.outcome == "exists":
        return f"already stored {result.idempotency_key} ({result.existing_state}): not sent again"
    attempt = attempt_text(result.attempt, result.max_attempts)
    return f"sent {result.idempotency_key} attempt {attempt} as run {result.run_id}"


def _fail_if_not_sent(results: Sequence[SendResult]) -> None:
    failed = [r for r in results if r.outcome == SEND_FAILED]
    if failed:
        raise click.ClickException(
            f"{len(failed)} run(s) could not be sent: {failed[0].error}; recorded, and "
            "retried under the routine's retry policy (see runs --state retrying)"
        )


# -- the commands --------------------------------------------------------------


@click.group(name="routines")
def routines() -> None:
    """Inspect and operate celery-routines (the database-backed beat)."""


@routines.command(name="list")
@json_option
@click.pass_context
@_errors
def list_(ctx: click.Context, as_json: bool) -> None:
    """Every stored routine: schedule, next run, state and last outcome."""
    summaries = _admin(ctx).list()
    if as_json:
        _print_json(summaries)
        return
    if not summaries:
        click.echo("no routines stored (beat writes the ones declared in code when it starts)")
        return
    _table(
        [
            "NAME",
            "SCHEDULE",
            "TIMEZONE",
            "NEXT RUN (UTC)",
            "NEXT RUN (LOCAL)",
            "STATE",
            "LAST",
            "NEXT RETRY (UTC)",
        ],
        [
            (
                s.name,
                s.schedule,
                s.timezone,
                *_next_run_cells(s),
                s.state,
                s.last_outcome,
                _utc(s.next_retry_at),
            )
            for s in summaries
        ],
    )


@routines.command()
@click.argument("name")
@click.option("-n", "windows", default=5, show_default=True, help="How many next windows.")
@json_option
@click.pass_context
@_errors
def show(ctx: click.Context, name: str, windows: int, as_json: bool) -> None:
    """One routine: definition, next windows with DST notes, spend this period."""
    detail = _admin(ctx).show(name, windows=windows)
    if as_json:
        _print_json(detail)
        return
    _print_detail(detail)


def _words(value: Any) -> str:
    """A definition value as a person reads it: no JSON ``null``/``true``."""
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | dict) and not value:
        return "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str | int | float):
        return str(value)
    # Arguments as the task receives them, in Python's spelling (as Flower
    # shows them): ['eu'], {'dry_run': True}.
    return repr(value)


def _ceiling_words(value: Any) -> str:
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        return _words(value)
    return (
        ", ".join(
            f"{_words(c.get('limit'))} {c.get('unit', 'fires')} per {c.get('per')}" for c in value
        )
        or "none"
    )


def _field(key: str, value: str) -> None:
    click.echo(f"  {key + ':':<20} {value}")


def _print_detail(detail: RoutineDetail) -> None:
    s = detail.summary
    click.echo(f"{s.name}  [{s.state}]")
    _field("schedule", s.schedule)
    for key, value in detail.definition.items():
        if key == "timezone":
            # The zone the schedule is read in, also when the row leaves it
            # to routines_timezone.
            _field(key, s.timezone if value else f"{s.timezone} (routines_timezone)")
        elif key == "ceiling":
            _field(key, _ceiling_words(value))
        else:
            _field(key, _words(value))
    last = f"{s.last_outcome} at {_utc(s.last_run_at)}" if s.last_outcome else "no runs yet"
    _field("last outcome", last)
    retrying = len(detail.retrying)
    _field(
        "open runs",
        f"{detail.open_runs} ({retrying} retrying)" if retrying else str(detail.open_runs),
    )
    for run in detail.retrying:
        _field(
            "next retry",
            f"{_utc(run.retry_at)}, attempt {attempt_text(run.attempt + 1, run.max_attempts)} "
            f"of {run.idempotency_key}",
        )
    if detail.last_error:
        _field("invalid", detail.last_error)
        if s.next_run_utc is not None:
            _field("re-checked at", _utc(s.next_run_utc))
    if detail.suspended_until:
        _field(
            "suspended until",
            f"{_utc(detail.suspended_until)} ({detail.suspended_reason or 'no reason recorded'})",
        )
    if detail.schedule_error:
        _field("schedule error", detail.schedule_error)
    else:
        heading = f"next {len(detail.next_windows)} windows (UTC, then {s.timezone})"
        if s.state in ("paused", "disabled"):
            heading += f"; {s.state}: none of them fires until it is " + (
                "resumed" if s.state == "paused" else "enabled"
            )
        click.echo(heading + ":")
        _windows(detail.next_windows)
    if detail.ceiling_error:
        _field("ceiling error", detail.ceiling_error)
    if detail.ceilings:
        click.echo("spend this period:")
        for c in detail.ceilings:
            click.echo(
                f"  {c.spent:g} of {c.limit:g} {c.unit} per {c.per} "
                f"({_utc(c.period_start)} to {_utc(c.period_end)})"
            )


@routines.command()
@click.argument("name", required=False)
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(RUN_STATES),
    help="Only runs in this state (repeatable).",
)
@click.option("--since", help="Only runs written since: 2026-11-30, 2026-11-30T08:00, 2h, 7d.")
@click.option("--limit", default=50, show_default=True, help="At most this many, newest first.")
@json_option
@click.pass_context
@_errors
def runs(
    ctx: click.Context,
    name: str | None,
    states: tuple[str, ...],
    since: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Run rows, newest first, of one routine or all. A date without an
    offset is UTC."""
    found = _admin(ctx).runs(name, state=list(states), since=since, limit=limit)
    if as_json:
        _print_json(found)
    else:
        _runs_table(found)


@routines.command()
@click.option("--since", help="Only skips written since: 2026-11-30, 2h, 7d (UTC).")
@click.option("--limit", default=1000, show_default=True, help="At most this many, newest first.")
@json_option
@click.pass_context
@_errors
def skips(ctx: click.Context, since: str | None, limit: int, as_json: bool) -> None:
    """Every decision not to fire (skipped run rows) with its reason and count."""
    found = _admin(ctx).skips(since=since, limit=limit)
    if as_json:
        _print_json(found)
        return
    if not found:
        click.echo("no skips")
        return
    _table(
        ["ROUTINE", "REASON", "COUNT", "FIRST WINDOW", "LAST WINDOW", "WRITTEN", "RUN ID"],
        [
            (
                r.routine,
                r.reason,
                r.skipped_count or 1,
                _utc(r.skipped_first or r.scheduled_for),
                _utc(r.skipped_last or r.scheduled_for),
                _utc(r.created_at),
                r.id,
            )
            for r in found
        ],
    )


@routines.command()
@click.argument("name")
@json_option
@click.pass_context
@_errors
def pause(ctx: click.Context, name: str, as_json: bool) -> None:
    """Stop firing NAME until it is resumed (no retries are scheduled meanwhile)."""
    _print_pause(_admin(ctx).pause(name), as_json)


@routines.command()
@click.argument("name")
@click.option(
    "--catch-up",
    is_flag=True,
    help="Treat the paused time like downtime: leave the next window where it was, "
    "so beat replays missed windows under the routine's catch_up policy and cap.",
)
@json_option
@click.pass_context
@_errors
def resume(ctx: click.Context, name: str, catch_up: bool, as_json: bool) -> None:
    """Fire NAME again.

    By default a pause is a decision, not an outage: the windows that fell due
    while paused are recorded as one skipped run (reason "paused") and the
    routine continues with its first window after now, so a long pause never
    comes back as a burst, whatever its catch_up policy. Pass --catch-up to
    let the catch_up policy decide instead.
    """
    _print_pause(_admin(ctx).resume(name, catch_up=catch_up), as_json)


def _print_pause(result: PauseResult, as_json: bool) -> None:
    if as_json:
        _print_json(result)
        return
    verb = "paused" if result.paused else "resumed"
    if not result.changed:
        click.echo(f"{result.routine} was already {'paused' if result.paused else 'running'}")
        return
    if result.paused:
        # Not "next window": a paused routine fires nothing at that time.
        line = f"paused {result.routine} (would be next: {_utc(result.next_run_at)})"
    else:
        line = f"{verb} {result.routine}; next window {_utc(result.next_run_at)}"
    if result.skipped_windows:
        line += f"; {result.skipped_windows} window(s) missed while paused recorded as skipped"
    click.echo(line)


@routines.command()
@click.argument("name")
@click.option("--force", is_flag=True, help="Send even over an open run or a spent ceiling.")
@json_option
@click.pass_context
@_errors
def trigger(ctx: click.Context, name: str, force: bool, as_json: bool) -> None:
    """Send NAME now under a manual key (NAME@manual:<uuid>) that never collides
    with a window. Refused while an open run exists under overlap skip/queue, or
    when a ceiling is spent, unless --force."""
    result = _admin(ctx).trigger(name, force=force)
    _print_json(result) if as_json else click.echo(_send_line(result))
    _fail_if_not_sent([result])


@routines.command()
@click.argument("run_id")
@click.option("--force", is_flag=True, help="Send even over an open run or a spent ceiling.")
@json_option
@click.pass_context
@_errors
def replay(ctx: click.Context, run_id: str, force: bool, as_json: bool) -> None:
    """Resend a failed, skipped or lost run as the next attempt of its window."""
    result = _admin(ctx).replay(run_id, force=force)
    _print_json(result) if as_json else click.echo(_send_line(result))
    _fail_if_not_sent([result])


@routines.command()
@click.argument("name")
@click.option("--from", "start", required=True, help="First instant (in the routine's zone).")
@click.option("--to", "end", required=True, help="Last instant, not in the future.")
@click.option(
    "--max",
    "max_windows",
    default=MAX_BACKFILL,
    show_default=True,
    help="Refuse a range with more windows than this.",
)
@click.option("--force", is_flag=True, help="Send even over an open run or a spent ceiling.")
@json_option
@click.pass_context
@_errors
def backfill(
    ctx: click.Context,
    name: str,
    start: str,
    end: str,
    max_windows: int,
    force: bool,
    as_json: bool,
) -> None:
    """Send the windows of NAME from --from to --to (both included), oldest first.

    Each window goes out under its own window key, so a window that already
    has a run (sent by beat, skipped, or backfilled before) is not sent again:
    running the same backfill twice sends nothing the second time. Replay a
    skipped window with `replay RUN_ID`. Dates without an offset are read in
    the routine's timezone.
    """
    result = _admin(ctx).backfill(name, start, end, max_windows=max_windows, force=force)
    if as_json:
        _print_json(result)
    else:
        for window in result.windows:
            click.echo(_send_line(window))
        click.echo(
            f"{result.routine}: {len(result.windows)} window(s) from {_utc(result.start)} "
            f"to {_utc(result.end)}: {result.sent} sent, {result.existing} already stored, "
            f"{result.failed} failed"
        )
    _fail_if_not_sent(result.windows)


@routines.command()
@json_option
@click.pass_context
@_errors
def migrate(ctx: click.Context, as_json: bool) -> None:
    """Apply the schema migrations to routines_database_url (beat also does at start)."""
    result = _admin(ctx).migrate()
    if as_json:
        _print_json(result)
    elif result.before == result.after:
        click.echo(f"{result.database} is up to date (revision {result.after})")
    else:
        click.echo(f"{result.database} migrated from {result.before or 'empty'} to {result.after}")


@routines.command()
@json_option
@click.pass_context
@_errors
def sync(ctx: click.Context, as_json: bool) -> None:
    """Write the routines declared in code to the database, as beat does when
    it starts (and migrate first), so they can be listed before beat runs."""
    result = _admin(ctx).sync()
    if as_json:
        _print_json(result)
    else:
        click.echo(f"{len(result.routines)} routine(s) written to {result.database}")
        for name in result.routines:
            click.echo(f"  {name}")


@routines.command(name="preview")
@click.argument("cron")
@click.option("--tz", "timezone", default="UTC", show_default=True, help="IANA time zone.")
@click.option("--from", "start", help="Start (inclusive), read in --tz; default now.")
@click.option("-n", "count", default=10, show_default=True, help="How many windows.")
@json_option
@_errors
def preview_(cron: str, timezone: str, start: str | None, count: int, as_json: bool) -> None:
    """The windows CRON would fire in --tz, with DST notes. Needs no database."""
    windows = preview(cron, timezone, start, count, clock=CLOCK)
    if as_json:
        _print_json(windows)
        return
    click.echo(f"{cron!r} in {timezone} (UTC, then local):")
    _windows(windows)


# -- errors while Celery loads the app (-A) --------------------------------------


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
    package = os.path.dirname(os.path.abspath(__file__))
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


def _install_short_app_errors() -> None:
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


_install_short_app_errors()
