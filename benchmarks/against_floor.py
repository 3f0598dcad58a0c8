"""celery-routines' tick and burst against Celery's own publishing floor, one run.

    python -m benchmarks.against_floor [--size 1000000] [--burst-size 10000]

Issue 19, item 1: the tick with 10 routines due, minus what publishing 10
messages costs through Celery (``send_task`` in a kombu publish batch, one
reused producer: ``benchmarks.publish_floor``), at ``--size`` routines
stored; and the one-beat burst of 10,000 windows due at one instant against
the same floor for 10,000 messages. Each scheduler figure comes from its own
measuring subprocess (``benchmarks.measure``, PostgreSQL store, Redis broker,
every guarantee on); the floors are measured in this process just before it.

``--direct`` (issue 19, item 2) measures instead, in one run and ``--rounds``
times: the one-beat burst with ``routines_publish = "direct"``, the same burst
with the default ``send_task`` path, Celery's own per-message loop
(``apply_async`` of 10,000 on one reused producer) and the batched
``send_task`` floor, side by side.

``--processes 1,2`` (issue 19, item 1) measures instead, ``--rounds`` times:
the one-beat burst with beat publishing in its own process and with each
count of publishing processes (``routines_publish_processes``), beside the
batched ``send_task`` floor measured before and after each round.

``--baseline DIR`` also measures the code checked out in DIR (say, the
previous commit: ``git worktree add /tmp/base HEAD~2``) in the same run,
each scenario right after this tree's, and prints both.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path
from typing import Any

from . import run as run_module
from .common import BURST, HOT, claim_redis_db, clear_redis_db, log
from .publish_floor import apply_async_loop_ms, publishers_ms, send_task_batched_ms
from .run import measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="routines stored (tick)")
    parser.add_argument("--burst-size", type=int, default=BURST, help="routines stored (burst)")
    parser.add_argument("--ticks", type=int, default=12)
    parser.add_argument("--setup-budget", type=float, default=240.0)
    parser.add_argument("--run-budget", type=float, default=300.0)
    parser.add_argument("--burst-cap", type=float, default=40.0)
    parser.add_argument("--baseline", help="a checkout to measure in the same run")
    parser.add_argument("--direct", action="store_true", help="direct publish against its peers")
    parser.add_argument("--rounds", type=int, default=1, help="with --direct or --processes")
    parser.add_argument(
        "--processes", help="publishing process counts to measure the burst with, say 1,2"
    )
    args = parser.parse_args()
    if args.direct:
        direct_against_loop(args)
        return
    if args.processes:
        processes_against_floor(args, [int(n) for n in args.processes.split(",")])
        return

    trees = [("this tree", run_module.ROOT)]
    if args.baseline:
        trees.append(("baseline", Path(args.baseline).resolve()))
    db = claim_redis_db()
    results: dict[str, dict[str, Any]] = {label: {} for label, _ in trees}
    try:
        log(f"floors: {HOT} and {BURST} messages")
        floor_hot = send_task_batched_ms(db, HOT, 200)
        floor_burst = send_task_batched_ms(db, BURST, 3) / 1000
        for label, root in trees:
            run_module.ROOT = root  # the measuring subprocess runs the code found there
            log(f"{label}: routines steady at {args.size:,}")
            results[label]["steady"] = measure(
                "routines", "steady", args.size, db, args, ["--ticks", str(args.ticks)]
            )
        for label, root in trees:
            run_module.ROOT = root
            log(f"{label}: routines burst at {args.burst_size:,}")
            results[label]["burst"] = measure(
                "routines", "burst", args.burst_size, db, args, ["--burst-cap", str(args.burst_cap)]
            )
        floor_burst_after = send_task_batched_ms(db, BURST, 3) / 1000
    finally:
        run_module.ROOT = trees[0][1]
        clear_redis_db(db, keep_owner=False)
    for label, _ in trees:
        print(f"[{label}]")
        found = results[label]
        floor = (floor_burst + floor_burst_after) / 2
        report(args, found["steady"], found["burst"], floor_hot, floor)


def direct_against_loop(args: argparse.Namespace) -> None:
    """The burst with ``routines_publish = "direct"`` and with ``send_task``,
    Celery's per-message ``apply_async`` loop and the batched ``send_task``
    floor, each round measured back to back."""
    db = claim_redis_db()
    burst_args = ["--burst-cap", str(args.burst_cap)]
    rows = []
    publishing: list[dict[str, float]] = []
    try:
        for round_number in range(1, args.rounds + 1):
            log(f"round {round_number}: apply_async loop and send_task floor, {BURST} messages")
            loop_s = apply_async_loop_ms(db, BURST, 1) / 1000
            floor_s = send_task_batched_ms(db, BURST, 1) / 1000
            publishing.append(publishers_ms(db, BURST))
            bursts = {}
            for peer in ("routines-direct", "routines"):
                log(f"round {round_number}: {peer} burst at {args.burst_size:,}")
                found = measure(peer, "burst", args.burst_size, db, args, burst_args)
                if not found.get("complete"):
                    raise SystemExit(f"{peer} burst did not complete: {found}")
                if found["rows"].get("sent") != BURST:
                    raise SystemExit(f"{peer} burst left runs unsent: {found['rows']}")
                bursts[peer] = found["burst_s"]
            rows.append((bursts["routines-direct"], bursts["routines"], loop_s, floor_s))
    finally:
        clear_redis_db(db, keep_owner=False)
    print(
        f"burst of {BURST:,} (one beat, PostgreSQL, Redis) against Celery's per-message loop;"
        " seconds, one round a line"
    )
    print(
        "  direct   send_task  apply_async loop  send_task batched | direct/loop  direct/send_task"
    )
    for direct, default, loop_s, floor_s in rows:
        print(
            f"  {direct:6.2f}   {default:9.2f}  {loop_s:16.2f}  {floor_s:17.2f} |"
            f" {direct / loop_s:10.2f}x  {direct / default:15.2f}x"
        )
    if len(rows) > 1:
        medians = [statistics.median(column) for column in zip(*rows, strict=True)]
        direct, default, loop_s, floor_s = medians
        print(
            f"  median: direct {direct:.2f} s, send_task {default:.2f} s, loop {loop_s:.2f} s,"
            f" floor {floor_s:.2f} s; direct/loop {direct / loop_s:.2f}x,"
            f" direct/send_task {direct / default:.2f}x"
        )
    print(f"publish_many of {BURST:,} runs alone (no tick), ms, one round a line")
    for found in publishing:
        celery_ms, direct_ms = found["CeleryPublisher"], found["DirectPublisher"]
        print(
            f"  CeleryPublisher (send_task) {celery_ms:7.0f}   DirectPublisher {direct_ms:7.0f}"
            f"   ratio {direct_ms / celery_ms:.2f}x"
        )


def processes_against_floor(args: argparse.Namespace, counts: list[int]) -> None:
    """The burst with beat publishing in its own process and in each count
    of publishing processes, against the floor around each round."""
    db = claim_redis_db()
    burst_args = ["--burst-cap", str(args.burst_cap)]
    columns = [0, *counts]
    rows = []
    try:
        for round_number in range(1, args.rounds + 1):
            floor_before = send_task_batched_ms(db, BURST, 1) / 1000
            bursts = {}
            # Alternate the order, so no setting always runs on a warmer machine.
            for count in columns if round_number % 2 else columns[::-1]:
                peer = "routines-processes" if count else "routines"
                os.environ["BENCH_PUBLISH_PROCESSES"] = str(count)
                log(f"round {round_number}: burst with {count} publishing process(es)")
                found = measure(peer, "burst", args.burst_size, db, args, burst_args)
                if not found.get("complete") or found["rows"].get("sent") != BURST:
                    raise SystemExit(f"{peer} ({count}) burst did not send every run: {found}")
                bursts[count] = found["burst_s"]
            floor = (floor_before + send_task_batched_ms(db, BURST, 1) / 1000) / 2
            rows.append([bursts[count] for count in columns] + [floor])
    finally:
        os.environ.pop("BENCH_PUBLISH_PROCESSES", None)
        clear_redis_db(db, keep_owner=False)
    print(
        f"burst of {BURST:,} (one beat, PostgreSQL, Redis, send_task) by publishing processes;"
        " seconds, one round a line, ratio to the batched send_task floor"
    )
    header = "".join(f"  {count} process(es)" for count in columns)
    print(f"{header}  send_task batched")
    medians = [statistics.median(column) for column in zip(*rows, strict=True)]
    for label, row in [*(("", row) for row in rows), ("   median", medians)]:
        *bursts, floor = row
        cells = "".join(f"  {b:5.2f} s ({b / floor:.2f}x)" for b in bursts)
        print(f"{cells}  {floor:15.2f} s{label}")


def report(
    args: argparse.Namespace,
    steady: dict[str, Any],
    burst: dict[str, Any],
    floor_hot_ms: float,
    floor_burst_s: float,
) -> None:
    print("celery-routines (PostgreSQL, Redis) against Celery's publishing floor, one run")
    if "tick" in steady:
        tick = steady["tick"]["median_ms"]
        print(
            f"  tick with {HOT} due at {args.size:,} stored: {tick:.2f} ms (median of"
            f" {steady['tick']['n']}); send_task batched for {HOT}: {floor_hot_ms:.2f} ms;"
            f" tick minus floor: {tick - floor_hot_ms:.2f} ms"
        )
    else:
        print(f"  tick at {args.size:,}: not measured: {steady}")
    if "burst_s" in burst:
        seconds = burst["burst_s"] if burst.get("complete") else burst.get("estimated_s")
        print(
            f"  burst of {BURST:,} (one beat): {seconds:.2f} s; send_task batched for"
            f" {BURST:,}: {floor_burst_s:.2f} s (mean of the floor before and after);"
            f" ratio {seconds / floor_burst_s:.2f}x"
        )
    else:
        print(f"  burst: not measured: {burst}")


if __name__ == "__main__":
    main()
