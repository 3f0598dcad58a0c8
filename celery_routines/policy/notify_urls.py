"""A routine's own notification endpoint (``notify_url``): what is accepted,
and how it is shown.

The same check at both doors of the model (a declaration, a ``routines``
row) and for the value a notifier looks up, so a row edited to a bad URL is
an invalid routine with the same words, and its notifications fall back to
``routines_notify_url`` instead of going nowhere.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from celery_routines.errors import ScheduleError

# Longer than any webhook URL seen; a column value past it is a mistake.
NOTIFY_URL_MAX_LENGTH = 2000
SCHEMES = ("http", "https")


def check_notify_url(value: object) -> str:
    """``value`` if it is an ``http(s)://host/...`` URL, else :class:`ScheduleError`."""
    if not isinstance(value, str) or not value:
        raise ScheduleError(f"notify_url must be an http:// or https:// URL, got {value!r}")
    if len(value) > NOTIFY_URL_MAX_LENGTH or not value.isprintable() or value != value.strip():
        shown = value if len(value) <= 80 else value[:80] + "..."
        raise ScheduleError(
            f"notify_url must be one line of at most {NOTIFY_URL_MAX_LENGTH} characters "
            f"without spaces around it, got {shown!r}"
        )
    try:
        parts = urlsplit(value)
        host = parts.hostname
        parts.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError as exc:
        raise ScheduleError(f"notify_url is not a URL ({exc}), got {value!r}") from None
    if parts.scheme.lower() not in SCHEMES or not host or " " in value:
        raise ScheduleError(
            f"notify_url must be an http:// or https:// URL with a host "
            f"(e.g. https://hooks.example.com/routines), got {value!r}"
        )
    return value


def usable_notify_url(value: object) -> str | None:
    """The URL when it passes :func:`check_notify_url`, else None."""
    try:
        return check_notify_url(value)
    except ScheduleError:
        return None


def shown_notify_url(value: str | None) -> str | None:
    """The URL as ``show``, the API, the history and the panel print it:
    enough to tell which endpoint (scheme, host, the first path segment),
    never its secret. A password becomes ``***``, and so do the rest of the
    path and the query: webhook relays put their token there (Slack's
    ``/services/T../B../<token>``, ``?token=``), and anyone who can read the
    panel could post to it."""
    if not value:
        return value
    try:
        parts = urlsplit(value)
        netloc = parts.netloc
        if parts.password is not None:
            user = parts.username or ""
            netloc = f"{user}:***@{netloc.rpartition('@')[2]}"
        first, more, _rest = parts.path.lstrip("/").partition("/")
        path = f"/{first}/***" if more else parts.path
        query = "***" if parts.query else ""
        return urlunsplit(parts._replace(netloc=netloc, path=path, query=query, fragment=""))
    except ValueError:
        return value
