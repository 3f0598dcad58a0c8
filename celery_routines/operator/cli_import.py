"""``celery routines import django-celery-beat | redbeat | file`` and
``celery routines export``: moving schedules in, and routines as files.

Added to the ``routines`` group by :func:`register_import_commands`; they
parse and print, :mod:`celery_routines.operator.importers` reads and decides.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

import click

from celery_routines.operator.cli_manage import by_option
from celery_routines.operator.importers.plan import ImportPlan, ImportResult
from celery_routines.operator.output import escaped, print_json, utc
from celery_routines.policy.states import CatchUp
from celery_routines.schedules.base import is_never

if TYPE_CHECKING:
    from celery_routines.operator.admin import Routines

dry_run_option = click.option(
    "--dry-run", is_flag=True, help="Print what would be written; write nothing."
)
disabled_option = click.option(
    "--disabled",
    is_flag=True,
    help="Import every routine paused: compare `show`/`preview` with the old scheduler, "
    "then `celery routines resume NAME` after stopping it.",
)
catch_up_option = click.option(
    "--catch-up",
    "catch_up",
    type=click.Choice([c.value for c in CatchUp]),
    default=CatchUp.LATEST.value,
    show_default=True,
    help="The imported routines' catch_up policy (the old schedulers fire once after "
    "downtime: latest).",
)

our_defaults_option = click.option(
    "--our-defaults",
    is_flag=True,
    help="Give the imported routines celery-routines' retries and overlap (max_retries 4, "
    "overlap skip) instead of the old scheduler's (no retries; a window is sent while the "
    "previous run goes on).",
)


def register_import_commands(
    group: click.Group,
    admin: Callable[[click.Context], Routines],
    errors: Callable[[Callable[..., None]], Callable[..., None]],
    json_option: Callable[[Callable[..., None]], Callable[..., None]],
) -> None:
    """Add ``import ...`` and ``export`` to ``group``."""

    def carry_out(
        ctx: click.Context,
        plan: ImportPlan,
        *,
        disabled: bool,
        dry_run: bool,
        by: str | None,
        as_json: bool,
        prune: bool = False,
    ) -> None:
        from celery_routines.operator.importers.apply import Importer

        result = Importer(admin(ctx)).apply(
            plan, paused=disabled, dry_run=dry_run, prune=prune, by=by
        )
        print_json(result) if as_json else _print_result(result, disabled)
        if result.refused:
            ctx.exit(1)

    @group.group(name="import")
    def import_() -> None:
        """Bring routines in from django-celery-beat, RedBeat or a file.
        Re-running an import updates what it imported; nothing is duplicated."""

    @import_.command(name="django-celery-beat")
    @click.argument("url")
    @dry_run_option
    @disabled_option
    @catch_up_option
    @our_defaults_option
    @click.option(
        "--naive-tz",
        default="UTC",
        show_default=True,
        help="Zone of datetimes stored without one (Django's TIME_ZONE with USE_TZ = False).",
    )
    @by_option
    @json_option
    @click.pass_context
    @errors
    def django_celery_beat(
        ctx: click.Context,
        url: str,
        dry_run: bool,
        disabled: bool,
        catch_up: str,
        our_defaults: bool,
        naive_tz: str,
        by: str | None,
        as_json: bool,
    ) -> None:
        """Import the periodic tasks of the django-celery-beat database at URL
        (postgresql://, mysql://, sqlite:///path; no Django needed). Each
        task's first window is the next one after its last_run_at, so nothing
        django-celery-beat already sent fires again."""
        from celery_routines.operator.importers import django_celery_beat as source

        plan = source.read(
            url,
            now=admin(ctx).clock(),
            naive_zone=naive_tz,
            catch_up=catch_up,
            our_defaults=our_defaults,
        )
        carry_out(ctx, plan, disabled=disabled, dry_run=dry_run, by=by, as_json=as_json)

    @import_.command(name="redbeat")
    @click.argument("redis_url")
    @click.option(
        "--key-prefix",
        default="redbeat",
        show_default=True,
        help="RedBeat's redbeat_key_prefix (with or without its trailing colon).",
    )
    @click.option(
        "--tz",
        "timezone",
        help="Zone RedBeat's crontabs run in: the app's timezone (default routines_timezone).",
    )
    @dry_run_option
    @disabled_option
    @catch_up_option
    @our_defaults_option
    @by_option
    @json_option
    @click.pass_context
    @errors
    def redbeat(
        ctx: click.Context,
        redis_url: str,
        key_prefix: str,
        timezone: str | None,
        dry_run: bool,
        disabled: bool,
        catch_up: str,
        our_defaults: bool,
        by: str | None,
        as_json: bool,
    ) -> None:
        """Import RedBeat's entries from the Redis at REDIS_URL. Each entry's
        first window is the next one after its last_run_at; the entries
        RedBeat copied from beat_schedule are left to the code."""
        from celery_routines.operator.importers import redbeat as source

        zone = timezone or admin(ctx).settings.timezone
        plan = source.read(
            redis_url,
            key_prefix=key_prefix,
            zone=zone,
            catch_up=catch_up,
            our_defaults=our_defaults,
        )
        carry_out(ctx, plan, disabled=disabled, dry_run=dry_run, by=by, as_json=as_json)

    @import_.command(name="file")
    @click.argument("path")
    @click.option(
        "--prune",
        is_flag=True,
        help="Retire the routines not declared in code that the file does not have.",
    )
    @dry_run_option
    @disabled_option
    @by_option
    @json_option
    @click.pass_context
    @errors
    def file(
        ctx: click.Context,
        path: str,
        prune: bool,
        dry_run: bool,
        disabled: bool,
        by: str | None,
        as_json: bool,
    ) -> None:
        """Upsert the routines of PATH (as `export` writes it, JSON or .yaml)
        by name. Routines declared in code are changed in the code."""
        from celery_routines.operator.importers import files

        plan = files.read(path)
        carry_out(
            ctx, plan, disabled=disabled, dry_run=dry_run, by=by, as_json=as_json, prune=prune
        )

    @group.command(name="export")
    @click.option(
        "--format",
        "fmt",
        type=click.Choice(["json", "yaml"]),
        default="json",
        show_default=True,
        help="yaml needs the yaml extra (PyYAML).",
    )
    @click.option(
        "--mask",
        is_flag=True,
        help="Print secrets (a notify_url's password, path token and query) as *** "
        "(for review or a ticket; a masked file is not imported back as it is).",
    )
    @click.option(
        "--output",
        "-o",
        "output",
        type=click.Path(dir_okay=False, writable=True),
        help="Write to this file (replaced whole, only once the export is complete) "
        "instead of printing.",
    )
    @click.pass_context
    @errors
    def export(ctx: click.Context, fmt: str, mask: bool, output: str | None) -> None:
        """Print every routine's definition (no runs, no runtime state), for
        review, git, or `import file` in another environment.

        The output holds secrets: each notify_url whole, with its password
        or token. Keep it where such secrets may be kept, or use --mask."""
        from celery_routines.operator.importers import files

        data = files.export(admin(ctx).store.routines.all(), mask=mask)
        # Rendered whole before anything is written: a failure (PyYAML
        # missing, a value that does not serialise) leaves no file behind.
        text = files.dumps(data, fmt)
        if output is None:
            click.echo(text, nl=False)
        else:
            files.write_whole(output, text)


def _print_result(result: ImportResult, disabled: bool) -> None:
    for line in result.lines:
        if line.action in ("not imported", "left alone", "retired"):
            click.echo(f"{line.action:<13} {escaped(line.name)}: {escaped(line.reason)}")
            continue
        text = f"{line.action:<13} {escaped(line.name)}"
        if line.action in ("added", "updated"):
            text += "  " + _next_text(line.next_run_at)
        if line.action == "added" and result.behaviour is not None:
            text += (
                f"  retries {line.fields.get('max_retries')}, overlap {line.fields.get('overlap')}"
            )
        if line.action == "updated" and line.fields:
            text += "  (" + ", ".join(sorted(line.fields)) + ")"
        click.echo(text.rstrip())
        if line.note:
            click.echo(f"{'':<14}{escaped(line.note)}")
    counts = ", ".join(
        f"{result.count(action)} {action}"
        for action in ("added", "updated", "unchanged", "retired", "left alone", "not imported")
        if result.count(action) or action in ("added", "not imported")
    )
    if result.behaviour is not None and result.count("added") + result.count("updated"):
        click.echo(result.behaviour)
    for note in result.notes:
        click.echo(escaped(note))
    tail = " (dry run: nothing written)" if result.dry_run else ""
    if disabled and not result.dry_run and result.count("added") + result.count("updated"):
        tail += "; paused: `celery routines resume NAME` once the old scheduler is stopped"
    click.echo(f"{result.source}: {counts}{tail}")


def _next_text(next_run_at: datetime | None) -> str:
    if next_run_at is None:
        return "next window: the first after beat adopts it"
    if is_never(next_run_at):
        return "done: no window left"
    return f"next window {utc(next_run_at)}"
