"""Publishing in forked processes (``routines_publish_processes``), against a
real Redis broker: the same messages as beat's own ``send_task``, each run
once, a publishing process that dies leaves its chunk to beat, and none
outlives beat's ``close``."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, signals
from kombu.utils.json import register_type

from celery_routines.clock import utc_now
from celery_routines.config import settings_from
from celery_routines.errors import ConfigurationError
from celery_routines.observe.metrics import MeasuredPublisher, RoutineMetrics
from celery_routines.sending.direct import DirectPublisher
from celery_routines.sending.offload import (
    CLOSE_TIMEOUT_SECONDS,
    ProcessPublisher,
    beats_publisher,
)
from celery_routines.sending.publish import (
    CeleryPublisher,
    NotSent,
    OutgoingRun,
)
from tests.harness import running
from tests.sending.test_direct_publish import (
    app_for,
    assert_same_messages,
    outgoing,
    take_messages,
)

pytestmark = pytest.mark.redis


def runs(n: int, start: int = 0, **fields: Any) -> list[OutgoingRun]:
    return [
        outgoing("tasks.unknown", run_id=f"run-{i}", routine_name=f"r{i}", **fields)
        for i in range(start, start + n)
    ]


def ids_on(url: str) -> Counter[str]:
    return Counter(m["headers"]["id"] for found in take_messages(url).values() for m in found)


def sent_from(found: dict[str, list[dict[str, Any]]]) -> set[str]:
    """Each message's ``origin`` header, taken out of it."""
    return {m["headers"].pop("origin") for messages in found.values() for m in messages}


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def offloaded(redis_url: str) -> Iterator[tuple[Celery, ProcessPublisher]]:
    app = app_for(redis_url)
    publisher = ProcessPublisher(app, lambda: CeleryPublisher(app), processes=2)
    try:
        yield app, publisher
    finally:
        publisher.close()


def test_a_publishing_process_puts_on_the_broker_what_send_task_puts_there(
    redis_url: str,
) -> None:
    # A handler connected before the fork adds a header: the children are
    # beat's process, signals and routing included.
    def stamp(headers: dict[str, Any], **_: Any) -> None:
        headers["tenant"] = "acme"

    signals.before_task_publish.connect(stamp, weak=False)
    app = app_for(redis_url)
    app.conf.task_routes = {"tasks.routed": {"queue": "elsewhere", "priority": 4}}
    sample = [
        outgoing("tasks.unknown"),
        outgoing("tasks.routed", run_id="run-2"),
        outgoing("tasks.unknown", {"link": app.signature("tasks.after")}, run_id="run-3"),
        outgoing("tasks.unknown", {"priority": 9, "expires": 300}, run_id="run-4"),
    ]
    try:
        in_beat = CeleryPublisher(app)
        try:
            assert in_beat.publish_many(sample) == [None] * len(sample)
        finally:
            in_beat.close()
        by_beat = take_messages(redis_url)
        publisher = ProcessPublisher(app, lambda: CeleryPublisher(app), processes=1)
        try:
            [child] = publisher.pids
            assert publisher.publish_many(sample) == [None] * len(sample)
        finally:
            publisher.close()
        by_child = take_messages(redis_url)
    finally:
        signals.before_task_publish.disconnect(stamp)
    # The one header that differs names the process that sent the message.
    assert sent_from(by_beat) == {f"gen{os.getpid()}@{socket.gethostname()}"}
    assert sent_from(by_child) == {f"gen{child}@{socket.gethostname()}"}
    assert_same_messages(by_beat, by_child)
    assert by_child["celery"][0]["headers"]["tenant"] == "acme"
    # Kombu's Redis list of a queue at priority 4: the route's queue and priority.
    [routed] = [key for key in by_child if key.startswith("elsewhere")]
    assert [m["headers"]["id"] for m in by_child[routed]] == ["run-2"]


def test_chunks_handed_over_in_turn_each_go_out_once(
    redis_url: str, offloaded: tuple[Celery, ProcessPublisher]
) -> None:
    _, publisher = offloaded
    assert len(set(publisher.pids)) == 2
    # As the tick does: every chunk handed over before the first answer is read.
    pending = [publisher.begin_publish_many(runs(300, start=300 * k)) for k in range(5)]
    assert [wait() for wait in pending] == [[None] * 300] * 5
    counts = ids_on(redis_url)
    assert len(counts) == 1500 and set(counts.values()) == {1}


def test_a_killed_publishing_process_leaves_its_chunks_to_beat(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_routines.beat")
    app = app_for(redis_url)
    publisher = ProcessPublisher(app, lambda: CeleryPublisher(app), processes=1)
    try:
        [pid] = publisher.pids
        os.kill(pid, signal.SIGSTOP)  # it takes the chunk and sends nothing of it
        pending = publisher.begin_publish_many(runs(50))
        time.sleep(0.2)
        os.kill(pid, signal.SIGKILL)
        # Its answer never comes: beat sends the chunk itself, as every chunk after.
        assert pending() == [None] * 50
        assert publisher.pids == []
        assert publisher.publish_many(runs(20, start=50)) == [None] * 20
    finally:
        publisher.close()
    counts = ids_on(redis_url)
    assert len(counts) == 70 and set(counts.values()) == {1}
    [gone] = [r for r in caplog.records if " is gone " in r.getMessage()]
    assert gone.levelno == logging.ERROR and "exit status -9" in gone.getMessage()


def test_with_one_process_gone_the_other_takes_every_chunk(
    redis_url: str, offloaded: tuple[Celery, ProcessPublisher]
) -> None:
    _, publisher = offloaded
    first, second = publisher.pids
    os.kill(first, signal.SIGKILL)
    for k in range(4):
        assert publisher.publish_many(runs(10, start=10 * k)) == [None] * 10
    assert publisher.pids == [second]
    counts = ids_on(redis_url)
    assert len(counts) == 40 and set(counts.values()) == {1}


class Token:
    """A kwarg Celery's JSON serializer encodes (a registered kombu type)
    and pickle refuses."""

    def __init__(self, value: str) -> None:
        self.value = value

    def __reduce__(self) -> Any:
        raise TypeError("a Token is not pickled")


register_type(Token, "test_offload_token", lambda t: t.value, Token)


def test_a_run_pickle_refuses_goes_out_from_beats_own_process(
    redis_url: str, offloaded: tuple[Celery, ProcessPublisher]
) -> None:
    _, publisher = offloaded
    assert publisher.publish_many(runs(3, kwargs={"token": Token("t-1")})) == [None] * 3
    assert len(publisher.pids) == 2  # the children stay for the next chunk
    counts = ids_on(redis_url)
    assert len(counts) == 3 and set(counts.values()) == {1}


def test_a_broker_that_is_down_comes_back_as_each_runs_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    app = app_for(f"redis://127.0.0.1:{port}/0")
    publisher = ProcessPublisher(app, lambda: CeleryPublisher(app), processes=1)
    try:
        first, *rest = publisher.publish_many(runs(4))
        assert publisher.pids  # the error came from the child, which stays
    finally:
        publisher.close()
    assert first is not None and not isinstance(first, NotSent)
    assert "refused" in str(first).lower() or "connect" in str(first).lower()
    assert all(isinstance(error, NotSent) for error in rest)


def test_a_stop_signal_ends_an_idle_publishing_process_and_beat_sends_the_rest(
    redis_url: str, offloaded: tuple[Celery, ProcessPublisher], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_routines.beat")
    # systemd and a terminal signal every process of the group, and
    # multiprocessing sends SIGTERM to its daemons as beat's process exits:
    # a child between chunks ends; a stopping beat sends what is left itself.
    _, publisher = offloaded
    first, second = publisher.pids
    os.kill(first, signal.SIGTERM)
    os.kill(second, signal.SIGINT)
    deadline = time.monotonic() + 10
    while running(first) or running(second):
        assert time.monotonic() < deadline, "a publishing process outlived its signal"
        time.sleep(0.05)
    for k in range(3):
        assert publisher.publish_many(runs(10, start=10 * k)) == [None] * 10
    assert publisher.pids == []
    counts = ids_on(redis_url)
    assert len(counts) == 30 and set(counts.values()) == {1}
    # Told to stop is not a failure: said at INFO, not ERROR.
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    stopped = [r for r in caplog.records if "stopped; beat sends" in r.getMessage()]
    assert len(stopped) == 2


def test_closing_ends_every_publishing_process(redis_url: str) -> None:
    app = app_for(redis_url)
    publisher = ProcessPublisher(app, lambda: CeleryPublisher(app), processes=3)
    pids = publisher.pids
    assert len(pids) == 3 and not any(gone(pid) for pid in pids)
    publisher.publish_many(runs(5))
    started = time.monotonic()
    publisher.close()
    # Each child ends on its pipe's end-of-file, not on the kill after the
    # close timeout (a later child held an older one's pipe open once).
    assert time.monotonic() - started < CLOSE_TIMEOUT_SECONDS / 2
    assert all(gone(pid) for pid in pids)
    assert publisher.pids == []


def test_the_setting_forks_that_many_publishing_processes(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = app_for(redis_url)
    assert settings_from(app).publish_processes == 0
    assert type(beats_publisher(app, settings_from(app))) is CeleryPublisher
    monkeypatch.setenv("ROUTINES_PUBLISH_PROCESSES", "2")
    publisher = beats_publisher(app, settings_from(app))
    try:
        assert isinstance(publisher, ProcessPublisher) and len(publisher.pids) == 2
    finally:
        publisher.close()


@pytest.mark.parametrize("bad", ["-1", "17", "two", "1.5"])
def test_a_bad_process_count_is_refused_by_name(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROUTINES_PUBLISH_PROCESSES", bad)
    with pytest.raises(ConfigurationError, match=rf"routines_publish_processes .*{bad}"):
        settings_from(Celery("bad", set_as_current=False))


def test_the_direct_path_publishes_from_the_processes_too(redis_url: str) -> None:
    app = app_for(redis_url)
    publisher = ProcessPublisher(app, lambda: DirectPublisher(app), processes=2)
    try:
        pending = [publisher.begin_publish_many(runs(200, start=200 * k)) for k in range(3)]
        assert [wait() for wait in pending] == [[None] * 200] * 3
    finally:
        publisher.close()
    counts = ids_on(redis_url)
    assert len(counts) == 600 and set(counts.values()) == {1}


def test_beats_metrics_see_the_runs_the_processes_sent(redis_url: str) -> None:
    # With routines_metrics_port set, beat wraps its publisher: the wrapper
    # still hands chunks over in the background and observes each answer.
    app = app_for(redis_url)
    metrics = RoutineMetrics(utc_now)
    measured = MeasuredPublisher(
        ProcessPublisher(app, lambda: CeleryPublisher(app), processes=2), metrics, utc_now
    )
    try:
        assert measured.in_background
        pending = [measured.begin_publish_many(runs(50, start=50 * k)) for k in range(2)]
        assert [wait() for wait in pending] == [[None] * 50] * 2
    finally:
        measured.close()
    assert b"routines_lateness_seconds_count 100.0" in metrics.render()


_SLOW_CHILD_START = threading.Event()


def _slow_child_start() -> None:
    if _SLOW_CHILD_START.is_set():
        time.sleep(0.3)


# Registered once per test process; it only waits while the event is set.
os.register_at_fork(after_in_child=_slow_child_start)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_right_after_the_fork_is_a_stop_not_a_crash(
    redis_url: str, signum: int, caplog: pytest.LogCaptureFixture
) -> None:
    # A group signal at beat's start can reach a child before it has set its
    # handlers: it is held back across the fork and taken as a stop.
    caplog.set_level(logging.INFO, logger="celery_routines.beat")
    app = app_for(redis_url)
    _SLOW_CHILD_START.set()  # the children wait 0.3 s before anything else: the window
    try:
        publisher = ProcessPublisher(app, lambda: CeleryPublisher(app), processes=2)
    finally:
        _SLOW_CHILD_START.clear()
    try:
        children = publisher.pids
        for pid in children:  # at once: the children are still starting
            os.kill(pid, signum)
        deadline = time.monotonic() + 10
        while any(running(pid) for pid in children):
            assert time.monotonic() < deadline, "a publishing process outlived its signal"
            time.sleep(0.05)
        for k in range(3):
            assert publisher.publish_many(runs(10, start=10 * k)) == [None] * 10
        assert publisher.pids == []
    finally:
        publisher.close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([r for r in caplog.records if "stopped; beat sends" in r.getMessage()]) == 2
