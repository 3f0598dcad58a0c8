"""The routine form as a person uses it (issue 33, items 1 and 6): Debian's
Chromium (headless, Selenium) against ``celery routines web`` with a real
beat and worker on PostgreSQL and Redis. Create a routine through the form,
edit one with a bad cron and see the error next to the field while typing
(nothing stored changes), and clone a routine owned by code. Without
Chromium these tests skip (and fail under ROUTINES_REQUIRE_SERVICES=1)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.e2e.panel_cluster import PanelCluster
from tests.e2e.processes import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]


def until(browser: Any, check: Any, timeout: float = 20) -> Any:
    return WebDriverWait(
        browser,
        timeout,
        ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
    ).until(check)


def type_into(browser: Any, field: str, text: str) -> None:
    box = browser.find_element(By.ID, f"f-{field}")
    box.clear()
    box.send_keys(text)


def error_of(browser: Any, field: str) -> str:
    return str(browser.find_element(By.ID, f"error-{field}").text)


def preview_rows(browser: Any) -> list[str]:
    return [row.text for row in browser.find_elements(By.CSS_SELECTOR, "#preview tr.window")]


def test_a_routine_created_through_the_form_is_stored_and_listed(
    browser: Any, cluster: PanelCluster
) -> None:
    browser.get(f"{cluster.url}/routines")
    browser.find_element(By.ID, "new-routine").click()
    until(browser, lambda b: b.find_element(By.ID, "form-title").text == "New routine")
    type_into(browser, "name", "made-in-browser")
    type_into(browser, "task", "e2e_app.sql_inserted")
    type_into(browser, "cron", "15 3 * * *")
    type_into(browser, "timezone", "Europe/Rome")
    type_into(browser, "kwargs", '{"label": "browser"}')
    type_into(browser, "max_lateness", "10m")
    # The preview follows the typing: the next 10 windows at 03:15 in Rome.
    until(browser, lambda b: len(preview_rows(b)) == 10)
    assert all("03:15:00 CE" in row for row in preview_rows(browser)), preview_rows(browser)
    browser.find_element(By.ID, "save").click()
    until(browser, lambda b: b.find_element(By.ID, "routine-name").text == "made-in-browser")
    assert browser.find_element(By.ID, "flash").text == "added made-in-browser"

    record = cluster.store.routines.by_name("made-in-browser")
    assert record is not None
    assert (record.cron, record.timezone, record.source) == ("15 3 * * *", "Europe/Rome", "cli")
    assert json.loads(record.kwargs) == {"label": "browser"} and record.max_lateness == 600
    [change] = cluster.store.changes.history(record.name, 10)
    assert change.action == "added" and str(change.changed_by).startswith("web:")

    browser.get(f"{cluster.url}/routines?name=made-in")
    links = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "a.routine-link")]
    assert links == ["made-in-browser"]


def test_a_bad_cron_is_named_next_to_its_field_while_typing_and_nothing_changes(
    browser: Any, cluster: PanelCluster
) -> None:
    cluster.add(
        "editable", "e2e_app.sql_inserted", cron="0 6 * * *", timezone="Europe/Rome",
        source="cli",
    )  # fmt: skip
    wait_until(
        lambda: (
            getattr(cluster.store.routines.by_name("editable"), "next_run_at", None) is not None
        ),
        60,
        "beat to adopt 'editable'",
        cluster.processes,
    )
    before = cluster.store.routines.by_name("editable")
    browser.get(f"{cluster.url}/routines/editable")
    browser.find_element(By.ID, "edit").click()
    until(browser, lambda b: b.find_element(By.ID, "form-title").text == "Edit editable")
    until(browser, lambda b: len(preview_rows(b)) == 10)
    type_into(browser, "cron", "0 25 * * *")
    # Live, before any submit: the CLI's message beside the field.
    until(browser, lambda b: "'0 25 * * *'" in error_of(b, "cron"))
    assert "hour field '25' is out of range" in error_of(browser, "cron")
    cron = browser.find_element(By.ID, "f-cron")
    assert cron.get_attribute("aria-invalid") == "true"
    assert "error-cron" in cron.get_attribute("aria-describedby").split()
    assert browser.current_url.endswith("/edit/editable")
    assert preview_rows(browser) == []
    assert cluster.store.routines.by_name("editable") == before

    # Submitted anyway, the server says the same next to the field (422).
    browser.find_element(By.ID, "save").click()
    until(browser, lambda b: b.find_element(By.ID, "form-errors").is_displayed())
    assert "'0 25 * * *'" in error_of(browser, "cron")
    assert cluster.store.routines.by_name("editable") == before
    assert [c.action for c in cluster.store.changes.history("editable", 10)] == []

    # Corrected, the error goes away as it is typed, and the edit is saved.
    type_into(browser, "cron", "0 7 * * *")
    until(browser, lambda b: error_of(b, "cron") == "")
    browser.find_element(By.ID, "save").click()
    until(browser, lambda b: b.find_element(By.ID, "flash").text == "edited editable")
    after = cluster.store.routines.by_name("editable")
    assert after is not None and after.cron == "0 7 * * *"


def test_a_routine_owned_by_code_is_read_only_and_cloned_as_a_new_routine(
    browser: Any, cluster: PanelCluster
) -> None:
    wait_until(
        lambda: cluster.store.routines.by_name("tick") is not None,
        60,
        "beat to store its code routine 'tick'",
        cluster.processes,
    )
    coded = cluster.store.routines.by_name("tick")
    assert coded is not None and coded.source == "code"
    browser.get(f"{cluster.url}/routines/tick")
    browser.find_element(By.ID, "edit").click()
    owned = until(browser, lambda b: b.find_element(By.ID, "owned-by-code")).text
    assert "owned by code" in owned and "e2e_app" in owned and coded.task in owned
    assert browser.find_elements(By.ID, "save") == []
    assert browser.find_element(By.ID, "f-interval_seconds").get_attribute("readonly")

    browser.find_element(By.ID, "clone").click()
    until(browser, lambda b: b.find_element(By.ID, "f-name").get_attribute("value") == "tick-copy")
    assert browser.find_element(By.ID, "f-task").get_attribute("value") == coded.task
    type_into(browser, "name", "tick-clone")
    until(browser, lambda b: len(preview_rows(b)) == 10)
    browser.find_element(By.ID, "save").click()
    until(browser, lambda b: b.find_element(By.ID, "routine-name").text == "tick-clone")
    clone = cluster.store.routines.by_name("tick-clone")
    assert clone is not None and clone.source == "cli"
    assert (clone.task, clone.interval_seconds) == (coded.task, coded.interval_seconds)
    after = cluster.store.routines.by_name("tick")
    assert after is not None and after.source == "code"
