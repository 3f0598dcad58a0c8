"""OpenTelemetry's Celery instrumentation with real beat and worker
processes: each run's publish by beat is a PRODUCER span and the worker's run
span continues the same trace, on every publish path."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from celery_routines.store import Store
from tests.e2e.processes import CeleryProcess, environment, wait_until
from tests.harness import runs_of

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]
pytest.importorskip("opentelemetry.instrumentation.celery")

RUNS = 3


def spans_of(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@pytest.mark.parametrize(
    "publishing",
    [{}, {"ROUTINES_PUBLISH": "direct"},
     {"ROUTINES_PUBLISH": "direct", "ROUTINES_PUBLISH_PROCESSES": "1"}],
    ids=["send_task", "direct", "direct-in-a-publishing-process"],
)  # fmt: skip
def test_the_workers_run_span_continues_the_trace_of_beats_publish(
    publishing: dict[str, str], tmp_path: Path, postgres_url: str, redis_url: str
) -> None:
    spans_file = tmp_path / "spans.jsonl"
    env = environment(
        redis_url, postgres_url, E2E_QUEUE=f"otel-{uuid.uuid4().hex[:8]}", E2E_INTERVAL="1",
        E2E_OTEL_SPANS=str(spans_file), **publishing,
    )  # fmt: skip
    processes = [
        CeleryProcess(
            ["worker", "--pool", "solo", "--loglevel", "INFO", "--without-heartbeat",
             "--without-mingle", "--without-gossip"],
            env,
            tmp_path / "worker.log",
        ),
        CeleryProcess(
            ["beat", "-S", "celery_routines.Scheduler", "--loglevel", "INFO",
             "--schedule", str(tmp_path / "celerybeat-schedule")],
            env,
            tmp_path / "beat.log",
        ),
    ]  # fmt: skip
    store = Store.from_url(postgres_url)

    def succeeded() -> list[str]:
        try:
            return [r["id"] for r in runs_of(store, "tick") if r["state"] == "succeeded"]
        except Exception:
            return []  # beat has not created the schema yet

    def traced() -> bool:
        spans = spans_of(spans_file)
        runs = {s["task_id"] for s in spans if s["kind"] == "CONSUMER"}
        return len(runs & set(succeeded())) >= RUNS

    try:
        wait_until(traced, 60, f"{RUNS} traced runs", processes)
    finally:
        for process in processes:
            process.stop()
    beat_pid = processes[1].process.pid
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for span in spans_of(spans_file):
        by_run[span["task_id"]].append(span)
    done = [run_id for run_id in succeeded() if any(
        s["kind"] == "CONSUMER" for s in by_run[run_id])]  # fmt: skip
    assert len(done) >= RUNS
    traces = set()
    for run_id in done:
        spans = by_run[run_id]
        [publish] = [s for s in spans if s["kind"] == "PRODUCER"]
        [run] = [s for s in spans if s["kind"] == "CONSUMER"]
        assert publish["name"] == "apply_async/e2e_app.tick" and run["name"] == "run/e2e_app.tick"
        assert run["trace_id"] == publish["trace_id"] and run["parent_id"] == publish["span_id"]
        assert publish["parent_id"] is None  # beat starts each run's trace
        if "ROUTINES_PUBLISH_PROCESSES" in publishing:
            assert publish["pid"] != beat_pid  # published by the forked process
        traces.add(publish["trace_id"])
    assert len(traces) == len(done)  # one trace per run
    per_run = {len(by_run[r]) for r in done}
    print(f"\n{publishing or 'send_task'}: {len(done)} runs, spans per run {sorted(per_run)}")
    assert per_run == {2}
    store.dispose()
