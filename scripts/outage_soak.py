"""The outage soak by hand: the full fault and calm periods, every target.

Runs ``tests/faults/test_outage_soak_real.py`` once per target (PostgreSQL,
MariaDB, the Redis broker, the Redis gate behind the fault proxy), each in a
pytest process of its own, and prints the figures each one measured as a
table, then whether it passed. The test itself prints them too (``-s``);
this only sets the durations, collects the figures
(``ROUTINES_SOAK_FIGURES``) and lines them up.

    python scripts/outage_soak.py                       # 180 s of faults, 60 s calm
    python scripts/outage_soak.py --fault 40 --calm 15 postgresql broker
    python scripts/outage_soak.py --seed 7              # replay one chaos

Needs the servers the suite needs (PostgreSQL, MariaDB, Redis on loopback;
tests/services.py). Exits 1 if any target failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEST = "tests/faults/test_outage_soak_real.py"
TARGETS = ("postgresql", "mariadb", "broker", "gate")
COLUMNS = (
    "windows",
    "windows_run",
    "windows_skipped",
    "windows_not_run",
    "windows_missing",
    "windows_run_twice",
    "runs_left_sent_or_running",
    "routines_frozen",
    "worst_recovery_s",
    "fault_windows",
    "fault_run_fraction",
    "attempts_after_first",
    "deliveries_repeated",
    "duplicates_refused",
    "seed",
)


def run_target(target: str, fault: float, calm: float, seed: int, figures: Path) -> bool:
    env = dict(os.environ)
    env.update(
        ROUTINES_SOAK_FAULT_SECONDS=str(fault),
        ROUTINES_SOAK_CALM_SECONDS=str(calm),
        ROUTINES_SOAK_FIGURES=str(figures),
    )
    if seed:
        env["ROUTINES_SOAK_SEED"] = str(seed)
    command = [
        sys.executable, "-m", "pytest", TEST, "-k", target, "-n", "0", "-s", "-q",
        "-o", f"timeout={int(fault + calm + 300)}",
    ]  # fmt: skip
    print(f"== {target}: {fault:g} s of faults, {calm:g} s calm", flush=True)
    return subprocess.run(command, cwd=REPO, env=env, check=False).returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help=f"some of {', '.join(TARGETS)} (default: all)")
    parser.add_argument("--fault", type=float, default=180.0, help="seconds of faults")
    parser.add_argument("--calm", type=float, default=60.0, help="seconds of calm after")
    parser.add_argument("--seed", type=int, default=0, help="the chaos's seed (0: a fresh one)")
    args = parser.parse_args()
    unknown = set(args.targets) - set(TARGETS)
    if unknown:
        parser.error(f"unknown target(s) {sorted(unknown)}: choose among {', '.join(TARGETS)}")
    with tempfile.TemporaryDirectory() as folder:
        figures = Path(folder) / "figures.jsonl"
        passed = {
            target: run_target(target, args.fault, args.calm, args.seed, figures)
            for target in args.targets or TARGETS
        }
        lines = figures.read_text().splitlines() if figures.exists() else []
        measured = {line["target"]: line for line in map(json.loads, lines)}
    print("\n== outage soak figures")
    print(f"{'':28}" + "".join(f"{target:>14}" for target in passed))
    for column in COLUMNS:
        cells = [
            json.dumps(measured[target].get(column)) if target in measured else "-"
            for target in passed
        ]
        print(f"{column:28}" + "".join(f"{cell:>14}" for cell in cells))
    print(f"{'passed':28}" + "".join(f"{'yes' if ok else 'NO':>14}" for ok in passed.values()))
    for target, ok in passed.items():
        if target not in measured:
            continue
        figures = measured[target]
        print(f"\n{target}: faults {json.dumps(figures['faults'])}")
        print(f"{target}: skips by reason {json.dumps(figures['skips_by_reason'])}")
        print(f"{target}: run states {json.dumps(figures['states'])}")
        if not ok:
            print(f"{target}: recovery seconds per routine {json.dumps(figures['recovery'])}")
    return 0 if all(passed.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
