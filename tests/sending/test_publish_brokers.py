"""Publishing on every broker and every kombu the ``redis`` extra allows
(issue 18, item 5).

Batched publishing (one Redis pipeline per 500 messages) needs kombu 5.7's
``Producer.batch``/``supports_batch_publish`` and a transport that implements
it (Redis). Everything else (RabbitMQ, kombu 5.3-5.6) takes the one-by-one
path; these tests pin that path on a real RabbitMQ and on Redis with the
kombu 5.7 batch API taken away, as an older kombu has it.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import kombu.messaging
import pytest
import redis
from kombu import Connection, Queue

from celery_routines.sending.direct import DirectPublisher
from celery_routines.sending.publish import MESSAGES_PER_BATCH, BatchingPublisher, CeleryPublisher
from tests import services
from tests.sending.test_publish import app_for, queued, run


def _no_fallback_warning(caplog: pytest.LogCaptureFixture) -> None:
    assert not [r for r in caplog.records if "batched publish" in r.getMessage()]


@pytest.mark.rabbitmq
@pytest.mark.parametrize(
    "publisher_class", [CeleryPublisher, DirectPublisher], ids=["send_task", "direct"]
)
def test_rabbitmq_sends_one_by_one_every_message_once_in_order(
    caplog: pytest.LogCaptureFixture, publisher_class: type[BatchingPublisher]
) -> None:
    if not services.port_open("127.0.0.1", 5672):
        services.unavailable("RabbitMQ", "nothing listens on 127.0.0.1:5672")
    queue_name = f"routines-publish-{uuid.uuid4().hex[:8]}"
    app = app_for(services.RABBITMQ_URL)
    app.conf.task_default_queue = queue_name
    runs = [run(i) for i in range(MESSAGES_PER_BATCH + 7)]
    received: list[str] = []
    with Connection(services.RABBITMQ_URL) as connection:
        queue = Queue(queue_name, channel=connection.default_channel)
        queue.declare()
        publisher = publisher_class(app)
        try:
            with caplog.at_level(logging.WARNING, logger="celery_routines.beat"):
                assert not publisher._can_batch()  # py-amqp has no publish batches
                errors = publisher.publish_many(runs)
        finally:
            publisher.close()
        try:
            while (message := queue.get(no_ack=True)) is not None:
                received.append(message.headers["id"])
        finally:
            queue.delete()
    assert errors == [None] * len(runs)
    assert received == [r.run_id for r in runs]
    _no_fallback_warning(caplog)


def test_without_kombus_batch_api_redis_sends_one_by_one(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # kombu before 5.7: producers have neither attribute.
    monkeypatch.delattr(kombu.messaging.Producer, "supports_batch_publish", raising=False)
    monkeypatch.delattr(kombu.messaging.Producer, "batch", raising=False)
    pipelined: list[int] = []
    real_execute = redis.client.Pipeline.execute

    def counting_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        pipelined.append(sum(1 for a, _ in self.command_stack if a[0] == "LPUSH"))
        return real_execute(self, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "execute", counting_execute)
    publisher = CeleryPublisher(app_for(redis_url))
    runs = [run(i) for i in range(MESSAGES_PER_BATCH + 7)]
    try:
        with caplog.at_level(logging.WARNING, logger="celery_routines.beat"):
            errors = publisher.publish_many(runs)
    finally:
        publisher.close()
    assert errors == [None] * len(runs)
    assert [m["headers"]["id"] for m in queued(redis_url)] == [r.run_id for r in runs]
    assert max(pipelined, default=0) <= 1  # no batch: at most one LPUSH per round trip
    _no_fallback_warning(caplog)
