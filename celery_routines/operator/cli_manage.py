"""``celery routines add | edit | enable | disable | delete | history | prune``:
managing routines without code, from the command line.

The commands are added to the ``routines`` group by
:func:`register_commands` (called from :mod:`celery_routines.operator.cli`,
which hands over its admin factory and error wrapper); they only parse and
print, :mod:`celery_routines.operator.manage` decides.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from celery_routines.operator.lifecycle_views import ChangeResult
from celery_routines.operator.output import print_json, table, utc
from celery_routines.operator.texts import BadOption
from celery_routines.policy.option_values import JSON_DEPTH_LIMIT, not_json, shown_briefly
from celery_routines.policy.options import RoutineOption
from celery_routines.policy.routine import OPTIONS

# The options add and edit take, each a flag as declared.
CLI_OPTIONS = tuple(o for o in OPTIONS if o.entry is not None and o.keyword_name)
# Every command that changes a routine records who did it (routine_changes).
by_option = click.option("--by", help="Who makes the change, for its history (default: user@host).")


def _json_arg(value: str | None, option: str) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value, parse_constant=not_json)
    except RecursionError:
        raise BadOption(
            f"{option} is nested too deep: more than {JSON_DEPTH_LIMIT} levels"
        ) from None
    except ValueError as exc:
        raise BadOption(f"{option} must be JSON ({exc}), got {shown_briefly(value)}") from None


def _on_a_terminal() -> bool:
    """A person can answer a question: both ends are a terminal."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def _deletion_text(plan: Any) -> str:
    states = ", ".join(f"{n} {s}" for s, n in sorted(plan.runs_by_state.items()))
    return f"{plan.routine} and its {plan.runs_deleted} run(s)" + (f" ({states})" if states else "")


def _option_flag(declared: RoutineOption) -> Callable[[Any], Any]:
    """The flag of a declared option, taken as its declaration says."""
    kinds: dict[str, Any] = {"whole": int, "number": float}
    kind = kinds.get(str(declared.entry))
    words = declared.words
    if declared.entry == "choice":
        # Checked by the definition, not by click (nor a count by an IntRange),
        # so a bad value gets the words every other door gives.
        words += f" One of: {', '.join(declared.choices)}."
    return click.option(
        declared.cli_flag,
        declared.name,
        type=kind,
        multiple=declared.entry in ("lines", "ceilings"),
        help=words,
    )


def _definition_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options ``add`` and ``edit`` share: the schedule, then every
    declared option (policy/routine.py)."""
    options = [
        click.option(
            "--cron",
            multiple=True,
            help="5-field cron expression, read in --tz; several fire on their union.",
        ),
        click.option("--every", help="Interval: 30s, 5m, 1h30m, 1d (or seconds)."),
        click.option(
            "--at", help="A one-off: fire once at this time (2026-12-24T18:00, read in --tz)."
        ),
        click.option(
            "--rrule",
            help="An RFC 5545 rule, two lines: DTSTART:20260105T090000 and RRULE:FREQ=...",
        ),
        click.option("--solar", help="A solar event: '<event> <latitude> <longitude>'."),
        *(_option_flag(o) for o in CLI_OPTIONS),
        click.option("--queue", help="Queue to send to (apply_async's queue)."),
        by_option,
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _definition(kw: dict[str, Any]) -> dict[str, Any]:
    for declared in CLI_OPTIONS:
        value = kw[declared.name]
        if declared.entry == "json":
            kw[declared.name] = _json_arg(value, declared.cli_flag)
        elif declared.entry in ("lines", "ceilings"):
            kw[declared.name] = list(value) if value else None
    queue = kw.pop("queue")
    if queue is not None:
        kw["options"] = {**(kw["options"] or {}), "queue": queue}
    crons = kw.pop("cron")
    kw["cron"] = None if not crons else crons[0] if len(crons) == 1 else list(crons)
    return kw


def _print_change(result: ChangeResult, as_json: bool) -> None:
    if as_json:
        print_json(result)
        return
    if not result.changed:
        click.echo(f"{result.routine} was already {result.action}: nothing changed")
        return
    line = f"{result.action} {result.routine}"
    if result.fields and result.action in ("added", "edited"):
        line += ": " + ", ".join(
            f"{k}={json.dumps(v)}" for k, v in result.fields.items() if v is not None
        )
    click.echo(line)
    if result.skipped_windows:
        click.echo(
            f"  {result.skipped_windows} window(s) missed while disabled recorded as one "
            "skipped run (reason disabled)"
        )
    if result.action == "added" or (result.action == "edited" and result.next_run_at is None):
        click.echo("  beat computes its next window from now at its next tick")
    elif result.next_run_at is not None:
        click.echo(f"  next run {utc(result.next_run_at)}")


def register_commands(
    group: click.Group,
    admin: Callable[[click.Context], Any],
    errors: Callable[[Any], Any],
    json_option: Callable[[Any], Any],
) -> None:
    """Add the lifecycle commands to ``group``."""

    @group.command()
    @click.argument("name")
    @click.argument("task")
    @_definition_options
    @json_option
    @click.pass_context
    @errors
    def add(ctx: click.Context, name: str, task: str, as_json: bool, **kw: Any) -> None:
        """Store a new routine NAME running TASK (no code needed): --cron, --every,
        --at, --rrule or --solar."""
        definition = _definition(kw)
        _print_change(admin(ctx).add(name, task, **definition), as_json)

    @group.command()
    @click.argument("name")
    @_definition_options
    @json_option
    @click.pass_context
    @errors
    def edit(ctx: click.Context, name: str, as_json: bool, **kw: Any) -> None:
        """Change a routine added without code; a new schedule applies from now,
        anything else from its next window. Routines declared in code are
        changed in the code."""
        _print_change(admin(ctx).edit(name, **_definition(kw)), as_json)

    @group.command()
    @click.argument("name")
    @by_option
    @json_option
    @click.pass_context
    @errors
    def enable(ctx: click.Context, name: str, by: str | None, as_json: bool) -> None:
        """Enable NAME again, like resume: the windows missed while disabled are
        one skipped run (reason disabled), not a burst."""
        _print_change(admin(ctx).enable(name, by=by), as_json)

    @group.command()
    @click.argument("name")
    @by_option
    @json_option
    @click.pass_context
    @errors
    def disable(ctx: click.Context, name: str, by: str | None, as_json: bool) -> None:
        """Stop firing NAME until it is enabled."""
        _print_change(admin(ctx).disable(name, by=by), as_json)

    @group.command()
    @click.argument("name")
    @click.option("--yes", "-y", is_flag=True, help="Do not ask (needed when not on a terminal).")
    @click.option("--dry-run", is_flag=True, help="Only say what would be deleted.")
    @by_option
    @json_option
    @click.pass_context
    @errors
    def delete(
        ctx: click.Context, name: str, yes: bool, dry_run: bool, by: str | None, as_json: bool
    ) -> None:
        """Delete NAME and its runs: a routine added without code, or one
        retired from the code. Its change history stays. Asks first on a
        terminal; elsewhere it needs --yes. --dry-run only says what would go."""
        routines = admin(ctx)
        if dry_run or not yes:
            plan = routines.delete(name, by=by, dry_run=True)
            what = _deletion_text(plan)
            if dry_run:
                print_json(plan) if as_json else click.echo(f"would delete {what}")
                return
            if not _on_a_terminal():
                raise click.ClickException(
                    f"not deleting {what}: pass --yes to delete without a terminal to ask on "
                    "(--dry-run shows what would go)"
                )
            if not click.confirm(f"delete {what}?", default=False):
                raise click.ClickException(f"nothing deleted: {name} is still stored")
        result = routines.delete(name, by=by)
        if as_json:
            print_json(result)
        else:
            click.echo(f"deleted {result.routine} and its {result.runs_deleted} run(s)")

    @group.command()
    @click.argument("name")
    @click.option(
        "--limit", default=100, show_default=True, help="At most this many, newest first."
    )
    @json_option
    @click.pass_context
    @errors
    def history(ctx: click.Context, name: str, limit: int, as_json: bool) -> None:
        """Who changed NAME and when (added, edited, paused, triggered, retired...)."""
        changes = admin(ctx).history(name, limit=limit)
        if as_json:
            print_json(changes)
            return
        table(
            ["WHEN (UTC)", "ACTION", "BY", "DETAIL"],
            [
                (
                    utc(c.changed_at),
                    c.action,
                    c.changed_by or "",
                    json.dumps(c.detail, default=str) if c.detail else "",
                )
                for c in changes
            ],
        )

    @group.command()
    @click.option(
        "--older-than", help="Age of the runs to delete: 7d, 12h (default routines_keep_runs_days)."
    )
    @click.option("--dry-run", is_flag=True, help="Only count what would be deleted.")
    @json_option
    @click.pass_context
    @errors
    def prune(ctx: click.Context, older_than: str | None, dry_run: bool, as_json: bool) -> None:
        """Delete finished runs older than --older-than, never an open run, a
        routine's newest run, or a run a ceiling still counts."""
        result = admin(ctx).prune(older_than=older_than, dry_run=dry_run)
        if as_json:
            print_json(result)
            return
        verb = "would delete" if dry_run else "deleted"
        states = ", ".join(f"{n} {s}" for s, n in sorted(result.deleted.items()))
        click.echo(
            f"{verb} {result.total} finished run(s) created before {utc(result.cutoff)}"
            + (f": {states}" if states else "")
        )
        if result.kept_for_ceilings:
            click.echo(
                f"  {result.kept_for_ceilings} routine(s) with a ceiling keep the runs of "
                "their current ceiling period"
            )
