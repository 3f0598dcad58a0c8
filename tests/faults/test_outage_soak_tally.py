"""The outage soak's accounting (tests/faults/soak_figures.py) over
run rows made here: each figure the soak asserts on can be non-zero."""

from __future__ import annotations

from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

from tests.faults.soak_figures import tally

T0 = datetime(2026, 12, 7, 12, 0)  # naive UTC, as run rows read back
STEP = timedelta(seconds=2)


def row(name: str, window: int, state: str = "succeeded", **more: Any) -> Any:
    at = T0 + window * STEP
    values: dict[str, Any] = {
        "name": name,
        "interval_seconds": 2.0,
        "id": f"{name}-{window}-{more.get('attempt', 1)}",
        "idempotency_key": f"{name}@{at.isoformat()}",
        "attempt": 1,
        "state": state,
        "reason": None,
        "scheduled_for": at,
        "skipped_count": None,
        "skipped_first": None,
        "skipped_last": None,
        "created_at": at,
        "sent_at": at,
        "started_at": at + timedelta(seconds=0.1) if state in ("succeeded", "running") else None,
        "finished_at": None,
        "worker": None,
        "duplicates": 0,
        "error": None,
    }
    values.update(more)
    return SimpleNamespace(**values)


def skip(name: str, first: int, count: int) -> Any:
    return row(
        name,
        first,
        "skipped",
        reason="overlap",
        skipped_count=count,
        skipped_first=T0 + first * STEP,
        skipped_last=T0 + (first + count - 1) * STEP,
    )


def figures_of(rows: list[Any], ran: list[str] = (), fault: tuple[int, int] = (2, 6)) -> Any:  # type: ignore[assignment]
    return tally(
        rows,
        list(ran),
        [],
        fault_start=T0 + fault[0] * STEP,
        fault_end=T0 + fault[1] * STEP,
        until=T0 + 12 * STEP,
    )


def test_a_clean_grid_counts_nothing_wrong() -> None:
    rows = [row("a", k) for k in range(11)]
    figures = figures_of(rows)
    assert figures.missing == figures.run_twice == figures.left_open == figures.frozen == []
    assert figures.windows == figures.windows_run == 11
    assert figures.fault_windows == figures.fault_windows_run == 5


def test_a_gap_a_double_and_a_frozen_routine_are_each_counted() -> None:
    rows = [row("a", k) for k in range(11) if k != 4]  # window 4 has no row
    rows += [row("a", 8, attempt=2, id="a-8-2")]  # window 8 started twice
    rows += [row("b", 0), row("b", 1, "sent"), skip("b", 2, 9)]  # frozen by a run left sent
    figures = figures_of(rows, ran=["ran a-3-1", "ran a-3-1"])  # a body ran twice
    assert figures.missing == [f"a {(T0 + 4 * STEP).isoformat()}"]
    assert figures.run_twice == [f"a {(T0 + k * STEP).isoformat()}" for k in (3, 8)]
    assert figures.left_open == ["b-1-1"] and figures.frozen == ["b"]
    assert figures.windows_skipped == 9 and figures.skips_by_reason == {"overlap": 9}
    assert figures.recovery_seconds["b"] is None and figures.recovery_seconds["a"] == 0.1
