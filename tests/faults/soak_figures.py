"""The outage soak's accounting (tests/faults/test_outage_soak_real.py):
pure, over run rows read back by plain SQL (naive UTC instants), the body
log's ``ran <run id>`` lines and the task ids the workers received, so
tests/faults/test_outage_soak_tally.py can feed it rows made by hand."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

# Every routine must start a run this soon after the last fault ended.
RECOVERY_SECONDS = 10.0


@dataclass
class Figures:
    """What a soak measured; the lists name the offending windows, runs or routines."""

    routines: int = 0
    windows: int = 0
    windows_run: int = 0
    windows_skipped: int = 0
    windows_not_run: int = 0
    skips_by_reason: dict[str, int] = field(default_factory=dict)
    states: dict[str, int] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    run_twice: list[str] = field(default_factory=list)
    covered_twice: list[str] = field(default_factory=list)
    left_open: list[str] = field(default_factory=list)
    frozen: list[str] = field(default_factory=list)
    recovery_seconds: dict[str, float | None] = field(default_factory=dict)
    fault_windows: int = 0
    fault_windows_run: int = 0
    fault_windows_skipped: int = 0
    attempts_after_first: int = 0
    deliveries_repeated: int = 0
    duplicates_refused: int = 0

    def summary(self) -> dict[str, Any]:
        worst = [s for s in self.recovery_seconds.values() if s is not None]
        return {
            "routines": self.routines,
            "windows": self.windows,
            "windows_run": self.windows_run,
            "windows_skipped": self.windows_skipped,
            "windows_not_run": self.windows_not_run,
            "skips_by_reason": self.skips_by_reason,
            "states": self.states,
            "windows_missing": len(self.missing),
            "windows_run_twice": len(self.run_twice),
            "windows_covered_twice": len(self.covered_twice),
            "runs_left_sent_or_running": len(self.left_open),
            "routines_frozen": len(self.frozen),
            "worst_recovery_s": round(max(worst), 1) if worst else None,
            "fault_windows": self.fault_windows,
            "fault_windows_run": self.fault_windows_run,
            "fault_windows_skipped": self.fault_windows_skipped,
            "fault_run_fraction": round(self.fault_windows_run / self.fault_windows, 3)
            if self.fault_windows
            else None,
            "attempts_after_first": self.attempts_after_first,
            "deliveries_repeated": self.deliveries_repeated,
            "duplicates_refused": self.duplicates_refused,
        }


def tally(
    rows: Sequence[Any],
    ran_lines: Sequence[str],
    received: Sequence[str],
    *,
    fault_start: datetime,
    fault_end: datetime,
    until: datetime,
) -> Figures:
    """The soak's figures from its run rows (naive UTC instants), the body
    log and the task ids the workers received. Windows later than
    ``until - 3 intervals`` are not required (the beats were being stopped).

    Like ``check_every_window_once`` (tests/faults/cluster.py) each routine's
    windows must form an unbroken grid, but counted, not asserted, and by
    window rather than by row: a window may hold several attempts here (a
    send failed, a run declared lost), which that check rightly refuses for
    its fault-free tests."""
    figures = Figures()
    ran = collections.Counter(line.split()[1] for line in ran_lines if line.startswith("ran "))
    figures.deliveries_repeated = sum(1 for n in collections.Counter(received).values() if n > 1)
    by_routine: dict[str, list[Any]] = collections.defaultdict(list)
    for row in rows:
        if row.interval_seconds is not None:  # Celery's own cron entries are not a grid
            by_routine[row.name].append(row)
    figures.routines = len(by_routine)
    figures.states = dict(collections.Counter(row.state for row in rows))
    figures.attempts_after_first = sum(1 for row in rows if row.attempt > 1)
    figures.duplicates_refused = sum(row.duplicates or 0 for row in rows)
    for name, runs in sorted(by_routine.items()):
        step = timedelta(seconds=runs[0].interval_seconds)
        runs_of: dict[datetime, list[Any]] = collections.defaultdict(list)
        skipped_by: dict[datetime, list[Any]] = collections.defaultdict(list)
        for row in runs:
            if row.state == "skipped":
                for k in range(row.skipped_count or 1):
                    skipped_by[row.skipped_first + k * step].append(row)
            else:
                runs_of[row.scheduled_for].append(row)
        instants = set(runs_of) | set(skipped_by)
        first = min(instants)
        instant = first
        while instant <= until - 3 * step:
            if instant not in instants:
                figures.missing.append(f"{name} {instant.isoformat()}")
            instant += step
        for instant in sorted(instants):
            if instant > until:
                continue
            figures.windows += 1
            started = [r for r in runs_of.get(instant, []) if r.started_at is not None]
            bodies = sum(ran[r.id] for r in runs_of.get(instant, []))
            has_run = bool(started) or bodies > 0
            if len(started) > 1 or bodies > 1:
                figures.run_twice.append(f"{name} {instant.isoformat()}")
            skips = skipped_by.get(instant, [])
            if (runs_of.get(instant) and skips) or len(skips) > 1:
                figures.covered_twice.append(f"{name} {instant.isoformat()}")
            if has_run:
                figures.windows_run += 1
            elif skips:
                figures.windows_skipped += 1
                reason = skips[0].reason or "?"
                figures.skips_by_reason[reason] = figures.skips_by_reason.get(reason, 0) + 1
            else:
                figures.windows_not_run += 1
            if fault_start <= instant <= fault_end:
                figures.fault_windows += 1
                figures.fault_windows_run += has_run
                figures.fault_windows_skipped += not has_run and bool(skips)
        figures.left_open += [row.id for row in runs if row.state in ("sent", "running")]
        after = [
            r.started_at for r in runs if r.started_at is not None and r.started_at > fault_end
        ]
        recovery = (min(after) - fault_end).total_seconds() if after else None
        figures.recovery_seconds[name] = None if recovery is None else round(recovery, 2)
        if recovery is None or recovery > RECOVERY_SECONDS:
            figures.frozen.append(name)
    return figures
