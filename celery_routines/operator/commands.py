"""The sub-commands of ``celery -A proj routines ...``.

Loaded by :mod:`celery_routines.operator.cli` (the entry point Celery imports)
only when ``celery routines`` runs. This module only parses arguments and
prints; :mod:`celery_routines.operator.admin` decides. Every error is one line
on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click
from sqlalchemy.exc import SQLAlchemyError

from celery_routines.clock import Clock, utc_now
from celery_routines.config import settings_from
from celery_routines.errors import RoutinesError
from celery_routines.operator.admin import MAX_BACKFILL, Routines
from celery_routines.operator.cli_beats import register_beats_command
from celery_routines.operator.cli_import import register_import_commands
from celery_routines.operator.cli_manage import by_option, register_commands
from celery_routines.operator.cli_preview import register_preview_command
from celery_routines.operator.cli_web import register_web_command
from celery_routines.operator.output import (
    fail_if_not_sent,
    next_run_cells,
    print_detail,
    print_json,
    print_pause,
    runs_table,
    send_line,
    state_text,
    table,
    utc,
)
from celery_routines.policy.states import RUN_STATES
from celery_routines.store.engine import explain_database_error

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
        except (RoutinesError, ValueError, LookupError, OverflowError) as exc:
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
        print_json(summaries)
        return
    if not summaries:
        click.echo("no routines stored (beat writes the ones declared in code when it starts)")
        return
    table(
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
                *next_run_cells(s),
                state_text(s),
                s.last_outcome,
                utc(s.next_retry_at),
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
        print_json(detail)
        return
    print_detail(detail)


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
        print_json(found)
    else:
        runs_table(found)


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
        print_json(found)
        return
    if not found:
        click.echo("no skips")
        return
    table(
        ["ROUTINE", "REASON", "COUNT", "FIRST WINDOW", "LAST WINDOW", "WRITTEN", "RUN ID"],
        [
            (
                r.routine,
                r.reason,
                r.skipped_count or 1,
                utc(r.skipped_first or r.scheduled_for),
                utc(r.skipped_last or r.scheduled_for),
                utc(r.created_at),
                r.id,
            )
            for r in found
        ],
    )


@routines.command()
@click.argument("name")
@click.option("--reason", help="Why (a short text, shown wherever it shows as paused).")
@by_option
@json_option
@click.pass_context
@_errors
def pause(ctx: click.Context, name: str, reason: str | None, by: str | None, as_json: bool) -> None:
    """Stop firing NAME until it is resumed (no retries are scheduled meanwhile)."""
    print_pause(_admin(ctx).pause(name, reason=reason, by=by), as_json)


@routines.command()
@click.argument("name")
@click.option(
    "--catch-up",
    is_flag=True,
    help="Treat the paused time like downtime: leave the next window where it was, "
    "so beat replays missed windows under the routine's catch_up policy and cap.",
)
@by_option
@json_option
@click.pass_context
@_errors
def resume(ctx: click.Context, name: str, catch_up: bool, by: str | None, as_json: bool) -> None:
    """Fire NAME again.

    By default a pause is a decision, not an outage: the windows that fell due
    while paused are recorded as one skipped run (reason "paused") and the
    routine continues with its first window after now, so a long pause never
    comes back as a burst, whatever its catch_up policy. Pass --catch-up to
    let the catch_up policy decide instead.
    """
    print_pause(_admin(ctx).resume(name, catch_up=catch_up, by=by), as_json)


@routines.command()
@click.argument("name")
@click.option("--force", is_flag=True, help="Send even over an open run or a spent ceiling.")
@by_option
@json_option
@click.pass_context
@_errors
def trigger(ctx: click.Context, name: str, force: bool, by: str | None, as_json: bool) -> None:
    """Send NAME now under a manual key (NAME@manual:<uuid>) that never collides
    with a window. Refused while an open run exists under overlap skip/queue, or
    when a ceiling is spent, unless --force."""
    result = _admin(ctx).trigger(name, force=force, by=by)
    print_json(result) if as_json else click.echo(send_line(result))
    fail_if_not_sent([result])


@routines.command()
@click.argument("run_id")
@click.option("--force", is_flag=True, help="Send even over an open run or a spent ceiling.")
@by_option
@json_option
@click.pass_context
@_errors
def replay(ctx: click.Context, run_id: str, force: bool, by: str | None, as_json: bool) -> None:
    """Resend a failed, skipped or lost run as the next attempt of its window."""
    result = _admin(ctx).replay(run_id, force=force, by=by)
    print_json(result) if as_json else click.echo(send_line(result))
    fail_if_not_sent([result])


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
@click.option(
    "--overlap",
    help="The overlap policy to follow (default: the routine's). skip/queue send the oldest "
    "new window, replace the newest, overlap all of them at once.",
)
@click.option("--force", is_flag=True, help="Send even over an open run or a spent ceiling.")
@by_option
@json_option
@click.pass_context
@_errors
def backfill(
    ctx: click.Context,
    name: str,
    start: str,
    end: str,
    max_windows: int,
    overlap: str | None,
    force: bool,
    by: str | None,
    as_json: bool,
) -> None:
    """Send the windows of NAME from --from to --to (both included), oldest first.

    Each window goes out under its own window key, so a window that already
    has a run (sent by beat, skipped, or backfilled before) is not sent again:
    running the same backfill twice sends nothing the second time. Replay a
    skipped window with `replay RUN_ID`. Dates without an offset are read in
    the routine's timezone.

    The routine's overlap policy holds, as in a catch-up: under skip and queue
    one window goes out (the oldest not yet sent; run the same backfill again
    once it has ended for the next), under replace only the newest; pass
    --overlap overlap to send them all at once.
    """
    result = _admin(ctx).backfill(
        name, start, end, max_windows=max_windows, force=force, by=by, overlap=overlap
    )
    if as_json:
        print_json(result)
    else:
        for window in result.windows:
            click.echo(send_line(window))
        click.echo(
            f"{result.routine}: {result.window_count} window(s) from {utc(result.start)} "
            f"to {utc(result.end)}: {result.sent} sent, {result.existing} already stored, "
            f"{result.failed} failed"
            + (
                f"; {result.left} left unsent (overlap={result.overlap} sends one at a time: "
                "run this backfill again once it has ended, or pass --overlap overlap)"
                if result.left
                else ""
            )
        )
    fail_if_not_sent(result.windows)


@routines.command()
@json_option
@click.pass_context
@_errors
def migrate(ctx: click.Context, as_json: bool) -> None:
    """Apply the schema migrations to routines_database_url (beat also does at start)."""
    result = _admin(ctx).migrate()
    if as_json:
        print_json(result)
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
        print_json(result)
    else:
        if result.newer_stamp is not None:
            click.echo(
                f"nothing written: the routines in {result.database} were written by newer "
                f"code (declaration stamp {result.newer_stamp})"
            )
            return
        click.echo(f"{len(result.routines)} routine(s) written to {result.database}")
        for name in result.routines:
            note = "  (back in service)" if name in result.revived else ""
            if name in result.resumed:
                note += "  (taken over from the import, which had paused it: resumed)"
            click.echo(f"  {name}{note}")
        for name in result.retired:
            click.echo(f"  {name}  retired: no longer declared in code")


register_commands(routines, _admin, _errors, json_option)
register_import_commands(routines, _admin, _errors, json_option)
register_web_command(routines, _admin, _errors)
register_beats_command(routines, _admin, _errors, json_option)
# The clock read when the command runs: tests replace CLOCK.
register_preview_command(routines, _admin, _errors, json_option, lambda: CLOCK())
