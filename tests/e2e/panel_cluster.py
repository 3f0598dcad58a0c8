"""A real beat, a real worker and ``celery routines web`` on PostgreSQL and
Redis, and Debian's Chromium driven through Selenium: what the panel's
browser tests and ``scripts/panel_screenshots.py`` run.

The web process runs docker-compose.yml's argv (``WEB``), configured through
the same environment variable names.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from celery_routines.store import Store
from celery_routines.store.models import ROUTINES
from tests import services
from tests.e2e.processes import CeleryProcess, environment, wait_until

# argv after ``celery -A <app>``, exactly as docker-compose.yml runs the panel.
WEB = ["routines", "web"]
WEB_HEALTH = [
    "python",
    "-c",
    "import os, urllib.request; urllib.request.urlopen("
    "'http://127.0.0.1:%s/healthz' % os.environ['ROUTINES_WEB_PORT'], timeout=5)",
]
CHROMIUM = os.environ.get("ROUTINES_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("ROUTINES_CHROMEDRIVER", "/usr/bin/chromedriver")
SCRIPT_NAME = "<script>alert(1)</script>"
REBOUND_HOST = "evil.example"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def chromium() -> Any:
    """Headless Chromium through Debian's chromedriver; skips (fails under
    ROUTINES_REQUIRE_SERVICES=1) when either is missing."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        services.unavailable("Selenium", exc)
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.exists(path) or shutil.which(path)):
            services.unavailable("Chromium", f"{path} is missing (apt-get install chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1400,1000")
    # A DNS-rebinding attacker's name resolving to the panel's address: what
    # the browser sees once the attacker's DNS answers 127.0.0.1.
    options.add_argument(f"--host-resolver-rules=MAP {REBOUND_HOST} 127.0.0.1")
    return webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))


class PanelCluster:
    """Routines inserted as an operator would, then worker, beat and panel."""

    def __init__(self, folder: Path, database_url: str, broker_url: str) -> None:
        self.folder = folder
        self.store = Store.from_url(database_url)
        self.store.migrate()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.release = folder / "release"
        self.env = environment(
            broker_url,
            database_url,
            E2E_QUEUE=f"panel-{uuid.uuid4().hex[:8]}",
            E2E_INTERVAL="3600",
            ROUTINES_WEB_HOST="127.0.0.1",
            ROUTINES_WEB_PORT=str(self.port),
        )
        self.processes: list[CeleryProcess] = []

    def add(self, name: str, task: str, **columns: Any) -> None:
        with self.store.engine.begin() as conn:
            conn.execute(insert(ROUTINES).values(name=name, task=task, **columns))

    def start(self) -> PanelCluster:
        holds = str(self.folder / "holds.log")
        # Every second a window; the first run holds the worker, so beat
        # records the next windows as overlap skips.
        self.add(
            "slow", "e2e_app.hold", interval_seconds=1, overlap="skip",
            kwargs=json.dumps({"path": holds, "release": str(self.release), "limit": 20}),
        )  # fmt: skip
        # overlap="overlap": a backfill sends all its windows at once (under
        # skip, one at a time: tests/operator/test_admin.py).
        self.add(
            "words", "e2e_app.sql_inserted", cron="0 * * * *", timezone="Europe/Rome",
            overlap="overlap",
        )  # fmt: skip
        self.add(SCRIPT_NAME, "e2e_app.sql_inserted", cron="*/30 * * * *")
        for name, argv in (
            ("worker", ["worker", "--pool", "threads", "-c", "4", "--loglevel", "INFO",
                        "--without-heartbeat", "--without-mingle", "--without-gossip"]),
            ("beat", ["beat", "-S", "celery_routines.Scheduler", "--loglevel", "INFO"]),
            ("web", WEB),
        ):  # fmt: skip
            self.processes.append(CeleryProcess(argv, self.env, self.folder / f"{name}.log"))
        wait_until(self.serving, 60, "the panel to answer", self.processes)
        return self

    def csrf_token(self, name: str = "words") -> str:
        """The CSRF token of a page, as a script on this machine reads it
        (no bearer token is configured, and none is made up)."""
        with urllib.request.urlopen(f"{self.url}/routines/{name}", timeout=30) as answer:
            page = answer.read().decode()
        found = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page)
        if found is None:
            raise AssertionError(f"no CSRF token on the page of {name}")
        return found.group(1)

    def serving(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        self.release.touch()
        for process in reversed(self.processes):
            process.stop()
        self.store.dispose()

    def __enter__(self) -> PanelCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
