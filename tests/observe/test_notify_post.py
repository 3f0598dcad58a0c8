"""A notification is posted only where it may go: the host's addresses are
checked after DNS (an injected resolver here: no traffic leaves loopback),
the connection goes to the address checked, and a redirect is not followed."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from celery import Celery

from celery_routines.errors import NotifyRefused
from celery_routines.observe import notify
from celery_routines.observe.notify import Notifier, notifier_for
from celery_routines.observe.notify_post import GuardedPoster
from celery_routines.policy.notify_hosts import NotifyHosts
from tests.integrations.receiver import JsonReceiver

LOOPBACK = NotifyHosts.parse("127.0.0.1")


def resolver(table: dict[str, list[str]]) -> Any:
    def resolve(host: str, port: int) -> list[str]:
        return table[host]

    return resolve


def never_connect(*args: object) -> None:
    raise AssertionError("a refused notification must not open a connection")


@pytest.mark.parametrize(
    "address", ["127.0.0.1", "169.254.169.254", "10.0.0.5", "192.168.1.10", "172.16.3.4", "::1"]
)
def test_a_name_that_resolves_inside_the_network_is_refused_before_any_connection(
    address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("socket.create_connection", never_connect)
    post = GuardedPoster(NotifyHosts(), resolver=resolver({"hooks.example.com": [address]}))
    with pytest.raises(NotifyRefused, match=f"resolves to {address}, which is"):
        post("https://hooks.example.com/services/T/B/t0k3n", b"{}")


def test_a_refused_post_is_dropped_at_once_and_logged_masked(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("socket.create_connection", never_connect)
    sleeps: list[float] = []
    post = GuardedPoster(NotifyHosts(), resolver=resolver({"hooks.example.com": ["10.0.0.5"]}))
    notifier = Notifier("https://u:s3cret@hooks.example.com/services/t0k3n", post=post,
                        sleep=sleeps.append)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="celery_routines.notify"):
        notifier.notify(notify.LOST, "payroll")
        assert notifier.flush(10)
    assert (notifier.dropped, sleeps) == (1, [])  # not retried: it would be refused again
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "1 notification(s) to https://u:***@hooks.example.com/services/*** dropped" in said
    assert "s3cret" not in said and "t0k3n" not in said


def test_the_connection_goes_to_the_address_that_was_checked() -> None:
    """A name only the injected resolver knows: the post reaches the
    receiver through the checked address, never a second lookup (which is
    what DNS rebinding would answer differently)."""
    receiver = JsonReceiver()
    try:
        port = receiver.server.server_port
        post = GuardedPoster(
            NotifyHosts.parse("hooks.test"), resolver=resolver({"hooks.test": ["127.0.0.1"]})
        )
        post(f"http://user:pw@hooks.test:{port}/hook?x=1", b'{"event": "lost"}')
        assert receiver.received() == [{"event": "lost"}]
    finally:
        receiver.close()


class Redirecting(BaseHTTPRequestHandler):
    target = ""

    def do_POST(self) -> None:
        self.send_response(302)
        self.send_header("Location", self.target)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def redirecting() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_redirect_is_not_followed(redirecting: ThreadingHTTPServer) -> None:
    inside = JsonReceiver()
    try:
        Redirecting.target = f"http://127.0.0.1:{inside.server.server_port}/reset?token=s3cret"
        url = f"http://127.0.0.1:{redirecting.server_port}/hook"
        with pytest.raises(NotifyRefused, match="answered 302") as raised:
            GuardedPoster(LOOPBACK)(url, b'{"event": "lost"}')
        assert "s3cret" not in str(raised.value) and "/reset?***" in str(raised.value)
        assert inside.received() == []
    finally:
        inside.close()


def test_an_own_url_at_a_refused_address_falls_back_to_the_setting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    own = {"payroll": "http://10.0.0.5:8080/admin/reset?token=s3cret"}
    routed = notify.Notifications("https://hooks.example.com/all", None, own.get)
    with caplog.at_level(logging.WARNING, logger="celery_routines.notify"):
        assert routed.url_for("payroll") == "https://hooks.example.com/all"
    said = caplog.records[0].getMessage()
    assert "the notify_url of payroll is not used: 10.0.0.5 is a private address" in said
    assert "s3cret" not in said
    allowed = notify.Notifications(None, None, own.get, allowed=NotifyHosts.parse("10.0.0.0/8"))
    assert allowed.url_for("payroll") == own["payroll"]


def test_a_failing_endpoint_is_logged_without_its_secrets(caplog: pytest.LogCaptureFixture) -> None:
    def refused(url: str, body: bytes) -> None:
        raise OSError("connection refused")

    url = "https://u:s3cret@hooks.example.com/services/T1/t0k3n?key=k3y"
    notifier = Notifier(url, post=refused, sleep=lambda seconds: None)
    with caplog.at_level(logging.INFO, logger="celery_routines.notify"):
        notifier.notify(notify.LOST, "payroll")
        assert notifier.flush(10)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert (
        "could not post a notification to https://u:***@hooks.example.com/services/***?***" in said
    )
    assert "s3cret" not in said and "t0k3n" not in said and "k3y" not in said


def test_by_default_the_setting_cannot_reach_a_loopback_endpoint() -> None:
    """routines_notify_url on loopback, no routines_notify_allowed_hosts:
    refused before connecting; allowing 127.0.0.1 lets it through."""
    receiver = JsonReceiver()
    try:
        app = Celery("refused", set_as_current=False, broker="memory://")
        app.conf.routines_notify_url = receiver.url
        routed = notifier_for(app)
        assert isinstance(routed, notify.Notifications)
        routed.notify(notify.LOST, "payroll")
        refused = notify.notifier(receiver.url)
        assert refused.flush(10) and (refused.dropped, receiver.received()) == (1, [])
        app.conf.routines_notify_allowed_hosts = "127.0.0.1"
        allowed = notifier_for(app)
        assert allowed is not None
        allowed.notify(notify.LOST, "payroll")
        assert notify.notifier(receiver.url, None, LOOPBACK).flush(10)
        assert [b["routine"] for b in receiver.received()] == ["payroll"]
    finally:
        receiver.close()
