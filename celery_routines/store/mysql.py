"""MySQL/MariaDB statements that take many rows as one JSON parameter.

PostgreSQL gets a burst's thousands of rows as one array per column
(``unnest``); the MySQL family's equivalent is ``JSON_TABLE`` (MySQL 8.0.4,
MariaDB 10.6). Without it, an advance of 10,000 routines was 10,000 UPDATEs
and round trips (15 s on PyMySQL, measured), and every IN list of 10,000
ids was escaped value by value in Python. One ``json.dumps`` and one
statement instead: the whole burst's bookkeeping is a few statements.

Strings are read as LONGTEXT, never at the column's width: a value too long
must reach the INSERT, which refuses it under the strict SQL mode the engine
sets, rather than be cut down inside JSON_TABLE and then collide with
another key.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from sqlalchemy import Connection, text

from .records import NewRun

# The run columns written by insert_new, in NewRun's field order.
_RUN_COLUMNS = (
    "id LONGTEXT PATH '$[0]', routine_id INT PATH '$[1]', idempotency_key LONGTEXT PATH '$[2]',"
    " attempt INT PATH '$[3]', scheduled_for DATETIME(6) PATH '$[4]', state LONGTEXT PATH '$[5]',"
    " reason LONGTEXT PATH '$[6]', skipped_count INT PATH '$[7]',"
    " skipped_first DATETIME(6) PATH '$[8]', skipped_last DATETIME(6) PATH '$[9]',"
    " deadline_at DATETIME(6) PATH '$[10]'"
)
IDS = "JSON_TABLE(:ids, '$[*]' COLUMNS (id LONGTEXT PATH '$')) AS j"

INSERT_RUNS = text(
    "INSERT INTO routine_runs (id, routine_id, idempotency_key, attempt, scheduled_for,"
    " state, reason, skipped_count, skipped_first, skipped_last, deadline_at, created_at) "
    f"SELECT j.*, :now FROM JSON_TABLE(:rows, '$[*]' COLUMNS ({_RUN_COLUMNS})) AS j "
    # A clash on the window's unique key (or the id) changes nothing and
    # raises nothing; any other error still raises (INSERT IGNORE would not).
    "ON DUPLICATE KEY UPDATE id = routine_runs.id"
)
# Which of these run ids are stored (a fresh id stored was written by us).
STORED_RUN_IDS = text(
    f"SELECT r.id FROM {IDS} STRAIGHT_JOIN routine_runs r FORCE INDEX (PRIMARY) ON r.id = j.id"
)
MARK_SENT = text(
    f"UPDATE {IDS} STRAIGHT_JOIN routine_runs r FORCE INDEX (PRIMARY) ON r.id = j.id"
    " SET r.state = 'sent', r.sent_at = :now WHERE r.state = 'pending'"
)
MARK_SENT_WITH_DEADLINE = text(
    f"UPDATE {IDS} STRAIGHT_JOIN routine_runs r FORCE INDEX (PRIMARY) ON r.id = j.id"
    " SET r.state = 'sent', r.sent_at = :now,"
    # Never back (see RunQueries' mark-sent): NULL > x is not true.
    " r.deadline_at = IF(r.deadline_at > :deadline, r.deadline_at, :deadline)"
    " WHERE r.state = 'pending'"
)
_WINDOWS = (
    "JSON_TABLE(:rows, '$[*]' COLUMNS (rid INT PATH '$[0]', nra DATETIME(6) PATH '$[1]')) AS j"
)
ADVANCE = text(
    f"UPDATE {_WINDOWS} STRAIGHT_JOIN routines r FORCE INDEX (PRIMARY) ON r.id = j.rid"
    " SET r.next_run_at = j.nra, r.locked_by = NULL, r.locked_until = NULL,"
    " r.last_error = NULL, r.updated_at = :now"
    " WHERE r.locked_by = :holder"
)
ADOPT = text(
    f"UPDATE {_WINDOWS} STRAIGHT_JOIN routines r FORCE INDEX (PRIMARY) ON r.id = j.rid"
    " SET r.next_run_at = j.nra, r.last_error = NULL, r.updated_at = :now,"
    # store/fingerprint.py's expression, as SQLAlchemy spells it on MySQL.
    " r.schedule_fingerprint = concat(coalesce(r.cron, ''), '|',"
    " coalesce(CAST(r.interval_seconds AS CHAR), ''), '|', coalesce(r.timezone, ''), '|',"
    " coalesce(CAST(r.at AS CHAR), ''), '|', coalesce(r.solar, ''), '|',"
    " coalesce(r.rrule, ''), '|',"
    " coalesce(CAST(r.starts_at AS CHAR), ''), '|', coalesce(CAST(r.ends_at AS CHAR), ''), '|',"
    " coalesce(CAST(r.jitter_seconds AS CHAR), ''),"
    " coalesce(nullif(concat('|', coalesce(r.schedules, ''), '|', coalesce(r.exclude, ''),"
    " '|', coalesce(r.shift, '')), '|||'), ''), '|',"
    " CASE WHEN r.enabled THEN 'on' ELSE 'off' END)"
    " WHERE r.next_run_at IS NULL"
)
CLAIM = text(
    "UPDATE JSON_TABLE(:ids, '$[*]' COLUMNS (id INT PATH '$')) AS j"
    " STRAIGHT_JOIN routines r FORCE INDEX (PRIMARY) ON r.id = j.id"
    " SET r.locked_by = :holder, r.locked_until = :until"
)


def instant(value: datetime | None) -> str | None:
    """An instant as JSON_TABLE reads a DATETIME(6): naive UTC text."""
    if value is None:
        return None
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


def naive(value: datetime) -> datetime:
    """A bound instant for a plain text() statement: naive UTC, as stored."""
    return value.astimezone(UTC).replace(tzinfo=None)


def run_rows(runs: Iterable[NewRun]) -> str:
    return json.dumps(
        [
            [
                r.id,
                r.routine_id,
                r.idempotency_key,
                r.attempt,
                instant(r.scheduled_for),
                r.state,
                r.reason,
                r.skipped_count,
                instant(r.skipped_first),
                instant(r.skipped_last),
                instant(r.deadline_at),
            ]
            for r in runs
        ]
    )


def windows(pairs: Iterable[tuple[int, datetime]]) -> str:
    """(routine id, instant) pairs in id order: rows are then locked in the
    same order by every statement that writes several routines."""
    return json.dumps([[rid, instant(at)] for rid, at in sorted(pairs, key=lambda p: p[0])])


def ids(values: Sequence[int] | Sequence[str]) -> str:
    return json.dumps(sorted(values))


def insert_runs(conn: Connection, runs: Sequence[NewRun], now: datetime) -> set[str]:
    """Insert what is new of ``runs`` and learn which rows went in.

    ``ON DUPLICATE KEY UPDATE id = id`` turns a clash on the unique
    ``(routine_id, idempotency_key, attempt)`` (or the primary key) into a
    no-op and nothing else: a row too long, a routine that does not exist,
    a lost connection still raise (``INSERT IGNORE`` would have turned
    those into warnings). MySQL has no RETURNING (MariaDB has none on an
    upsert), so the answer is read back in the same transaction: a run id
    is fresh, so a stored row with one of ours is one this statement wrote.
    """
    conn.execute(INSERT_RUNS, {"rows": run_rows(runs), "now": naive(now)})
    return {row.id for row in conn.execute(STORED_RUN_IDS, {"ids": ids([run.id for run in runs])})}
