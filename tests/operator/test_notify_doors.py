"""A notify_url aimed inside the network is refused at the operator's doors
(one line naming the routine and the value, masked; nothing stored) unless
routines_notify_allowed_hosts allows it; ``export`` prints secrets whole
unless asked to mask them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from celery_routines.store import Store
from tests.conftest import FakeClock
from tests.operators import cli_invoker, make_app, ok, one_error

INTERNAL = "http://127.0.0.1:18700/internal-admin/reset?confirm=yes"
METADATA = "http://169.254.169.254/latest/meta-data/"


def test_add_and_edit_refuse_an_internal_address_by_default(
    store: Store,
    database_url: str,
    tmp_path: Path,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    invoke = cli_invoker(make_app(tmp_path / "broker", database_url), clock, monkeypatch)
    line = one_error(invoke("add", "x", "tasks.x", "--every", "1m", "--notify-url", INTERNAL))
    assert line == (
        "Error: routine 'x': notify_url 'http://127.0.0.1:18700/internal-admin/***?***' is "
        "refused: 127.0.0.1 is a loopback address; notifications go to public addresses "
        "unless routines_notify_allowed_hosts allows it (e.g. '127.0.0.1')"
    )
    assert store.routines.by_name("x") is None
    ok(
        invoke(
            "add", "x", "tasks.x", "--every", "1m", "--notify-url", "https://hooks.example.com/a"
        )
    )
    line = one_error(invoke("edit", "x", "--notify-url", METADATA))
    assert "routine 'x': notify_url 'http://169.254.169.254/latest/***'" in line
    assert "a cloud metadata address" in line
    assert store.routines.by_name("x").notify_url == "https://hooks.example.com/a"


def test_the_setting_lets_a_named_internal_host_through(
    store: Store,
    database_url: str,
    tmp_path: Path,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = make_app(tmp_path / "broker", database_url, routines_notify_allowed_hosts="127.0.0.1")
    invoke = cli_invoker(app, clock, monkeypatch)
    ok(invoke("add", "x", "tasks.x", "--every", "1m", "--notify-url", INTERNAL))
    assert store.routines.by_name("x").notify_url == INTERNAL
    line = one_error(invoke("edit", "x", "--notify-url", METADATA))
    assert "a cloud metadata address" in line


def test_export_prints_secrets_whole_unless_masked(
    store: Store,
    database_url: str,
    tmp_path: Path,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    invoke = cli_invoker(make_app(tmp_path / "broker", database_url), clock, monkeypatch)
    secret = "https://u:s3cret@hooks.example.com/services/T1/t0k3n?key=k3y"
    ok(invoke("add", "pay", "tasks.pay", "--every", "1m", "--notify-url", secret))
    assert "holds secrets" in ok(invoke("export", "--help")).replace("\n", " ")
    assert json.loads(ok(invoke("export")))["routines"]["pay"]["notify_url"] == secret
    masked = ok(invoke("export", "--mask"))
    assert "s3cret" not in masked and "t0k3n" not in masked and "k3y" not in masked
    assert json.loads(masked)["routines"]["pay"]["notify_url"] == (
        "https://u:***@hooks.example.com/services/***?***"
    )
