"""Beat's declaration of the routines in its code: at start, and again when
the store has lost them.

Code routines are written at beat start (and by ``celery routines sync``)
only. A database dropped and recreated while beat runs (a restore, an
environment reset) comes back without them: beat would tick on an empty
store, ``list`` would say "no routines stored", and nothing would fire. So:

- after a tick failed because the tables are missing, the next tick first
  migrates, as beat does at start, and declares the code's routines again;
- every ``CHECK_EVERY`` seconds, and at the tick after each ``/readyz``,
  it checks that each routine its code declares is stored (one indexed read
  of their names), and declares them again if one is not;
- ``/readyz`` is not ready from a tick that met missing tables until beat
  has declared the code's routines again, and while a check found routines
  missing that beat could not declare, and says which. It answers from
  beat's view, not from the table: a probe never waits on a lock someone
  holds on ``routines``, and an idle tick stays one statement.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from celery import Celery

from .clock import Clock
from .config import Settings
from .declare import declare
from .observe.events import RoutineEvents
from .registry import InvalidEntry, celery_default_entries, definitions_for
from .store import Store
from .store.declarations import DeclarationQueries
from .store.engine import app_argument, safe_url
from .store.faults import tables_missing

logger = logging.getLogger("celery_routines.beat")

# How often a beat nobody probes checks that the code's routines are stored.
CHECK_EVERY = 60.0


class CodeDeclarations:
    """The code's routines of one beat, kept in its store."""

    def __init__(
        self,
        app: Celery,
        settings: Settings,
        store: Store,
        clock: Clock,
        *,
        stamp: str,
        holder: str,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app, self.settings, self.store = app, settings, store
        self.clock, self.stamp, self.holder = clock, stamp, holder
        self.monotonic = monotonic
        self.queries = DeclarationQueries(store.engine)
        self.names: frozenset[str] = frozenset()
        # Set by a tick that failed on missing tables: the next tick migrates.
        self.tables_lost = False
        # Set by /readyz (its thread): the next tick checks.
        self.recheck = False
        # What the last check found missing and could not declare again.
        self.missing: list[str] = []
        self._checked_at = monotonic()

    def declare(self) -> list[str]:
        """Write the code's routines to the store; their names."""
        invalid: list[InvalidEntry] = []
        definitions = definitions_for(self.app, invalid)
        events = RoutineEvents(self.app, hostname=self.holder, store=self.store)
        try:
            declared = declare(
                self.store,
                definitions,
                self.clock(),
                owner=self.settings.owner,
                stamp=self.stamp,
                default_zone=self.settings.timezone,
                events=events,
                invalid=invalid,
            )
        finally:
            events.close()
        names = [d.name for d in definitions]
        self.names = frozenset(names) | {exc.routine_name for exc, _task in invalid}
        if declared.newer_stamp is not None:
            # Newer code owns the declarations (a rolling deploy): what it
            # does not declare is not ours to bring back, now or later.
            self.names -= set(self.queries.missing(self.names))
        return names

    def tick_failed(self, exc: BaseException) -> None:
        if tables_missing(exc):
            self.tables_lost = True

    def keep(self) -> None:
        """Before a tick: put the code's routines back if the store lost them
        (raises what the store raises: the tick fails and backs off)."""
        now = self.monotonic()
        if not (self.tables_lost or self.recheck or now - self._checked_at >= CHECK_EVERY):
            return
        self.recheck = False
        if self.tables_lost:
            self.store.migrate()  # as at start: creates the tables if they are gone
        self.missing = missing = self.queries.missing(self.names)
        if missing:
            self.declare()
            self.missing = self.queries.missing(self.names)
            self._say_declared(missing)
        self.tables_lost = False
        self._checked_at = now

    def _say_declared(self, missing: list[str]) -> None:
        where = safe_url(self.settings.database_url)
        if self.tables_lost:
            logger.warning(
                "celery-routines: the tables of %s had been dropped: created them again and "
                "declared the %d routine(s) of the code again, as at beat start (their run "
                "history went with the tables; each starts from its next window)",
                where,
                len(self.names),
            )
        else:
            logger.warning(
                "celery-routines: %d routine(s) declared in code were missing from %s (%s): "
                "declared them again, as at beat start",
                len(missing),
                where,
                shown_names(missing),
            )

    def readiness_problem(self) -> str | None:
        """Why this beat is not ready as far as the code's routines go (for
        /readyz's thread), as its last check found; the next tick checks again."""
        self.recheck = True
        if self.tables_lost:
            return (
                "the store's tables were dropped: beat creates them if they are still "
                "missing and declares the code's routines again at its next tick"
            )
        missing = self.missing
        if missing:
            return (
                f"{len(missing)} routine(s) declared in code are missing from the store "
                f"({shown_names(missing)}): beat declares them again at its next tick "
                f"(or run `celery -A {app_argument()} routines sync`)"
            )
        return None


def shown_names(names: list[str], most: int = 5) -> str:
    """``a, b, c and 4 more``: names for one line."""
    more = len(names) - most
    return ", ".join(names[:most]) + (f" and {more} more" if more > 0 else "")


def written_line(app: Celery, names: list[str], database_url: str) -> str:
    """``wrote 3 routine(s) declared in code to <url>``, naming the ones the
    user did not declare and why they exist (a routine nobody declared looks
    like a bug)."""
    defaults = {d.name for d in celery_default_entries(app)} & set(names)
    text = f"wrote {len(names) - len(defaults)} routine(s) declared in code"
    if "celery.backend_cleanup" in defaults:
        text += " and celery.backend_cleanup"
    text += f" to {safe_url(database_url)}"
    if "celery.backend_cleanup" in defaults:
        text += (
            " (celery.backend_cleanup is Celery's own: its beat adds it too, because "
            "result_expires is set and the result backend does not expire results by itself)"
        )
    return text
