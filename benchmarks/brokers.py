"""The 10k burst on RabbitMQ next to Redis: what publishing a burst of runs
costs on each broker, through celery-routines' own publisher (every message
built by Celery's ``send_task``, as beat sends them).

    python -m benchmarks.brokers [--n 10000] [--rounds 1]

Variants, measured in one run on one machine (quote the ratios, not the
absolute times: the machine is shared and noisy):

- ``redis batched``: kombu 5.7 publish batches, one pipeline per 500 messages
  (what beat does on Redis);
- ``redis one by one``: the same with the batch API taken away (kombu < 5.7);
- ``rabbitmq``: py-amqp, publisher confirms off. This is Celery's default:
  kombu's ``pyamqp`` transport sends ``basic_publish`` without waiting unless
  ``broker_transport_options={"confirm_publish": True}``;
- ``rabbitmq confirms``: the same with ``confirm_publish=True``: every
  publish waits for the broker's ack (one round trip per message).

Each variant publishes into a queue of its own, which is deleted after
(Redis: a claimed empty database number, emptied after).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import kombu.messaging
from celery import Celery
from kombu import Connection, Queue

from celery_routines.sending.publish import CeleryPublisher, OutgoingRun

from .common import claim_redis_db, clear_redis_db, redis_url

RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"
WINDOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


def runs(n: int) -> list[OutgoingRun]:
    return [
        OutgoingRun(
            run_id=str(uuid.uuid4()),
            routine_name=f"r{i}",
            task="bench.noop",
            args=[],
            kwargs={},
            options={},
            window=WINDOW,
            idempotency_key=f"r{i}@2026-11-30T03:00:00+00:00",
            attempt=1,
        )
        for i in range(n)
    ]


@contextlib.contextmanager
def without_batches() -> Iterator[None]:
    """kombu before 5.7: producers have no batch API."""
    saved = {
        name: kombu.messaging.Producer.__dict__[name]
        for name in ("batch", "supports_batch_publish")
        if name in kombu.messaging.Producer.__dict__
    }
    for name in saved:
        delattr(kombu.messaging.Producer, name)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(kombu.messaging.Producer, name, value)


def burst_seconds(broker: str, n: int, **conf: Any) -> float:
    queue = f"bench-brokers-{uuid.uuid4().hex[:8]}"
    app = Celery("brokers", set_as_current=False)
    app.conf.update(broker_url=broker, task_default_queue=queue, **conf)
    with Connection(broker) as connection:
        declared = Queue(queue, channel=connection.default_channel)
        declared.declare()
        publisher = CeleryPublisher(app)
        try:
            publisher.publish_many(runs(10))  # connect and warm up
            batch = runs(n)
            started = time.perf_counter()
            errors = publisher.publish_many(batch)
            took = time.perf_counter() - started
        finally:
            publisher.close()
            declared.delete()
    failed = sum(error is not None for error in errors)
    if failed:
        raise SystemExit(f"{failed} of {n} publishes failed on {broker}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    db = claim_redis_db()
    try:
        variants: dict[str, Any] = {
            "redis batched": lambda: burst_seconds(redis_url(db), args.n),
            "redis one by one": lambda: _unbatched(redis_url(db), args.n),
            "rabbitmq (Celery's default: no confirms)": lambda: burst_seconds(RABBITMQ, args.n),
            "rabbitmq confirms": lambda: burst_seconds(
                RABBITMQ, args.n, broker_transport_options={"confirm_publish": True}
            ),
        }
        results = {name: [] for name in variants}
        for _ in range(args.rounds):  # interleaved, so drift hits every variant alike
            for name, measure in variants.items():
                results[name].append(measure())
    finally:
        clear_redis_db(db, keep_owner=False)
    base = statistics.median(results["redis batched"])
    print(f"burst of {args.n:,} runs published, median of {args.rounds} round(s)")
    print(f"{'variant':45} {'seconds':>8} {'msg/s':>8} {'x redis batched':>16}")
    for name, samples in results.items():
        took = statistics.median(samples)
        print(f"{name:45} {took:8.2f} {args.n / took:8.0f} {took / base:16.2f}")


def _unbatched(broker: str, n: int) -> float:
    with without_batches():
        return burst_seconds(broker, n)


if __name__ == "__main__":
    main()
