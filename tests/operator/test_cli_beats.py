"""``celery routines beats`` (issue 33): the panel's Beats table in a terminal."""

from __future__ import annotations

import json

from celery_routines.store import Store
from tests.operator import test_cli
from tests.store.test_beats import two_beats

# The command runner of tests/operator/test_cli.py (fixtures).
invoke, broker_folder = test_cli.invoke, test_cli.broker_folder
Invoke = test_cli.Invoke


def test_beats_lists_live_and_stale_beats_and_prints_json(
    invoke: Invoke,
    store: Store,
) -> None:
    assert invoke("beats").output.strip() == "no beat ticked in the last hour"
    two_beats(store)
    lines = invoke("beats").output.splitlines()
    assert lines[0].split()[:3] == ["STATE", "HOST", "PID"]
    by_host = {host: line for line in lines[1:] for host in ("host-a", "host-b") if host in line}
    assert by_host["host-b"].startswith("STALE (4") and "202" in by_host["host-b"]
    assert by_host["host-a"].startswith("live") and "1.5 ms" in by_host["host-a"]
    found = json.loads(invoke("beats", "--json").output)
    assert {b["beat_id"]: b["stale"] for b in found} == {
        "host-a:101:live": False,
        "host-b:202:dead": True,
    }
