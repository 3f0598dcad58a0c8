"""The direct path's Redis batch (``redis_push``): one ``LPUSH`` per list,
each envelope what kombu would write, and BatchingPublisher's failure rules.

``test_direct_publish`` compares the decoded messages of both paths for a
matrix of routes; these pin what that comparison cannot see: the raw bytes,
the number of commands, a queue with ``x-expires``, a failed flush, a signal
receiver that changes the message, and the paths that are not templated.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery, signals
from kombu import Queue

from celery_routines.sending.direct import DirectPublisher
from celery_routines.sending.publish import CeleryPublisher, OutgoingRun

from .test_direct_publish import (
    app_for,
    assert_same_messages,
    outgoing,
    publish_both_ways,
    take_messages,
)

TAG = re.compile(r'"delivery_tag": "[0-9a-f-]{36}"')


def raw_lists(url: str) -> dict[str, list[str]]:
    """Every Redis list's raw envelopes, delivery tags blanked; emptied."""
    client = redis.Redis.from_url(url)
    try:
        found = {}
        for key in client.scan_iter():
            if client.type(key) == b"list":
                values = client.lrange(key, 0, -1)
                client.delete(key)
                found[key.decode()] = [TAG.sub('"delivery_tag": ""', v.decode()) for v in values]
        return found
    finally:
        client.close()


def several(n: int = 3, options: dict[str, Any] | None = None) -> list[OutgoingRun]:
    return [outgoing("tasks.unknown", options, run_id=f"run-{i}") for i in range(n)]


def test_each_envelope_is_kombus_bytes_but_the_delivery_tag(redis_url: str) -> None:
    app = app_for(redis_url)
    runs = [
        *several(2),
        outgoing("tasks.unknown", {"priority": 7, "headers": {"x": [1]}}, run_id="run-p"),
        outgoing("tasks.unknown", args=[], kwargs={}, run_id="run-empty"),
    ]
    found = []
    for publisher in (CeleryPublisher(app), DirectPublisher(app)):
        try:
            assert publisher.publish_many(runs) == [None] * len(runs)
        finally:
            publisher.close()
        found.append(raw_lists(redis_url))
    assert found[0] == found[1]
    assert set(found[0]) == {"celery", "celery\x06\x166"}  # 7: the step at 6


def test_a_batch_is_one_round_trip_with_one_lpush_per_list(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pushes: list[list[tuple[str, int]]] = []
    real_execute = redis.client.Pipeline.execute

    def recording_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        pushes.append([(a[1], len(a) - 2) for a, _ in self.command_stack if a[0] == "LPUSH"])
        return real_execute(self, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "execute", recording_execute)
    app = app_for(redis_url)
    queues = ["a", "b", "a", "a", "b", "celery"]
    runs = [outgoing("tasks.unknown", {"queue": q}, run_id=f"r{i}") for i, q in enumerate(queues)]
    publisher = DirectPublisher(app)
    try:
        assert publisher.publish_many(runs) == [None] * len(runs)
    finally:
        publisher.close()
    assert [p for p in pushes if p] == [[("a", 3), ("b", 2), ("celery", 1)]]
    lists = take_messages(redis_url)
    assert [m["headers"]["id"] for m in lists["a"]] == ["r0", "r2", "r3"]


def test_a_queue_that_expires_gets_its_pexpire_as_through_kombu(redis_url: str) -> None:
    app = app_for(redis_url)
    app.conf.task_queues = [Queue("celery"), Queue("expiring", expires=600)]
    publisher = DirectPublisher(app)
    try:
        runs = several(3, {"queue": "expiring"})
        assert publisher.publish_many(runs) == [None] * 3
    finally:
        publisher.close()
    client = redis.Redis.from_url(redis_url)
    try:
        assert 0 < client.pttl("expiring") <= 600_000
    finally:
        client.close()
    assert [m["headers"]["id"] for m in take_messages(redis_url)["expiring"]] == [
        "run-0",
        "run-1",
        "run-2",
    ]


@pytest.mark.parametrize("reached_redis", [False, True], ids=["lost", "delivered_then_failed"])
def test_a_failed_flush_sends_each_run_again_on_its_own(
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    reached_redis: bool,
) -> None:
    real_execute = redis.client.Pipeline.execute
    failed = []

    def failing_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not failed and any(a[0] == "LPUSH" for a, _ in self.command_stack):
            failed.append(True)
            if reached_redis:
                real_execute(self, *args, **kwargs)
            raise redis.ConnectionError("connection lost mid-batch")
        return real_execute(self, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "execute", failing_once)
    publisher = DirectPublisher(app_for(redis_url))
    runs = several(4)
    try:
        with caplog.at_level(logging.WARNING, logger="celery_routines.beat"):
            assert publisher.publish_many(runs) == [None] * 4
    finally:
        publisher.close()
    assert failed
    assert "sending them one by one" in caplog.text
    ids = [m["headers"]["id"] for m in take_messages(redis_url)["celery"]]
    # Not knowing what Redis took, every run is sent again: at least once each
    # (the worker's claim refuses a second copy), exactly once if nothing arrived.
    expected = [r.run_id for r in runs]
    assert ids == (expected + expected if reached_redis else expected)


def test_what_before_task_publish_changes_is_in_the_message(redis_url: str) -> None:
    def stamp(headers: dict[str, Any], properties: dict[str, Any], **kwargs: Any) -> None:
        headers["traced"] = headers["id"]
        properties["priority"] = 6  # a property Producer.publish takes by name

    signals.before_task_publish.connect(stamp, weak=False)
    try:
        app = app_for(redis_url)
        by_celery, direct = publish_both_ways(redis_url, app, several(3), many=True)
    finally:
        signals.before_task_publish.disconnect(stamp)
    assert list(direct) == ["celery\x06\x166"]
    assert [m["headers"]["traced"] for m in direct["celery\x06\x166"]] == [
        "run-0",
        "run-1",
        "run-2",
    ]
    assert_same_messages(by_celery, direct)


@pytest.mark.parametrize(
    "setting", [{"task_protocol": 1}, {"task_send_sent_event": True}], ids=["protocol_1", "events"]
)
def test_messages_celery_builds_its_other_ways_are_built_per_message(
    redis_url: str, setting: dict[str, Any]
) -> None:
    app: Celery = app_for(redis_url)
    app.conf.update(setting)
    runs = several(2)
    if "task_protocol" not in setting:  # protocol 1 puts "now + 60" in the body: not comparable
        runs.append(outgoing("tasks.unknown", {"expires": 60}, run_id="run-x"))
    by_celery, direct = publish_both_ways(redis_url, app, runs, many=True)
    assert_same_messages(by_celery, direct)


def take_bindings(url: str) -> dict[str, set[bytes]]:
    """kombu's bindings (made when a queue is declared) on the test's database; deleted."""
    client = redis.Redis.from_url(url)
    try:
        found = {}
        for key in client.scan_iter(match="_kombu.binding.*"):
            found[key.decode()] = set(client.smembers(key))
            client.delete(key)
        return found
    finally:
        client.close()


def test_the_queue_is_declared_as_send_task_declares_it(redis_url: str) -> None:
    app = app_for(redis_url)
    runs = several(3, {"queue": "fresh"})
    found = []
    for publisher in (CeleryPublisher(app), DirectPublisher(app)):
        take_bindings(redis_url)
        try:
            assert publisher.publish_many(runs) == [None] * 3
        finally:
            publisher.close()
        found.append(take_bindings(redis_url))
        take_messages(redis_url)
    assert "_kombu.binding.fresh" in found[0]
    assert found[1] == found[0]


def test_a_run_left_to_send_task_keeps_its_place_in_the_batch(redis_url: str) -> None:
    app = app_for(redis_url)
    runs = several(3)
    # countdown is one of the options the direct path leaves to send_task.
    runs.insert(1, outgoing("tasks.unknown", {"countdown": 0}, run_id="run-celery"))
    by_celery, direct = publish_both_ways(redis_url, app, runs, many=True)
    assert [m["headers"]["id"] for m in direct["celery"]] == [
        "run-0",
        "run-celery",
        "run-1",
        "run-2",
    ]
    assert_same_messages(by_celery, direct)


def test_a_real_worker_takes_and_acks_every_pushed_message(redis_url: str, tmp_path: Path) -> None:
    from celery.contrib.testing.worker import start_worker

    app = app_for(redis_url)
    app.conf.update(
        worker_hijack_root_logger=False,
        # The worker's hooks look for run rows there (none: each run is refused, then acked).
        routines_database_url=f"sqlite:///{tmp_path / 'routines.db'}",
    )

    @app.task(name="tasks.record", shared=False)
    def record(*args: Any, **kwargs: Any) -> None: ...

    app.finalize()
    priorities: list[int | None] = [None, 9, 0, 5, None, 3]
    runs = [
        outgoing("tasks.record", {} if p is None else {"priority": p}, run_id=f"run-{i}")
        for i, p in enumerate(priorities)
    ]
    publisher = DirectPublisher(app)
    try:
        assert publisher.publish_many(runs) == [None] * len(runs)
    finally:
        publisher.close()
    received: list[str] = []

    def on_received(request: Any, **kwargs: Any) -> None:
        received.append(request.id)

    signals.task_received.connect(on_received, weak=False)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
            deadline = time.monotonic() + 30
            while len(received) < len(runs) and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        signals.task_received.disconnect(on_received)
    assert sorted(received) == sorted(r.run_id for r in runs)
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.hlen("unacked") == 0  # each acked by its delivery tag
        assert not take_messages(redis_url)
    finally:
        client.close()


def test_runs_with_callbacks_amid_plain_runs_keep_their_own_bodies(redis_url: str) -> None:
    # The direct batch serialises the body of a run without arguments once;
    # a run with a callback (or an empty callback list) has a body of its own.
    app = app_for(redis_url)
    plain = {"args": [], "kwargs": {}}
    runs = [
        outgoing("tasks.unknown", run_id="run-0", **plain),
        outgoing("tasks.unknown", {"link": app.signature("tasks.after")}, run_id="run-1", **plain),
        outgoing("tasks.unknown", {"link": []}, run_id="run-2", **plain),
        outgoing("tasks.unknown", run_id="run-3", **plain),
    ]
    by_celery, direct = publish_both_ways(redis_url, app, runs, many=True)
    assert_same_messages(by_celery, direct)
    bodies = [m["body"] for m in direct["celery"]]
    assert bodies[0] == bodies[3] != bodies[1] != bodies[2]
