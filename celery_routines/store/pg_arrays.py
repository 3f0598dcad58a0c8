"""PostgreSQL array parameters written as array literals, one text value each.

psycopg dumps a Python list parameter element by element in pure Python
(``psycopg/types/array.py``): a thousand run ids cost it 3.7 ms of CPU, a
thousand timestamps 7 ms, and a burst's tick binds a dozen such arrays (the
run rows' INSERT, the bookkeeping, the overlap check). Joined here into one
literal (``{"a","b",NULL}``) that the statement casts (``CAST(:ids AS
varchar[])``), the same arrays cost 0.1 to 0.5 ms: the text is dumped in C
and PostgreSQL parses it. What is written does not change: the cast reads
the literal back into exactly the list's values.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, cast
from sqlalchemy.dialects import postgresql
from sqlalchemy.types import NullType

from .compiled import naive_utc


def array_param(name: str, element: Any) -> Any:
    """An array parameter bound as one of the literals below, cast in the statement.

    The parameter has no type on purpose: SQLAlchemy would render a String's
    as ``%(ids)s::VARCHAR``, and a varchar cast to an array is an expression
    PostgreSQL evaluates per row (the overlap check went from 6 ms to 430 ms
    a tick); an untyped literal is read as the array once, when bound."""
    return cast(bindparam(name, type_=NullType()), postgresql.ARRAY(element))


def text_array(values: Iterable[str | None]) -> str:
    """``{"v1","v2",NULL}``: every element quoted (so commas, braces, spaces
    and the word NULL stay data), its backslashes and double quotes escaped."""
    return (
        "{"
        + ",".join(
            "NULL" if value is None else '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
            for value in values
        )
        + "}"
    )


def int_array(values: Iterable[int | None]) -> str:
    """``{1,2,NULL}``."""
    return "{" + ",".join("NULL" if value is None else str(int(value)) for value in values) + "}"


def timestamp_array(instants: Iterable[datetime | None]) -> str:
    """Aware instants as a ``timestamp[]`` literal of naive UTC, what the
    ``UTCDateTime`` column type stores (a naive instant is refused, as there).

    A burst's arrays repeat a few instants (one deadline, one send instant
    per batch) a thousand times: each distinct UTC instant is written once.
    An instant in another zone is converted on its own: within one zone, the
    two readings of a repeated hour compare (and hash) equal, an hour apart."""
    written: dict[datetime, str] = {}
    out: list[str] = []
    for instant in instants:
        if instant is None:
            out.append("NULL")
        elif instant.tzinfo is UTC:
            literal = written.get(instant)
            if literal is None:
                literal = written[instant] = _timestamp(instant.replace(tzinfo=None))
            out.append(literal)
        else:
            out.append(_timestamp(naive_utc(instant)))
    return "{" + ",".join(out) + "}"


def _timestamp(naive: datetime | None) -> str:
    # ISO 8601 with a space, read the same whatever the session's DateStyle.
    assert naive is not None  # naive_utc returns None only for None
    return '"' + naive.isoformat(" ") + '"'
