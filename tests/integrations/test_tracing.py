"""OpenTelemetry's Celery instrumentation and OpenTelemetry's in-memory
exporter, in process: every run beat publishes (``send_task`` and ``direct``)
is a PRODUCER span whose context travels in the message's ``traceparent``
header, one trace per run. (The worker's side, with real processes and every
publish path: tests/integrations/test_tracing_real.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from celery_routines import Scheduler, register
from tests.conftest import FakeClock
from tests.harness import filesystem_app, published

pytest.importorskip("opentelemetry.instrumentation.celery")
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    instrumentor = CeleryInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    yield memory
    instrumentor.uninstrument()


@pytest.mark.parametrize("publish", ["send_task", "direct"])
def test_each_run_beat_publishes_is_a_span_whose_context_rides_in_the_message(
    publish: str, exporter: InMemorySpanExporter, sqlite_url: str, tmp_path: Path,
    clock: FakeClock,
) -> None:  # fmt: skip
    for name in ("a", "b", "c"):
        register(f"tasks.{name}", timedelta(minutes=1), name=name)
    folder = tmp_path / "broker"
    app = filesystem_app(folder, sqlite_url, routines_publish=publish)
    scheduler = Scheduler(app, clock=clock)
    try:
        scheduler.tick()
        clock.advance(minutes=1)
        scheduler.tick()
    finally:
        scheduler.close()
    messages = published(folder)
    spans = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.PRODUCER]
    assert len(messages) == len(spans) == 3
    by_task = {s.attributes["messaging.message.id"]: s for s in spans}
    for headers in messages:
        span = by_task[headers["id"]]
        assert span.name == f"apply_async/{headers['task']}"
        trace_id, span_id = headers["traceparent"].split("-")[1:3]
        assert (trace_id, span_id) == (
            f"{span.context.trace_id:032x}",
            f"{span.context.span_id:016x}",
        )
    assert len({s.context.trace_id for s in spans}) == 3  # a trace of its own per run
