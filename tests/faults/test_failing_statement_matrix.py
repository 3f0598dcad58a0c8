"""Issue 29: a tick that fails at any statement never sends a run twice.

Several in-process beats on one real PostgreSQL (see
``tests/faults/statement_faults.py``); the first beat's n-th statement of its
burst fails, for every n from the first statement to the last, and every
published message is counted per task id. ``connection``: the failure sticks
to every connection the beat had opened (psycopg's prepared statements behind
PgBouncer did that), so that beat cannot write down what it published until
it opens a fresh connection; before issue 29 its claims expired meanwhile and
another beat sent those runs again (up to 4 task ids of 12 twice per cell).

``ROUTINES_FAULT_MATRIX=full`` runs every combination (beats 1-3, each mode,
the failing beat ticking on or stopping) for the figures of the closing note.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from celery_routines import registry
from tests import services
from tests.faults.statement_faults import Cell, run_cell

pytestmark = [pytest.mark.postgres]

MODES = ("before", "after", "connection")
COMBINATIONS = (
    [(mode, beats, then) for mode in MODES for beats in (1, 2, 3) for then in ("ticks", "stops")]
    if os.environ.get("ROUTINES_FAULT_MATRIX") == "full"
    else [("before", 3, "ticks"), ("after", 2, "stops"), ("connection", 2, "ticks")]
)


@pytest.mark.parametrize(("mode", "beats", "then"), COMBINATIONS)
def test_a_tick_failing_at_any_statement_never_sends_a_run_twice(
    tmp_path: Path,
    postgres_databases: services.PostgresDatabases,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    beats: int,
    then: str,
) -> None:
    # The burst's statements, each failed once: the claim's transaction, the
    # markings behind the next chunk, the one-statement bookkeeping, the probes.
    kinds = ("BEGIN", "COMMIT", "INSERT INTO", "UPDATE routine_runs", "WITH marked", "WITH due")
    cells: list[Cell] = []
    # The burst's background threads (the next batch, a marking) interleave
    # with the tick, so the n-th statement is not the same one every sweep:
    # a kind a sweep missed gets another sweep rather than going unchecked.
    for sweep in range(3):
        cells += _sweep(
            tmp_path / f"sweep-{sweep}", postgres_databases, monkeypatch, mode, beats, then
        )
        failed_at = {" ".join(cell.statement.split()[:2]) for cell in cells if cell.statement}
        missed = [kind for kind in kinds if not any(f.startswith(kind) for f in failed_at)]
        if not missed:
            break
    assert not missed, (missed, failed_at)
    doubled = [cell for cell in cells if cell.doubled]
    assert not doubled, doubled
    assert all(cell.messages == cell.runs for cell in cells), cells


def _sweep(
    folder: Path,
    postgres_databases: services.PostgresDatabases,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    beats: int,
    then: str,
) -> list[Cell]:
    """One cell per statement of the burst, the n-th failing, until n is past its end."""
    cells: list[Cell] = []
    nth = 0
    while True:
        nth += 1
        url = postgres_databases.create(migrated=True)
        registry._declared.clear()
        try:
            cell, _ = run_cell(
                folder / str(nth), url, monkeypatch, nth=nth, beats=beats, mode=mode, then=then
            )
        finally:
            postgres_databases.drop(url)
        if cell.statement is None:  # past the burst's last statement
            return cells
        cells.append(cell)
        print(
            f"matrix: {mode} {then} beats={beats} #{cell.nth} {cell.statement}: "
            f"{cell.messages} messages, {cell.doubled} twice"
        )
