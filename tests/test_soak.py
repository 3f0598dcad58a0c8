"""A smoke test of ``scripts/soak.py``'s accounting (the soak itself runs
real processes for many minutes and is not part of the suite): its pure
``tally`` over run rows and body-log lines made here."""

from __future__ import annotations

import importlib.util
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "soak.py"
T0 = datetime(2026, 12, 1, 12, 0)  # naive UTC, as the run rows read back
CUT = datetime(2026, 12, 1, 12, 0, 9, tzinfo=UTC)


@pytest.fixture(scope="module")
def soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soak_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def row(name: str, second: int, state: str = "succeeded", attempt: int = 1, **more: Any) -> Any:
    window = T0 + timedelta(seconds=second)
    values = {
        "name": name,
        "interval_seconds": 3.0,
        "id": f"{name}-{second}-{attempt}",
        "idempotency_key": f"{name}@{window.isoformat()}",
        "attempt": attempt,
        "state": state,
        "reason": None,
        "scheduled_for": window,
        "skipped_count": None,
        "skipped_first": None,
        "started_at": window + timedelta(seconds=0.5),
    }
    values.update(more)
    return SimpleNamespace(**values)


def test_a_clean_soak_counts_every_window_once(soak: ModuleType) -> None:
    rows = [row("soak000", s) for s in (0, 3, 6, 9)]
    rows.append(row("soak000", 12))  # after the cut: not counted
    lines = [f"ran {r.id}" for r in rows]
    figures = soak.tally(rows, lines, CUT)
    assert (figures["expected"], figures["sent"], figures["succeeded"]) == (4, 4, 4)
    assert (figures["doubled"], figures["lost"]) == (0, 0)
    assert figures["worst_start_lateness_s"] == 0.5


def test_a_missing_window_a_double_body_and_a_lost_retry_are_counted(soak: ModuleType) -> None:
    rows = [
        row("soak000", 0),
        # 3 s: no row at all (missing). 6 s: lost, retried, the retry succeeded.
        row("soak000", 6, state="retrying", reason="lost", started_at=T0 + timedelta(seconds=9)),
        row("soak000", 6, attempt=2),
        row("soak000", 9, state="failed"),  # never succeeded
    ]
    lines = [f"ran {r.id}" for r in rows] + [f"ran {rows[0].id}"]  # body of 0 s twice
    figures = soak.tally(rows, lines, CUT)
    assert figures["missing_windows"] == 1 and figures["windows_without_success"] == 1
    assert figures["lost"] == 2 and figures["doubled"] == 1
    assert figures["lost_runs_recovered"] == 1 and figures["retried_attempts"] == 1
    assert figures["worst_start_lateness_s"] == 3.0


def test_skipped_summaries_cover_their_windows_and_long_bodies_are_tallied(
    soak: ModuleType,
) -> None:
    rows = [
        row("soak000", 0),
        row(
            "soak000",
            3,
            state="skipped",
            skipped_count=2,
            skipped_first=T0 + timedelta(seconds=3),
            started_at=None,
        ),
        row("soak000", 9),
        row("long000", 0, interval_seconds=40.0),
    ]
    lines = [f"ran {rows[0].id}", f"ran {rows[2].id}", f"start {rows[3].id} 123"]
    figures = soak.tally(rows, lines, CUT)
    assert (figures["expected"], figures["skipped"], figures["lost"]) == (5, 2, 0)
    assert figures["long_windows_sent"] == figures["long_windows_succeeded"] == 1
    assert figures["long_bodies_run_twice"] == 0
