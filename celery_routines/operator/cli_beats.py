"""``celery routines beats``: the beats that ticked in the last hour, as the
panel's Beats page and ``GET /api/beats`` show them (operator/beats.py).
Added to the ``routines`` group by :func:`register_beats_command`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from celery_routines.operator.beats import beats_of
from celery_routines.operator.output import print_json, table

if TYPE_CHECKING:
    from celery_routines.operator.admin import Routines


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def register_beats_command(
    group: click.Group,
    admin: Callable[[click.Context], Routines],
    errors: Callable[[Callable[..., None]], Callable[..., None]],
    json_option: Callable[[Callable[..., None]], Callable[..., None]],
) -> None:
    """Add ``beats`` to ``group``."""

    @group.command()
    @json_option
    @click.pass_context
    @errors
    def beats(ctx: click.Context, as_json: bool) -> None:
        """Every beat that ticked in the last hour; STALE: silent for longer
        than three of its heartbeat gaps (30 s with the defaults)."""
        found = beats_of(admin(ctx).store)
        if as_json:
            print_json(found)
            return
        if not found:
            click.echo("no beat ticked in the last hour")
            return
        table(
            ["STATE", "HOST", "PID", "LAST TICK", "P50", "P99", "CLAIMS", "SKEW", "PUBLISHERS",
             "VERSION"],
            [
                (
                    f"STALE ({b['seconds_since_tick']:.0f} s)" if b["stale"] else "live",
                    b["host"],
                    b["pid"],
                    f"{b['seconds_since_tick']:.1f} s ago",
                    _ms(b["tick_p50_ms"]),
                    _ms(b["tick_p99_ms"]),
                    b["claims_held"],
                    f"{b['clock_skew_seconds']:+.3f} s",
                    b["publish_processes"],
                    b["version"],
                )
                for b in found
            ],
        )  # fmt: skip
