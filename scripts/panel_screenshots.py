"""Regenerate the panel's screenshots in docs/img/ with the browser tests'
harness: a real beat, worker and ``celery routines web`` on PostgreSQL and
Redis, and Debian's Chromium (headless).

    python -m scripts.panel_screenshots [--out docs/img]

Needs what the browser tests need (PostgreSQL and Redis on loopback,
/usr/bin/chromium and /usr/bin/chromedriver).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis

from tests import services
from tests.e2e.panel_cluster import PanelCluster, chromium
from tests.e2e.processes import wait_until

REPO = Path(__file__).resolve().parent.parent
SHOTS = {
    "panel-routines.png": "/routines",
    "panel-routine.png": "/routines/words",
    "panel-skips.png": "/skips",
    "panel-form.png": "/edit/words",
    "panel-beats.png": "/beats",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    databases = services.PostgresDatabases()
    redis_db = services.free_redis_db()
    broker = f"redis://{services.REDIS_HOST}:{services.REDIS_PORT}/{redis_db}"
    browser = chromium()
    try:
        with tempfile.TemporaryDirectory() as folder:
            cluster = PanelCluster(Path(folder), databases.create(), broker)
            with cluster:
                cluster.add(
                    "reports.weekly", "e2e_app.sql_inserted", cron="0 7 * * 1",
                    timezone="America/New_York", paused=True,
                )  # fmt: skip
                cluster.add("invoices.send", "e2e_app.boom", cron="*/15 * * * *")
                end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
                _backfill(cluster, "words", end - timedelta(hours=8), end)
                _backfill(cluster, "invoices.send", end - timedelta(hours=2), end)
                wait_until(
                    lambda: len(cluster.store.admin.runs(states=["skipped"], limit=5)) >= 3,
                    60,
                    "a few overlap skips",
                    cluster.processes,
                )
                time.sleep(3)  # the worker finishes the backfilled runs
                for name, path in SHOTS.items():
                    browser.get(cluster.url + path)
                    browser.save_screenshot(str(args.out / name))
                    print(f"wrote {args.out / name}")
    finally:
        browser.quit()
        databases.drop_all()
        client = redis.Redis(host=services.REDIS_HOST, port=services.REDIS_PORT, db=redis_db)
        client.flushdb()
        client.close()


def _backfill(cluster: PanelCluster, name: str, start: datetime, end: datetime) -> None:
    """Through the panel's own API, as a script on the machine would."""
    import json
    import urllib.request

    request = urllib.request.Request(
        f"{cluster.url}/api/routines/{name}/backfill",
        data=json.dumps({"from": start.isoformat(), "to": end.isoformat()}).encode(),
        headers={"Content-Type": "application/json", "X-CSRF-Token": cluster.csrf_token(name)},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        answer.read()


if __name__ == "__main__":
    main()
