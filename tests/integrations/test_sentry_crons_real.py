"""Sentry Crons under Celery's beat and under ours, side by side: the same
``beat_schedule`` (two crontab entries, one task succeeds, one fails), the
same ``sentry_sdk.init(integrations=[CeleryIntegration(monitor_beat_tasks=True)])``,
real beat and worker processes, and a local server recording the envelopes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.processes import CeleryProcess, environment, wait_until
from tests.integrations.sentry_recorder import SentryRecorder

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]
pytest.importorskip("sentry_sdk")

SLUGS = ("minutely-ok", "minutely-fails")


@pytest.fixture
def recorders() -> Iterator[tuple[SentryRecorder, SentryRecorder]]:
    celery_beat, ours = SentryRecorder(), SentryRecorder()
    yield celery_beat, ours
    celery_beat.close()
    ours.close()


def first_window(check_ins: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per slug, the check-ins of its first check-in id, in order."""
    found: dict[str, list[dict[str, Any]]] = {}
    for check_in in check_ins:
        slug = check_in["monitor_slug"]
        first = found.setdefault(slug, [])
        if not first or first[0]["check_in_id"] == check_in["check_in_id"]:
            first.append(check_in)
    return found


def closed(recorder: SentryRecorder) -> bool:
    windows = first_window(recorder.recorded())
    return all(len(windows.get(slug, [])) >= 2 for slug in SLUGS)


def start(tmp_path: Path, label: str, env: dict[str, str], scheduler: str) -> list[CeleryProcess]:
    worker = CeleryProcess(
        ["worker", "--pool", "solo", "--loglevel", "INFO", "--without-heartbeat",
         "--without-mingle", "--without-gossip"],
        env,
        tmp_path / f"{label}-worker.log",
    )  # fmt: skip
    beat = CeleryProcess(
        ["beat", "-S", scheduler, "--loglevel", "INFO",
         "--schedule", str(tmp_path / f"{label}-schedule")],
        env,
        tmp_path / f"{label}-beat.log",
    )  # fmt: skip
    return [worker, beat]


@pytest.mark.parametrize(
    "publishing",
    [{}, {"ROUTINES_PUBLISH": "direct", "ROUTINES_PUBLISH_PROCESSES": "1"}],
    ids=["send_task", "direct-in-a-publishing-process"],
)
def test_every_run_gets_the_check_ins_celery_beat_gives_it(
    publishing: dict[str, str],
    tmp_path: Path,
    postgres_url: str,
    redis_url: str,
    recorders: tuple[SentryRecorder, SentryRecorder],
) -> None:
    under_celery, under_ours = recorders
    base = {"E2E_QUEUE": f"sentry-{uuid.uuid4().hex[:8]}"}
    celery_env = environment(redis_url, postgres_url, E2E_SENTRY_DSN=under_celery.dsn, **base)
    celery_env["E2E_QUEUE"] += "-celery"
    ours_env = environment(
        redis_url, postgres_url, E2E_SENTRY_DSN=under_ours.dsn, **base, **publishing
    )
    processes = [
        *start(tmp_path, "celery", celery_env, "celery.beat:PersistentScheduler"),
        *start(tmp_path, "ours", ours_env, "celery_routines.Scheduler"),
    ]
    try:
        # crontab(): the next minute boundary, under both.
        wait_until(lambda: closed(under_celery) and closed(under_ours), 150,
                   "both beats' first check-ins to close", processes)  # fmt: skip
    finally:
        for process in processes:
            process.stop()

    celery_windows = first_window(under_celery.recorded())
    our_windows = first_window(under_ours.recorded())
    counts = [
        {slug: [c["status"] for c in window] for slug, window in windows.items()}
        for windows in (celery_windows, our_windows)
    ]
    print(f"\nSentry check-ins, first window: Celery beat {counts[0]}; ours {counts[1]}")
    for slug, final in (("minutely-ok", "ok"), ("minutely-fails", "error")):
        theirs, ours = celery_windows[slug], our_windows[slug]
        assert (
            [c["status"] for c in theirs]
            == [c["status"] for c in ours]
            == [
                "in_progress",
                final,
            ]
        ), slug
        assert len({c["check_in_id"] for c in ours}) == 1  # linked by check-in id
        assert ours[1]["duration"] is not None and ours[1]["duration"] >= 0
        # The same monitor config Sentry builds, and more from the routine.
        theirs_config, ours_config = theirs[0]["monitor_config"], ours[0]["monitor_config"]
        assert theirs_config == {
            "schedule": {"type": "crontab", "value": "* * * * *"},
            "timezone": "UTC",
        }
        assert ours_config == {**theirs_config, "max_runtime": 60}
    # Our own 2 s routine (tests/e2e/e2e_app.py), a schedule Sentry cannot
    # express: its check-ins go without a config (Celery's beat sends none).
    tick = our_windows["tick"]
    assert [c["status"] for c in tick] == ["in_progress", "ok"]
    assert "monitor_config" not in tick[0]
    assert "tick" not in celery_windows
