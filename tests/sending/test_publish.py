"""The publisher against a real Redis broker: batched sends, a broker that is
down, and one bad message among good ones."""

from __future__ import annotations

import json
import socket
import threading
import time
from datetime import UTC, datetime
from typing import Any

import kombu.messaging
import pytest
import redis
from celery import Celery
from celery._state import task_join_will_block

from celery_routines.sending.direct import DirectPublisher
from celery_routines.sending.publish import (
    MESSAGES_PER_BATCH,
    PUBLISH_RETRY_POLICY,
    BatchingPublisher,
    CeleryPublisher,
    NotSent,
    OutgoingRun,
    results_never_awaited,
)

# Both publish paths share the batching and the error bookkeeping; each is pinned.
each_publisher = pytest.mark.parametrize(
    "publisher_class", [CeleryPublisher, DirectPublisher], ids=["send_task", "direct"]
)

WINDOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


def run(i: int, **kwargs: Any) -> OutgoingRun:
    return OutgoingRun(
        run_id=f"run-{i}",
        routine_name=f"r{i}",
        task="tasks.noop",
        args=[i],
        kwargs=kwargs,
        options={},
        window=WINDOW,
        idempotency_key=f"r{i}@2026-11-30T03:00:00+00:00",
        attempt=1,
    )


def app_for(broker_url: str) -> Celery:
    app = Celery("publish_test", set_as_current=False)
    app.conf.update(broker_url=broker_url, broker_connection_retry_on_startup=False)
    return app


def queued(url: str) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(url)
    try:
        # LPUSH puts the newest first; the worker takes from the other end.
        return [json.loads(raw) for raw in reversed(client.lrange("celery", 0, -1))]
    finally:
        client.close()


@each_publisher
def test_many_runs_go_out_in_order_one_pipeline_per_batch(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, publisher_class: type[BatchingPublisher]
) -> None:
    if not hasattr(kombu.messaging.Producer, "batch"):
        pytest.skip("kombu before 5.7 has no publish batches (test_publish_brokers pins that path)")
    executed: list[int] = []
    real_execute = redis.client.Pipeline.execute

    def counting_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Messages pushed (an LPUSH carries one or more: the direct path pushes a list's at once).
        executed.append(sum(len(args) - 2 for args, _ in self.command_stack if args[0] == "LPUSH"))
        return real_execute(self, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "execute", counting_execute)
    publisher = publisher_class(app_for(redis_url))
    runs = [run(i) for i in range(2 * MESSAGES_PER_BATCH + 7)]
    try:
        errors = publisher.publish_many(runs)
    finally:
        publisher.close()

    assert errors == [None] * len(runs)
    messages = queued(redis_url)
    assert [m["headers"]["id"] for m in messages] == [r.run_id for r in runs]
    assert {m["headers"]["routine_attempt"] for m in messages} == {1}
    # Three pipelines carry every message: a round trip per batch, not per message.
    assert [n for n in executed if n] == [MESSAGES_PER_BATCH, MESSAGES_PER_BATCH, 7]


@each_publisher
def test_a_message_that_cannot_be_encoded_fails_alone(
    redis_url: str, publisher_class: type[BatchingPublisher]
) -> None:
    publisher = publisher_class(app_for(redis_url))
    runs = [run(0), run(1, when=object()), run(2)]
    try:
        errors = publisher.publish_many(runs)
    finally:
        publisher.close()

    assert errors[0] is None and errors[2] is None
    assert errors[1] is not None and not isinstance(errors[1], NotSent)
    assert [m["headers"]["id"] for m in queued(redis_url)] == ["run-0", "run-2"]


POLICY_SLEEPS = sum(
    PUBLISH_RETRY_POLICY["interval_start"] + k * PUBLISH_RETRY_POLICY["interval_step"]
    for k in range(PUBLISH_RETRY_POLICY["max_retries"])
)


@each_publisher
def test_a_broker_that_is_down_fails_the_first_send_and_skips_the_rest(
    publisher_class: type[BatchingPublisher],
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    publisher = publisher_class(app_for(f"redis://127.0.0.1:{port}/0"))
    started = time.monotonic()
    try:
        errors = publisher.publish_many([run(i) for i in range(4)])
    finally:
        publisher.close()
    # Beat waits out the publish retry policy once (its sleeps: 0.9 s), not
    # kombu's connection retries (broker_connection_timeout, 6 s a try here).
    assert time.monotonic() - started < POLICY_SLEEPS + 2.5

    first, *rest = errors
    assert first is not None and not isinstance(first, NotSent)
    assert "refused" in str(first).lower() or "connect" in str(first).lower()
    # Only one send waited out the retry policy; the others were not tried.
    assert all(isinstance(error, NotSent) for error in rest)
    assert all(str(error).startswith("not sent: ") for error in rest)


@each_publisher
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one_by_one"])
def test_beats_sends_with_a_redis_result_backend_subscribe_to_no_result_channel(
    redis_url: str, publisher_class: type[BatchingPublisher], batched: bool
) -> None:
    # send_task subscribes its caller to each task's result channel (Celery
    # before 5.7 keeps every subscription; 5.7 drops it when the result object
    # is collected): two Redis round trips per run that beat never reads.
    app = app_for(redis_url)
    app.conf.result_backend = redis_url
    publisher = publisher_class(app, subscribe_to_results=False)
    runs = [run(i) for i in range(3)]
    try:
        if batched:
            assert publisher.publish_many(runs) == [None, None, None]
        else:
            for each in runs:
                publisher.publish(each)
        # The backend's result consumer starts with its first subscription.
        never_subscribed = app.backend.result_consumer._pubsub is None
    finally:
        publisher.close()
        app.close()

    assert never_subscribed
    # The messages are unchanged: the worker still stores each result.
    messages = queued(redis_url)
    assert len(messages) == 3 and not any(m["headers"]["ignore_result"] for m in messages)
    # Celery's flag is lowered again: this process may still wait on results.
    assert task_join_will_block() is False


def test_the_operators_send_task_path_is_celerys_own(redis_url: str) -> None:
    # The panel or an application's Python API may wait on results in another
    # thread: their sends leave Celery's flag alone.
    app = app_for(redis_url)
    app.conf.result_backend = redis_url
    publisher = CeleryPublisher(app)
    try:
        publisher.publish(run(1))
        subscribed = app.backend.result_consumer._pubsub is not None
    finally:
        publisher.close()
        app.close()
    assert subscribed


def test_concurrent_senders_leave_celerys_flag_as_they_found_it() -> None:
    # Two beats in one process (the tests run them in threads): the flag is
    # lowered when the last sender is done, the one that found it raised.
    first_in, second_in = threading.Event(), threading.Event()
    first_out, second_out = threading.Event(), threading.Event()

    def send(inside: threading.Event, leave: threading.Event) -> None:
        with results_never_awaited():
            inside.set()
            leave.wait(10)

    first = threading.Thread(target=send, args=(first_in, first_out))
    second = threading.Thread(target=send, args=(second_in, second_out))
    first.start()
    assert first_in.wait(10)
    second.start()
    assert second_in.wait(10)
    assert task_join_will_block() is True
    first_out.set()
    first.join()
    assert task_join_will_block() is True  # the second is still sending
    second_out.set()
    second.join()
    assert task_join_will_block() is False
