"""What ``celery routines ...`` prints: tables, JSON, words and one-line results."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import click

from celery_routines.operator.views import (
    BackfillResult,
    PauseResult,
    RoutineDetail,
    RoutineSummary,
    RunView,
    SendResult,
    WindowView,
    attempt_text,
)
from celery_routines.sending.dispatch import SEND_FAILED


def jsonable(value: object) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        data = {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, BackfillResult):
            data.update(sent=value.sent, existing=value.existing, failed=value.failed)
        return data
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def print_json(value: object) -> None:
    click.echo(json.dumps(jsonable(value), indent=2))


def utc(instant: datetime | None) -> str:
    return instant.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if instant else "-"


def local(instant: datetime | None) -> str:
    # The zone abbreviation (CET/CEST) shows which side of a transition it is.
    return instant.strftime("%Y-%m-%d %H:%M:%S %Z") if instant else "-"


def escaped(text: object) -> str:
    """``text`` with every character that is not printable (control
    characters, a line break, ESC, bidirectional overrides such as U+202E)
    written as its escape (``\\n``, ``\\x1b``, ``\\u202e``): a value stored by
    SQL or another app can neither forge a line nor drive the terminal."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[("-" if c is None else escaped(c)) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for row in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def print_windows(windows: Sequence[WindowView]) -> None:
    for w in windows:
        note = f"  ({w.note})" if w.note else ""
        click.echo(f"  {utc(w.utc)}   {local(w.local)}{note}")


def runs_table(runs: Sequence[RunView]) -> None:
    if not runs:
        click.echo("no runs")
        return
    table(
        ["RUN ID", "ROUTINE", "WINDOW", "ATTEMPT", "STATE", "RETRY AT", "REASON", "WRITTEN"],
        [
            (
                r.id,
                r.routine,
                r.idempotency_key.split("@", 1)[-1],
                # A skipped window was never attempted: "1 of 5" would say it was.
                "-" if r.state == "skipped" else attempt_text(r.attempt, r.max_attempts),
                r.state,
                utc(r.retry_at),
                r.reason or r.error,
                utc(r.created_at),
            )
            for r in runs
        ],
    )


def state_text(s: RoutineSummary) -> str:
    """The STATE of ``list``/``show``; a retired routine says since when, a
    paused one why."""
    if s.state == "retired":
        return f"retired (no longer declared in code since {utc(s.retired_at)})"
    if s.state == "paused" and s.paused_reason:
        return f"paused: {s.paused_reason}"
    return s.state


def next_run_cells(s: RoutineSummary) -> tuple[str, str]:
    """The NEXT RUN cells of ``list``. A bare time would read as "it fires
    then": for an invalid routine the stored instant is only when beat looks
    at it again, and a paused or disabled routine fires nothing."""
    if s.next_run_utc is None:
        return "-", "-"
    if s.state == "retired":
        return "-", "-"
    if s.state == "invalid":
        return f"invalid, re-checked at {utc(s.next_run_utc)}", "-"
    if s.state in ("paused", "disabled"):
        return (
            f"{s.state} (would be next: {utc(s.next_run_utc)})",
            f"(would be next: {local(s.next_run_local)})",
        )
    return utc(s.next_run_utc), local(s.next_run_local)


def send_line(result: SendResult) -> str:
    if result.outcome == SEND_FAILED:
        return f"NOT SENT {result.idempotency_key} (run {result.run_id}): {result.error}"
    if result.outcome == "exists":
        return f"already stored {result.idempotency_key} ({result.existing_state}): not sent again"
    attempt = attempt_text(result.attempt, result.max_attempts)
    return f"sent {result.idempotency_key} attempt {attempt} as run {result.run_id}"


def fail_if_not_sent(results: Sequence[SendResult]) -> None:
    failed = [r for r in results if r.outcome == SEND_FAILED]
    if failed:
        raise click.ClickException(
            f"{len(failed)} run(s) could not be sent: {failed[0].error}; recorded, and "
            "retried under the routine's retry policy (see runs --state retrying)"
        )


def words(value: object) -> str:
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


def ceiling_words(value: object) -> str:
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        return words(value)
    return (
        ", ".join(
            f"{words(c.get('limit'))} {c.get('unit', 'fires')} per {c.get('per')}" for c in value
        )
        or "none"
    )


# Wide enough for the longest option name ("pause_after_failures:").
KEY_WIDTH = 22


def field(key: str, value: str) -> None:
    click.echo(f"  {key + ':':<{KEY_WIDTH}} {escaped(value)}")


def print_detail(detail: RoutineDetail) -> None:
    s = detail.summary
    click.echo(escaped(f"{s.name}  [{state_text(s)}]"))
    field("schedule", s.schedule)
    if s.schedule_words:
        field("in words", s.schedule_words)
    for key, value in detail.definition.items():
        if key == "timezone":
            # The zone the schedule is read in, also when the row leaves it
            # to routines_timezone.
            field(key, s.timezone if value else f"{s.timezone} (routines_timezone)")
        elif key == "ceiling":
            field(key, ceiling_words(value))
        elif key == "exclude" and value:
            field(key, "; ".join(value))
        else:
            field(key, words(value))
    last = f"{s.last_outcome} at {utc(s.last_run_at)}" if s.last_outcome else "no runs yet"
    field("last outcome", last)
    retrying = len(detail.retrying)
    field(
        "open runs",
        f"{detail.open_runs} ({retrying} retrying)" if retrying else str(detail.open_runs),
    )
    for run in detail.retrying:
        field(
            "next retry",
            f"{utc(run.retry_at)}, attempt {attempt_text(run.attempt + 1, run.max_attempts)} "
            f"of {run.idempotency_key}",
        )
    if detail.last_error:
        field("invalid", detail.last_error)
        if s.next_run_utc is not None:
            field("re-checked at", utc(s.next_run_utc))
    if detail.suspended_until:
        field(
            "suspended until",
            f"{utc(detail.suspended_until)} ({detail.suspended_reason or 'no reason recorded'})",
        )
    if detail.next_excluded:
        field("next excluded", detail.next_excluded)
    if detail.schedule_error:
        field("schedule error", detail.schedule_error)
    else:
        zones = "UTC" if s.timezone == "UTC" else f"UTC, then {s.timezone}"
        count = len(detail.next_windows)
        heading = f"next {'window' if count == 1 else f'{count} windows'} ({zones})"
        none_fire = "it does not fire" if count == 1 else "none of them fires"
        if s.state == "retired":
            heading += f"; retired: {none_fire} unless it is declared again"
        elif s.state in ("paused", "disabled"):
            resumed = "resumed" if s.state == "paused" else "enabled"
            heading += f"; {s.state}: {none_fire} until it is {resumed}"
        click.echo(heading + ":")
        print_windows(detail.next_windows)
    if detail.ceiling_error:
        field("ceiling error", detail.ceiling_error)
    if detail.ceilings:
        click.echo("spend this period:")
        for c in detail.ceilings:
            click.echo(
                f"  {c.spent:g} of {c.limit:g} {c.unit} per {c.per} "
                f"({utc(c.period_start)} to {utc(c.period_end)})"
            )


def print_pause(result: PauseResult, as_json: bool) -> None:
    if as_json:
        print_json(result)
        return
    verb = "paused" if result.paused else "resumed"
    if not result.changed:
        click.echo(f"{result.routine} was already {'paused' if result.paused else 'running'}")
        return
    if result.paused:
        # Not "next window": a paused routine fires nothing at that time.
        line = f"paused {result.routine} (would be next: {utc(result.next_run_at)})"
    else:
        line = f"{verb} {result.routine}; next window {utc(result.next_run_at)}"
    if result.skipped_windows:
        line += f"; {result.skipped_windows} window(s) missed while paused recorded as skipped"
    click.echo(line)
