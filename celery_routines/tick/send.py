"""The send half of a tick: the written runs published, after their rows
are committed (a worker claims a run only from its row), through the one
:class:`~celery_routines.sending.sender.Sender`, under claims known to be
live; what went out is entered in the beat's ledger. Before that, a row taken
over from another beat is looked at again, and ``max_lateness`` is judged
at the moment of sending.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from celery_routines.clock import Clock
from celery_routines.config import Settings
from celery_routines.observe.events import Events
from celery_routines.policy.decide import Decision
from celery_routines.sending.publish import Publisher
from celery_routines.sending.sender import Marker, Outbound, Sender, outgoing_run
from celery_routines.store import NewRun, Store
from celery_routines.tick.ledger import PublishLedger
from celery_routines.tick.report import TickReport
from celery_routines.tick.skip_lines import late_skipped

logger = logging.getLogger("celery_routines.beat")

# Messages go out on claims taken or renewed less than this share of
# routines_lock_ttl ago; older claims are renewed in the database first (the
# rest of the TTL is the margin for a chunk of messages and its bookkeeping).
CLAIM_TRUSTED_SHARE = 0.25
# A beat told to stop mid-tick (SIGTERM) keeps publishing what it committed
# for at most this long; what is left stays pending for the next beat, which
# may take it at once (the stopping beat releases its claims).
STOP_GRACE_SECONDS = 5.0


@dataclass
class Outgoing:
    """What a tick wrote: the routines it moves on, the runs to send."""

    ready: list[Decision]
    sends: list[tuple[Decision, NewRun, str]] = field(default_factory=list)


class WindowSender:
    """Publishes a tick's written windows and enters what went out."""

    def __init__(
        self,
        store: Store,
        publisher: Publisher,
        settings: Settings,
        holder: str,
        clock: Clock,
        events: Events,
        ledger: PublishLedger,
        marker: Marker,
    ) -> None:
        self.store = store
        self.publisher = publisher
        self.settings = settings
        self.holder = holder
        self.clock = clock
        self.events = events
        self.ledger = ledger
        self.marker = marker
        # time.monotonic() when beat was told to stop (SIGTERM), else None.
        self.stopping: float | None = None
        # The database's clock minus the beat's, for claims (set each tick).
        self.offset = timedelta(0)

    def send(self, outgoing: Outgoing, now: datetime, report: TickReport) -> set[int]:
        """Publish the written runs, after their rows are committed (a worker
        claims a run only from its row), through the one :class:`Sender`;
        the ids of the routines whose claims held to the end.

        Messages go out in chunks, each under claims known to be live: a
        chunk that starts later than a quarter of ``routines_lock_ttl`` after
        the claims were taken or last renewed renews them first, so no other
        beat can take a routine over while its messages are going out.
        """
        claims = _TickClaims(self, outgoing.ready, now)
        sending = [
            Outbound(outgoing_run(item.claimed.routine, run, run_id), item.claimed.record)
            for item, run, run_id in self._orphans_still_pending(outgoing.sends, report)
            if not self._too_late(item, run, run_id, report)
        ]
        done = Sender(self.store, self.publisher, self.clock).send(
            sending, self.ledger, claims=claims, marker=self.marker, stop=self._out_of_grace
        )
        report.sent += done.sent
        report.send_failures += done.failed
        if done.left:
            return claims.still - self._left_pending(done.left)
        return claims.still

    def _out_of_grace(self) -> bool:
        return self.stopping is not None and time.monotonic() - self.stopping >= STOP_GRACE_SECONDS

    def _left_pending(self, unsent: list[Outbound]) -> set[int]:
        """The routines of runs a stopping beat leaves unpublished: not moved
        on, so the beat that takes them over sends those same rows."""
        routines = {item.record.id for item in unsent}
        logger.warning(
            "stopping: %d run(s) of %d routine(s) left pending after %.0f s of publishing; "
            "the next beat sends them",
            len(unsent),
            len(routines),
            STOP_GRACE_SECONDS,
        )
        return routines

    def _orphans_still_pending(
        self, sends: list[tuple[Decision, NewRun, str]], report: TickReport
    ) -> list[tuple[Decision, NewRun, str]]:
        """Look again, just before publishing, at the rows taken over from
        another beat: if that beat was only slow, not gone, it may have
        published and marked them sent since this tick read them."""
        orphans = [run_id for _, run, run_id in sends if run_id != run.id]
        if not orphans:
            return sends
        pending = self.store.runs.still_pending(orphans)
        kept = []
        for send in sends:
            _, run, run_id = send
            if run_id != run.id and run_id not in pending:
                report.conflicts += 1
                logger.info(
                    "not sending %s: the beat that wrote it sent it meanwhile", run.idempotency_key
                )
                continue
            kept.append(send)
        return kept

    def _too_late(self, item: Decision, run: NewRun, run_id: str, report: TickReport) -> bool:
        """``max_lateness`` judged now, at the moment of sending, not when the
        row was read: a long drain behind a backlog cannot send a stale window."""
        limit = item.claimed.routine.max_lateness
        if limit is None:
            return False
        # From the send instant: a jittered window is due `offset` after it.
        lateness = (self.clock() - item.claimed.send_at(run.scheduled_for)).total_seconds()
        if lateness <= limit or not self.store.runs.skip_late(run_id, self.clock()):
            return False
        late_skipped(report, self.events, item.claimed.routine.name, run.scheduled_for, run_id)
        logger.warning(
            "skipped %s: late (%.1f s late at send time, max_lateness is %s s)",
            run.idempotency_key,
            lateness,
            limit,
        )
        return True

    def renew_claims(self, ready: list[Decision], held: set[int], checked: datetime) -> set[int]:
        """The routines of ``held`` whose claims this beat still has, renewed
        from ``checked`` for the messages still to go out and their bookkeeping.

        A claim lets another beat take the routine over once it expires, and
        that beat sends the routine's ``pending`` rows itself; a routine taken
        over meanwhile is left to its new holder, its rows unpublished here.
        """
        ttl = timedelta(seconds=self.settings.lock_ttl)
        until = checked + self.offset + ttl  # on the database's clock
        still = self.store.routines.renew_claims(sorted(held), self.holder, until)
        taken = [d for d in ready if d.claimed.record.id in held - still]
        if taken:
            logger.warning(
                "claims of %d routine(s) were taken over before this beat sent their runs "
                "(%s): their %d pending run(s) are left to the new holder (raise "
                "routines_lock_ttl or lower routines_batch_size if ticks are this slow)",
                len(taken),
                ", ".join(d.claimed.routine.name for d in taken[:5])
                + (", ..." if len(taken) > 5 else ""),
                sum(len(d.sends) for d in taken),
            )
        return still


class _TickClaims:
    """The claims of the routines a tick publishes for, renewed from the
    clock when they are older than ``CLAIM_TRUSTED_SHARE`` of the TTL."""

    def __init__(self, sender: WindowSender, ready: list[Decision], claimed_at: datetime) -> None:
        self.sender = sender
        self.ready = ready
        self.still = {d.claimed.record.id for d in ready}
        self.confirmed = claimed_at
        self.trusted = timedelta(seconds=sender.settings.lock_ttl * CLAIM_TRUSTED_SHARE)

    def held(self) -> set[int]:
        clock = self.sender.clock
        if clock() >= self.confirmed + self.trusted:
            self.confirmed = clock()
            self.still = self.sender.renew_claims(self.ready, self.still, self.confirmed)
        return self.still
