"""plan_due: normal fires, the three catch-up policies, lateness, cost."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from celery_routines.errors import ScheduleError
from celery_routines.policy.catch_up import (
    FirePlan,
    SkippedWindows,
    one_at_a_time,
    plan_due,
    resume_written,
    this_tick,
)
from celery_routines.policy.states import CatchUp, Overlap
from celery_routines.schedules.cron import CronSchedule
from celery_routines.schedules.interval import IntervalSchedule
from tests.work import ScheduleWork

POLICIES = tuple(CatchUp)
FIVE_MINUTES = IntervalSchedule(300)
MIDNIGHT = datetime(2026, 3, 1, tzinfo=UTC)


def at(hour: int, minute: int, second: int = 0, day: int = 1) -> datetime:
    return datetime(2026, 3, day, hour, minute, second, tzinfo=UTC)


def test_policies() -> None:
    assert [p.value for p in POLICIES] == ["catch_up", "latest", "skip_to_next"]


# -- normal fire ----------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_one_due_window_is_a_normal_fire_under_every_policy(policy: str) -> None:
    plan = plan_due(FIVE_MINUTES, at(10, 0), at(10, 0, 30), catch_up=policy)
    assert plan == FirePlan(send=(at(10, 0),), skipped=(), next_run_at=at(10, 5))


def test_exactly_on_time() -> None:
    plan = plan_due(FIVE_MINUTES, at(10, 0), at(10, 0))
    assert plan.send == (at(10, 0),) and plan.next_run_at == at(10, 5)


def test_nothing_due_yet_keeps_the_due_time() -> None:
    plan = plan_due(FIVE_MINUTES, at(10, 5), at(10, 0))
    assert plan == FirePlan(send=(), skipped=(), next_run_at=at(10, 5))


def test_normal_fire_too_late_is_skipped_as_late() -> None:
    plan = plan_due(FIVE_MINUTES, at(10, 0), at(10, 2), max_lateness=60)
    assert plan == FirePlan(
        send=(),
        skipped=(SkippedWindows("late", 1, at(10, 0), at(10, 0)),),
        next_run_at=at(10, 5),
    )


def test_lateness_equal_to_the_limit_is_still_sent() -> None:
    plan = plan_due(FIVE_MINUTES, at(10, 0), at(10, 1), max_lateness=60)
    assert plan.send == (at(10, 0),) and plan.skipped == ()


# -- recovery: a 5-minute schedule down for a day ------------------------------------
# Due window 00:00; now 23:59:59. Due: 00:00, 00:05, ..., 23:55 = 288 windows.

NOW = at(23, 59, 59)


def test_catch_up_sends_the_newest_25_oldest_first_and_summarises_263() -> None:
    plan = plan_due(FIVE_MINUTES, MIDNIGHT, NOW, catch_up="catch_up")
    assert plan.send == tuple(at(21, 55) + timedelta(minutes=5 * k) for k in range(25))
    assert plan.send[0] == at(21, 55) and plan.send[-1] == at(23, 55)
    assert plan.skipped == (SkippedWindows("catch_up_cap", 263, at(0, 0), at(21, 50)),)
    assert plan.next_run_at == at(0, 0, day=2)


def test_catch_up_down_exactly_one_day_has_289_windows() -> None:
    # 00:00 through 24:00 inclusive.
    plan = plan_due(FIVE_MINUTES, MIDNIGHT, at(0, 0, day=2))
    assert len(plan.send) == 25
    assert plan.send[0] == at(22, 0) and plan.send[-1] == at(0, 0, day=2)
    assert plan.skipped == (SkippedWindows("catch_up_cap", 264, at(0, 0), at(21, 55)),)
    assert plan.next_run_at == at(0, 5, day=2)


def test_catch_up_with_fewer_missed_windows_than_the_cap_sends_all() -> None:
    plan = plan_due(FIVE_MINUTES, at(10, 0), at(10, 22))
    assert plan.send == (at(10, 0), at(10, 5), at(10, 10), at(10, 15), at(10, 20))
    assert plan.skipped == ()
    assert plan.next_run_at == at(10, 25)


def test_catch_up_with_exactly_cap_plus_one_windows() -> None:
    plan = plan_due(FIVE_MINUTES, at(10, 0), at(10, 15), catch_up_cap=3)
    assert plan.send == (at(10, 5), at(10, 10), at(10, 15))
    assert plan.skipped == (SkippedWindows("catch_up_cap", 1, at(10, 0), at(10, 0)),)


def test_latest_sends_only_the_newest() -> None:
    plan = plan_due(FIVE_MINUTES, MIDNIGHT, NOW, catch_up="latest")
    assert plan.send == (at(23, 55),)
    assert plan.skipped == (SkippedWindows("latest", 287, at(0, 0), at(23, 50)),)
    assert plan.next_run_at == at(0, 0, day=2)


def test_skip_to_next_sends_nothing() -> None:
    plan = plan_due(FIVE_MINUTES, MIDNIGHT, NOW, catch_up="skip_to_next")
    assert plan.send == ()
    assert plan.skipped == (SkippedWindows("skip_to_next", 288, at(0, 0), at(23, 55)),)
    assert plan.next_run_at == at(0, 0, day=2)


def test_catch_up_moves_late_windows_into_a_late_summary() -> None:
    # Of the 25 newest (21:55..23:55), those more than 10 minutes before
    # 23:59:59 (21:55..23:45, 23 windows) are late; 23:50 and 23:55 go out.
    plan = plan_due(FIVE_MINUTES, MIDNIGHT, NOW, max_lateness=600)
    assert plan.send == (at(23, 50), at(23, 55))
    assert plan.skipped == (
        SkippedWindows("catch_up_cap", 263, at(0, 0), at(21, 50)),
        SkippedWindows("late", 23, at(21, 55), at(23, 45)),
    )


def test_latest_too_late() -> None:
    plan = plan_due(FIVE_MINUTES, MIDNIGHT, NOW, catch_up="latest", max_lateness=60)
    assert plan.send == ()
    assert plan.skipped == (
        SkippedWindows("latest", 287, at(0, 0), at(23, 50)),
        SkippedWindows("late", 1, at(23, 55), at(23, 55)),
    )


def test_every_due_window_is_accounted_for() -> None:
    for policy in POLICIES:
        for lateness in (None, 0, 600, 10**6):
            plan = plan_due(FIVE_MINUTES, MIDNIGHT, NOW, catch_up=policy, max_lateness=lateness)
            assert len(plan.send) + sum(s.count for s in plan.skipped) == 288
            assert len({s.reason for s in plan.skipped}) == len(plan.skipped)


def test_cron_recovery_across_the_rome_spring_gap() -> None:
    nightly = CronSchedule("30 2 * * *", "Europe/Rome")
    due = datetime(2026, 3, 27, 1, 30, tzinfo=UTC)
    now = datetime(2026, 3, 31, 12, 0, tzinfo=UTC)
    plan = plan_due(nightly, due, now, catch_up_cap=3)
    assert plan.send == (
        datetime(2026, 3, 29, 1, 30, tzinfo=UTC),  # 02:30 does not exist: 03:30 CEST
        datetime(2026, 3, 30, 0, 30, tzinfo=UTC),
        datetime(2026, 3, 31, 0, 30, tzinfo=UTC),
    )
    assert plan.skipped == (
        SkippedWindows(
            "catch_up_cap",
            2,
            datetime(2026, 3, 27, 1, 30, tzinfo=UTC),
            datetime(2026, 3, 28, 1, 30, tzinfo=UTC),
        ),
    )
    assert plan.next_run_at == datetime(2026, 4, 1, 0, 30, tzinfo=UTC)


# -- a schedule that only implements the bare protocol ------------------------------


class BareInterval:
    """Only next_after/windows/describe: the planner must still be right."""

    def __init__(self, seconds: float) -> None:
        self._inner = IntervalSchedule(seconds)

    def next_after(self, instant: datetime) -> datetime:
        return self._inner.next_after(instant)

    def windows(self, after: datetime, until: datetime) -> Iterator[datetime]:
        return self._inner.windows(after, until)

    def describe(self) -> str:
        return "bare"


@pytest.mark.parametrize("policy", POLICIES)
def test_bare_protocol_schedule_plans_the_same(policy: str) -> None:
    bare = plan_due(BareInterval(300), MIDNIGHT, NOW, catch_up=policy, max_lateness=600)
    fast = plan_due(FIVE_MINUTES, MIDNIGHT, NOW, catch_up=policy, max_lateness=600)
    assert bare == fast


def test_a_schedule_that_does_not_move_forward_is_an_error() -> None:
    class Stuck(BareInterval):
        def next_after(self, instant: datetime) -> datetime:
            return instant

    with pytest.raises(ScheduleError, match="a schedule must move forward"):
        plan_due(Stuck(300), at(10, 0), at(10, 0))


# -- validation -------------------------------------------------------------------------


def test_naive_instants_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        plan_due(FIVE_MINUTES, datetime(2026, 3, 1), at(10, 0))


# -- cost: a year of one-minute windows ----------------------------------------------

YEAR_AGO = datetime(2025, 6, 1, tzinfo=UTC)
NOW_YEAR = datetime(2026, 6, 1, 0, 0, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    "schedule",
    [CronSchedule("* * * * *", "Europe/Rome"), IntervalSchedule(60)],
    ids=["cron_every_minute_rome", "interval_60s"],
)
@pytest.mark.parametrize("policy", POLICIES)
def test_a_year_down_plans_without_listing_the_year(
    schedule: object, policy: str, schedule_work: ScheduleWork
) -> None:
    plan = plan_due(schedule, YEAR_AGO, NOW_YEAR, catch_up=policy)  # type: ignore[arg-type]

    total = 365 * 24 * 60 + 1  # 2025-06-01 00:00 through 2026-06-01 00:00
    assert len(plan.send) + sum(s.count for s in plan.skipped) == total
    assert plan.skipped[0].first == YEAR_AGO
    assert plan.next_run_at == datetime(2026, 6, 1, 0, 1, tzinfo=UTC)
    if policy == "catch_up":
        assert plan.send[-1] == datetime(2026, 6, 1, tzinfo=UTC) and len(plan.send) == 25
        assert plan.skipped[0].count == total - 25
    # Counted arithmetically: a handful of days listed (21 today), never the year.
    assert schedule_work.days_listed <= 30
    assert schedule_work.interval_windows <= 30


# -- against a plan built by listing every window ----------------------------------------


def reference_plan(
    schedule: CronSchedule | IntervalSchedule,
    due: datetime,
    now: datetime,
    policy: str,
    cap: int,
    max_lateness: float | None,
) -> FirePlan:
    due_windows = [due, *schedule.windows(due, now)]
    keep = {"catch_up": min(cap, len(due_windows)), "latest": 1, "skip_to_next": 0}[policy]
    if len(due_windows) == 1:
        keep = 1
    kept = due_windows[len(due_windows) - keep :] if keep else []
    dropped = due_windows[: len(due_windows) - len(kept)]
    skipped = []
    if dropped:
        reason = "catch_up_cap" if policy == "catch_up" else policy
        skipped.append(SkippedWindows(reason, len(dropped), dropped[0], dropped[-1]))
    if max_lateness is not None:
        late = [w for w in kept if (now - w).total_seconds() > max_lateness]
        if late:
            skipped.append(SkippedWindows("late", len(late), late[0], late[-1]))
        kept = [w for w in kept if w not in late]
    following = next(schedule.windows(due_windows[-1], now + timedelta(days=400)))
    return FirePlan(tuple(kept), tuple(skipped), following)


@settings(max_examples=300, deadline=None)
@given(
    schedule=st.one_of(
        st.builds(IntervalSchedule, st.sampled_from([1, 7.5, 60, 300, 3600, 86400])),
        st.builds(
            CronSchedule,
            st.sampled_from(["*/5 * * * *", "30 2 * * *", "0 */3 * * 1-5", "0,30 1,2,3 * * *"]),
            st.sampled_from(["Europe/Rome", "Australia/Lord_Howe", "America/New_York", "UTC"]),
        ),
    ),
    due=st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2026, 12, 1)),
    outage=st.one_of(st.integers(0, 900), st.integers(0, 3 * 86400)),
    policy=st.sampled_from(POLICIES),
    cap=st.integers(1, 30),
    max_lateness=st.none() | st.integers(0, 7200),
)
def test_plan_matches_a_plan_built_from_every_window(
    schedule: CronSchedule | IntervalSchedule,
    due: datetime,
    outage: int,
    policy: str,
    cap: int,
    max_lateness: int | None,
) -> None:
    # Start from a real window so `due` is one, as it is in the beat.
    first = schedule.next_after(due.replace(tzinfo=UTC))
    now = first + timedelta(seconds=outage)
    assume(schedule.count_windows(first, now) <= 20_000)  # keep the listing reference cheap
    expected = reference_plan(schedule, first, now, policy, cap, max_lateness)
    got = plan_due(
        schedule, first, now, catch_up=policy, catch_up_cap=cap, max_lateness=max_lateness
    )
    assert got == expected


# -- the overlap policy among a recovery's windows ------------------------------------

RECOVERY = plan_due(FIVE_MINUTES, at(10, 0), at(10, 20), catch_up_cap=3)  # 10:10, 10:15, 10:20
CAPPED = SkippedWindows("catch_up_cap", 2, at(10, 0), at(10, 5))


@pytest.mark.parametrize(
    ("overlap", "send", "skipped", "next_run_at", "waiting"),
    [
        # skip: the newest goes, as Celery beat sends a missed entry once;
        # the older ones are passed over for it, one summary row.
        (
            "skip",
            (at(10, 20),),
            (CAPPED, SkippedWindows("latest", 2, at(10, 10), at(10, 15))),
            at(10, 25),
            0,
        ),
        # queue: the oldest goes; the next stays due and waits for it.
        ("queue", (at(10, 10),), (CAPPED,), at(10, 15), 2),
        # replace: each would replace the one before; only the newest goes.
        (
            "replace",
            (at(10, 20),),
            (CAPPED, SkippedWindows("replaced", 2, at(10, 10), at(10, 15))),
            at(10, 25),
            0,
        ),
        # overlap: all of them, up to catch_up_cap.
        ("overlap", (at(10, 10), at(10, 15), at(10, 20)), (CAPPED,), at(10, 25), 0),
    ],
)
def test_a_recovery_meets_the_overlap_policy_among_its_own_windows(
    overlap: str,
    send: tuple[datetime, ...],
    skipped: tuple[SkippedWindows, ...],
    next_run_at: datetime,
    waiting: int,
) -> None:
    assert RECOVERY.send == (at(10, 10), at(10, 15), at(10, 20))
    assert one_at_a_time(RECOVERY, Overlap(overlap)) == FirePlan(
        send=send, skipped=skipped, next_run_at=next_run_at, waiting=waiting
    )


def test_ten_minutes_down_under_the_defaults_sends_the_newest_window_once() -> None:
    # Beat down from 19:02:30 to 19:12: windows 19:03 .. 19:12 are due at once.
    every_minute = IntervalSchedule(60)
    due, now = at(19, 3), at(19, 12, 1)
    recovery = one_at_a_time(plan_due(every_minute, due, now), Overlap.SKIP)
    assert recovery == FirePlan(
        send=(at(19, 12),),
        skipped=(SkippedWindows("latest", 9, at(19, 3), at(19, 11)),),
        next_run_at=at(19, 13),
    )


def test_a_recovery_under_skip_across_spring_forward_sends_the_newest_window() -> None:
    # 02:30 in Rome, beat down from the 28th to the 30th of March 2026: the
    # 29th's 02:30 did not exist and is 03:30 CEST (01:30 UTC), passed over
    # like any other; the 30th's 02:30 CEST goes out.
    nightly = CronSchedule("30 2 * * *", "Europe/Rome")
    due = datetime(2026, 3, 28, 1, 30, tzinfo=UTC)
    now = datetime(2026, 3, 30, 0, 31, tzinfo=UTC)
    recovery = one_at_a_time(plan_due(nightly, due, now), Overlap.SKIP)
    assert recovery.send == (datetime(2026, 3, 30, 0, 30, tzinfo=UTC),)
    assert recovery.skipped == (
        SkippedWindows("latest", 2, due, datetime(2026, 3, 29, 1, 30, tzinfo=UTC)),
    )


# A recovery under skip at 10:20: 10:20 goes out, 10:00 .. 10:15 are passed over.
PASSED_OVER = one_at_a_time(plan_due(FIVE_MINUTES, at(10, 0), at(10, 20)), Overlap.SKIP)


@pytest.mark.parametrize(
    ("written", "send", "skipped"),
    [
        # A beat that gave the routine up wrote 10:10 (its newest, at 10:10).
        (
            [at(10, 10)],
            at(10, 10),
            (
                SkippedWindows("latest", 2, at(10, 0), at(10, 5)),
                SkippedWindows("overlap", 2, at(10, 15), at(10, 20)),
            ),
        ),
        # ... or 10:05, the window after the oldest: one window stays passed over.
        (
            [at(10, 5)],
            at(10, 5),
            (
                SkippedWindows("latest", 1, at(10, 0), at(10, 0)),
                SkippedWindows("overlap", 3, at(10, 10), at(10, 20)),
            ),
        ),
        # ... or the oldest window itself: nothing is passed over.
        ([at(10, 0)], at(10, 0), (SkippedWindows("overlap", 4, at(10, 5), at(10, 20)),)),
        # Of several written windows the newest is taken.
        (
            [at(10, 5), at(9, 55), at(10, 10)],
            at(10, 10),
            (
                SkippedWindows("latest", 2, at(10, 0), at(10, 5)),
                SkippedWindows("overlap", 2, at(10, 15), at(10, 20)),
            ),
        ),
    ],
)
def test_a_recovery_under_skip_settles_on_a_window_already_written(
    written: list[datetime], send: datetime, skipped: tuple[SkippedWindows, ...]
) -> None:
    assert PASSED_OVER.send == (at(10, 20),)
    assert resume_written(PASSED_OVER, written, FIVE_MINUTES) == FirePlan(
        send=(send,), skipped=skipped, next_run_at=at(10, 25)
    )


def test_a_written_window_the_recovery_did_not_pass_over_changes_nothing() -> None:
    # Before the recovery, or its newest window (that one's own row settles it).
    assert resume_written(PASSED_OVER, [at(9, 55), at(10, 20)], FIVE_MINUTES) is PASSED_OVER
    # The cap's windows are not the recovery's to send.
    capped = one_at_a_time(
        plan_due(FIVE_MINUTES, at(10, 0), at(10, 20), catch_up_cap=3), Overlap.SKIP
    )
    assert resume_written(capped, [at(10, 5)], FIVE_MINUTES) is capped
    with_cap = resume_written(capped, [at(10, 10)], FIVE_MINUTES)
    assert with_cap.send == (at(10, 10),)
    assert with_cap.skipped == (
        SkippedWindows("catch_up_cap", 2, at(10, 0), at(10, 5)),
        SkippedWindows("overlap", 2, at(10, 15), at(10, 20)),
    )
    # Nothing passed over (one window): nothing to settle on.
    single = plan_due(FIVE_MINUTES, at(10, 0), at(10, 0, 30))
    assert resume_written(single, [at(9, 55)], FIVE_MINUTES) is single


@pytest.mark.parametrize("overlap", tuple(Overlap))
def test_a_single_window_or_none_is_left_as_planned(overlap: Overlap) -> None:
    single = plan_due(FIVE_MINUTES, at(10, 0), at(10, 0, 30))
    nothing = plan_due(FIVE_MINUTES, at(10, 0), at(10, 20), catch_up="skip_to_next")
    assert one_at_a_time(single, overlap) is single
    assert one_at_a_time(nothing, overlap) is nothing


# -- one routine's share of a tick (routines_catch_up_per_tick) ------------------------


def test_a_catch_up_larger_than_a_ticks_share_goes_out_over_the_next_ticks() -> None:
    recovery = plan_due(FIVE_MINUTES, at(10, 0), at(10, 20), catch_up_cap=10)  # 10:00 .. 10:20
    first = this_tick(recovery, 2)
    assert first == FirePlan(
        send=(at(10, 0), at(10, 5)), skipped=(), next_run_at=at(10, 10), waiting=3
    )
    # The next tick plans from the oldest window left: the next two go.
    second = this_tick(plan_due(FIVE_MINUTES, first.next_run_at, at(10, 20), catch_up_cap=10), 2)
    assert second.send == (at(10, 10), at(10, 15)) and second.next_run_at == at(10, 20)
    assert this_tick(recovery, 5) is recovery


@pytest.mark.parametrize("bad", [0, -1, 2.5, "many"])
def test_the_share_of_a_tick_must_be_a_whole_number_of_windows(bad: object) -> None:
    from celery_routines.config import Settings
    from celery_routines.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=rf"routines_catch_up_per_tick .*{bad}"):
        Settings(catch_up_per_tick=bad)  # type: ignore[arg-type]
