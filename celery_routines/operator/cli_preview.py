"""``celery routines preview SCHEDULE|NAME``: the windows a schedule would
fire (no database), or those beat fires for a stored routine.

Added to the ``routines`` group by :func:`register_preview_command` (called
from :mod:`celery_routines.operator.commands`); it only parses and prints,
:mod:`celery_routines.operator.previews` decides.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import click
from sqlalchemy.exc import SQLAlchemyError

from celery_routines.errors import UnknownRoutine
from celery_routines.operator.output import escaped, print_json, print_windows
from celery_routines.operator.previews import FORMS, NotASchedule, preview
from celery_routines.store.engine import explain_database_error


def register_preview_command(
    group: click.Group,
    admin: Callable[[click.Context], Any],
    errors: Callable[[Any], Any],
    json_option: Callable[[Any], Any],
    clock: Callable[[], datetime],
) -> None:
    """Add ``preview`` to ``group``."""

    @group.command(name="preview")
    @click.argument("schedule")
    @click.option(
        "--tz", "timezone", help="IANA time zone of a schedule (default UTC; a routine: its own)."
    )
    @click.option("--from", "start", help="Start (inclusive), read in the zone; default now.")
    @click.option("-n", "count", default=10, show_default=True, help="How many windows.")
    @click.option(
        "--exclude",
        "exclude",
        multiple=True,
        help="A date, a range A..B, a cron, or holidays:CC[-SUBDIV] (repeatable).",
    )
    @click.option(
        "--shift",
        help="next_business_day or previous_business_day: move a window on a weekend or "
        "excluded day instead of dropping it.",
    )
    @json_option
    @click.pass_context
    @errors
    def preview_(
        ctx: click.Context,
        schedule: str,
        timezone: str | None,
        start: str | None,
        count: int,
        exclude: tuple[str, ...],
        shift: str | None,
        as_json: bool,
    ) -> None:
        """The windows SCHEDULE fires, with DST notes: a cron ('30 2 * * *'),
        'every 20s', 'at 2026-12-24T18:00', 'sunrise 45.46 9.19', an rrule,
        or several joined by ' + ' (as `list` prints them); needs no
        database. Or the NAME of a stored routine: the windows beat fires for
        it (its schedule, zone, exclusions and shift). A text that reads as a
        schedule is previewed as one."""
        try:
            windows = preview(
                schedule, timezone or "UTC", start, count,
                clock=clock, exclude=exclude, shift=shift,
            )  # fmt: skip
        except NotASchedule as exc:
            # Not a schedule: a routine's name, or neither (said in one line).
            if getattr(ctx.obj, "app", None) is None:
                # No app (-A): no store to look a name up in.
                raise click.ClickException(
                    f"{schedule!r} is not a schedule ({FORMS}): {exc}"
                ) from None
            given = [flag for flag, value in (("--tz", timezone), ("--shift", shift)) if value]
            given += ["--exclude"] if exclude else []
            _preview_routine(admin(ctx), schedule, exc, given, start, count, as_json)
            return
        if as_json:
            print_json(windows)
            return
        calendar_text = "".join(f" except {e}" for e in exclude) + (f", {shift}" if shift else "")
        click.echo(f"{schedule!r} in {timezone or 'UTC'}{calendar_text} (UTC, then local):")
        print_windows(windows)


def _preview_routine(
    admin: Any,
    name: str,
    not_schedule: NotASchedule,
    given: list[str],
    start: str | None,
    count: int,
    as_json: bool,
) -> None:
    try:
        found = admin.preview(name, start, count)
    except UnknownRoutine:
        raise click.ClickException(
            f"{name!r} is neither a stored routine nor a schedule ({FORMS}): {not_schedule}"
        ) from None
    except SQLAlchemyError as exc:
        reason = explain_database_error(exc, admin.settings.database_url).splitlines()[0]
        raise click.ClickException(
            f"{name!r} is not a schedule ({not_schedule}), and no routine of that name could "
            f"be looked up: {reason}"
        ) from None
    if given:
        raise click.ClickException(
            f"routine {name!r} is previewed with its own zone and calendar: drop "
            + ", ".join(given)
        )
    if as_json:
        print_json(found)
        return
    zones = "UTC" if found.timezone == "UTC" else f"UTC, then {found.timezone}"
    state = "" if found.state == "enabled" else f"; {found.state}: none of them fires now"
    click.echo(f"{escaped(name)}: {escaped(found.schedule)} in {found.timezone}{state} ({zones}):")
    if not found.windows:
        click.echo("  no window left (done)")
    print_windows(found.windows)
