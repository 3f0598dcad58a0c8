"""The panel as a person uses it: Debian's Chromium (headless, Selenium)
against ``celery routines web`` with a real beat and a real worker on
PostgreSQL and Redis. Without Chromium these tests skip, and fail under
ROUTINES_REQUIRE_SERVICES=1 (CI installs chromium-driver)."""

from __future__ import annotations

import functools
import http.server
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from selenium.common.exceptions import (
    NoAlertPresentException,
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from tests.e2e.panel_cluster import (
    REBOUND_HOST,
    SCRIPT_NAME,
    WEB,
    WEB_HEALTH,
    PanelCluster,
    free_port,
)
from tests.e2e.processes import HERE, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]


def wait_for(browser: Any, css: str, timeout: float = 20) -> Any:
    return WebDriverWait(browser, timeout).until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, css))
    )


def wait_text(browser: Any, element_id: str, text: str, timeout: float = 20) -> None:
    """Until the element shows ``text`` (across the page load a click starts)."""
    WebDriverWait(
        browser,
        timeout,
        ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
    ).until(lambda b: b.find_element(By.ID, element_id).text == text)


def test_a_skipped_windows_reason_is_on_the_skips_page(browser: Any, cluster: PanelCluster) -> None:
    wait_until(
        lambda: bool(cluster.store.admin.runs(states=["skipped"], limit=1)),
        60,
        "beat to skip a window of 'slow' (overlap)",
        cluster.processes,
    )
    browser.get(f"{cluster.url}/skips")
    rows = browser.find_elements(By.CSS_SELECTOR, "tr.skip")
    assert rows
    cells = [cell.text for cell in rows[0].find_elements(By.TAG_NAME, "td")]
    assert cells[1:3] == ["slow", "overlap"], cells
    # The routines page shows the skip in the strip and as the last outcome.
    browser.get(f"{cluster.url}/routines?name=slow")
    strip = browser.find_elements(By.CSS_SELECTOR, 'tr[data-routine="slow"] .cell.skipped')
    assert strip


def test_pause_changes_the_state_in_the_database_and_on_the_page(
    browser: Any, cluster: PanelCluster
) -> None:
    browser.get(f"{cluster.url}/routines/words")
    assert browser.find_element(By.ID, "routine-state").text == "active"
    browser.find_element(By.ID, "pause").click()
    wait_text(browser, "routine-state", "paused")
    assert browser.find_element(By.ID, "flash").text == "paused words"
    assert cluster.store.routines.by_name("words").paused is True
    browser.find_element(By.ID, "resume").click()
    wait_text(browser, "routine-state", "active")
    assert cluster.store.routines.by_name("words").paused is False


def test_live_refresh_shows_a_change_made_elsewhere_without_a_click(
    browser: Any, cluster: PanelCluster
) -> None:
    browser.get(f"{cluster.url}/routines/words?live=1")
    assert browser.find_element(By.ID, "routine-state").text == "active"
    marker = browser.execute_script("document.body.dataset.marker = 'same page'; return 1;")
    # Paused by a script through the API: the open page follows by itself.
    request = urllib.request.Request(
        f"{cluster.url}/api/routines/words/pause",
        headers={"X-CSRF-Token": cluster.csrf_token()},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200 and marker == 1
    wait_text(browser, "routine-state", "paused", timeout=30)
    # Swapped in place by the script, not reloaded.
    assert browser.execute_script("return document.body.dataset.marker") == "same page"
    resumed = cluster.store.routines.by_name("words")
    assert resumed is not None and resumed.paused
    browser.find_element(By.ID, "resume").click()
    wait_text(browser, "routine-state", "active")


def test_a_backfill_is_counted_confirmed_and_its_runs_appear(
    browser: Any, cluster: PanelCluster
) -> None:
    browser.get(f"{cluster.url}/routines/words")
    for field, value in (
        ("backfill-from", "2026-01-10T08:00"),
        ("backfill-to", "2026-01-10T10:00"),
    ):
        box = browser.find_element(By.ID, field)
        box.clear()
        box.send_keys(value)
    browser.find_element(By.ID, "backfill").click()
    assert wait_for(browser, "#backfill-count").text == "3"
    assert cluster.store.admin.runs(routine_id=_id(cluster, "words")) == []
    browser.find_element(By.ID, "confirm-backfill").click()
    assert "3 sent" in wait_for(browser, "#flash").text

    def succeeded_on_the_page() -> bool:
        browser.get(f"{cluster.url}/runs?routine=words&state=succeeded")
        return len(browser.find_elements(By.CSS_SELECTOR, "tr[data-run]")) == 3

    wait_until(succeeded_on_the_page, 60, "3 backfilled runs to succeed", cluster.processes)
    keys = {
        r.run.idempotency_key for r in cluster.store.admin.runs(routine_id=_id(cluster, "words"))
    }
    assert "words@2026-01-10T08:00:00+01:00" in keys and len(keys) == 3


def test_a_script_in_a_routine_name_is_shown_as_text(browser: Any, cluster: PanelCluster) -> None:
    browser.get(f"{cluster.url}/routines")
    links = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "a.routine-link")]
    assert SCRIPT_NAME in links
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - raises when no alert is open
    browser.find_element(By.LINK_TEXT, SCRIPT_NAME).click()
    assert wait_for(browser, "#routine-name").text == SCRIPT_NAME
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018


def test_a_post_without_a_token_is_refused(browser: Any, cluster: PanelCluster) -> None:
    browser.get(f"{cluster.url}/routines/words")
    status = browser.execute_script(
        "return fetch('/api/routines/words/pause', {method: 'POST'}).then(r => r.status);"
    )
    assert status == 403
    # A form without the CSRF token, submitted by the page itself.
    browser.execute_script(
        "const f = document.createElement('form'); f.method = 'post';"
        "f.action = '/actions/pause'; const i = document.createElement('input');"
        "i.name = 'name'; i.value = 'words'; f.appendChild(i);"
        "document.body.appendChild(f); f.submit();"
    )
    WebDriverWait(browser, 20).until(lambda b: "CSRF token" in b.page_source)
    assert cluster.store.routines.by_name("words").paused is False


def test_the_compose_health_check_passes_and_a_public_address_needs_auth(
    cluster: PanelCluster,
) -> None:
    health = subprocess.run(WEB_HEALTH, env=cluster.env, capture_output=True, timeout=30)
    assert health.returncode == 0, health.stderr
    # No bearer token is made up, so none is printed into the service's log.
    started = cluster.processes[-1].output()
    assert "celery-routines panel on" in started and "Bearer" not in started, started
    refused = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "e2e_app", *WEB],
        cwd=HERE,
        env={**cluster.env, "ROUTINES_WEB_HOST": "0.0.0.0"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1
    assert "refusing to serve the panel on 0.0.0.0 without authentication" in refused.stderr


def test_a_rebound_name_can_neither_read_the_panel_nor_act(
    browser: Any, cluster: PanelCluster
) -> None:
    """DNS rebinding, as Chromium lives it: a page of evil.example whose name
    now resolves to 127.0.0.1 reads and posts "same-origin" to the panel.
    Even holding a valid CSRF token, it gets nothing and changes nothing."""
    token = cluster.csrf_token()
    rebound = f"http://{REBOUND_HOST}:{cluster.port}"
    browser.get(f"{rebound}/routines/words")
    assert "is not a name this panel answers to" in browser.page_source
    assert token not in browser.page_source and "csrf_token" not in browser.page_source
    read, posted, form = browser.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        const token = arguments[0];
        Promise.all([
          fetch('/routines/words').then(r => r.text().then(t => [r.status, t])),
          fetch('/api/routines/words/pause',
                {method: 'POST', headers: {'X-CSRF-Token': token}}).then(r => r.status),
          fetch('/actions/pause', {method: 'POST',
                body: new URLSearchParams({name: 'words', csrf_token: token})}).then(r => r.status),
        ]).then(done, e => done(String(e)));
        """,
        token,
    )
    assert read[0] == 400 and token not in read[1], read
    assert (posted, form) == (400, 400)
    assert cluster.store.routines.by_name("words").paused is False
    # The panel under its own name still works in the same browser.
    browser.get(f"{cluster.url}/routines/words")
    assert browser.find_element(By.ID, "routine-state").text == "active"


def test_another_sites_form_is_refused_even_with_the_token(
    browser: Any, cluster: PanelCluster, tmp_path: Path
) -> None:
    """Cross-site request forgery: a page on another origin posts the panel's
    pause form to it (with a token it somehow got); Chromium sends its Origin
    and Sec-Fetch-Site, and the panel refuses."""
    token = cluster.csrf_token()
    (tmp_path / "attack.html").write_text(
        f'<form id="f" method="post" action="{cluster.url}/actions/pause">'
        f'<input name="name" value="words"><input name="csrf_token" value="{token}">'
        "</form><script>document.getElementById('f').submit()</script>"
    )
    port = free_port()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    attacker = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    serving = threading.Thread(target=attacker.serve_forever, daemon=True)
    serving.start()
    try:
        browser.get(f"http://localhost:{port}/attack.html")
        WebDriverWait(browser, 20).until(lambda b: "cross-site POST refused" in b.page_source)
    finally:
        attacker.shutdown()
        attacker.server_close()
    assert cluster.store.routines.by_name("words").paused is False


def _id(cluster: PanelCluster, name: str) -> int:
    record = cluster.store.routines.by_name(name)
    assert record is not None
    return record.id


def test_bulk_pause_with_a_reason_confirms_which_and_shows_why(
    browser: Any, cluster: PanelCluster
) -> None:
    """Issue 33: select routines on the list, pause them with a reason; the
    confirmation says how many and which, and the reason shows on the list
    and on each routine's page."""
    for name in ("bulk-a", "bulk-b", "bulk-c"):
        cluster.add(name, "e2e_app.sql_inserted", cron="0 3 * * *", timezone="Europe/Rome")
    browser.get(f"{cluster.url}/routines?name=bulk-")
    row = browser.find_element(By.CSS_SELECTOR, 'tr[data-routine="bulk-a"]')
    assert "At 03:00 (Europe/Rome)" in row.find_element(By.CSS_SELECTOR, ".schedule-words").text
    for name in ("bulk-a", "bulk-b"):
        browser.find_element(By.CSS_SELECTOR, f'input[name="names"][value="{name}"]').click()
    browser.find_element(By.ID, "bulk-reason").send_keys("quarterly close")
    browser.find_element(By.ID, "bulk-pause").click()
    wait_text(browser, "bulk-title", "Pause 2 routines")
    targets = browser.find_elements(By.CSS_SELECTOR, "#bulk-targets li")
    assert [t.text for t in targets] == ["bulk-a", "bulk-b"]
    reason = browser.find_element(By.ID, "bulk-confirm-reason")
    assert reason.get_attribute("value") == "quarterly close"
    # Without a reason the browser does not even send the form.
    reason.clear()
    browser.find_element(By.ID, "confirm-bulk").click()
    assert browser.find_element(By.ID, "bulk-title").text == "Pause 2 routines"
    assert cluster.store.routines.by_name("bulk-a").paused is False
    browser.find_element(By.ID, "bulk-confirm-reason").send_keys("quarterly close")
    browser.find_element(By.ID, "confirm-bulk").click()
    wait_for(browser, "#flash")
    assert browser.find_element(By.ID, "flash").text == (
        "pause: 2 of 2 routine(s) changed (bulk-a, bulk-b); reason: quarterly close"
    )
    for name in ("bulk-a", "bulk-b"):
        record = cluster.store.routines.by_name(name)
        assert record.paused and record.paused_reason == "quarterly close"
        shown = browser.find_element(By.CSS_SELECTOR, f'tr[data-routine="{name}"] .paused-reason')
        assert shown.text == "quarterly close"
    assert cluster.store.routines.by_name("bulk-c").paused is False
    browser.get(f"{cluster.url}/routines/bulk-b")
    assert browser.find_element(By.ID, "paused-reason").text == "quarterly close"
    assert browser.find_element(By.ID, "routine-state").text == "paused"


def test_a_routines_record_reads_as_text_and_the_list_sorts_by_it(
    browser: Any, cluster: PanelCluster
) -> None:
    """Issue 33, item 5: the routine's page shows its record (figures and a
    30-day strip whose days say their counts in words), its period changes
    from the page's own form, and the list sorts by failure rate."""
    from datetime import UTC, datetime, timedelta
    from zoneinfo import ZoneInfo

    from selenium.webdriver.support.ui import Select

    from tests.operators import add_run

    for name in ("record-a", "record-b"):
        cluster.add(name, "e2e_app.sql_inserted", cron="0 3 * * *", timezone="Europe/Rome")
    a = cluster.store.routines.by_name("record-a")
    b = cluster.store.routines.by_name("record-b")
    now = datetime.now(UTC).replace(microsecond=0)
    rome = ZoneInfo("Europe/Rome")
    expected: dict[str, dict[str, int]] = {}
    for key, state, minutes, seconds in (
        ("a@1", "succeeded", 3, 10), ("a@2", "succeeded", 2, 30), ("a@3", "failed", 1, 20),
    ):  # fmt: skip
        at = now - timedelta(minutes=minutes)
        counts = expected.setdefault(at.astimezone(rome).date().isoformat(), {})
        counts[state] = counts.get(state, 0) + 1
        add_run(
            cluster.store, a, key, state, at, at, sent_at=at + timedelta(seconds=1),
            started_at=at + timedelta(seconds=2),
            finished_at=at + timedelta(seconds=2 + seconds),
        )  # fmt: skip
    late = now - timedelta(days=3)
    add_run(cluster.store, a, "a@0", "skipped", late, late, reason="late")
    add_run(cluster.store, b, "b@1", "failed", now - timedelta(minutes=4), now)

    browser.get(f"{cluster.url}/routines/record-a")
    record = wait_for(browser, "#record")
    assert browser.find_element(By.ID, "record-title").text == "Record, last 7 days"
    assert browser.find_element(By.ID, "record-counts").text == "1 failed, 1 skipped, 2 succeeded"
    assert browser.find_element(By.ID, "record-success").text == "66.7% of 3 ended windows"
    assert browser.find_element(By.ID, "record-duration").text == "20 s / 29 s"
    assert browser.find_element(By.ID, "record-sent-lateness").text == "1 s / 1 s"
    assert browser.find_element(By.ID, "record-skips").text == "1 late"
    # Every day of the strip carries its words (read aloud, shown on hover).
    days = record.find_elements(By.CSS_SELECTOR, "#record-strip li")
    assert len(days) == 30
    for cell in days:
        assert cell.get_attribute("textContent") == cell.get_attribute("title") != ""
    # Each day in Rome as its runs fell (a run a few minutes before a Roman
    # midnight is on the day before).
    titles = {cell.get_attribute("title").partition(":")[0]: cell for cell in days}
    for day, counts in expected.items():
        words = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        assert titles[day].get_attribute("title") == f"{day}: {words}"
    # The failure's day is coloured as failed; the words say the rest.
    failed_day = next(day for day, counts in expected.items() if "failed" in counts)
    assert "cell failed" in titles[failed_day].get_attribute("class")

    period = browser.find_element(By.ID, "record-days")
    period.clear()
    period.send_keys("1")
    period.submit()
    wait_text(browser, "record-title", "Record, last 1 day")
    assert browser.find_element(By.ID, "record-counts").text == "1 failed, 2 succeeded"

    browser.get(f"{cluster.url}/routines?name=record-")
    Select(browser.find_element(By.ID, "sort")).select_by_value("failure_rate")
    browser.find_element(By.CSS_SELECTOR, "form.filters button[type=submit]").click()
    wait_for(browser, ".sort-figure")
    rows = browser.find_elements(By.CSS_SELECTOR, "tr[data-routine]")
    assert [r.get_attribute("data-routine") for r in rows] == ["record-b", "record-a"]
    assert "failure rate 100.0%" in rows[0].find_element(By.CSS_SELECTOR, ".sort-figure").text
    assert "failure rate 33.3%" in rows[1].find_element(By.CSS_SELECTOR, ".sort-figure").text
