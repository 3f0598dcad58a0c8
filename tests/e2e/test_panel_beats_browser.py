"""The Beats page as a person uses it (issue 33, items 4 and 6): Debian's
Chromium (headless, Selenium) on ``celery routines web``, with a real beat
and a real worker (tests/e2e/panel_cluster.py), on PostgreSQL and SQLite.
The beat is frozen with SIGSTOP: the open page, refreshing itself, marks it
stale in words with how long ago it ticked; after SIGCONT it is live again.

Beat runs with ``routines_refresh_seconds`` = 1: it sleeps at most a second
and writes its heartbeat at most every 5 s, so it is stale after
3 x (1 + 5) = 18 s of silence (30 s with the default refresh of 5 s)."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests import services
from tests.e2e.panel_cluster import PanelCluster

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

STALE_AFTER = 18.0


@pytest.fixture(params=["postgresql", "sqlite"])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, redis_db: int
) -> Iterator[PanelCluster]:
    folder = tmp_path_factory.mktemp("beats")
    if request.param == "sqlite":
        database_url = f"sqlite:///{folder / 'routines.db'}"
    else:
        database_url = request.getfixturevalue("postgres_databases").create()
    redis_url = f"redis://{services.REDIS_HOST}:{services.REDIS_PORT}/{redis_db}"
    panel = PanelCluster(folder, database_url, redis_url)
    panel.env["ROUTINES_REFRESH_SECONDS"] = "1"
    with panel:
        yield panel


def beat_pid(cluster: PanelCluster) -> int:
    [beat] = [p for p in cluster.processes if "beat" in p.process.args]
    return beat.process.pid


def row_state(browser: Any, pid: int) -> str:
    """The state cell of the beat's row on the open page ('' while absent)."""
    try:
        row = browser.find_element(By.CSS_SELECTOR, f'tr.beat[data-pid="{pid}"]')
        return row.get_attribute("class") + "|" + row.find_element(By.CLASS_NAME, "beat-state").text
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def api_beat(cluster: PanelCluster, pid: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"{cluster.url}/api/beats", timeout=30) as answer:
        beats = json.load(answer)["beats"]
    [beat] = [b for b in beats if b["pid"] == pid]
    return beat


def test_a_frozen_beat_is_marked_stale_on_the_open_page_and_live_again_after(
    browser: Any, cluster: PanelCluster
) -> None:
    pid = beat_pid(cluster)
    browser.get(f"{cluster.url}/beats?live=1")
    browser.find_element(By.LINK_TEXT, "Beats")  # in the nav
    wait = WebDriverWait(browser, 60, poll_frequency=0.25)
    wait.until(lambda b: row_state(b, pid).endswith("|live"))
    live = api_beat(cluster, pid)
    assert live["stale"] is False and live["stale_after_seconds"] == STALE_AFTER
    assert live["ticks_measured"] >= 1 and live["tick_p99_ms"] >= live["tick_p50_ms"] > 0
    assert abs(live["clock_skew_seconds"]) < 1  # one host, one clock
    os.kill(pid, signal.SIGSTOP)
    try:
        # Refreshed by the page itself (live), not reloaded by the test.
        wait.until(lambda b: "STALE" in row_state(b, pid))
        state = row_state(browser, pid)
        assert "stale" in state.split("|")[0].split() and "no tick for" in state, state
        frozen = api_beat(cluster, pid)
        assert frozen["stale"] is True and frozen["seconds_since_tick"] > STALE_AFTER
        assert browser.find_element(By.ID, "beats-stale-count").text == "1 stale"
    finally:
        os.kill(pid, signal.SIGCONT)
    wait.until(lambda b: row_state(b, pid).endswith("|live"))
    assert api_beat(cluster, pid)["stale"] is False
