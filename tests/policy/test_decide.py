"""The tick's decision, pure: tables of cases, no database, no broker, no clock.

A routine fires every five minutes (UTC); its due window is 10:00. Each case
sets the catch-up policy, the overlap policy and whether a run is open, the
ceiling and its usage, ``max_lateness``, and whether a beat that died left
the due window's row behind; then says what the tick does. A last test runs
every combination and checks what must hold for all of them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from celery_routines.policy.ceilings import Ceiling
from celery_routines.policy.decide import (
    Claimed,
    Decision,
    Facts,
    Verdict,
    decide,
    plan,
    written_key,
)
from celery_routines.policy.decide import take_over as take_over_
from celery_routines.policy.routine import define
from celery_routines.policy.states import Reason, RunState
from celery_routines.schedules.base import count_windows
from celery_routines.schedules.cron import CronSchedule
from celery_routines.store.records import OpenRun, RoutineRecord, RunRecord

EVERY_FIVE = CronSchedule("*/5 * * * *", "UTC")
RUN_TIMEOUT = 3600.0
NAME = "poll"


def at(hour: int, minute: int, day: int = 1) -> datetime:
    return datetime(2026, 3, day, hour, minute, tzinfo=UTC)


DUE = at(10, 0)
MINUTE = timedelta(minutes=1)
MIDNIGHT = at(0, 0, day=2)


@dataclass(frozen=True)
class Case:
    id: str
    now: datetime = DUE
    catch_up: str = "catch_up"
    overlap: str = "skip"
    open_run: str | None = None
    """State of an open run of an earlier window (deadline in the future)."""
    ceiling: float | None = None
    used: float = 0.0
    max_lateness: float | None = None
    suspended_until: datetime | None = None
    written: str | None = None
    """State of a row of the due window left by a beat whose claim expired."""
    last_error: str | None = None
    # What the tick does.
    verdict: Verdict = Verdict.FIRE
    sent: tuple[datetime, ...] = ()
    skipped: tuple[tuple[str, int], ...] = ()
    next_run_at: datetime | None = None
    suspended: bool = False
    replaced: bool = False
    options: dict[str, Any] = field(default_factory=dict)


CASES = [
    # -- catch-up -----------------------------------------------------------------
    Case("one-window", sent=(DUE,), next_run_at=at(10, 5)),
    Case(
        "recovery-catch_up-cap-3",
        now=at(10, 50),
        overlap="overlap",
        sent=(at(10, 40), at(10, 45), at(10, 50)),
        skipped=(("catch_up_cap", 8),),
        next_run_at=at(10, 55),
    ),
    Case(
        "recovery-latest",
        now=at(10, 50),
        catch_up="latest",
        sent=(at(10, 50),),
        skipped=(("latest", 10),),
        next_run_at=at(10, 55),
    ),
    Case(
        "recovery-skip_to_next",
        now=at(10, 52),
        catch_up="skip_to_next",
        skipped=(("skip_to_next", 11),),
        next_run_at=at(10, 55),
    ),
    # -- lateness -----------------------------------------------------------------
    Case("late", now=at(10, 2), max_lateness=60, skipped=(("late", 1),), next_run_at=at(10, 5)),
    Case(
        "recovery-then-late",
        now=at(10, 50),
        overlap="overlap",
        max_lateness=400,
        sent=(at(10, 45), at(10, 50)),
        skipped=(("catch_up_cap", 8), ("late", 1)),
        next_run_at=at(10, 55),
    ),
    Case(
        "latest-is-not-late",
        now=at(10, 50),
        catch_up="latest",
        max_lateness=60,
        sent=(at(10, 50),),
        skipped=(("latest", 10),),
        next_run_at=at(10, 55),
    ),
    # -- overlap ------------------------------------------------------------------
    Case(
        "overlap-skip",
        open_run="running",
        skipped=(("overlap", 1),),
        next_run_at=at(10, 5),
    ),
    Case(
        "overlap-skip-recovery",
        now=at(10, 50),
        open_run="sent",
        # The recovery passes 10:40 and 10:45 over for 10:50, which an open run holds back.
        skipped=(("catch_up_cap", 8), ("latest", 2), ("overlap", 1)),
        next_run_at=at(10, 55),
    ),
    # A recovery meets the overlap policy among its own windows: the three
    # kept by the cap (10:40, 10:45, 10:50) are all due at once, and under
    # skip the newest goes out, as Celery beat sends a missed entry once.
    Case(
        "recovery-skip-sends-the-newest",
        now=at(10, 50),
        sent=(at(10, 50),),
        skipped=(("catch_up_cap", 8), ("latest", 2)),
        next_run_at=at(10, 55),
    ),
    Case(
        "recovery-skip-after-late-sends-the-newest",
        now=at(10, 50),
        max_lateness=400,
        sent=(at(10, 50),),
        skipped=(("catch_up_cap", 8), ("late", 1), ("latest", 1)),
        next_run_at=at(10, 55),
    ),
    Case(
        "recovery-replace-sends-the-newest",
        now=at(10, 50),
        overlap="replace",
        sent=(at(10, 50),),
        skipped=(("catch_up_cap", 8), ("replaced", 2)),
        next_run_at=at(10, 55),
    ),
    Case(
        "recovery-replace-over-an-open-run",
        now=at(10, 50),
        overlap="replace",
        open_run="running",
        sent=(at(10, 50),),
        skipped=(("catch_up_cap", 8), ("replaced", 2)),
        next_run_at=at(10, 55),
        replaced=True,
    ),
    Case(
        "recovery-overlap-sends-every-kept-window",
        now=at(10, 50),
        overlap="overlap",
        sent=(at(10, 40), at(10, 45), at(10, 50)),
        skipped=(("catch_up_cap", 8),),
        next_run_at=at(10, 55),
    ),
    Case(
        "recovery-skip-counts-only-what-it-sends-against-the-ceiling",
        now=at(10, 50),
        ceiling=10,
        used=8,
        sent=(at(10, 50),),
        skipped=(("catch_up_cap", 8), ("latest", 2)),
        next_run_at=at(10, 55),
    ),
    Case(
        "recovery-queue-last-fire-suspends",
        now=at(10, 50),
        overlap="queue",
        ceiling=10,
        used=9,
        sent=(at(10, 40),),
        skipped=(("catch_up_cap", 8), ("ceiling", 159)),  # 10:45 .. 23:55
        next_run_at=MIDNIGHT,
        suspended=True,
    ),
    Case("overlap-queue", overlap="queue", open_run="running", verdict=Verdict.QUEUED),
    Case(
        "overlap-queue-recovery-one-at-a-time",
        now=at(10, 50),
        overlap="queue",
        sent=(at(10, 40),),
        skipped=(("catch_up_cap", 8),),
        next_run_at=at(10, 45),
    ),
    Case("overlap-overlap", overlap="overlap", open_run="running", sent=(DUE,)),
    Case("overlap-replace", overlap="replace", open_run="running", sent=(DUE,), replaced=True),
    Case("a-pending-run-holds-nothing-back", open_run="pending", sent=(DUE,)),
    # -- ceilings -----------------------------------------------------------------
    Case("ceiling-room", ceiling=10, used=5, sent=(DUE,)),
    Case(
        "ceiling-last-fire-suspends",
        ceiling=10,
        used=9,
        sent=(DUE,),
        skipped=(("ceiling", 167),),  # 10:05 .. 23:55
        next_run_at=MIDNIGHT,
        suspended=True,
    ),
    Case(
        "ceiling-reached",
        ceiling=10,
        used=10,
        skipped=(("ceiling", 168),),  # 10:00 .. 23:55
        next_run_at=MIDNIGHT,
        suspended=True,
    ),
    Case(
        "ceiling-cuts-a-recovery",
        now=at(10, 50),
        overlap="overlap",
        ceiling=10,
        used=8,
        sent=(at(10, 40), at(10, 45)),
        skipped=(("catch_up_cap", 8), ("ceiling", 158)),  # 10:50 .. 23:55
        next_run_at=MIDNIGHT,
        suspended=True,
    ),
    Case(
        "suspended-routine",
        suspended_until=at(12, 0),
        skipped=(("ceiling", 24),),  # 10:00 .. 11:55
        next_run_at=at(12, 0),
    ),
    Case(
        "ceiling-then-overlap-skip",
        ceiling=10,
        used=5,
        open_run="running",
        skipped=(("overlap", 1),),
    ),
    # A window an open run holds back spends nothing: the last fire of the
    # budget is still there, so the routine is not suspended.
    Case(
        "ceiling-last-fire-then-overlap-skip",
        ceiling=10,
        used=9,
        open_run="running",
        skipped=(("overlap", 1),),
    ),
    Case(
        "ceiling-last-fire-while-queued",
        ceiling=10,
        used=9,
        overlap="queue",
        open_run="running",
        verdict=Verdict.QUEUED,
    ),
    Case(
        "ceiling-reached-while-queued",
        ceiling=10,
        used=10,
        overlap="queue",
        open_run="running",
        skipped=(("ceiling", 168),),
        next_run_at=MIDNIGHT,
        suspended=True,
    ),
    # -- takeover -----------------------------------------------------------------
    Case(
        "takeover-pending-row-is-sent-not-skipped",
        now=at(10, 52),
        catch_up="skip_to_next",
        written="pending",
        sent=(DUE,),
        skipped=(("skip_to_next", 10),),
        next_run_at=at(10, 55),
    ),
    Case(
        "takeover-sent-row-is-not-skipped-again",
        now=at(10, 52),
        catch_up="skip_to_next",
        written="sent",
        skipped=(("skip_to_next", 10),),
        next_run_at=at(10, 55),
    ),
    Case(
        "takeover-of-a-window-overlap-would-skip",
        open_run="running",
        written="pending",
        sent=(DUE,),
        next_run_at=at(10, 5),
    ),
    Case(
        "takeover-with-latest-and-late",
        now=at(10, 50),
        catch_up="latest",
        max_lateness=60,
        written="pending",
        sent=(DUE, at(10, 50)),
        skipped=(("latest", 9),),
    ),
    # -- an invalid routine that reads again ------------------------------------------
    Case(
        "valid-again-resumes-from-now",
        now=at(10, 52),
        last_error="routine 'poll': ...",
        verdict=Verdict.RESUMED,
        next_run_at=at(10, 55),
    ),
]


class Ids:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> str:
        self.n += 1
        return f"run-{self.n}"


def claimed(case: Case) -> Claimed:
    options: dict[str, Any] = {
        "name": NAME,
        "catch_up": case.catch_up,
        "catch_up_cap": 3,
        "overlap": case.overlap,
        "max_lateness": case.max_lateness,
        **case.options,
    }
    if case.ceiling is not None:
        options["ceiling"] = Ceiling(case.ceiling, per="day")
    routine = define("tasks.poll", "*/5 * * * *", timezone="UTC", **options)
    record = RoutineRecord(
        id=7,
        **{k: v for k, v in routine.columns().items() if k != "name"},
        name=NAME,
        next_run_at=DUE,
        paused=False,
        suspended_until=case.suspended_until,
        suspended_reason=None,
        last_error=case.last_error,
        locked_by="this-beat",
        locked_until=case.now + timedelta(seconds=60),
    )
    return Claimed(record, routine, EVERY_FIVE, "UTC")


def facts(case: Case) -> Facts:
    open_runs = []
    if case.open_run is not None:
        open_runs.append(
            OpenRun("earlier", 7, f"{NAME}@2026-03-01T09:55:00+00:00", case.open_run, at(11, 0))
        )
    used = {"fires": case.used} if case.ceiling is not None else None
    return Facts(used=used, open_runs=open_runs)


def written_row(case: Case, key: str) -> RunRecord:
    assert case.written is not None
    return RunRecord(
        id="dead-beats-row",
        routine_id=7,
        idempotency_key=key,
        attempt=1,
        scheduled_for=DUE,
        state=case.written,
        reason=None,
        error=None,
        retry_at=None,
        created_at=DUE,
        sent_at=None,
        started_at=None,
        finished_at=None,
        worker=None,
        spend=None,
        skipped_count=None,
        skipped_first=None,
        skipped_last=None,
    )


def run_tick(case: Case) -> Decision:
    """What the engine does around the pure calls, with the reads answered
    from the case instead of a database."""
    item = claimed(case)
    ids = Ids()
    planned = plan(item, case.now) if case.last_error is None else None
    decision = decide(item, planned, facts(case), case.now, run_timeout=RUN_TIMEOUT, new_id=ids)
    key = written_key(decision)
    if key is not None and case.written is not None:
        decision = take_over_(decision, written_row(case, key[1]), new_id=ids)
    return decision


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_tick_decides(case: Case) -> None:
    decision = run_tick(case)
    assert decision.verdict == case.verdict
    if case.verdict == Verdict.QUEUED:
        assert decision.next_run_at == case.now + timedelta(seconds=1)
        assert decision.skips == () and decision.holding
        assert decision.suspension is None  # nothing went out: nothing was spent
        return
    assert tuple(run.scheduled_for for run in decision.sends) == case.sent
    assert tuple((run.reason, run.skipped_count) for run in decision.skips) == case.skipped
    if case.next_run_at is not None:
        assert decision.next_run_at == case.next_run_at
    assert (decision.suspension is not None) == case.suspended
    assert bool(decision.replace) == case.replaced
    if case.replaced:
        assert decision.replace == ("earlier",)


def test_rows_carry_window_keys_deadlines_and_summaries() -> None:
    decision = run_tick(CASES[1])  # recovery-catch_up-cap-3
    first = decision.sends[0]
    assert first.idempotency_key == "poll@2026-03-01T10:40:00+00:00"
    assert first.state == RunState.PENDING and first.attempt == 1
    assert first.deadline_at == at(10, 50) + timedelta(seconds=RUN_TIMEOUT)
    [skip] = decision.skips
    assert skip.idempotency_key == "poll@2026-03-01T10:00:00+00:00..2026-03-01T10:35:00+00:00"
    assert (skip.state, skip.skipped_first, skip.skipped_last) == ("skipped", DUE, at(10, 35))


def test_the_suspension_says_until_when_and_why() -> None:
    case = next(c for c in CASES if c.id == "ceiling-reached")
    suspension = run_tick(case).suspension
    assert suspension is not None and suspension.until == MIDNIGHT
    assert suspension.reason.startswith("ceiling 10 fires/day reached (10 used)")


def test_a_taken_over_pending_row_goes_out_under_its_own_key() -> None:
    case = next(c for c in CASES if c.id.startswith("takeover-pending"))
    decision = run_tick(case)
    assert decision.resent is not None and decision.resent.id == "dead-beats-row"
    assert decision.sends[0].idempotency_key == "poll@2026-03-01T10:00:00+00:00"
    assert decision.skips[0].skipped_first == at(10, 5)


def test_ten_minutes_down_with_the_default_options_sends_the_newest_window_once() -> None:
    # A routine declared with no catch-up or overlap option; beat was down
    # from 19:02:30 to 19:12, so 19:03 .. 19:12 are due at once.
    routine = define("tasks.flaky", "* * * * *", timezone="UTC")
    record = RoutineRecord(
        id=9,
        **routine.columns(),
        next_run_at=at(19, 3),
        paused=False,
        suspended_until=None,
        suspended_reason=None,
        last_error=None,
        locked_by="this-beat",
        locked_until=at(19, 13),
    )
    item = Claimed(record, routine, CronSchedule("* * * * *", "UTC"), "UTC")
    now = at(19, 12) + timedelta(seconds=1)
    decision = decide(item, plan(item, now), Facts(), now, run_timeout=RUN_TIMEOUT, new_id=Ids())
    [sent] = decision.sends
    assert sent.idempotency_key == "tasks.flaky@2026-03-01T19:12:00+00:00"
    [passed_over] = decision.skips
    assert passed_over.reason == Reason.LATEST and passed_over.skipped_count == 9
    assert (passed_over.skipped_first, passed_over.skipped_last) == (at(19, 3), at(19, 11))
    assert decision.next_run_at == at(19, 13)


@pytest.mark.parametrize(
    ("overlap", "sent", "skipped"),
    [
        # skip settles on the window a beat that gave the routine up wrote.
        ("skip", (at(10, 45),), (("catch_up_cap", 8), ("latest", 1), ("overlap", 1))),
        # The other policies send the windows they send anyway (the writer
        # finds 10:45's row and sends it again under its own id).
        ("overlap", (at(10, 40), at(10, 45), at(10, 50)), (("catch_up_cap", 8),)),
        ("queue", (at(10, 40),), (("catch_up_cap", 8),)),
    ],
)
def test_a_recovery_under_skip_sends_again_a_window_a_beat_that_gave_it_up_wrote(
    overlap: str, sent: tuple[datetime, ...], skipped: tuple[tuple[str, int], ...]
) -> None:
    # The beat that held the routine planned at 10:45, wrote 10:45 (its
    # newest) and stopped before moving the routine on; this beat plans at
    # 10:50: without settling, it would send 10:50 beside 10:45.
    case = Case("taken-over", now=at(10, 50), overlap=overlap)
    item = claimed(case)
    left = OpenRun("dead-beats-row", 7, f"{NAME}@2026-03-01T10:45:00+00:00", "pending", None)
    facts = Facts(open_runs=[left])
    decision = decide(item, plan(item, case.now), facts, case.now, run_timeout=RUN_TIMEOUT)
    assert tuple(run.scheduled_for for run in decision.sends) == sent
    assert tuple((run.reason, run.skipped_count) for run in decision.skips) == skipped
    assert decision.next_run_at == (at(10, 45) if overlap == "queue" else at(10, 55))
    if overlap == "skip":
        assert decision.sends[0].idempotency_key == left.idempotency_key


def test_ceiling_usage_must_have_been_read() -> None:
    item = claimed(Case("x", ceiling=10))
    with pytest.raises(ValueError, match="usage was not read"):
        decide(item, plan(item, DUE), Facts(), DUE, run_timeout=RUN_TIMEOUT)


def test_the_same_inputs_give_the_same_decision() -> None:
    for case in CASES:
        assert run_tick(case) == run_tick(case), case.id


# -- every combination ------------------------------------------------------------------

NOWS = (DUE, at(10, 2), at(10, 50))
COMBINATIONS = list(
    itertools.product(
        ("catch_up", "latest", "skip_to_next"),
        ("skip", "queue", "overlap", "replace"),
        (None, "running"),
        ((None, 0.0), (10, 3), (10, 9), (10, 10)),
        (None, 60, 400),
        (None, "pending", "sent"),
        NOWS,
    )
)


def test_every_combination_accounts_for_each_window_once() -> None:
    for combination in COMBINATIONS:
        try:
            check_combination(*combination)
        except AssertionError as exc:
            raise AssertionError(f"{combination}: {exc}") from exc


def check_combination(
    catch_up: str,
    overlap: str,
    open_run: str | None,
    ceiling: tuple[float | None, float],
    lateness: float | None,
    written: str | None,
    now: datetime,
) -> None:
    case = Case(
        f"{catch_up}-{overlap}-{open_run}-{ceiling}-{lateness}-{written}-{now:%H:%M}",
        now=now,
        catch_up=catch_up,
        overlap=overlap,
        open_run=open_run,
        ceiling=ceiling[0],
        used=ceiling[1],
        max_lateness=lateness,
        written=written,
    )
    decision = run_tick(case)
    if decision.verdict == Verdict.QUEUED:
        # Held back behind an open run: nothing written, looked at again soon.
        assert overlap == "queue" and open_run is not None
        assert decision.skips == () and decision.next_run_at > now
        assert decision.suspension is None
        return
    assert decision.verdict == Verdict.FIRE
    # The routine moves forward, never into the past: nothing stays due in a hot loop.
    assert decision.next_run_at > DUE
    sends = [run for run in decision.sends if run.deadline_at is not None]
    resent = [run for run in decision.sends if run.deadline_at is None]
    # Every window in [due, next_run_at) is sent, skipped (once), or was already written.
    windows = 1 + count_windows(EVERY_FIVE, DUE, decision.next_run_at - timedelta(microseconds=1))
    already_written = 1 if decision.resent is not None else 0
    skipped = sum(run.skipped_count or 1 for run in decision.skips)
    assert len(sends) + skipped + already_written == windows
    # What goes out never passes the ceiling; reaching it, when anything was
    # to go out, suspends; a window an open run held back spends nothing, so
    # it suspends nothing either (only a ceiling already reached does).
    limit, used = ceiling
    if limit is not None:
        assert used + len(sends) <= limit
        if decision.planned:
            assert (decision.suspension is not None) == (used + len(sends) >= limit)
    # A window later than max_lateness never goes out (judged at now).
    if lateness is not None:
        assert all((now - run.scheduled_for).total_seconds() <= lateness for run in sends)
    # An open run holds new windows back under skip and queue, not under overlap/replace.
    if open_run is not None and overlap == "skip":
        assert sends == []
    # Within a recovery too: under skip, queue and replace one window goes out
    # (under queue the oldest, under skip and replace the newest), never two at once.
    if overlap != "overlap":
        assert len(sends) <= 1
        replaced = [r.skipped_last for r in decision.skips if r.reason == "replaced"]
        if replaced:
            assert overlap == "replace"
            assert all(s.scheduled_for > last for s in sends for last in replaced if last)
    if overlap == "replace" and decision.replace:
        assert sends
    # Under skip a recovery's one window is its newest due one, never an older one.
    if overlap == "skip" and sends:
        assert sends[0].scheduled_for == DUE + 5 * count_windows(EVERY_FIVE, DUE, now) * MINUTE
    # Only a pending row left by a dead beat is sent again, and under its own key.
    assert len(resent) <= 1
    if resent:
        assert written == "pending" and resent[0].scheduled_for == DUE
    # Sends are oldest first, skip rows never collide with a sent window's key.
    assert [r.scheduled_for for r in sends] == sorted(r.scheduled_for for r in sends)
    sent_keys = {r.idempotency_key for r in decision.sends}
    assert not sent_keys & {r.idempotency_key for r in decision.skips}
    assert all(r.state == RunState.SKIPPED and r.reason in set(Reason) for r in decision.skips)
