"""The tables, as SQLAlchemy Core ``Table`` objects.

Column names are part of the user-facing contract: add columns, never rename.

Core, not ORM models: every query is a Core statement, and importing
``sqlalchemy.orm`` only to declare the tables cost each beat and worker about
6 MB of memory (issue 19). ``tests/test_imports.py`` keeps it out of beat.
"""

from __future__ import annotations

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

from ..policy.routine import NAME_MAX_LENGTH
from .dialects import TABLE_OPTIONS
from .types import Seconds, UTCDateTime

KEY_MAX_LENGTH = 500

metadata = MetaData()


def partial_index(name: str, *columns: str, where: str) -> Index:
    """An index of the rows matching ``where`` on PostgreSQL and SQLite;
    MySQL/MariaDB have no partial indexes and index every row."""
    return Index(name, *columns, postgresql_where=text(where), sqlite_where=text(where))


ROUTINES = Table(
    "routines",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(NAME_MAX_LENGTH), unique=True, nullable=False),
    Column("task", String(255), nullable=False),
    Column("cron", String(255), nullable=True),
    Column("interval_seconds", Seconds, nullable=True),
    # NULL means the configured routines_timezone (rows inserted by plain SQL).
    Column("timezone", String(64), nullable=True),
    Column("enabled", Boolean, server_default=text("true"), nullable=False),
    Column("args", Text, server_default=text("'[]'"), nullable=False),
    Column("kwargs", Text, server_default=text("'{}'"), nullable=False),
    Column("options", Text, server_default=text("'{}'"), nullable=False),
    Column("catch_up", String(16), server_default=text("'catch_up'"), nullable=False),
    Column("catch_up_cap", Integer, server_default=text("25"), nullable=False),
    Column("max_lateness", Seconds, nullable=True),
    Column("overlap", String(16), server_default=text("'skip'"), nullable=False),
    Column("max_retries", Integer, server_default=text("4"), nullable=False),
    Column("retry_base_seconds", Seconds, server_default=text("60"), nullable=False),
    # JSON list of {"limit", "per", "unit"}; NULL when the routine has no ceiling.
    Column("ceiling", Text, nullable=True),
    # Seconds without a heartbeat before a run is lost; NULL: routines_run_timeout.
    Column("run_timeout", Seconds, nullable=True),
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
    # Schedule kinds besides cron and interval_seconds (exactly one is set):
    # a one-off's instant, a solar event "<event> <lat> <lon>".
    Column("at", UTCDateTime, nullable=True),
    Column("solar", String(100), nullable=True),
    # An RFC 5545 rule with a local DTSTART, e.g. "DTSTART:20261201T090000\nRRULE:...".
    Column("rrule", Text, nullable=True),
    # Bounds of any schedule, and the deterministic spread of its send instants.
    Column("starts_at", UTCDateTime, nullable=True),
    Column("ends_at", UTCDateTime, nullable=True),
    Column("jitter_seconds", Integer, nullable=True),
    # Calendars (issue 34): several specs (a JSON list of crons, rrules and
    # interval seconds), exclusions (a JSON list, or entries separated by ';'),
    # and "next_business_day" / "previous_business_day".
    Column("schedules", Text, nullable=True),
    Column("exclude", Text, nullable=True),
    Column("shift", String(32), nullable=True),
    # Pause after this many consecutive final failures (NULL: never); why it
    # paused; the instant from which failures count (resume restarts the count).
    Column("pause_after_failures", Integer, nullable=True),
    Column("paused_reason", Text, nullable=True),
    Column("failures_counted_from", UTCDateTime, nullable=True),
    # Where this routine's notifications go (NULL: routines_notify_url).
    Column("notify_url", Text, nullable=True),
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
