"""Run every scheduler side by side and write the table.

    python -m benchmarks.run --sizes 1000,10000,100000 --out docs/benchmarks.md

Each (peer, size, scenario) runs in its own subprocess (``benchmarks.measure``)
against its own throwaway PostgreSQL database (dropped after) and one
throwaway Redis database number (emptied between runs and released at the
end). See ``docs/benchmarks.md`` for what each figure means.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import report
from .common import (
    BURST,
    claim_redis_db,
    clear_redis_db,
    create_database,
    drop_database,
    log,
    queue_length,
    redis_client,
)
from .peers import PEERS

ROOT = Path(__file__).resolve().parent.parent
ORDER = [
    "routines",
    "routines-direct",
    "routines-processes",
    "routines-mariadb",
    "celery",
    "redbeat",
    "django",
]
# Measured only when named in --peers (against_floor --direct measures it too).
OPT_IN = ("routines-direct", "routines-processes")


class Child:
    """A measuring subprocess whose stderr is relayed and watched for the end
    of its set-up, so a peer whose set-up alone is too slow can be skipped."""

    def __init__(
        self, argv: list[str], stdin: bool = False, module: str = "benchmarks.measure"
    ) -> None:
        self.started = time.monotonic()
        self.setup_done: float | None = None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *argv],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            text=True,
        )
        self.stderr_tail: list[str] = []
        self._relay = threading.Thread(target=self._read_stderr, daemon=True)
        self._relay.start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if "set-up" in line and self.setup_done is None:
                self.setup_done = time.monotonic()
            self.stderr_tail = [*self.stderr_tail[-30:], line.rstrip()]
            sys.stderr.write("    " + line)

    def wait(self, setup_budget: float, total_budget: float) -> dict[str, Any]:
        while self.proc.poll() is None:
            elapsed = time.monotonic() - self.started
            if self.setup_done is None and elapsed > setup_budget:
                self.kill()
                return {"skipped": f"set-up > {setup_budget:.0f} s"}
            if elapsed > total_budget:
                self.kill()
                return {"skipped": f"did not finish in {total_budget:.0f} s"}
            time.sleep(0.2)
        return self.result()

    def result(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()
        self._relay.join(timeout=5)
        for line in out.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT ") :])
        tail = "\n".join(self.stderr_tail[-8:])
        return {"error": f"exit {self.proc.returncode}: {tail[-600:]}"}

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def measure(
    peer: str, scenario: str, size: int, db: int, args: argparse.Namespace, extra: list[str]
) -> dict[str, Any]:
    database = None
    argv = [peer, scenario, "--size", str(size), "--redis-db", str(db), *extra]
    mysql = PEERS[peer].needs_mysql
    if PEERS[peer].needs_postgres or mysql:
        database, url = create_database(f"{peer}_{size}", mysql=mysql)
        argv += ["--pg-url", url]
    clear_redis_db(db)
    try:
        child = Child(argv)
        budget = args.setup_budget + args.run_budget
        return child.wait(args.setup_budget, budget)
    finally:
        clear_redis_db(db)
        if database:
            drop_database(database, mysql=mysql)


def burst_many(size: int, beats: int, db: int, args: argparse.Namespace) -> dict[str, Any]:
    """celery-routines only: ``beats`` beat processes share one burst."""
    database, url = create_database(f"routines_{size}_x{beats}")
    clear_redis_db(db)
    children: list[Child] = []
    try:
        loader = Child(
            ["routines", "load", "--size", str(size), "--redis-db", str(db), "--pg-url", url]
        )
        loaded = loader.wait(args.setup_budget, args.setup_budget + 60)
        if "t0" not in loaded:
            return loaded
        common = ["--size", str(size), "--redis-db", str(db), "--pg-url", url, "--t0", loaded["t0"]]
        children = [Child(["routines", "beat", *common], stdin=True) for _ in range(beats)]
        for child in children:
            assert child.proc.stdout is not None
            line = child.proc.stdout.readline()
            if line.strip() != "READY":
                return {"error": f"beat did not start: {line!r} {child.stderr_tail[-5:]}"}
        go = time.time() + 0.5
        for child in children:
            assert child.proc.stdin is not None
            child.proc.stdin.write(f"GO {go}\n")
            child.proc.stdin.flush()
        results = [child.wait(args.run_budget, args.run_budget) for child in children]
        if any("end" not in r for r in results):
            return {"error": f"a beat failed: {results}"}
        published = queue_length(redis_client(db))
        from sqlalchemy import create_engine, text

        engine = create_engine(url)
        with engine.connect() as conn:
            rows = dict(
                conn.execute(text("SELECT state, count(*) FROM routine_runs GROUP BY state")).all()
            )
        engine.dispose()
        return {
            "burst_s": max(r["end"] for r in results) - go,
            "published": published,
            "complete": published >= BURST,
            "per_beat_sent": [r["sent"] for r in results],
            "rows": {str(k): int(v) for k, v in rows.items()},
            "setup_s": loaded["setup_s"],
        }
    finally:
        for child in children:
            if child.proc.poll() is None:
                child.kill()
        clear_redis_db(db)
        drop_database(database)


def lateness(peer: str, db: int, args: argparse.Namespace) -> dict[str, Any]:
    """Steady load on the real clock: a beat process and a consumer process."""
    database = None
    common = ["--size", str(args.lateness_size), "--redis-db", str(db)]
    if PEERS[peer].needs_postgres:
        database, url = create_database(f"{peer}_lateness")
        common += ["--pg-url", url]
    clear_redis_db(db)
    children: list[Child] = []
    try:
        beat = Child(
            ["beat", peer, *common, "--duration", str(args.lateness_seconds)],
            module="benchmarks.lateness",
        )
        children.append(beat)
        assert beat.proc.stdout is not None
        line = beat.proc.stdout.readline().split()
        if not line or line[0] != "READY":
            beat.kill()
            return {"error": f"beat did not start: {line} {beat.stderr_tail[-5:]}"}
        t0 = float(line[1])
        until = t0 + args.lateness_seconds
        # The consumer stands in for celery-routines' worker only.
        consumer_args = common if peer == "routines" else common[:4]
        consumer = Child(
            ["consume", *consumer_args, "--t0", str(t0), "--until", str(until)],
            module="benchmarks.lateness",
        )
        children.append(consumer)
        budget = args.lateness_seconds + 120
        beat_result = beat.wait(budget, budget)
        consumed = consumer.wait(budget, budget)
        return {**consumed, "beat": beat_result}
    finally:
        for child in children:
            if child.proc.poll() is None:
                child.kill()
        clear_redis_db(db)
        if database:
            drop_database(database)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes",
        default="1000,10000,100000",
        help="routines stored, comma separated (1000000 works)",
    )
    parser.add_argument("--peers", default=",".join(p for p in ORDER if p not in OPT_IN))
    parser.add_argument("--out", default="docs/benchmarks.md", help="markdown report ('' for none)")
    parser.add_argument(
        "--json", default="/tmp/celery-routines-benchmarks.json", help="raw results"
    )
    parser.add_argument("--ticks", type=int, default=12, help="measured ticks per peer and size")
    parser.add_argument(
        "--burst-cap",
        type=float,
        default=40.0,
        help="stop a burst after this many seconds and extrapolate",
    )
    parser.add_argument(
        "--setup-budget", type=float, default=180.0, help="skip a peer whose set-up takes longer"
    )
    parser.add_argument(
        "--run-budget", type=float, default=420.0, help="give up on a measurement after this long"
    )
    parser.add_argument("--no-burst", action="store_true")
    parser.add_argument(
        "--merge",
        metavar="JSON",
        help="add this run's sizes to the results of an earlier run (its --json) and report both",
    )
    parser.add_argument(
        "--lateness",
        action="store_true",
        help="also measure lateness under steady load (real clock, about 2 min per peer)",
    )
    parser.add_argument("--lateness-size", type=int, default=10_000)
    parser.add_argument("--lateness-seconds", type=float, default=90.0)
    parser.add_argument(
        "--only-lateness",
        metavar="JSON",
        help="measure lateness only and add it to the results of an earlier run (its --json)",
    )
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument(
        "--profile-size", type=int, help="size to profile at (default: largest up to 100,000)"
    )
    args = parser.parse_args(argv)

    # A stopped run still empties its Redis database and drops its databases.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sizes = [int(s) for s in args.sizes.split(",") if s]
    peers = [p for p in ORDER if p in args.peers.split(",")]
    started = time.monotonic()
    db = claim_redis_db()
    log(f"Redis database {db} claimed; sizes {sizes}; peers {peers}")
    results: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
        "sizes": sizes,
        "peers": peers,
        "cpus": os.cpu_count(),
        "ticks": args.ticks,
        "burst_cap_s": args.burst_cap,
        "steady": {},
        "burst": {},
        "burst_two_beats": {},
    }
    if args.only_lateness:
        results = json.loads(Path(args.only_lateness).read_text())
        sizes, peers = [], [p for p in peers if p in results["peers"]]
        args.lateness = True
    try:
        largest = max(sizes or [0])
        for size in sizes:
            for peer in peers:
                log(f"== {peer} at {size:,}: steady")
                extra = ["--ticks", str(args.ticks)]
                if peer in ("routines", "routines-mariadb") and size == largest:
                    extra.append("--explain")
                results["steady"].setdefault(peer, {})[str(size)] = measure(
                    peer, "steady", size, db, args, extra
                )
            if args.no_burst or size < BURST:
                continue
            for peer in peers:
                steady_cell = results["steady"].get(peer, {}).get(str(size), {})
                if str(steady_cell.get("skipped", "")).startswith("set-up"):
                    # Its set-up is the same for the burst: do not wait it out twice.
                    results["burst"].setdefault(peer, {})[str(size)] = steady_cell
                    continue
                log(f"== {peer} at {size:,}: burst of {BURST:,}")
                extra = ["--burst-cap", str(args.burst_cap)]
                results["burst"].setdefault(peer, {})[str(size)] = measure(
                    peer, "burst", size, db, args, extra
                )
            if "routines" in peers:
                log(f"== routines at {size:,}: burst of {BURST:,}, two beats")
                results["burst_two_beats"][str(size)] = burst_many(size, 2, db, args)
        if args.lateness:
            earlier = results.get("lateness", {})
            same = (earlier.get("size"), earlier.get("seconds")) == (
                args.lateness_size,
                args.lateness_seconds,
            )
            results["lateness"] = {
                "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                "commit": _commit(),
                "size": args.lateness_size,
                "seconds": args.lateness_seconds,
                # Peers measured earlier with the same load are kept.
                "peers": dict(earlier.get("peers", {})) if same else {},
            }
            for peer in peers:
                log(f"== {peer}: lateness, {args.lateness_size:,} routines every minute")
                results["lateness"]["peers"][peer] = lateness(peer, db, args)
        if not args.no_profile and "routines" in peers and sizes:
            profile_size = args.profile_size or max([s for s in sizes if s <= 100_000] or sizes)
            log(f"== profiling celery-routines at {profile_size:,}")
            results["profile"] = {"size": profile_size}
            tick_txt = "/tmp/celery-routines-profile-tick.txt"
            burst_txt = "/tmp/celery-routines-profile-burst.txt"
            results["profile"]["tick"] = measure(
                "routines",
                "steady",
                profile_size,
                db,
                args,
                ["--ticks", "3", "--profile", tick_txt],
            ).get("profile")
            if profile_size >= BURST:
                results["profile"]["burst"] = measure(
                    "routines", "burst", profile_size, db, args, ["--profile", burst_txt]
                ).get("profile")
    finally:
        clear_redis_db(db, keep_owner=False)
        log(f"Redis database {db} emptied and released")
    if args.merge:
        results = _merge(json.loads(Path(args.merge).read_text()), results)
    results["elapsed_s"] = results.get("elapsed_s", 0) + time.monotonic() - started
    Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    text = report.render(results)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        log(f"wrote {args.out} and {args.json}")


def _merge(earlier: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """The earlier run's results with the later run's sizes added (later wins)."""
    merged = dict(earlier)
    for key in ("steady", "burst"):
        for peer, by_size in later[key].items():
            merged[key].setdefault(peer, {}).update(by_size)
    merged["burst_two_beats"] = {**earlier["burst_two_beats"], **later["burst_two_beats"]}
    merged["sizes"] = sorted(set(earlier["sizes"]) | set(later["sizes"]))
    merged["peers"] = [p for p in ORDER if p in set(earlier["peers"]) | set(later["peers"])]
    for key in ("lateness", "profile"):
        if key in later:
            merged[key] = later[key]
    merged["also"] = [
        *earlier.get("also", []),
        {"date": later["date"], "commit": later["commit"], "sizes": later["sizes"]},
    ]
    return merged


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except Exception:
        return "unknown"


if __name__ == "__main__":
    main()
