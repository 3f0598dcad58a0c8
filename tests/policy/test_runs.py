"""The lifecycle's pure decisions: retry instants, lost deadlines, overlap."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from celery_routines.policy.runs import (
    RetryPolicy,
    after_failure,
    lost_deadline,
    overlap_action,
    settled_state,
)
from celery_routines.policy.states import Overlap

T = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("attempt", "wait"), [(1, 60), (2, 120), (3, 240), (4, 480)], ids=["1st", "2nd", "3rd", "4th"]
)
def test_a_failed_attempt_is_retried_after_base_times_two_to_the_attempt_minus_one(
    attempt: int, wait: int
) -> None:
    decision = after_failure(attempt, RetryPolicy(max_retries=4, retry_base_seconds=60), T)
    assert decision.state == "retrying"
    assert decision.retry_at == T + timedelta(seconds=wait)


def test_the_attempt_after_max_retries_is_final() -> None:
    decision = after_failure(5, RetryPolicy(max_retries=4, retry_base_seconds=60), T)
    assert (decision.state, decision.retry_at) == ("failed", None)
    assert "max_retries=4" in decision.why


def test_max_retries_zero_never_retries() -> None:
    decision = after_failure(1, RetryPolicy(max_retries=0, retry_base_seconds=60), T)
    assert decision.state == "failed"


@pytest.mark.parametrize(
    ("policy", "why"),
    [
        (RetryPolicy(4, 60, paused=True), "paused"),
        (RetryPolicy(4, 60, enabled=False), "disabled"),
        (RetryPolicy(4, 60, suspended_until=T + timedelta(hours=1)), "suspended"),
    ],
    ids=["paused", "disabled", "suspended"],
)
def test_a_paused_suspended_or_disabled_routine_schedules_no_retry(
    policy: RetryPolicy, why: str
) -> None:
    decision = after_failure(1, policy, T, final_state="lost", reason="lost")
    assert (decision.state, decision.retry_at, decision.reason) == ("lost", None, f"no_retry:{why}")


def test_a_suspension_that_has_ended_does_not_block_retries() -> None:
    decision = after_failure(1, RetryPolicy(4, 60, suspended_until=T), T)
    assert decision.state == "retrying"


def test_a_lost_attempt_keeps_its_reason_and_settles_as_lost() -> None:
    decision = after_failure(1, RetryPolicy(4, 60), T, final_state="lost", reason="lost")
    assert (decision.state, decision.reason) == ("retrying", "lost")
    assert settled_state("lost") == "lost"
    assert settled_state(None) == "failed"
    assert settled_state("send_failed") == "failed"


def test_the_lost_deadline_is_the_run_timeout_or_the_time_limit_plus_a_margin() -> None:
    assert lost_deadline(T, 3600) == T + timedelta(hours=1)
    assert lost_deadline(T, 3600, time_limit=30) == T + timedelta(seconds=90)
    assert lost_deadline(T, 3600, time_limit=0) == T + timedelta(hours=1)


@pytest.mark.parametrize(
    ("policy", "open_runs", "action"),
    [
        ("skip", 0, "send"),
        ("skip", 1, "skip"),
        ("queue", 1, "queue"),
        ("overlap", 2, "send"),
        ("replace", 1, "replace"),
    ],
)
def test_overlap_actions(policy: str, open_runs: int, action: str) -> None:
    assert overlap_action(Overlap(policy), open_runs) == action
