"""Typed SQLAlchemy models of the two contract tables.

Column names are part of the user-facing contract: add columns, never rename.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from ..policy.routine import NAME_MAX_LENGTH
from .dialects import TABLE_OPTIONS
from .types import Seconds, UTCDateTime

KEY_MAX_LENGTH = 500


class Base(DeclarativeBase):
    pass


class Routine(Base):
    __tablename__ = "routines"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(NAME_MAX_LENGTH), unique=True)
    task: Mapped[str] = mapped_column(String(255))
    cron: Mapped[str | None] = mapped_column(String(255))
    interval_seconds: Mapped[float | None] = mapped_column(Seconds)
    # NULL means the configured routines_timezone (rows inserted by plain SQL).
    timezone: Mapped[str | None] = mapped_column(String(64))
    enabled: Mapped[bool] = mapped_column(Boolean, server_default=text("true"))
    args: Mapped[str] = mapped_column(Text, server_default=text("'[]'"))
    kwargs: Mapped[str] = mapped_column(Text, server_default=text("'{}'"))
    options: Mapped[str] = mapped_column(Text, server_default=text("'{}'"))
    catch_up: Mapped[str] = mapped_column(String(16), server_default=text("'catch_up'"))
    catch_up_cap: Mapped[int] = mapped_column(Integer, server_default=text("25"))
    max_lateness: Mapped[float | None] = mapped_column(Seconds)
    overlap: Mapped[str] = mapped_column(String(16), server_default=text("'skip'"))
    max_retries: Mapped[int] = mapped_column(Integer, server_default=text("4"))
    retry_base_seconds: Mapped[float] = mapped_column(Seconds, server_default=text("60"))
    # JSON list of {"limit", "per", "unit"}; NULL when the routine has no ceiling.
    ceiling: Mapped[str | None] = mapped_column(Text)
    # Seconds without a heartbeat before a run is lost; NULL: routines_run_timeout.
    run_timeout: Mapped[float | None] = mapped_column(Seconds)
    next_run_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    paused: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    suspended_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    suspended_reason: Mapped[str | None] = mapped_column(Text)
    # Set while the routine's definition cannot be computed; such a routine is
    # retried at most once a minute (guarantee 7).
    last_error: Mapped[str | None] = mapped_column(Text)
    locked_by: Mapped[str | None] = mapped_column(String(100))
    locked_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # "code" for routines declared with routine()/register()/beat_schedule,
    # "cli" for routines added with `celery routines add`; NULL or "sql" for SQL rows.
    source: Mapped[str | None] = mapped_column(String(16))
    # The app whose code declared it (routines_owner, else the app's main).
    owner: Mapped[str | None] = mapped_column(String(200))
    # Declaration stamp of the code that last wrote it: an older one never wins.
    declared_version: Mapped[str | None] = mapped_column(String(100))
    # Set while a code routine is no longer declared by its owner: never fired.
    retired_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The schedule next_run_at was computed from, as the database spells it.
    schedule_fingerprint: Mapped[str | None] = mapped_column(String(400))
    created_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        # The due-query walks this index from the oldest due row: a range scan
        # whose cost grows with what is due, not with what is stored.
        Index(
            "ix_routines_due",
            "next_run_at",
            postgresql_where=text("enabled AND NOT paused"),
            sqlite_where=text("enabled AND NOT paused"),
        ),
        Index(
            "ix_routines_unscheduled",
            "id",
            postgresql_where=text("next_run_at IS NULL"),
            sqlite_where=text("next_run_at IS NULL"),
        ),
        TABLE_OPTIONS,
    )


class RoutineChange(Base):
    """Who changed which routine, when and how (``celery routines history``)."""

    __tablename__ = "routine_changes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # By name, not a foreign key: the history of a deleted routine stays.
    routine: Mapped[str] = mapped_column(String(NAME_MAX_LENGTH))
    action: Mapped[str] = mapped_column(String(32))
    changed_by: Mapped[str | None] = mapped_column(String(255))
    changed_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # JSON object: the changed fields and their new values, or the operation's arguments.
    detail: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (Index("ix_routine_changes_routine", "routine", "id"), TABLE_OPTIONS)


class RoutineRun(Base):
    __tablename__ = "routine_runs"

    # Also the Celery task id, so a Flower row and a run row are the same thing.
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    routine_id: Mapped[int] = mapped_column(ForeignKey("routines.id", ondelete="CASCADE"))
    idempotency_key: Mapped[str] = mapped_column(String(KEY_MAX_LENGTH))
    attempt: Mapped[int] = mapped_column(Integer, server_default=text("1"))
    scheduled_for: Mapped[datetime] = mapped_column(UTCDateTime)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    retry_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    worker: Mapped[str | None] = mapped_column(String(255))
    # JSON object unit -> amount, e.g. {"fires": 1, "eur": 0.12}.
    spend: Mapped[str | None] = mapped_column(Text)
    # For a skipped row summarising several windows: how many, first and last.
    skipped_count: Mapped[int | None] = mapped_column(Integer)
    skipped_first: Mapped[datetime | None] = mapped_column(UTCDateTime)
    skipped_last: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # An open run not finished by this instant is declared lost (beat's sweep).
    deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Deliveries refused because the run had already started or finished.
    duplicates: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # request.retries of the delivery holding the run: Celery's own
    # self.retry() redelivers the same run with a higher count.
    celery_retries: Mapped[int] = mapped_column(Integer, server_default=text("0"))

    __table_args__ = (
        UniqueConstraint(
            "routine_id", "idempotency_key", "attempt", name="uq_routine_runs_window_attempt"
        ),
        Index("ix_routine_runs_routine_created", "routine_id", "created_at"),
        Index(
            "ix_routine_runs_open",
            "routine_id",
            postgresql_where=text("state IN ('pending', 'sent', 'running')"),
            sqlite_where=text("state IN ('pending', 'sent', 'running')"),
        ),
        Index(
            "ix_routine_runs_retry_due",
            "retry_at",
            postgresql_where=text("state = 'retrying'"),
            sqlite_where=text("state = 'retrying'"),
        ),
        # The lost sweep: open runs by deadline, a range scan from the oldest.
        Index(
            "ix_routine_runs_deadline",
            "deadline_at",
            postgresql_where=text("state IN ('pending', 'sent', 'running')"),
            sqlite_where=text("state IN ('pending', 'sent', 'running')"),
        ),
        # The run listings across routines (admin runs/skips), newest first:
        # a backward range scan in the listing's exact order, stopping at its limit.
        Index("ix_routine_runs_created", "created_at", "scheduled_for", "attempt"),
        # Run metrics (issue 18): the runs finished since the last read.
        Index("ix_routine_runs_finished", "finished_at"),
        Index(
            "ix_routine_runs_skipped_created",
            "created_at",
            "scheduled_for",
            "attempt",
            postgresql_where=text("state = 'skipped'"),
            sqlite_where=text("state = 'skipped'"),
        ),
        TABLE_OPTIONS,
    )


class RoutineWorkerEvent(Base):
    """What a worker did that no run row's own columns date: a refused
    duplicate delivery (``duplicate``), a suspension decided by the after-run
    ceiling check (``suspended``). Append-only; beat's metrics read the rows
    past the last id they saw, so every worker process (prefork children
    included) is counted once, whichever beat exports it."""

    __tablename__ = "routine_worker_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    routine_id: Mapped[int | None] = mapped_column(Integer)
    run_id: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))
    at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (TABLE_OPTIONS,)
