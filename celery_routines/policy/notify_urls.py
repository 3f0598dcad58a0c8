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
# What the masked parts of a URL print as.
MASK = "***"


def check_notify_url(value: object) -> str:
    """``value`` if it is an ``http(s)://host/...`` URL, else :class:`ScheduleError`.

    The messages print the value as :func:`shown_notify_url` does: a refused
    URL is echoed in the routine's error, the log and the panel, and its
    token must not be."""
    if not isinstance(value, str) or not value:
        raise ScheduleError(f"notify_url must be an http:// or https:// URL, got {value!r}")
    shown = shown_notify_url(value) or ""
    if len(value) > NOTIFY_URL_MAX_LENGTH or not value.isprintable() or value != value.strip():
        shown = shown if len(shown) <= 80 else shown[:80] + "..."
        raise ScheduleError(
            f"notify_url must be one line of at most {NOTIFY_URL_MAX_LENGTH} characters "
            f"without spaces around it, got {shown!r}"
        )
    try:
        parts = urlsplit(value)
        host = parts.hostname
        parts.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError as exc:
        raise ScheduleError(f"notify_url is not a URL ({exc}), got {shown!r}") from None
    if parts.scheme.lower() not in SCHEMES or not host or " " in value:
        raise ScheduleError(
            f"notify_url must be an http:// or https:// URL with a host "
            f"(e.g. https://hooks.example.com/routines), got {shown!r}"
        )
    if MASK in value:
        raise ScheduleError(
            f"notify_url holds {MASK!r}, the mask printed in place of a stored URL's secret: "
            f"give the whole URL (an edit that leaves it out keeps the stored one), got {shown!r}"
        )
    return value


def usable_notify_url(value: object) -> str | None:
    """The URL when it passes :func:`check_notify_url`, else None."""
    try:
        return check_notify_url(value)
    except ScheduleError:
        return None


def shown_notify_url(value: str | None) -> str | None:
    """The URL as ``show``, the API, the history, the log and the panel
    print it: enough to tell which endpoint (scheme, host, the first path
    segment), never its secret. A password (or a user name alone, which
    services use as a token) becomes ``***``, and so do the rest of the path
    and the query: webhook relays put their token there (Slack's
    ``/services/T../B../<token>``, ``?token=``), and anyone who can read the
    panel could post to it. Text that does not read as a URL keeps only
    what comes before ``//``."""
    if not value:
        return value
    try:
        parts = urlsplit(value)
        netloc = parts.netloc
        if "@" in netloc:
            user, _, host = netloc.rpartition("@")
            name, colon, _password = user.partition(":")
            netloc = f"{name}:{MASK}@{host}" if colon else f"{MASK}@{host}"
        lead = "/" if parts.path.startswith("/") else ""
        first, more, _rest = parts.path.lstrip("/").partition("/")
        path = f"{lead}{first}/{MASK}" if more else parts.path
        query = MASK if parts.query else ""
        return urlunsplit(parts._replace(netloc=netloc, path=path, query=query, fragment=""))
    except ValueError:
        before, slashes, _rest = value.partition("//")
        return f"{before}//{MASK}" if slashes else MASK
