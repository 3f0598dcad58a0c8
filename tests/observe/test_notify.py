"""The notifier's delivery: in order, off the caller's thread, retried with
backoff, a broken endpoint said once a minute, a full queue dropped visibly;
and what beat's events notify."""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC, datetime

import pytest
from celery import Celery
from sqlalchemy import insert

from celery_routines.observe import notify
from celery_routines.observe.events import RoutineEvents
from celery_routines.observe.final_failures import after_final_failure
from celery_routines.observe.notify import Notifier, notifier_for
from celery_routines.policy.notify_hosts import NotifyHosts
from celery_routines.store import Store
from celery_routines.store.models import ROUTINES
from tests.integrations.receiver import JsonReceiver

T0 = datetime(2026, 12, 2, 1, 30, tzinfo=UTC)
# The receivers listen on loopback, which notifications reach only when allowed.
LOOPBACK = NotifyHosts.parse("127.0.0.1")


class Monotonic:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_notification_is_posted_as_documented_json() -> None:
    receiver = JsonReceiver()
    try:
        notifier = Notifier(
            receiver.url, "https://ops.example.com/panel/", clock=lambda: T0, allowed=LOOPBACK
        )
        notifier.notify(
            notify.FINAL_FAILURE, "night ly", window=T0, run_id="r1", state="failed",
            reason="RuntimeError: boom", attempt=5,
        )  # fmt: skip
        assert notifier.flush(10)
        assert receiver.received() == [
            {
                "version": 1,
                "event": "final_failure",
                "routine": "night ly",
                "window": "2026-12-02T01:30:00+00:00",
                "run_id": "r1",
                "state": "failed",
                "reason": "RuntimeError: boom",
                "at": "2026-12-02T01:30:00+00:00",
                "panel_url": "https://ops.example.com/panel/routines/night%20ly",
                "details": {"attempt": 5},
            }
        ]
    finally:
        receiver.close()


def test_a_refused_post_is_retried_with_backoff_and_a_broken_endpoint_said_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    monotonic, waits, posted = Monotonic(), [], []
    answers = iter([OSError("refused")] * 8 + [None] * 10)

    def post(url: str, body: bytes) -> None:
        answer = next(answers)
        if answer is not None:
            raise answer
        posted.append(body)

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        monotonic.now += seconds

    notifier = Notifier("http://hook", post=post, sleep=sleep, monotonic=monotonic)
    with caplog.at_level(logging.WARNING, logger="celery_routines.notify"):
        notifier.notify(notify.LOST, "a")
        notifier.notify(notify.LOST, "b")
        assert notifier.flush(10)
    # Six tries for the first (five waits), then dropped; the second got
    # through on its third try.
    assert waits == [1, 2, 4, 8, 16, 1, 2]
    assert (notifier.dropped, notifier.delivered, len(posted)) == (1, 1, 1)
    said = [r.getMessage() for r in caplog.records]
    # 33 s of failures: one warning (not seven), one drop line deferred past the minute.
    assert sum("could not post a notification" in line for line in said) == 1, said


def test_the_caller_never_waits_for_the_endpoint_and_a_full_queue_drops_visibly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()
    monkeypatch.setattr(notify, "QUEUE_LIMIT", 3)

    def post(url: str, body: bytes) -> None:
        release.wait(10)

    notifier = Notifier("http://hook", post=post)
    with caplog.at_level(logging.ERROR, logger="celery_routines.notify"):
        for name in "abcdef":  # returns at once although nothing is delivered
            notifier.notify(notify.LOST, name)
    release.set()
    assert notifier.flush(10)
    assert notifier.dropped >= 2
    assert any("dropped: the queue is full" in r.getMessage() for r in caplog.records)


class Sent(RoutineEvents):
    def __init__(self, notifier: Notifier) -> None:
        self.notifier = notifier

    def send(self, event_type: str, **fields: object) -> None:
        pass  # the Celery event is tests/observe/test_events.py's


def test_beats_events_notify_the_moments_a_person_must_know() -> None:
    posted: list[bytes] = []
    notifier = Notifier("http://hook", post=lambda url, body: posted.append(body))
    events = Sent(notifier)
    events.skipped("a", reason="overlap", count=1, first=T0, last=T0)  # not a dropped window
    events.skipped("a", reason="catch_up_cap", count=7, first=T0, last=T0, run_id="s1")
    events.suspended("a", until=T0, reason="ceiling 10 fires per day reached")
    events.lost("a", run_id="r2", idempotency_key="a@k")
    events.invalid("a", error="bad cron", before=None)
    events.invalid("a", error="bad cron", before="bad cron")  # still the same: said once
    assert notifier.flush(10)
    import json

    bodies = [json.loads(b) for b in posted]
    assert [b["event"] for b in bodies] == ["dropped_windows", "suspended", "lost", "invalid"]
    assert bodies[0]["details"]["count"] == 7 and bodies[0]["reason"] == "catch_up_cap"


# -- a routine's own notify_url ----------------------------------------------------


def test_each_routine_is_notified_at_its_own_url_else_at_the_setting() -> None:
    default, own = JsonReceiver(), JsonReceiver()
    try:
        stored = {"payroll": own.url, "typo": "hooks.example.com/x"}
        reads: list[str] = []

        def url_of(routine: str) -> str | None:
            reads.append(routine)
            if routine == "down":
                raise OSError("database is away")
            return stored.get(routine)

        routed = notify.Notifications(
            default.url, None, url_of, allowed=LOOPBACK, monotonic=Monotonic()
        )
        for routine in ("payroll", "payroll", "nightly", "typo", "down"):
            routed.notify(notify.FINAL_FAILURE, routine, run_id=routine)
        assert notify.notifier(own.url, None, LOOPBACK).flush(10)
        assert notify.notifier(default.url, None, LOOPBACK).flush(10)
        assert [b["routine"] for b in own.received()] == ["payroll", "payroll"]
        # No own URL, a stored value that is no URL (the routine is invalid,
        # and says so), a read that failed: the setting's endpoint.
        assert [b["routine"] for b in default.received()] == ["nightly", "typo", "down"]
        assert reads.count("payroll") == 1  # read once, then kept CACHE_SECONDS
    finally:
        default.close()
        own.close()


def test_an_own_url_is_followed_within_the_cache_time_and_without_any_url_nothing_is_posted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    posted: list[tuple[str, str]] = []
    monkeypatch.setattr(notify, "notifier", lambda url, *_: Recorder(url, posted))
    monotonic, stored = Monotonic(), {"a": "http://first/hook"}
    routed = notify.Notifications(None, None, stored.get, monotonic=monotonic)
    routed.notify(notify.LOST, "a")
    routed.notify(notify.LOST, "b")  # no own URL and no setting: nobody to tell
    stored["a"] = "http://second/hook"
    routed.notify(notify.LOST, "a")
    monotonic.now += notify.CACHE_SECONDS
    routed.notify(notify.LOST, "a")
    assert posted == [
        ("http://first/hook", "a"), ("http://first/hook", "a"), ("http://second/hook", "a"),
    ]  # fmt: skip


class Recorder:
    def __init__(self, url: str, posted: list[tuple[str, str]]) -> None:
        self.url, self.posted = url, posted

    def notify(self, event: str, routine: str, **fields: object) -> None:
        self.posted.append((self.url, routine))


class QuietEvents(RoutineEvents):
    def send(self, event_type: str, **fields: object) -> None:
        pass  # the Celery event is tests/observe/test_events.py's


def test_beat_and_the_worker_read_a_routines_notify_url_from_the_store(store: Store) -> None:
    """What beat's events and a worker's final failure notify, routed by the
    ``notify_url`` column of a real store (a routine added by SQL, as the CLI
    and code routines write it)."""
    default, own = JsonReceiver(), JsonReceiver()
    try:
        app = Celery("notify-url", set_as_current=False, broker="memory://")
        app.conf.routines_notify_url = default.url
        app.conf.routines_notify_allowed_hosts = ["127.0.0.1"]
        with store.engine.begin() as conn:
            table = ROUTINES
            conn.execute(insert(table).values(name="payroll", task="t.p", cron="0 9 * * *",
                                              notify_url=own.url))  # fmt: skip
            conn.execute(insert(table).values(name="nightly", task="t.n", cron="0 3 * * *"))
        events = QuietEvents(app, store=store)
        events.skipped("payroll", reason="catch_up_cap", count=3, first=T0, last=T0)
        events.suspended("nightly", until=T0, reason="ceiling")
        payroll = store.routines.by_name("payroll")
        after_final_failure(
            store, routine_id=payroll.id, routine="payroll", pause_after=None, run_id="r1",
            window=T0, state="failed", error="boom", now=T0,
            notifier=notifier_for(app, store.streaks.notify_url),
        )  # fmt: skip
        assert notify.notifier(own.url, None, LOOPBACK).flush(10)
        assert notify.notifier(default.url, None, LOOPBACK).flush(10)
        assert [(b["event"], b["routine"]) for b in own.received()] == [
            ("dropped_windows", "payroll"), ("final_failure", "payroll"),
        ]  # fmt: skip
        assert [(b["event"], b["routine"]) for b in default.received()] == [
            ("suspended", "nightly")
        ]
    finally:
        default.close()
        own.close()


def test_three_hundred_urls_share_a_few_sender_threads_and_each_keeps_its_order() -> None:
    posted: dict[str, list[str]] = {}
    lock = threading.Lock()

    def post(url: str, body: bytes) -> None:
        with lock:
            posted.setdefault(url, []).append(json.loads(body)["routine"])

    def senders() -> int:
        return sum(t.name == "routines-notify" for t in threading.enumerate())

    notifiers = [Notifier(f"http://hook-{i}", post=post) for i in range(300)]
    for name in "abc":
        for each in notifiers:
            each.notify(notify.LOST, name)
    # The process's few senders (another test's may be among them), not one per URL.
    assert senders() <= notify.SENDERS
    assert all(each.flush(10) for each in notifiers)
    assert len(posted) == 300
    assert all(order == ["a", "b", "c"] for order in posted.values()), posted
    assert senders() <= notify.SENDERS
