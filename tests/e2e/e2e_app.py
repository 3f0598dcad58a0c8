"""The Celery app the end-to-end tests run in real beat and worker processes.

Configured from the environment: CELERY_BROKER_URL (read by Celery itself),
ROUTINES_DATABASE_URL and ROUTINES_REDIS_URL (read by celery-routines), and
E2E_INTERVAL for the routine's period in seconds.
"""

from __future__ import annotations

import os
from datetime import timedelta

from celery import Celery

from celery_routines import register, routine, spend

app = Celery("e2e_app")
app.conf.update(
    beat_max_loop_interval=5,
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
    # Each test run gets its own queue, so leftovers never decide a result.
    task_default_queue=os.environ.get("E2E_QUEUE", "celery"),
)
if os.environ.get("E2E_BROKER_FOLDER"):
    # kombu's filesystem transport: a worker -B test that needs no server.
    folder = os.environ["E2E_BROKER_FOLDER"]
    app.conf.broker_url = "filesystem://"
    app.conf.broker_transport_options = {
        "data_folder_in": folder,
        "data_folder_out": folder,
        "control_folder": folder + "-control",
        "polling_interval": 0.2,
    }
if os.environ.get("E2E_NO_BROKER_HEALTH_CHECK"):
    # Under a sped-up libfaketime clock redis-py's periodic health check
    # misfires (see FIELD-NOTES); the stress tests turn it off.
    app.conf.broker_transport_options = {"health_check_interval": 0}
if os.environ.get("E2E_SENTINEL_MASTER"):
    # A sentinel:// broker (tests/topology): kombu's master_name option, which
    # the Redis gate reads too when routines_redis_sentinel_master is unset.
    app.conf.broker_transport_options = {
        **(app.conf.broker_transport_options or {}),
        "master_name": os.environ["E2E_SENTINEL_MASTER"],
    }
if os.environ.get("E2E_SOLAR"):
    # "sunrise <lat> <lon>": a celery.schedules.solar entry (tests/e2e/test_schedule_types.py).
    from celery.schedules import solar

    event, lat, lon = os.environ["E2E_SOLAR"].split()
    app.conf.beat_schedule = {
        "solar-entry": {"task": "e2e_app.legacy", "schedule": solar(event, float(lat), float(lon))}
    }
if os.environ.get("E2E_BEAT_SCHEDULE"):
    # E2E_BEAT_SCHEDULE: the entry's period in seconds ("1" means the default 2 s).
    period = float(os.environ["E2E_BEAT_SCHEDULE"])
    app.conf.beat_schedule = {
        "legacy-entry": {
            "task": "e2e_app.legacy",
            "schedule": timedelta(seconds=period if period != 1 else 2),
        },
    }


@routine(timedelta(seconds=float(os.environ.get("E2E_INTERVAL", "2"))), name="tick")
@app.task
def tick() -> str:
    spend(2, "emails")
    return "ok"


# E2E_BURST=N: N more routines with the same period, all due at one instant
# (tests/e2e/test_worker_stops.py stops a worker -B in the middle of one).
for number in range(int(os.environ.get("E2E_BURST", "0"))):
    register(
        "e2e_app.sql_inserted",
        timedelta(seconds=float(os.environ.get("E2E_INTERVAL", "2"))),
        name=f"burst-{number:04d}",
        catch_up="latest",
    )


@app.task
def legacy() -> str:
    return "legacy"


@app.task
def sql_inserted(word: str = "") -> str:
    return word


# -- tasks of the run-lifecycle tests (tests/e2e/test_lifecycle.py) ------------


@app.task(bind=True)
def record(self, path: str) -> str:
    """Appends one line per body run, so a test can count them."""
    with open(path, "a") as log:
        log.write(f"ran {self.request.id}\n")
    return "recorded"


@app.task(bind=True)
def hold(self, path: str, release: str, limit: float = 25.0) -> str:
    """A slow task: runs until the file ``release`` exists (at most ``limit`` s)."""
    import time

    with open(path, "a") as log:
        log.write(f"start {self.request.id} {os.getpid()}\n")
    deadline = time.monotonic() + limit
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(path, "a") as log:
        log.write(f"end {self.request.id}\n")
    return "held"


@app.task
def boom() -> None:
    raise RuntimeError("boom")


# -- the catch-up x overlap tests (tests/e2e/test_catch_up_overlap.py) ---------


@app.task(bind=True)
def timed(self, path: str, label: str, seconds: float) -> str:
    """A body of ``seconds``: appends ``start``/``end`` lines with the run id,
    the routine's label and the wall time, so a test can measure how many
    bodies of one routine ran at once and in which order."""
    import time

    with open(path, "a") as log:
        log.write(f"start {label} {self.request.id} {time.time():.3f}\n")
    time.sleep(seconds)
    with open(path, "a") as log:
        log.write(f"end {label} {self.request.id} {time.time():.3f}\n")
    return "timed"


# -- current_run() in a real worker (tests/e2e/test_current_run.py) ------------


@app.task
def window_probe(path: str, fail_on: str = "") -> str:
    """Appends what ``current_run()`` says as one JSON line; fails attempt 1
    of the window whose local date is ``fail_on`` (to have a run to replay)."""
    import json
    import threading

    from celery_routines import current_run

    run = current_run()
    line = (
        None
        if run is None
        else {
            "routine": run.routine,
            "window": run.window.isoformat(),
            "local_window": run.local_window.isoformat(),
            "zone": str(run.local_window.tzinfo),
            "attempt": run.attempt,
            "run_id": run.run_id,
            "kind": str(run.kind),
            "pid": os.getpid(),
            "thread": threading.current_thread().name,
        }
    )
    with open(path, "a") as log:
        log.write(json.dumps(line) + "\n")
    if run is not None and run.attempt == 1 and run.local_window.date().isoformat() == fail_on:
        raise RuntimeError(f"failing attempt 1 of {run.idempotency_key} on purpose")
    return "probed"


# -- Sentry Crons (tests/e2e/test_sentry_crons.py) ------------------------------

if os.environ.get("E2E_SENTRY_DSN"):
    # The same beat_schedule runs under Celery's beat and under ours; Sentry
    # watches both as its users set it up.
    import sentry_sdk
    from celery.schedules import crontab
    from sentry_sdk.integrations.celery import CeleryIntegration

    sentry_sdk.init(
        dsn=os.environ["E2E_SENTRY_DSN"],
        integrations=[CeleryIntegration(monitor_beat_tasks=True)],
        default_integrations=False,
    )
    app.conf.beat_schedule = {
        "minutely-ok": {"task": "e2e_app.legacy", "schedule": crontab()},
        "minutely-fails": {"task": "e2e_app.boom", "schedule": crontab()},
    }


# -- OpenTelemetry (tests/integrations/test_tracing_real.py) ---------------------

if os.environ.get("E2E_OTEL_SPANS"):
    # OpenTelemetry's Celery instrumentation as its users set it up; every
    # finished span is appended to a file as one JSON line (beat's publishing
    # processes end with os._exit, so nothing can wait for an exit to dump).
    import json as _json

    from opentelemetry import trace
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class _JsonLines(SpanExporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            with open(os.environ["E2E_OTEL_SPANS"], "a") as out:
                for span in spans:
                    parent = span.parent.span_id if span.parent else None
                    out.write(_json.dumps({
                        "name": span.name, "kind": span.kind.name, "pid": os.getpid(),
                        "trace_id": f"{span.context.trace_id:032x}",
                        "span_id": f"{span.context.span_id:016x}",
                        "parent_id": f"{parent:016x}" if parent else None,
                        "task_id": span.attributes.get("messaging.message.id")
                        or span.attributes.get("celery.task_id"),
                    }) + "\n")  # fmt: skip
            return SpanExportResult.SUCCESS

    _provider = TracerProvider()
    _provider.add_span_processor(SimpleSpanProcessor(_JsonLines()))
    trace.set_tracer_provider(_provider)
    CeleryInstrumentor().instrument()
