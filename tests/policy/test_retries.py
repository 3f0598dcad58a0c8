"""A due retry's decision, pure: tables of cases, no database, no broker, no clock.

A routine fires hourly (UTC); attempt 1 of its 10:00 window failed and its
retry is due at 10:02. Each case sets the overlap policy and whether another
run is open, the routine's state, a definition that no longer reads, the
ceiling and its usage, ``max_lateness`` and the instant; then says what the
tick does with the retry.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pytest

from celery_routines.policy.ceilings import Ceiling
from celery_routines.policy.retries import RetryVerdict, decide_retry
from celery_routines.policy.routine import define
from celery_routines.policy.states import Reason, RunState
from celery_routines.store.records import RoutineRecord

WINDOW = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
NOW = WINDOW + timedelta(minutes=2)
KEY = "poll@2026-03-01T10:00:00+00:00"
RUN_TIMEOUT = 3600.0


@dataclass(frozen=True)
class Failed:
    """The ``retrying`` attempt (the fields :class:`RetryingRunLike` names)."""

    id: str = "run-1"
    routine_id: int = 7
    idempotency_key: str = KEY
    attempt: int = 1
    scheduled_for: datetime = WINDOW
    reason: str | None = Reason.SEND_FAILED


def routine(**options: object) -> RoutineRecord:
    state = {k: options.pop(k) for k in ("enabled", "paused", "suspended_until") if k in options}
    defined = define("tasks.poll", "0 * * * *", name="poll", max_retries=3, **options)
    record = RoutineRecord(
        id=7,
        **{k: v for k, v in defined.columns().items() if k != "name"},
        name="poll",
        next_run_at=WINDOW + timedelta(hours=1),
        paused=False,
        suspended_until=None,
        suspended_reason=None,
        last_error=None,
        locked_by=None,
        locked_until=None,
    )
    return replace(record, **state)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Case:
    id: str
    options: dict[str, object]
    verdict: RetryVerdict
    open_keys: tuple[str, ...] = ()
    run: Failed = Failed()
    now: datetime = NOW
    used: dict[str, float] | None = None
    reason: str | None = None
    """The dropped attempt's reason."""
    settled: str = RunState.FAILED
    suspends: bool = False


OTHER = "poll@2026-03-01T11:00:00+00:00"

CASES = [
    Case("nothing-in-the-way-sends", {}, RetryVerdict.SEND),
    Case("skip-behind-another-open-run-waits", {"overlap": "skip"}, RetryVerdict.WAIT, (OTHER,)),
    Case("queue-behind-another-open-run-waits", {"overlap": "queue"}, RetryVerdict.WAIT, (OTHER,)),
    Case(
        "replace-behind-a-newer-open-run-drops",
        {"overlap": "replace"},
        RetryVerdict.DROP,
        (OTHER,),
        reason="no_retry:replaced",
    ),
    Case("overlap-policy-sends-beside-an-open-run", {"overlap": "overlap"}, RetryVerdict.SEND),
    Case("its-own-window-open-is-no-overlap", {"overlap": "skip"}, RetryVerdict.SEND, (KEY,)),
    Case("paused-drops", {"paused": True}, RetryVerdict.DROP, reason="no_retry:paused"),
    Case("disabled-drops", {"enabled": False}, RetryVerdict.DROP, reason="no_retry:disabled"),
    Case(
        "suspended-drops",
        {"suspended_until": NOW + timedelta(hours=1)},
        RetryVerdict.DROP,
        reason="no_retry:suspended",
    ),
    Case(
        "a-suspension-that-ended-sends",
        {"suspended_until": NOW - timedelta(seconds=1)},
        RetryVerdict.SEND,
    ),
    Case(
        "a-ceiling-asks-for-its-usage-first",
        {"ceiling": Ceiling(5, per="day")},
        RetryVerdict.READ_USAGE,
    ),
    Case(
        "under-the-ceiling-sends",
        {"ceiling": Ceiling(5, per="day")},
        RetryVerdict.SEND,
        used={"fires": 3.0},
    ),
    Case(
        "reaching-the-ceiling-sends-and-suspends",
        {"ceiling": Ceiling(5, per="day")},
        RetryVerdict.SEND,
        used={"fires": 4.0},
        suspends=True,
    ),
    Case(
        "over-the-ceiling-drops",
        {"ceiling": Ceiling(5, per="day")},
        RetryVerdict.DROP,
        used={"fires": 5.0},
        reason="no_retry:over its ceiling",
        suspends=True,
    ),
    Case("within-max-lateness-sends", {"max_lateness": 600}, RetryVerdict.SEND),
    Case(
        "past-max-lateness-is-skipped-late",
        {"max_lateness": 60},
        RetryVerdict.SKIP_LATE,
    ),
    Case(
        "a-lost-attempt-settles-lost",
        {},
        RetryVerdict.SEND,
        run=Failed(reason=Reason.LOST),
        settled=RunState.LOST,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_a_due_retry(case: Case) -> None:
    decision = decide_retry(
        case.run,
        routine(**case.options),
        case.open_keys,
        case.now,
        offset=timedelta(0),
        run_timeout=RUN_TIMEOUT,
        timezone="UTC",
        used=case.used,
        new_id=lambda: "next",
    )
    assert decision.verdict == case.verdict
    assert decision.settled == case.settled
    assert decision.reason == case.reason
    assert (decision.suspension is not None) == case.suspends
    if case.verdict in (RetryVerdict.SEND, RetryVerdict.SKIP_LATE):
        assert decision.next_run is not None
        assert decision.next_run.id == "next"
        assert decision.next_run.attempt == case.run.attempt + 1
        assert decision.next_run.idempotency_key == KEY
        assert decision.next_run.scheduled_for == WINDOW
    else:
        assert decision.next_run is None


def test_a_sent_retry_carries_its_lost_deadline_on_the_database_clock() -> None:
    decision = decide_retry(
        Failed(),
        routine(),
        (),
        NOW,
        offset=timedelta(seconds=30),
        run_timeout=RUN_TIMEOUT,
        timezone="UTC",
    )
    assert decision.next_run is not None
    assert decision.next_run.state == RunState.PENDING
    assert decision.next_run.deadline_at == NOW + timedelta(seconds=30 + RUN_TIMEOUT)


def test_a_late_retry_is_one_skipped_row_for_its_window() -> None:
    decision = decide_retry(
        Failed(),
        routine(max_lateness=60),
        (),
        NOW,
        offset=timedelta(0),
        run_timeout=RUN_TIMEOUT,
        timezone="UTC",
    )
    skipped = decision.next_run
    assert skipped is not None
    assert (skipped.state, skipped.reason, skipped.skipped_count) == (
        RunState.SKIPPED,
        Reason.LATE,
        1,
    )
    assert skipped.skipped_first == skipped.skipped_last == WINDOW
    assert skipped.deadline_at is None


def test_a_waiting_retry_is_looked_at_again_later() -> None:
    decision = decide_retry(
        Failed(),
        routine(overlap="queue"),
        (OTHER,),
        NOW,
        offset=timedelta(0),
        run_timeout=RUN_TIMEOUT,
        timezone="UTC",
    )
    assert decision.retry_at is not None and decision.retry_at > NOW
    assert decision.holding == OTHER


def test_a_definition_that_no_longer_reads_drops_the_retry() -> None:
    broken = replace(routine(), kwargs="{not json")
    decision = decide_retry(
        Failed(), broken, (), NOW, offset=timedelta(0), run_timeout=RUN_TIMEOUT, timezone="UTC"
    )
    assert decision.verdict == RetryVerdict.DROP
    assert decision.reason is not None and decision.reason.startswith("no_retry:invalid (")
