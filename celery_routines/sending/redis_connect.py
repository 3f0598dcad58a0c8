"""A Redis client for ``routines_redis_url``: one server, or the master a
group of Sentinels names.

A Sentinel URL is written as kombu writes its ``sentinel://`` broker URLs:
every Sentinel of the group as its own ``sentinel://host:port`` part, parts
separated by ``;``, and the database number after the last one::

    sentinel://10.0.0.1:26379;sentinel://10.0.0.2:26379;sentinel://10.0.0.3:26379/1

The master's name (``sentinel monitor <name> ...``) is the setting
``routines_redis_sentinel_master``, else the broker's transport option
``master_name`` (one setting for both, when the broker goes through the same
Sentinels). A password in a part (``sentinel://:secret@host:port``) is the
master's, as in kombu; the Sentinels themselves are reached without one.

The client asks a Sentinel for the master when it connects, and again after
a connection fails: after a failover, the gate's next call reaches the new
master (the calls in between fail, and the gate steps aside for them: the
database arbitrates alone, see :mod:`celery_routines.sending.gate`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from celery_routines.errors import ConfigurationError

SENTINEL_SCHEME = "sentinel"
SENTINEL_PORT = 26379
# Seconds before a Redis (or Sentinel) call is given up: a tick waits no
# longer than this on a master that vanished without closing its socket.
REDIS_TIMEOUT = 2.0
# A failed call is tried once more at once (on a new connection: after a
# failover, to the new master), not redis-py 8's ten times with back-off
# (about 4 s): the gate is a fast path, and steps aside when Redis is away.
REDIS_RETRIES = 1


@dataclass(frozen=True)
class SentinelURL:
    sentinels: tuple[tuple[str, int], ...]
    db: int
    username: str | None
    password: str | None


def is_sentinel_url(url: str) -> bool:
    return url.strip().lower().startswith(SENTINEL_SCHEME + "://")


def parse_sentinel_url(url: str, setting: str = "routines_redis_url") -> SentinelURL:
    """The Sentinels, the database number and the master's credentials of a
    kombu-style ``sentinel://`` URL; a clear error for anything else."""
    sentinels: list[tuple[str, int]] = []
    dbs: set[int] = set()
    username = password = None
    for part in (p.strip() for p in url.split(";")):
        if not part:
            continue
        parsed = urlsplit(part)
        if parsed.scheme.lower() != SENTINEL_SCHEME or not parsed.hostname:
            raise ConfigurationError(
                f"{setting} {_hidden(url)!r}: each ';'-separated part must be "
                f"sentinel://host:port, got {_hidden(part)!r}"
            )
        try:
            port = parsed.port or SENTINEL_PORT
        except ValueError:
            raise ConfigurationError(
                f"{setting} {_hidden(url)!r}: bad port in {_hidden(part)!r}"
            ) from None
        sentinels.append((parsed.hostname, port))
        path = parsed.path.strip("/")
        if path:
            if not path.isdigit():
                raise ConfigurationError(
                    f"{setting} {_hidden(url)!r}: the database must be a number, got {path!r}"
                )
            dbs.add(int(path))
        if parsed.password is not None and password is None:
            username = unquote(parsed.username) if parsed.username else None
            password = unquote(parsed.password)
    if not sentinels:
        raise ConfigurationError(f"{setting} {_hidden(url)!r} names no Sentinel")
    if len(dbs) > 1:
        raise ConfigurationError(
            f"{setting} {_hidden(url)!r}: parts name different databases {sorted(dbs)}; "
            "write the number once, after the last part"
        )
    return SentinelURL(tuple(sentinels), dbs.pop() if dbs else 0, username, password)


def redis_client(url: str, sentinel_master: str | None = None) -> Any:
    """A redis-py client for ``url`` (redis://, rediss://, unix:// or sentinel://)."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    options = {
        "socket_timeout": REDIS_TIMEOUT,
        "socket_connect_timeout": REDIS_TIMEOUT,
        "retry": Retry(NoBackoff(), REDIS_RETRIES),
    }
    if not is_sentinel_url(url):
        return redis.Redis.from_url(url, **options)
    if not sentinel_master:
        raise ConfigurationError(
            f"routines_redis_url {_hidden(url)!r} is a Sentinel URL: set "
            "routines_redis_sentinel_master to the master's name (as in `sentinel monitor "
            "<name> ...`), or broker_transport_options['master_name']"
        )
    from redis.sentinel import Sentinel

    found = parse_sentinel_url(url)
    asking = {"socket_timeout": REDIS_TIMEOUT, "socket_connect_timeout": REDIS_TIMEOUT}
    group = Sentinel(
        list(found.sentinels),
        sentinel_kwargs=asking,
        socket_timeout=REDIS_TIMEOUT,
        socket_connect_timeout=REDIS_TIMEOUT,
        retry=Retry(NoBackoff(), REDIS_RETRIES),
    )
    return group.master_for(
        sentinel_master, db=found.db, username=found.username, password=found.password
    )


def describe(url: str, sentinel_master: str | None) -> str:
    """``url`` for a log line, without its password."""
    if is_sentinel_url(url):
        found = parse_sentinel_url(url)
        hosts = ", ".join(f"{host}:{port}" for host, port in found.sentinels)
        return f"master {sentinel_master!r} of Sentinels {hosts}, db {found.db}"
    return _hidden(url)


def _hidden(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    out = []
    for part in url.split(";"):
        parsed = urlsplit(part)
        if parsed.password:
            part = part.replace(":" + parsed.password + "@", ":***@", 1)
        out.append(part)
    return ";".join(out)
