"""The tables, as SQLAlchemy Core ``Table`` objects.

Column names are part of the user-facing contract: add columns, never rename.

Core, not ORM models: every query is a Core statement, and importing
``sqlalchemy.orm`` only to declare the tables cost each beat and worker about
6 MB of memory (issue 19). ``tests/test_imports.py`` keeps it out of beat.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from ..policy.options import RoutineOption
from ..policy.routine import NAME_MAX_LENGTH, OPTIONS
from .dialects import TABLE_OPTIONS
from .types import Seconds, UTCDateTime

KEY_MAX_LENGTH = 500

metadata = MetaData()


def partial_index(name: str, *columns: str, where: str) -> Index:
    """An index of the rows matching ``where`` on PostgreSQL and SQLite;
    MySQL/MariaDB have no partial indexes and index every row."""
    return Index(name, *columns, postgresql_where=text(where), sqlite_where=text(where))


_OPTION_TYPES: dict[str, Any] = {
    "text": Text,
    "json": Text,
    "integer": Integer,
    "seconds": Seconds,
    "instant": UTCDateTime,
    "boolean": Boolean,
}


def option_column(declared: RoutineOption) -> Column[Any]:
    """The column of a routine option, as its declaration
    (:class:`~celery_routines.policy.routine.Routine`) says."""
    stored = declared.stored
    kind = String(stored.length) if stored.kind == "string" else _OPTION_TYPES[stored.kind]
    default = None if stored.server_default is None else text(stored.server_default)
    return Column(declared.column_name, kind, server_default=default, nullable=stored.nullable)


ROUTINES = Table(
    "routines",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(NAME_MAX_LENGTH), unique=True, nullable=False),
    Column("task", String(255), nullable=False),
    # The definition: every option's column, declared with the option.
    *(option_column(declared) for declared in OPTIONS),
    # What beat and the operator keep about it.
    Column("next_run_at", UTCDateTime, nullable=True),
    Column("paused", Boolean, server_default=text("false"), nullable=False),
    Column("suspended_until", UTCDateTime, nullable=True),
    Column("suspended_reason", Text, nullable=True),
    # Set while the routine's definition cannot be computed; such a routine is
    # retried at most once a minute (guarantee 7).
    Column("last_error", Text, nullable=True),
    Column("locked_by", String(100), nullable=True),
    Column("locked_until", UTCDateTime, nullable=True),
    # "code" for routines declared with routine()/register()/beat_schedule,
    # "cli" for routines added with `celery routines add`; NULL or "sql" for SQL rows.
    Column("source", String(16), nullable=True),
    # The app whose code declared it (routines_owner, else the app's main).
    Column("owner", String(200), nullable=True),
    # Declaration stamp of the code that last wrote it: an older one never wins.
    Column("declared_version", String(100), nullable=True),
    # Set while a code routine is no longer declared by its owner: never fired.
    Column("retired_at", UTCDateTime, nullable=True),
    # The schedule next_run_at was computed from, as the database spells it.
    # Text: with an rrule (and the bounds) it outgrows the String(400) of 0004;
    # SQLite keeps its VARCHAR(400), whose length it never enforces (see 0005).
    Column("schedule_fingerprint", Text().with_variant(String(400), "sqlite"), nullable=True),
    Column("created_at", UTCDateTime, nullable=True),
    Column("updated_at", UTCDateTime, nullable=True),
    # Why pause_after_failures paused it; the instant from which failures
    # count (resume restarts the count).
    Column("paused_reason", Text, nullable=True),
    Column("failures_counted_from", UTCDateTime, nullable=True),
    # The due-query walks this index from the oldest due row: a range scan
    # whose cost grows with what is due, not with what is stored.
    partial_index("ix_routines_due", "next_run_at", where="enabled AND NOT paused"),
    partial_index("ix_routines_unscheduled", "id", where="next_run_at IS NULL"),
    **TABLE_OPTIONS,
)


# Who changed which routine, when and how (``celery routines history``).
ROUTINE_CHANGES = Table(
    "routine_changes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    # By name, not a foreign key: the history of a deleted routine stays.
    Column("routine", String(NAME_MAX_LENGTH), nullable=False),
    Column("action", String(32), nullable=False),
    Column("changed_by", String(255), nullable=True),
    Column("changed_at", UTCDateTime, nullable=False),
    # JSON object: the changed fields and their new values, or the operation's arguments.
    Column("detail", Text, nullable=True),
    Index("ix_routine_changes_routine", "routine", "id"),
    **TABLE_OPTIONS,
)


ROUTINE_RUNS = Table(
    "routine_runs",
    metadata,
    # Also the Celery task id, so a Flower row and a run row are the same thing.
    Column("id", String(64), primary_key=True),
    Column("routine_id", ForeignKey("routines.id", ondelete="CASCADE"), nullable=False),
    Column("idempotency_key", String(KEY_MAX_LENGTH), nullable=False),
    Column("attempt", Integer, server_default=text("1"), nullable=False),
    Column("scheduled_for", UTCDateTime, nullable=False),
    Column("state", String(16), nullable=False),
    Column("reason", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("retry_at", UTCDateTime, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("sent_at", UTCDateTime, nullable=True),
    Column("started_at", UTCDateTime, nullable=True),
    Column("finished_at", UTCDateTime, nullable=True),
    Column("worker", String(255), nullable=True),
    # JSON object unit -> amount, e.g. {"fires": 1, "eur": 0.12}.
    Column("spend", Text, nullable=True),
    # For a skipped row summarising several windows: how many, first and last.
    Column("skipped_count", Integer, nullable=True),
    Column("skipped_first", UTCDateTime, nullable=True),
    Column("skipped_last", UTCDateTime, nullable=True),
    # An open run not finished by this instant is declared lost (beat's sweep).
    Column("deadline_at", UTCDateTime, nullable=True),
    # Deliveries refused because the run had already started or finished.
    Column("duplicates", Integer, server_default=text("0"), nullable=False),
    # request.retries of the delivery holding the run: Celery's own
    # self.retry() redelivers the same run with a higher count.
    Column("celery_retries", Integer, server_default=text("0"), nullable=False),
    UniqueConstraint(
        "routine_id", "idempotency_key", "attempt", name="uq_routine_runs_window_attempt"
    ),
    Index("ix_routine_runs_routine_created", "routine_id", "created_at"),
    partial_index(
        "ix_routine_runs_open",
        "routine_id",
        where="state IN ('pending', 'sent', 'running')",
    ),
    partial_index("ix_routine_runs_retry_due", "retry_at", where="state = 'retrying'"),
    # The lost sweep: open runs by deadline, a range scan from the oldest.
    partial_index(
        "ix_routine_runs_deadline",
        "deadline_at",
        where="state IN ('pending', 'sent', 'running')",
    ),
    # The run listings across routines (admin runs/skips), newest first:
    # a backward range scan in the listing's exact order, stopping at its limit.
    Index("ix_routine_runs_created", "created_at", "scheduled_for", "attempt"),
    # Run metrics (issue 18): the runs finished since the last read.
    Index("ix_routine_runs_finished", "finished_at"),
    partial_index(
        "ix_routine_runs_skipped_created",
        "created_at",
        "scheduled_for",
        "attempt",
        where="state = 'skipped'",
    ),
    **TABLE_OPTIONS,
)


# What a worker did that no run row's own columns date: a refused
# duplicate delivery (``duplicate``), a suspension decided by the after-run
# ceiling check (``suspended``). Append-only; beat's metrics read the rows
# past the last id they saw, so every worker process (prefork children
# included) is counted once, whichever beat exports it.
ROUTINE_WORKER_EVENTS = Table(
    "routine_worker_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("routine_id", Integer, nullable=True),
    Column("run_id", String(64), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("at", UTCDateTime, nullable=False),
    **TABLE_OPTIONS,
)


# One row per beat process (issue 33): its heartbeat, upserted by the beat
# itself (tick/heartbeat.py) at most once every few seconds, read by the
# panel's Beats page and ``GET /api/beats``. Pruned a day after its last tick.
ROUTINE_BEATS = Table(
    "routine_beats",
    metadata,
    # The beat's holder id, as in ``routines.locked_by``: host:pid:random.
    Column("beat_id", String(100), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    # The database's clock when the heartbeat was written (the process clock
    # on SQLite), and the beat's own clock read just before: their difference
    # is the beat's clock skew, measured by that one statement.
    Column("last_tick_at", UTCDateTime, nullable=False),
    Column("beat_clock_at", UTCDateTime, nullable=False),
    # Tick durations over the beat's recent ticks (milliseconds), and how many.
    Column("tick_p50_ms", Seconds, nullable=True),
    Column("tick_p99_ms", Seconds, nullable=True),
    Column("ticks_measured", Integer, nullable=False),
    Column("claims_held", Integer, nullable=False),
    Column("publish_processes", Integer, nullable=False),
    Column("version", String(64), nullable=False),
    # Seconds without a heartbeat after which this beat is shown stale: a
    # few of its longest gaps between two heartbeats (tick/heartbeat.py).
    Column("stale_after_seconds", Seconds, nullable=False),
    Index("ix_routine_beats_last_tick", "last_tick_at"),
    **TABLE_OPTIONS,
)
