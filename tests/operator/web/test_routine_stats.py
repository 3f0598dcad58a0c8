"""A routine's record through the panel (issue 33, item 5), on SQLite and
PostgreSQL: ``GET /api/routines/{name}/stats`` answers the figures worked out
in tests/store/test_routine_stats.py, refuses a bad ``days`` naming the
routine and the value, and the routine's page shows the record as text."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from celery_routines.operator.admin import Routines
from celery_routines.operator.web.auth import hash_password, parse_web_auth
from celery_routines.store import Store
from tests.operator.web.conftest import BEARER, client_for
from tests.operators import add_routine
from tests.store.test_routine_stats import known_history, sorted_history


def test_the_api_answers_the_record(client: TestClient, store: Store) -> None:
    known_history(store)
    answer = client.get("/api/routines/nightly/stats?days=7", headers=BEARER)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert (data["routine"], data["timezone"], data["days"]) == ("nightly", "Europe/Rome", 7)
    assert data["since"] == "2026-11-23T12:00:00+00:00"
    assert data["until"] == "2026-11-30T12:00:00+00:00"
    assert data["counts"] == {
        "failed": 3, "lost": 1, "running": 1, "skipped": 3, "succeeded": 4,
    }  # fmt: skip
    assert data["success_rate"] == pytest.approx(4 / 7) and data["ended_windows"] == 7
    assert data["duration"] == {"p50_seconds": 25.0, "p95_seconds": 47.5, "count": 6}
    assert data["lateness"] == {
        "sent": {"p50_seconds": 4.0, "p95_seconds": 9.4, "count": 7},
        "started": {"p50_seconds": 7.0, "p95_seconds": 10.6, "count": 5},
    }
    assert data["retries"] == {"attempts": 1, "celery_retries": 2}
    assert data["skipped_windows"] == 7
    assert data["skips_by_reason"] == {"catch_up_cap": 5, "late": 1, "overlap": 1}
    assert (data["dropped_by_catch_up"], data["missed_late"]) == (5, 1)
    strip = data["strip"]
    assert len(strip) == 30 and strip[0]["day"] == "2026-11-01"
    assert strip[-1] == {
        "day": "2026-11-30",
        "counts": {"running": 1, "succeeded": 2},
        "text": "2026-11-30: 1 running, 2 succeeded",
    }
    assert strip[0]["counts"] == {} and strip[0]["text"] == "2026-11-01: no runs"


def test_the_default_period_is_seven_days_and_ninety_is_allowed(
    client: TestClient, store: Store
) -> None:
    known_history(store)
    assert client.get("/api/routines/nightly/stats", headers=BEARER).json()["days"] == 7
    wide = client.get("/api/routines/nightly/stats?days=90", headers=BEARER).json()
    # 90 days reach the run of November 10 and of October 20.
    assert wide["counts"]["succeeded"] == 6


@pytest.mark.parametrize(
    ("days", "words"),
    [
        ("0", "days must be from 1 to 90, got 0"),
        ("91", "days must be from 1 to 90, got 91"),
        ("-3", "days must be from 1 to 90, got -3"),
        ("week", "days must be a whole number from 1 to 90, got 'week'"),
        ("1.5", "days must be a whole number from 1 to 90, got '1.5'"),
    ],
)
def test_a_bad_period_is_a_400_naming_the_routine_and_the_value(
    client: TestClient, store: Store, days: str, words: str
) -> None:
    add_routine(store, "nightly")
    answer = client.get(f"/api/routines/nightly/stats?days={days}", headers=BEARER)
    assert answer.status_code == 400
    assert answer.json()["error"] == f"stats of 'nightly': {words}"
    page = client.get(f"/routines/nightly?days={days}")
    assert page.status_code == 400 and "days must be" in page.text


def test_an_unknown_routine_is_a_404(client: TestClient) -> None:
    answer = client.get("/api/routines/nobody/stats", headers=BEARER)
    assert answer.status_code == 404
    assert answer.json()["error"] == "no routine named 'nobody' is stored"


def test_a_routine_named_stats_is_still_itself(client: TestClient, store: Store) -> None:
    add_routine(store, "stats")
    assert client.get("/api/routines/stats", headers=BEARER).json()["summary"]["name"] == "stats"
    assert client.get("/api/routines/stats/stats", headers=BEARER).json()["routine"] == "stats"


def test_the_page_shows_the_record_as_text(
    admin: Routines, client: TestClient, store: Store
) -> None:
    known_history(store)
    page = client.get("/routines/nightly")
    assert page.status_code == 200
    text = page.text
    assert '<td id="record-counts">4 succeeded' not in text  # sorted by state
    assert '<td id="record-counts">3 failed, 1 lost, 1 running, 3 skipped, 4 succeeded</td>' in text
    assert '<td id="record-success">57.1% of 7 ended windows</td>' in text
    assert '<td id="record-duration">25 s / 47.5 s</td>' in text
    assert '<td id="record-sent-lateness">4 s / 9.4 s</td>' in text
    assert '<td id="record-start-lateness">7 s / 10.6 s</td>' in text
    assert "1 retry attempt, 2 Celery self.retry()" in text
    assert '<td id="record-skips">5 catch_up_cap, 1 late, 1 overlap</td>' in text
    assert '<td id="record-dropped">5</td>' in text and '<td id="record-missed">1</td>' in text
    # The strip says each day in words, not in colour only.
    assert 'title="2026-11-30: 1 running, 2 succeeded">2026-11-30: 1 running' in text
    assert "<td>2026-11-25</td><td>6 skipped</td>" in text
    narrow = client.get("/routines/nightly?days=1").text
    assert "Record, last 1 day</h2>" in narrow
    assert '<td id="record-counts">1 running, 2 succeeded</td>' in narrow


def test_the_list_sorts_by_failure_rate_and_lateness(client: TestClient, store: Store) -> None:
    sorted_history(store)
    names = lambda answer: [r["summary"]["name"] for r in answer.json()["routines"]]  # noqa: E731
    worst = client.get("/api/routines?sort=failure_rate", headers=BEARER)
    assert worst.status_code == 200 and names(worst) == ["d", "a", "b", "c", "e", "f"]
    first = worst.json()["routines"][0]
    assert (first["failure_rate"], first["lateness_seconds"]) == (1.0, 5.0)
    late = client.get("/api/routines?sort=lateness&per_page=2&page=2", headers=BEARER)
    assert names(late) == ["d", "c"]
    plain = client.get("/api/routines", headers=BEARER).json()["routines"]
    assert [r["summary"]["name"] for r in plain] == list("abcdef")
    assert plain[0]["failure_rate"] is None
    bad = client.get("/api/routines?sort=speed", headers=BEARER)
    assert bad.status_code == 400
    assert bad.json()["error"] == "sort 'speed' is unknown; sort by failure_rate or lateness"

    page = client.get("/routines?sort=failure_rate")
    assert page.status_code == 200
    rows = sorted("abcdef", key=lambda n: page.text.index(f'data-routine="{n}"'))
    assert rows == ["d", "a", "b", "c", "e", "f"]
    assert "7 days: failure rate 100.0%, sent 5 s late on average" in page.text
    assert "nothing ended or sent in 7 days" in page.text
    assert '<option value="failure_rate" selected>' in page.text
    assert client.get("/routines?sort=speed").status_code == 400


def test_the_record_is_behind_the_panels_guards(admin: Routines, store: Store) -> None:
    """Same doors as every read: a login or the bearer token, and the host
    check (a rebinding name gets 400 before anything is read)."""
    add_routine(store, "nightly")
    auth = parse_web_auth(f"alice:{hash_password('pw', iterations=1000)}", {})
    client = client_for(admin, auth=auth)
    anonymous = client.get("/api/routines/nightly/stats")
    assert anonymous.status_code == 401
    assert client.get("/routines/nightly").status_code == 401
    assert client.get("/api/routines?sort=lateness").status_code == 401
    assert client.get("/api/routines/nightly/stats", headers=BEARER).status_code == 200
    assert client.get("/api/routines/nightly/stats", auth=("alice", "pw")).status_code == 200
    rebound = client.get("/api/routines/nightly/stats", headers={**BEARER, "Host": "evil.example"})
    assert rebound.status_code == 400
