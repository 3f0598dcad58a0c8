"""The panel at size: the routines page and ``/api/routines`` over 10,000
routines and 1,000,000 runs on PostgreSQL (target: under 300 ms each).

    python -m benchmarks.panel [--routines 10000] [--runs 1000000] [--repeat 20]

Loads a throwaway database with ``INSERT ... SELECT generate_series`` (runs
spread over the routines, newest within the last day), then times each page
through Starlette's TestClient in this process (the app, the admin API and
the queries; no network) and prints the median and p90. Not a timed test.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime

from sqlalchemy import text

from benchmarks.common import create_database, drop_database, log, summary_ms, timed
from celery_routines.operator.admin import Routines
from celery_routines.store import Store

PAGES = [
    ("routines page 1", "/routines"),
    ("routines page 100", "/routines?page=100"),
    ("routines paused", "/routines?state=paused"),
    ("routines by name", "/routines?name=routine-0999"),
    ("/api/routines", "/api/routines"),
    ("/api/routines page 150", "/api/routines?page=150"),
    ("/api/routines active", "/api/routines?state=active&per_page=100"),
    ("routine page", "/routines/routine-05000"),
    ("/api/routines/{name}", "/api/routines/routine-05000"),
    ("runs page", "/runs"),
    ("skips page", "/skips"),
]


def load(store: Store, routines: int, runs: int, now: datetime) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO routines (name, task, cron, timezone, enabled, paused, next_run_at,"
                " source, created_at, updated_at)"
                " SELECT 'routine-' || lpad(g::text, 5, '0'), 'tasks.report', '*/5 * * * *',"
                " 'Europe/Rome', true, g % 10 = 0, :now + (g % 300) * interval '1 second',"
                " CASE WHEN g % 2 = 0 THEN 'code' END, :now, :now"
                " FROM generate_series(1, :n) AS g"
            ),
            {"n": routines, "now": now},
        )
        conn.execute(
            text(
                "INSERT INTO routine_runs (id, routine_id, idempotency_key, attempt,"
                " scheduled_for, state, reason, created_at, sent_at, started_at, finished_at)"
                " SELECT 'run-' || g, r.id, r.name || '@' || g, 1, w, s,"
                " CASE WHEN s = 'skipped' THEN 'overlap' END, w, w + interval '1 second',"
                " w + interval '2 seconds', w + interval '5 seconds'"
                " FROM generate_series(1, :n) AS g"
                " JOIN routines r ON r.id = 1 + (g % :routines)"
                " CROSS JOIN LATERAL (SELECT :now - (g / :routines) * interval '5 minutes' AS w,"
                "  (ARRAY['succeeded','succeeded','succeeded','failed','skipped','lost'])"
                "  [1 + g % 6] AS s) AS x"
            ),
            {"n": runs, "routines": routines, "now": now},
        )
        conn.execute(text("ANALYZE routines"))
        conn.execute(text("ANALYZE routine_runs"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--routines", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()

    from celery import Celery
    from starlette.testclient import TestClient

    from celery_routines.operator.web import create_app
    from celery_routines.operator.web.auth import WebAuth

    name, url = create_database("panel")
    try:
        store = Store.from_url(url)
        store.migrate()
        now = datetime.now(UTC).replace(microsecond=0)
        log(f"loading {args.routines:,} routines and {args.runs:,} runs")
        loading = timed(lambda: load(store, args.routines, args.runs, now))
        log(f"loaded in {loading.seconds:.1f} s")
        app = Celery("panel_bench", broker="memory://", set_as_current=False)
        app.conf.routines_database_url = url
        admin = Routines(app, store=store)
        client = TestClient(create_app(app, routines=admin, auth=WebAuth()))
        sizes = f"{args.routines:,} routines, {args.runs:,} runs on PostgreSQL"
        print(f"{sizes}; {args.repeat} requests each")
        print(f"{'page':<28}{'median ms':>10}{'p90 ms':>10}{'min ms':>10}  status")
        for label, path in PAGES:
            client.get(path)  # warm: templates compiled, plans cached
            samples, status = [], 0
            for _ in range(args.repeat):
                started = time.perf_counter()
                status = client.get(path).status_code
                samples.append(time.perf_counter() - started)
            s = summary_ms(samples)
            print(
                f"{label:<28}{s['median_ms']:>10.1f}{s['p90_ms']:>10.1f}{s['min_ms']:>10.1f}"
                f"  {status}"
            )
        admin.close()
        store.dispose()
    finally:
        drop_database(name)


if __name__ == "__main__":
    main()
