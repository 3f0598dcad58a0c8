"""The panel for a person on a keyboard or with low vision: every page passes
axe-core's WCAG 2.1 A/AA rules in Debian's Chromium, every control is reached
by Tab in order and shows where the focus is, and every piece of text meets
WCAG AA contrast (4.5:1; 3:1 for large text) against what is behind it.

axe-core comes from the npm registry (``.ci/run`` installs it and points
``ROUTINES_AXE`` at ``axe.min.js``). Without it the axe test skips, and fails
under ROUTINES_REQUIRE_SERVICES=1; the contrast and keyboard checks below are
our own and always run.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tests import services
from tests.e2e.panel_cluster import PanelCluster
from tests.e2e.processes import wait_until

HERE = Path(__file__).parent

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

AXE_CANDIDATES = (
    os.environ.get("ROUTINES_AXE", ""),
    str(Path.home() / ".cache/celery-routines-axe/node_modules/axe-core/axe.min.js"),
)
PAGES = (
    "/routines",
    "/routines/words",
    "/runs",
    "/skips",
    "/beats",
    "/new",
    "/edit/words",
    "/edit/celery.backend_cleanup",  # owned by code: read-only
    "/clone/celery.backend_cleanup",
)


def axe_source() -> str:
    for candidate in AXE_CANDIDATES:
        if candidate and Path(candidate).is_file():
            return Path(candidate).read_text(encoding="utf-8")
    services.unavailable("axe-core", "npm install axe-core, then set ROUTINES_AXE to axe.min.js")
    raise AssertionError("unreachable")


@pytest.fixture(scope="module", autouse=True)
def content(cluster: PanelCluster) -> None:
    """A paused routine, and a skipped window for the skips page and strips."""
    cluster.add("reports.weekly", "e2e_app.sql_inserted", cron="0 7 * * 1", paused=True)
    wait_until(
        lambda: bool(cluster.store.admin.runs(states=["skipped"], limit=1)),
        60,
        "a skipped window",
        cluster.processes,
    )


def pages(cluster: PanelCluster) -> list[str]:
    """Every page of the panel (each must answer 200)."""
    found = [cluster.url + path for path in PAGES]
    missing = []
    for url in found:
        try:
            urllib.request.urlopen(url, timeout=10).close()
        except OSError as exc:
            missing.append(f"{url}: {exc}")
    assert not missing, missing
    return found


def test_every_page_passes_axe_core_wcag_a_and_aa(browser: Any, cluster: PanelCluster) -> None:
    source = axe_source()
    problems: list[str] = []
    for url in pages(cluster):
        browser.get(url)
        browser.execute_script(source)
        result = browser.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "axe.run(document, {runOnly: {type: 'tag',"
            " values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']}})"
            ".then(r => done(r.violations.map(v => ({id: v.id, help: v.help,"
            " nodes: v.nodes.slice(0, 3).map(n => n.target.join(' '))}))))"
            ".catch(e => done([{id: 'axe-error', help: String(e), nodes: []}]));"
        )
        problems += [f"{url}: {v['id']} ({v['help']}) at {v['nodes']}" for v in result]
    assert not problems, "\n".join(problems)


CONTRAST_SCRIPT = (HERE / "contrast.js").read_text(encoding="utf-8")


def test_all_text_meets_wcag_aa_contrast(browser: Any, cluster: PanelCluster) -> None:
    low: list[str] = []
    for url in pages(cluster):
        browser.get(url)
        low += [f"{url}: {item}" for item in browser.execute_script(CONTRAST_SCRIPT)]
    assert not low, "\n".join(low)


FOCUSABLE = (
    "a[href], button:not([disabled]), input:not([disabled]):not([type=hidden]),"
    " select:not([disabled]), textarea:not([disabled]), [tabindex]:not([tabindex='-1'])"
)


def test_tab_reaches_every_control_in_order_and_shows_the_focus(
    browser: Any, cluster: PanelCluster
) -> None:
    for url in pages(cluster):
        browser.get(url)
        controls = [
            element
            for element in browser.find_elements(By.CSS_SELECTOR, FOCUSABLE)
            if element.is_displayed()
        ]
        reached = []
        browser.execute_script("document.activeElement && document.activeElement.blur()")
        for _ in range(len(controls)):
            ActionChains(browser).send_keys(Keys.TAB).perform()
            active = browser.switch_to.active_element
            reached.append(active)
            shown = browser.execute_script(
                "const s = getComputedStyle(arguments[0]);"
                "return (s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) > 0)"
                " || s.boxShadow !== 'none';",
                active,
            )
            assert shown, f"{url}: no visible focus on {active.get_attribute('outerHTML')[:80]}"
        assert reached == controls, f"{url}: Tab order differs from the page's order"
