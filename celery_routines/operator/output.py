"""What ``celery routines ...`` prints: tables, JSON and one-line results."""

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
    RunView,
    SendResult,
    WindowView,
)
from celery_routines.sending.dispatch import SEND_FAILED


def jsonable(value: Any) -> Any:
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


def print_json(value: Any) -> None:
    click.echo(json.dumps(jsonable(value), indent=2))


def utc(instant: datetime | None) -> str:
    return instant.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if instant else "-"


def local(instant: datetime | None) -> str:
    # The zone abbreviation (CET/CEST) shows which side of a transition it is.
    return instant.strftime("%Y-%m-%d %H:%M:%S %Z") if instant else "-"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
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
        ["RUN ID", "ROUTINE", "WINDOW", "ATTEMPT", "STATE", "REASON", "WRITTEN"],
        [
            (
                r.id,
                r.routine,
                r.idempotency_key.split("@", 1)[-1],
                r.attempt,
                r.state,
                r.reason or r.error,
                utc(r.created_at),
            )
            for r in runs
        ],
    )


def send_line(result: SendResult) -> str:
    if result.outcome == SEND_FAILED:
        return f"NOT SENT {result.idempotency_key} (run {result.run_id}): {result.error}"
    if result.outcome == "exists":
        return f"already stored {result.idempotency_key} ({result.existing_state}): not sent again"
    return f"sent {result.idempotency_key} attempt {result.attempt} as run {result.run_id}"


def fail_if_not_sent(results: Sequence[SendResult]) -> None:
    failed = [r for r in results if r.outcome == SEND_FAILED]
    if failed:
        raise click.ClickException(
            f"{len(failed)} run(s) could not be sent: {failed[0].error}; recorded, and "
            "retried under the routine's retry policy (see runs --state retrying)"
        )


def print_detail(detail: RoutineDetail) -> None:
    s = detail.summary
    click.echo(f"{s.name}  [{s.state}]")
    click.echo(f"  schedule:  {s.schedule} ({s.timezone})")
    for key, value in detail.definition.items():
        click.echo(
            f"  {key + ':':<20} {json.dumps(value) if not isinstance(value, str) else value}"
        )
    last = f"{s.last_outcome} at {utc(s.last_run_at)}" if s.last_outcome else "no runs yet"
    click.echo(f"  {'last outcome:':<20} {last}")
    click.echo(f"  {'open runs:':<20} {detail.open_runs}")
    if detail.last_error:
        click.echo(f"  {'invalid:':<20} {detail.last_error}")
    if detail.suspended_until:
        click.echo(
            f"  {'suspended until:':<20} {utc(detail.suspended_until)} "
            f"({detail.suspended_reason or 'no reason recorded'})"
        )
    if detail.schedule_error:
        click.echo(f"  schedule cannot be computed: {detail.schedule_error}")
    else:
        click.echo(f"next {len(detail.next_windows)} windows (UTC, then {s.timezone}):")
        print_windows(detail.next_windows)
    if detail.ceiling_error:
        click.echo(f"  ceiling cannot be read: {detail.ceiling_error}")
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
    line = f"{verb} {result.routine}; next window {utc(result.next_run_at)}"
    if result.skipped_windows:
        line += f"; {result.skipped_windows} window(s) missed while paused recorded as skipped"
    click.echo(line)
