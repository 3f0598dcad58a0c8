"""Waiting out due routines that other beats hold in flight.

A beat's claim skips rows another beat's claim transaction has locked
(``FOR UPDATE SKIP LOCKED``), but its probe reads the last committed state, in
which those rows are still free and due. Such a beat claims nothing and its
probe still says "due": woken at that instant, it retried every 5 ms for as
long as the other transaction stayed open (a busy loop through each burst).
It waits instead, doubling from a few milliseconds up to a fraction of a
second: when the other beat commits, those routines are its own (its claim
expiry is the next instant this beat needs); if it dies before committing,
its transaction is rolled back, the rows are free again and this beat takes
them at its next wake, well within the claim TTL a committed claim would make
the survivors wait.
"""

from __future__ import annotations

from datetime import datetime, timedelta

# The first wait after a refused claim, and the longest.
FIRST_WAIT = 0.01
LONGEST_WAIT = 0.5


class HeldElsewhere:
    """The wait after ticks whose due routines were all held by other beats."""

    def __init__(self) -> None:
        self.wait = 0.0

    def retry_at(
        self, window: datetime | None, claimed_at: datetime | None, claimed: int, now: datetime
    ) -> datetime | None:
        """When to try the probe's oldest free ``window`` again: None when
        the tick's claim was not refused (wake when it falls due, as ever),
        else ``now`` plus a wait that doubles while claims keep being refused.
        ``claimed_at``: the instant the tick claimed at (None: it did not
        claim); ``claimed``: the routines it claimed. A window that fell due
        after the claim is not a refusal."""
        refused = (
            claimed_at is not None and claimed == 0 and window is not None and window <= claimed_at
        )
        if not refused:
            self.wait = 0.0
            return None
        self.wait = min(max(self.wait * 2, FIRST_WAIT), LONGEST_WAIT)
        return now + timedelta(seconds=self.wait)
