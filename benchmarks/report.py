"""Render the results of ``benchmarks.run`` as markdown (docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .common import BURST, HOT
from .peers import PEERS

FINDINGS = Path(__file__).with_name("findings.md")
SHORT = {
    "routines": "celery-routines",
    "routines-mariadb": "celery-routines (MariaDB)",
    "celery": "Celery beat",
    "redbeat": "RedBeat",
    "django": "django-celery-beat",
}


def _fmt_s(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 10:
        return f"{value:.0f} s"
    if value >= 1:
        return f"{value:.1f} s"
    return f"{value * 1000:.0f} ms" if value >= 0.01 else f"{value * 1000:.1f} ms"


def _fmt_ms(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 100:
        return f"{value:.0f} ms"
    if value >= 1:
        return f"{value:.1f} ms"
    return f"{value:.2f} ms"


def _ratio(peer: float | None, ours: float | None) -> str:
    if peer is None or ours is None or ours <= 0:
        return ""
    return f" (x{peer / ours:.2g})" if peer / ours < 10 else f" (x{peer / ours:.0f})"


def _steady(results: dict[str, Any], peer: str, size: int) -> dict[str, Any]:
    return results["steady"].get(peer, {}).get(str(size), {})


def _burst(results: dict[str, Any], peer: str, size: int) -> dict[str, Any]:
    return results["burst"].get(peer, {}).get(str(size), {})


def _why_missing(cell: dict[str, Any]) -> str | None:
    if not cell:
        return "not run"
    if "skipped" in cell:
        return f"skipped: {cell['skipped']}"
    if "error" in cell:
        return "failed (see log)"
    return None


def _metrics(
    results: dict[str, Any], size: int
) -> list[tuple[str, dict[str, tuple[str, float | None]]]]:
    rows: list[tuple[str, dict[str, tuple[str, float | None]]]] = []

    def row(label: str, get: Any, fmt: Any, source: Any) -> None:
        cells: dict[str, tuple[str, float | None]] = {}
        for peer in results["peers"]:
            cell = source(results, peer, size)
            missing = _why_missing(cell)
            if missing:
                cells[peer] = (missing, None)
                continue
            value = get(cell)
            cells[peer] = (fmt(value, cell), value)
        rows.append((label, cells))

    row(
        "start-up (construct + first tick)",
        lambda c: c["startup_s"],
        lambda v, c: _fmt_s(v),
        _steady,
    )
    row(
        f"tick with {HOT} due, median",
        lambda c: c["tick"]["median_ms"],
        lambda v, c: _fmt_ms(v),
        _steady,
    )
    row(
        f"tick with {HOT} due, p90", lambda c: c["tick"]["p90_ms"], lambda v, c: _fmt_ms(v), _steady
    )
    row(
        "idle tick (nothing due), median",
        lambda c: c["idle_tick"]["median_ms"],
        lambda v, c: _fmt_ms(v) + (" (not idle: sent)" if any(c.get("idle_tick_sent", [])) else ""),
        _steady,
    )
    row("RSS after warm-up", lambda c: c["rss_mb"], lambda v, c: f"{v:.0f} MB", _steady)
    row(
        "RSS growth over the bare interpreter",
        lambda c: c["rss_growth_mb"],
        lambda v, c: f"{v:.0f} MB",
        _steady,
    )
    if size >= BURST:

        def burst_value(c: dict[str, Any]) -> float | None:
            return c["burst_s"] if c.get("complete") else c.get("estimated_s")

        def burst_fmt(v: float | None, c: dict[str, Any]) -> str:
            if c.get("complete"):
                return _fmt_s(v)
            return f"> {_fmt_s(c['burst_s'])} ({c['published']:,} sent; est. {_fmt_s(v)})"

        row(f"burst: {BURST:,} due at once, all published", burst_value, burst_fmt, _burst)
    return rows


def render(results: dict[str, Any]) -> str:
    peers = results["peers"]
    out: list[str] = []
    out.append("# Benchmarks: celery-routines side by side with the other Celery schedulers\n")
    out.append(
        f"Measured {results['date']} at commit `{results['commit']}` on this machine "
        f"({results['cpus']} cores, shared with other work: figures are noisy, the ratios "
        "of one run are what we quote).\n"
    )
    for extra in results.get("also", []):
        sizes_also = ", ".join(f"{s:,}" for s in extra["sizes"])
        out.append(
            f"Sizes {sizes_also} measured {extra['date']} at `{extra['commit']}` "
            "(`--merge`), with the same harness.\n"
        )
    out.append("Reproduce with:\n")
    out.append("```\npython3 -m venv /tmp/benchvenv")
    out.append(
        "/tmp/benchvenv/bin/pip install -e '.[postgres,redis]' -r benchmarks/requirements.txt"
    )
    sizes = ",".join(str(s) for s in results["sizes"])
    out.append(
        "/tmp/benchvenv/bin/python -m benchmarks.run "
        f"--sizes {sizes} --out docs/benchmarks.md\n```\n"
    )
    out.append(
        "Needs PostgreSQL (`postgres@127.0.0.1:5432`, trust auth; `BENCH_PG` to change) and "
        "Redis (`127.0.0.1:6379`). Every peer: the same interval routines of one task, "
        "the same Redis broker, one subprocess per measurement (so RSS is one scheduler's), "
        "a throwaway PostgreSQL database per peer and size. Peers: "
        + ", ".join(f"**{SHORT[p]}** = {PEERS[p].label}" for p in peers)
        + ".\n"
    )
    out.append(
        "In brackets: the peer's figure divided by ours, so **above 1 means celery-routines is "
        "faster/smaller**, below 1 means the peer is.\n"
    )
    for size in results["sizes"]:
        out.append(f"\n## {size:,} routines stored\n")
        out.append("| figure | " + " | ".join(SHORT[p] for p in peers) + " |")
        out.append("|---|" + "---|" * len(peers))
        for label, cells in _metrics(results, size):
            ours = cells.get("routines", ("", None))[1]
            line = [label]
            for peer in peers:
                text, value = cells[peer]
                line.append(text + (_ratio(value, ours) if peer != "routines" else ""))
            out.append("| " + " | ".join(line) + " |")
        two = results.get("burst_two_beats", {}).get(str(size))
        if two:
            if "burst_s" in two:
                one = _burst(results, "routines", size).get("burst_s")
                out.append(
                    f"\nTwo celery-routines beats together: {_fmt_s(two['burst_s'])} for the same "
                    f"{BURST:,} (one beat: {_fmt_s(one)}); sent per beat {two['per_beat_sent']}, "
                    f"{two['published']:,} messages on the queue, run rows {two['rows']}."
                )
            else:
                out.append(f"\nTwo celery-routines beats together: {_why_missing(two) or two}")
        stamps = []
        for label, cell in (
            ("steady", _steady(results, "routines", size)),
            ("burst", _burst(results, "routines", size)),
        ):
            if cell.get("at"):
                stamp = f"{label} {cell['at'][11:16]}"
                stamps.append(stamp + (f" at `{cell['commit']}`" if cell.get("commit") else ""))
        if stamps:
            out.append(f"\ncelery-routines measured (UTC): {', '.join(stamps)}.")
        passes = []
        for peer in peers:
            cell = _steady(results, peer, size)
            if "tick_calls_per_pass" in cell:
                passes.append(f"{SHORT[peer]} {cell['tick_calls_per_pass']}")
        if passes:
            out.append(f"\n`tick()` calls per measured tick: {', '.join(passes)}.")
        setups = []
        for peer in peers:
            cell = _steady(results, peer, size)
            if "setup_s" in cell:
                setups.append(f"{SHORT[peer]} {_fmt_s(cell['setup_s'])}")
        if setups:
            out.append(
                f"Set-up (loading the routines, not measured as start-up): {', '.join(setups)}."
            )
    out.append(_lateness(results))
    out.append(_targets(results))
    out.append(_explain(results))
    out.append(_profile(results))
    out.append(METHOD)
    if FINDINGS.exists():
        out.append("\n" + FINDINGS.read_text())
    return "\n".join(out) + "\n"


def _targets(results: dict[str, Any]) -> str:
    """Issue 7's targets against what was measured."""
    sizes = results["sizes"]
    ours = results["steady"].get("routines", {})
    lines = ["\n## Issue 7's targets, as measured\n"]
    small, large = str(min(sizes)), str(max(sizes))
    a, b = ours.get(small, {}), ours.get(large, {})
    if "tick" in a and "tick" in b:
        ta, tb = a["tick"]["median_ms"], b["tick"]["median_ms"]
        ok = tb <= 2 * ta and tb < 1
        lines.append(
            f"- Tick flat and under 1 ms: {tb:.2f} ms at {int(large):,} vs {ta:.2f} ms at "
            f"{int(small):,} (x{tb / ta:.2f}): **{'met' if ok else 'not met'}**"
            + ("" if int(large) >= 1_000_000 else " (target is stated at 1,000,000)")
        )
        ra, rb = a["rss_mb"], b["rss_mb"]
        lines.append(
            f"- RSS flat (within 5 MB): {rb:.0f} MB at {int(large):,} vs {ra:.0f} MB at "
            f"{int(small):,} ({rb - ra:+.1f} MB): **{'met' if abs(rb - ra) <= 5 else 'not met'}**"
        )
    bursts = results["burst"].get("routines", {})
    for size, cell in bursts.items():
        if "burst_s" in cell:
            ok = cell["complete"] and cell["burst_s"] < 2
            lines.append(
                f"- Burst under 2 s at {int(size):,} stored: {cell['burst_s']:.1f} s: "
                f"**{'met' if ok else 'not met'}**"
            )
        two = results.get("burst_two_beats", {}).get(size, {})
        if "burst_s" in two and "burst_s" in cell:
            ok = two["complete"] and two["burst_s"] < cell["burst_s"]
            lines.append(
                f"- Two beats sooner than one at {int(size):,}: {two['burst_s']:.1f} s vs "
                f"{cell['burst_s']:.1f} s: **{'met' if ok else 'not met'}**"
            )
    late = results.get("lateness", {}).get("peers", {}).get("routines", {})
    if late.get("p99_s") is not None:
        ok = late["p99_s"] < 1 and late["received"] >= late["expected"]
        lines.append(
            f"- Lateness under steady load: p99 {late['p99_s']:.2f} s "
            f"({late['received']:,} of {late['expected']:,} windows arrived): "
            f"**{'met' if ok else 'not met'}**"
        )
    else:
        lines.append(
            "- Lateness under steady load (p99 publish - window, 10,000 routines a minute, "
            "worker running): **not measured** in this run (`--lateness`)."
        )
    idle = (late.get("beat") or {}).get("idle_cpu")
    if idle is not None:
        lines.append(
            f"- Idle beat under 1% of a core: {idle * 100:.2f}% over the "
            f"{late['beat']['idle_seconds']:.0f} s before the first window: "
            f"**{'met' if idle < 0.01 else 'not met'}** (a short idle stretch; see below)"
        )
    else:
        lines.append("- Idle CPU of a beat with nothing due: **not measured** in this run.")
    return "\n".join(lines)


def _lateness(results: dict[str, Any]) -> str:
    data = results.get("lateness")
    if not data:
        return ""
    peers = [p for p in results["peers"] if p in data["peers"]]
    lines = [
        f"\n## Lateness under steady load ({data['size']:,} routines every minute)\n",
        f"Measured {data.get('date', '')} at `{data.get('commit', '')}`. Real clock; routine i's "
        "windows at t0 + (i mod 60) s + k min, about 167 a second; the beat runs Celery's service "
        f"loop for {data['seconds']:.0f} s; a consumer process pops each message off the Redis "
        "queue as it lands (for celery-routines it also marks the run `succeeded`, as a worker "
        "would). Lateness = arrival - window, over the windows up to 5 s before the end; the "
        "window is taken as the latest one before the arrival, so for a peer more than a "
        "minute behind it is a lower bound (its 'arrived' count tells how far behind). "
        "CPU is the beat process's share of one core.\n",
        "| figure | " + " | ".join(SHORT[p] for p in peers) + " |",
        "|---|" + "---|" * len(peers),
    ]

    def cell(peer: str, get: Any) -> str:
        value = data["peers"][peer]
        missing = _why_missing(value)
        if missing:
            return missing
        try:
            return get(value)
        except (KeyError, TypeError):
            return "—"

    def secs(v: float | None) -> str:
        return "—" if v is None else f"{v:.2f} s"

    rows = [
        ("windows arrived / due", lambda v: f"{v['received']:,} / {v['expected']:,}"),
        ("lateness p50", lambda v: secs(v["p50_s"])),
        ("lateness p99", lambda v: secs(v["p99_s"])),
        ("lateness max", lambda v: secs(v["max_s"])),
        ("beat CPU under this load", lambda v: f"{v['beat']['busy_cpu'] * 100:.0f}%"),
        (
            "beat CPU idle (nothing due yet)",
            lambda v: f"{v['beat']['idle_cpu'] * 100:.2f}% over {v['beat']['idle_seconds']:.0f} s",
        ),
    ]
    for label, get in rows:
        lines.append("| " + " | ".join([label, *(cell(p, get) for p in peers)]) + " |")
    return "\n".join(lines)


def _explain(results: dict[str, Any]) -> str:
    return "\n".join(
        _explain_peer(results, peer, title)
        for peer, title in (("routines", "PostgreSQL"), ("routines-mariadb", "MariaDB"))
    )


def _explain_peer(results: dict[str, Any], peer: str, title: str) -> str:
    sizes = results["sizes"]
    cell = results["steady"].get(peer, {}).get(str(max(sizes)), {})
    explain = cell.get("explain")
    if not explain:
        return ""
    how = (
        "`EXPLAIN (ANALYZE, BUFFERS)` in a rolled-back transaction"
        if peer == "routines"
        else "`EXPLAIN` (one line per table: access type, index, estimated rows)"
    )
    lines = [
        f"\n## Our due-query at {max(sizes):,} stored ({title})\n",
        "`store.routines.due_select` as the claim runs it (`FOR UPDATE SKIP LOCKED`), "
        f"{how}, "
        "while the 10 hot routines are due:\n",
        "```sql",
        explain["due_select"]["sql"],
        "```",
        "```",
        explain["due_select"]["plan"],
        "```",
        f"\nEvery statement one tick with {HOT} due sent, with its plan (re-run after the tick, "
        "in a rolled-back transaction, so rows it changed are no longer due):\n",
    ]
    if "statement_count" in explain:
        lines.insert(
            -1,
            f"\nThat tick sent {explain['statement_count']} statements over "
            f"{explain['pool_checkouts']} connection checkouts"
            + (
                " (each one a pre-ping round trip: `pool_pre_ping` is on)"
                if explain["pre_ping"]
                else ""
            )
            + ".\n",
        )
    for number, statement in enumerate(explain["tick_statements"], 1):
        sql = statement["sql"]
        lines.append(f"{number}. `{sql[:300]}{'…' if len(sql) > 300 else ''}`")
        lines.append("   ```")
        lines.extend("   " + line for line in statement["plan"].splitlines())
        lines.append("   ```")
    return "\n".join(lines)


def _profile(results: dict[str, Any]) -> str:
    profile = results.get("profile")
    if not profile:
        return ""
    lines = [f"\n## Where our time goes (pyinstrument, {profile['size']:,} stored)\n"]
    for kind, title in (("tick", f"ticks with {HOT} due"), ("burst", f"the burst of {BURST:,}")):
        data = profile.get(kind)
        if not data:
            continue
        lines.append(
            f"\n### {title}: {data['total_s']:.2f} s profiled\n\n"
            "Inclusive share of wall time (a frame's time includes what it calls, "
            "so shares overlap):\n"
        )
        lines.append("| frame | share | seconds |")
        lines.append("|---|---|---|")
        for item in data["top"]:
            lines.append(
                f"| `{item['frame']}` | {item['share'] * 100:.0f}% | {item['seconds']:.3f} |"
            )
    return "\n".join(lines)


METHOD = """
## What each figure is

- **start-up**: constructing the scheduler as `celery beat` would (for celery-routines: migrate
  check, definitions, gate; for Celery beat: merging `beat_schedule` into the shelve file; for
  django-celery-beat: reading every enabled row) plus its first `tick()`.
- **tick with 10 due**: ten routines every second, the rest once a day and not due. A measured
  tick is what the beat service does while something is due: call `tick()` until it asks to
  sleep, publishing the 10 messages (Celery beat and django-celery-beat send one entry per
  `tick()` call, so that is 11 calls; RedBeat and celery-routines send all due in one). The
  peers run on the real clock and are measured 1.03 s after their previous sends; celery-routines
  runs on an injected clock moved one second per tick (`Scheduler(app, clock=...)`). Each pass
  is checked to have put exactly 10 messages on the Redis queue.
- **idle tick**: one `tick()` right after, with nothing due.
- **RSS**: resident memory of the measuring process (psutil) after the warm-up and the
  measured ticks; growth is over the same process before the routines were loaded.
- **burst**: 10,000 routines whose window fell due at the same past instant among the stored
  ones; the time from the first `tick()` (scheduler already constructed) until all 10,000
  messages are on the Redis queue, driven like Celery's service loop (sleep when `tick()` says
  so). For celery-routines the run rows are written and marked `sent` (checked after), with the
  Redis idempotency gate on. A peer still sending after the cap is stopped and its time is
  extrapolated from its rate so far. Two beats: two processes started at the same instant on
  the same database.
- **set-up** (loading the routines, not a scheduler figure): celery-routines one
  `INSERT ... SELECT generate_series`; Celery beat a `beat_schedule` dict; RedBeat pipelined
  `HSET`/`ZADD` of RedBeat's own encoding; django-celery-beat `migrate` and `bulk_create`.
  A peer whose set-up takes longer than the budget (180 s by default) is skipped at that size.
- celery-routines runs with its defaults (`overlap="skip"`, Redis idempotency gate on, batch
  1,000). Between measured ticks (untimed) a stand-in worker marks every open run `succeeded`,
  as a real worker would have by then; without it `overlap="skip"` would (rightly) turn each
  later window of a hot routine into an overlap skip.
"""
