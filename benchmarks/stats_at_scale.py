"""A routine's record at 1,000,000 runs on PostgreSQL (issue 33, item 5):
the stats query, ``GET /api/routines/{name}/stats`` and the whole routine
page (target: under 200 ms), and the routine list sorted by failure rate and
by lateness, each beside its floor measured in the same run.

    python -m benchmarks.stats_at_scale [--runs 1000000] [--hot 200000] [--routines 1000]

Loads a throwaway database with ``INSERT ... SELECT generate_series``: one
minutely routine (``hot``) holds ``--hot`` runs (its newest 30 days: 43,200
of them, the most a page reads at 1 run a minute), the other routines share
the rest over the same span; a routine without runs (``quiet``) gives the
page's floor. Requests go through the real Starlette app in this process
(TestClient: the app, the admin API and the queries; no network). Floors:
``SELECT count(*)`` over the very rows the stats statement reads, and the
same routine page for a routine with no runs. Prints EXPLAIN ANALYZE of the
statement to show the index range scan. Not a timed test.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import event, text

from benchmarks.common import create_database, drop_database, log, summary_ms, timed
from celery_routines.operator.admin import Routines
from celery_routines.policy.run_stats import strip_days
from celery_routines.store import Store

HOT_EVERY = "1 minute"


def load(store: Store, routines: int, runs: int, hot: int, now: datetime) -> None:
    """``hot`` runs of the minutely routine ``hot``, ``runs - hot`` spread over
    ``routines`` others across the same span, and ``quiet`` with none."""
    span_minutes = hot  # one a minute
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO routines (name, task, cron, timezone, source, created_at, updated_at)"
                " VALUES ('hot', 'tasks.hot', '* * * * *', 'Europe/Rome', 'code', :now, :now),"
                " ('quiet', 'tasks.quiet', '* * * * *', 'Europe/Rome', 'code', :now, :now)"
            ),
            {"now": now},
        )
        conn.execute(
            text(
                "INSERT INTO routines (name, task, cron, timezone, created_at, updated_at)"
                " SELECT 'routine-' || lpad(g::text, 5, '0'), 'tasks.report', '0 * * * *',"
                " 'America/New_York', :now, :now FROM generate_series(1, :n) AS g"
            ),
            {"n": routines - 2, "now": now},
        )
        # Interleaved like a real history: the hot routine's rows are spread
        # over the whole table, not packed together.
        conn.execute(
            text(
                "INSERT INTO routine_runs (id, routine_id, idempotency_key, attempt,"
                " scheduled_for, state, reason, skipped_count, created_at, sent_at, started_at,"
                " finished_at, celery_retries)"
                " SELECT 'run-' || g, rid, rname || '@' || g, attempt, w, s,"
                "  CASE WHEN s = 'skipped' THEN"
                "   (ARRAY['overlap','catch_up_cap','late','ceiling'])[1 + g % 4] END,"
                "  CASE WHEN s = 'skipped' THEN 1 + g % 3 END,"
                "  w + attempt * interval '1 second',"
                "  CASE WHEN s <> 'skipped' THEN w + (g % 5000) * interval '1 millisecond' END,"
                "  CASE WHEN s IN ('succeeded','failed') THEN"
                "   w + (g % 9000) * interval '1 millisecond' END,"
                "  CASE WHEN s IN ('succeeded','failed') THEN"
                "   w + (9 + g % 60) * interval '1 second' END,"
                "  CASE WHEN g % 97 = 0 THEN 1 ELSE 0 END"
                " FROM generate_series(1, :n) AS g"
                " CROSS JOIN LATERAL (SELECT g % (:n / :hot) = 0 AS is_hot) AS h"
                " CROSS JOIN LATERAL (SELECT"
                "   CASE WHEN is_hot THEN (SELECT id FROM routines WHERE name = 'hot')"
                "    ELSE (SELECT min(id) FROM routines) + 2 + g % (:routines - 2) END AS rid,"
                "   CASE WHEN is_hot THEN 'hot' ELSE 'r' || (g % (:routines - 2)) END AS rname,"
                "   :now - (g::float / :n * :span) * interval '1 minute' AS w,"
                "   CASE WHEN (g / (:n / :hot)) % 50 = 1 THEN 2 ELSE 1 END AS attempt,"
                "   (ARRAY['succeeded','succeeded','succeeded','succeeded','succeeded',"
                "     'succeeded','succeeded','failed','skipped','lost'])"
                "    [1 + (g / (:n / :hot)) % 10] AS s) AS x"
            ),
            {"n": runs, "hot": hot, "routines": routines, "now": now, "span": span_minutes},
        )
        conn.execute(text("ANALYZE routines"))
        conn.execute(text("ANALYZE routine_runs"))


def repeat(fn: Callable[[], Any], times: int) -> dict[str, float]:
    fn()  # warm: plans cached, templates compiled
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return summary_ms(samples)


def row(label: str, s: dict[str, float], note: str = "") -> None:
    print(f"{label:<46}{s['median_ms']:>10.1f}{s['p90_ms']:>10.1f}{s['min_ms']:>10.1f}  {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--hot", type=int, default=200_000)
    parser.add_argument("--routines", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()

    from celery import Celery
    from starlette.testclient import TestClient

    from celery_routines.operator.web import create_app
    from celery_routines.operator.web.auth import WebAuth

    name, url = create_database("stats")
    try:
        store = Store.from_url(url)
        store.migrate()
        now = datetime.now(UTC).replace(microsecond=0)
        log(f"loading {args.runs:,} runs ({args.hot:,} of 'hot') over {args.routines:,} routines")
        loading = timed(lambda: load(store, args.routines, args.runs, args.hot, now))
        log(f"loaded in {loading.seconds:.1f} s")
        app = Celery("stats_bench", broker="memory://", set_as_current=False)
        app.conf.routines_database_url = url
        admin = Routines(app, store=store)
        client = TestClient(
            create_app(app, routines=admin, auth=WebAuth()), base_url="http://localhost"
        )
        hot = store.routines.by_name("hot")
        assert hot is not None
        bounds = [start for _, start in strip_days(admin.clock(), "Europe/Rome")]
        with store.engine.connect() as conn:
            total = conn.execute(text("SELECT count(*) FROM routine_runs")).scalar_one()
            read = {
                days: conn.execute(
                    text(
                        "SELECT count(*) FROM routine_runs WHERE routine_id = :id"
                        " AND created_at >= :since"
                    ),
                    {"id": hot.id, "since": min(now - timedelta(days=days), bounds[0])},
                ).scalar_one()
                for days in (7, 90)
            }
        print(
            f"{total:,} runs on PostgreSQL; 'hot' reads {read[7]:,} rows (days=7, the strip's"
            f" 30 days) and {read[90]:,} (days=90); {args.repeat} repeats each"
        )
        print(f"{'measure':<46}{'median ms':>10}{'p90 ms':>10}{'min ms':>10}")

        def count_floor(days: int) -> Callable[[], Any]:
            since = min(admin.clock() - timedelta(days=days), bounds[0])
            sql = text(
                "SELECT count(*) FROM routine_runs WHERE routine_id = :id AND created_at >= :since"
            )

            def run() -> Any:
                with store.engine.connect() as conn:
                    return conn.execute(sql, {"id": hot.id, "since": since}).scalar_one()

            return run

        for days in (7, 90):
            row(
                f"floor: SELECT count(*) of those rows, days={days}",
                repeat(count_floor(days), args.repeat),
            )
            row(f"stats query (admin.stats.of), days={days}",
                repeat(lambda d=days: admin.stats.of("hot", d), args.repeat))  # fmt: skip
            row(f"GET /api/routines/hot/stats?days={days}",
                repeat(lambda d=days: client.get(f"/api/routines/hot/stats?days={d}"), args.repeat),
                str(client.get(f"/api/routines/hot/stats?days={days}").status_code))  # fmt: skip
        page = lambda path: repeat(lambda: client.get(path), args.repeat)  # noqa: E731
        row("floor: GET /routines/quiet (page, no runs)", page("/routines/quiet"))
        row("GET /routines/hot (the whole page, days=7)", page("/routines/hot"),
            str(client.get("/routines/hot").status_code))  # fmt: skip
        row("GET /routines/hot?days=90", page("/routines/hot?days=90"))
        row("floor: GET /api/routines (by name)", page("/api/routines"))
        row("GET /api/routines?sort=failure_rate", page("/api/routines?sort=failure_rate"))
        row("GET /api/routines?sort=lateness", page("/api/routines?sort=lateness"))
        row("floor: GET /routines (by name)", page("/routines"))
        row("GET /routines?sort=failure_rate", page("/routines?sort=failure_rate"))

        # The statement exactly as sent (recorded at the cursor), explained.
        sent: list[tuple[str, Any]] = []

        def record(conn: Any, cursor: Any, sql: str, params: Any, *rest: Any) -> None:
            if "stats_runs" in sql:
                sent.append((sql, params))

        event.listen(store.engine, "before_cursor_execute", record)
        admin.stats.of("hot", 7)
        event.remove(store.engine, "before_cursor_execute", record)
        with store.engine.connect() as conn:
            plan = (
                conn.exec_driver_sql(
                    "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sent[0][0], sent[0][1]
                )
                .scalars()
                .all()
            )
        print(f"\n{len(sent)} statement; EXPLAIN ANALYZE (days=7), its scans and timing:")
        for line in plan:
            if any(word in line for word in ("Scan", "Execution Time", "Planning Time", "CTE")):
                print("  " + line.strip())
        admin.close()
        store.dispose()
    finally:
        drop_database(name)


if __name__ == "__main__":
    main()
