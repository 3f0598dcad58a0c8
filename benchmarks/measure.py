"""One measurement of one scheduler, in its own process (so RSS is honest).

    python -m benchmarks.measure PEER SCENARIO --size N --redis-db D [--pg-url URL]

Prints progress on stderr and one ``RESULT {json}`` line on stdout.
Scenarios: ``steady`` (start-up, tick with 10 due, idle tick, RSS),
``burst`` (10,000 due at once, one beat), ``beat`` (one of several beats in a
celery-routines burst, driven by ``benchmarks.run``).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from typing import Any

from .common import (
    BURST,
    HOT,
    cpu_seconds,
    emit,
    log,
    queue_length,
    redis_client,
    rss_mb,
    summary_ms,
    timed,
)
from .peers import PEERS, Peer

# A real-clock peer's hot entries fall due one second after their last send.
DUE_MARGIN = 0.03
MAX_CALLS = 100_000


def one_pass(scheduler: Any, client: Any = None, target: int | None = None) -> int:
    """What Celery's beat service does while something is due: call ``tick``
    until it asks to sleep, or until the queue holds ``target`` messages (a
    scheduler that sends one entry per call and cannot send 10 a second never
    asks to sleep: by the time it sent the tenth the first is due again).
    Returns the number of calls."""
    calls = 0
    while calls < MAX_CALLS:
        calls += 1
        interval = scheduler.tick()
        if interval and interval > 0:
            return calls
        # One call sends at most one entry: no need to look before the 10th.
        if target is not None and calls >= HOT and queue_length(client) >= target:
            return calls
    raise RuntimeError("tick never asked to sleep")


def start(peer: Peer) -> tuple[Any, float, float]:
    """Construct the scheduler and run its first tick; (scheduler, construct s, first tick s)."""
    made = timed(peer.make)
    scheduler = made.value
    peer.after_start(scheduler)
    first = timed(scheduler.tick)
    return scheduler, made.seconds, first.seconds


def steady(peer: Peer, args: argparse.Namespace) -> dict[str, Any]:
    client = redis_client(peer.db)
    scheduler, construct_s, first_tick_s = start(peer)
    log(f"{peer.name} {peer.size}: started in {construct_s + first_tick_s:.2f} s")
    last_end = time.perf_counter()

    def wait_until_due() -> None:
        if peer.injected_clock:
            peer.advance(scheduler, 1.0)
            return
        delay = last_end + 1.0 + DUE_MARGIN - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        if scheduler.should_sync():  # as Celery's service loop does after a sleep
            scheduler._do_sync()
        remaining = last_end + 1.0 + DUE_MARGIN - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)

    ticks: list[float] = []
    idle: list[float] = []
    sent: list[int] = []
    calls: list[int] = []
    idle_sent: list[int] = []
    for i in range(args.warmup + args.ticks):
        wait_until_due()
        before = queue_length(client)
        measured = timed(lambda target=before + HOT: one_pass(scheduler, client, target))
        last_end = time.perf_counter()
        after = queue_length(client)
        peer.between_ticks()
        quiet = timed(scheduler.tick)
        if i >= args.warmup:
            ticks.append(measured.seconds)
            idle.append(quiet.seconds)
            sent.append(after - before)
            calls.append(measured.value)
            idle_sent.append(queue_length(client) - after)
    rss = rss_mb()
    profile = None
    if args.profile and peer.injected_clock:
        from pyinstrument import Profiler

        from .profiling import summarise

        profiler = Profiler(interval=0.0005)
        profiler.start()
        for _ in range(args.profile_ticks):
            peer.advance(scheduler, 1.0)
            one_pass(scheduler)
            profiler.stop()  # sessions are combined when it starts again
            peer.between_ticks()
            profiler.start()
        profiler.stop()
        profile = summarise(profiler, args.profile)
    result = {
        "startup_s": construct_s + first_tick_s,
        "construct_s": construct_s,
        "first_tick_s": first_tick_s,
        "tick": summary_ms(ticks),
        "idle_tick": summary_ms(idle),
        "sent_per_tick": sorted(set(sent)),
        "tick_calls_per_pass": sorted(set(calls)),
        # Messages the "idle" tick sent: non-zero when the scheduler is so slow
        # that a hot entry was due again by then.
        "idle_tick_sent": sorted(set(idle_sent)),
        "rss_mb": rss,
    }
    if profile is not None:
        result["profile"] = profile
    if args.explain and peer.name in ("routines", "routines-mariadb"):
        from .explain import explain_tick

        peer.advance(scheduler, 1.0)
        result["explain"] = explain_tick(scheduler)
    if args.idle_seconds and not peer.injected_clock:
        result["idle_cpu"] = idle_cpu(scheduler, args.idle_seconds)
    scheduler.close()
    return result


def idle_cpu(scheduler: Any, seconds: float) -> float:
    """Share of one core used by the service loop while nothing is due."""
    cpu0, wall0 = cpu_seconds(), time.monotonic()
    while time.monotonic() - wall0 < seconds:
        interval = scheduler.tick()
        if interval and interval > 0:
            time.sleep(
                min(interval, seconds - (time.monotonic() - wall0), 5.0) if seconds > 0 else 0
            )
    return (cpu_seconds() - cpu0) / (time.monotonic() - wall0)


def burst(peer: Peer, args: argparse.Namespace) -> dict[str, Any]:
    """Time from the first tick until all 10,000 due windows are published."""
    client = redis_client(peer.db)
    made = timed(peer.make)
    scheduler = made.value
    peer.after_start(scheduler)
    profiler = None
    if args.profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.001)
        profiler.start()
    started = time.perf_counter()
    deadline = started + args.burst_cap
    published = 0
    last_check = 0.0
    calls = 0
    while True:
        interval = scheduler.tick()
        calls += 1
        now = time.perf_counter()
        if now - last_check > 0.02 or (interval and interval > 0):
            published = queue_length(client)
            last_check = now
            if published >= BURST or now > deadline:
                break
        if interval and interval > 0:
            time.sleep(max(0.0, min(interval, deadline - now)))
            if scheduler.should_sync():
                scheduler._do_sync()
    elapsed = time.perf_counter() - started
    if profiler is not None:
        profiler.stop()
    result: dict[str, Any] = {
        "construct_s": made.seconds,
        "burst_s": elapsed,
        "published": published,
        "complete": published >= BURST,
        "tick_calls": calls,
        "rss_mb": rss_mb(),
    }
    if not result["complete"]:
        rate = published / elapsed if elapsed else 0.0
        result["estimated_s"] = BURST / rate if rate else None
    if peer.name in ("routines", "routines-direct", "routines-processes"):
        result["rows"] = run_rows(peer)
    if profiler is not None:
        from .profiling import summarise

        result["profile"] = summarise(profiler, args.profile)
    scheduler.close()
    return result


def run_rows(peer: Peer) -> dict[str, int]:
    from sqlalchemy import create_engine, text

    engine = create_engine(peer.pg_url)
    with engine.connect() as conn:
        rows = dict(
            conn.execute(text("SELECT state, count(*) FROM routine_runs GROUP BY state")).all()
        )
    engine.dispose()
    return {str(k): int(v) for k, v in rows.items()}


def beat(peer: Peer, args: argparse.Namespace) -> dict[str, Any]:
    """One of several celery-routines beats in a burst: build, say READY, wait
    for ``GO <epoch>``, tick until nothing more is due for it."""
    peer.restore(args.t0)
    scheduler = peer.make()
    scheduler.engine  # noqa: B018 - connect and migrate-check before the start line
    print("READY", flush=True)
    line = sys.stdin.readline().split()
    go = float(line[1])
    time.sleep(max(0.0, go - time.time()))
    sent = claimed = ticks = 0
    while True:
        scheduler.tick()
        ticks += 1
        report = scheduler.last_report
        sent += report.sent
        claimed += report.claimed
        if not report.more_due:
            break
    end = time.time()
    scheduler.close()
    return {"end": end, "sent": sent, "claimed": claimed, "ticks": ticks}


def _head() -> str:
    import subprocess

    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except Exception:
        return "unknown"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("peer", choices=sorted(PEERS))
    parser.add_argument("scenario", choices=["steady", "burst", "beat", "load"])
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--redis-db", type=int, required=True)
    parser.add_argument("--pg-url")
    parser.add_argument("--ticks", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--burst-cap", type=float, default=60.0)
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--profile", help="pyinstrument: write the profile text here")
    parser.add_argument("--profile-ticks", type=int, default=200)
    parser.add_argument("--idle-seconds", type=float, default=0.0)
    parser.add_argument("--t0", help="beat scenario: the burst instant (ISO)")
    args = parser.parse_args(argv)

    rss_start = rss_mb()
    cls = PEERS[args.peer]
    scenario = {"steady": "steady", "burst": "burst", "beat": "burst", "load": "burst"}[
        args.scenario
    ]
    peer = cls(args.size, scenario, args.redis_db, args.pg_url)
    if args.scenario == "beat":
        emit(beat(peer, args))
        return
    loaded = timed(peer.load)
    log(f"{peer.name} {args.size} {args.scenario}: set-up {loaded.seconds:.1f} s")
    if args.scenario == "load":
        emit({"setup_s": loaded.seconds, "t0": peer.t0.isoformat()})
        return
    result = steady(peer, args) if args.scenario == "steady" else burst(peer, args)
    result.update(
        setup_s=loaded.seconds,
        rss_start_mb=rss_start,
        rss_growth_mb=result["rss_mb"] - rss_start,
        hot=HOT,
        at=datetime.now().isoformat(timespec="seconds"),
        # Others commit to the same tree while a run goes on: say which code ran.
        commit=_head(),
    )
    emit(result)


if __name__ == "__main__":
    main()
