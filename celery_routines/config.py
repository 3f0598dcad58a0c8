"""Settings read once from the Celery app's config and the environment.

Precedence: a value set on ``app.conf`` wins, then the environment variable of
the same name in capitals (``ROUTINES_DATABASE_URL``), then the default.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from celery import Celery

from .errors import ConfigurationError
from .policy.notify_hosts import SETTING as NOTIFY_ALLOWED_HOSTS
from .policy.notify_hosts import NotifyHosts
from .schedules.zones import load_zone
from .sending.redis_connect import is_sentinel_url, parse_sentinel_url

DEFAULT_DATABASE_URL = "sqlite:///routines.db"
# How runs are published: Celery's send_task (default) or the direct path
# (celery_routines/sending/direct.py), which builds the same message faster.
PUBLISH_PATHS = ("send_task", "direct")
PREPARED_STATEMENTS = ("auto", "on", "off")


@dataclass(frozen=True)
class Settings:
    database_url: str = DEFAULT_DATABASE_URL
    redis_url: str | None = None
    # The master's name when routines_redis_url is a sentinel:// URL
    # (sending/redis_connect.py); the broker's master_name when unset.
    redis_sentinel_master: str | None = None
    lock_ttl: float = 60.0
    batch_size: int = 1000
    run_timeout: float = 3600.0
    # Seconds a sent run may wait for a worker's claim before it is declared
    # lost (policy/runs.py unstarted_timeout): a lost message frees its routine.
    start_timeout: float = 300.0
    timezone: str = "UTC"
    # The app whose code routines this process declares (and may retire).
    owner: str = "default"
    # The declaration stamp of this process's code: numbers compare as
    # numbers, text as text; None: the instant the process loaded its code.
    code_version: str | None = None
    refresh_seconds: float = 5.0
    keep_runs_days: float = 30.0
    prune_batch: int = 5000
    publish: str = "send_task"
    # Processes forked to publish a tick's messages (sending/offload.py); 0:
    # beat publishes in its own process.
    publish_processes: int = 0
    # The most windows one routine sends in one tick (a large catch-up goes
    # out over the next ticks, which serve the other routines' windows too);
    # the default keeps such a tick near a quarter second: docs/catch-up-and-overlap.md.
    catch_up_per_tick: int = 100
    # Beat's /livez and /readyz (observe/health.py); None: not served.
    health_port: int | None = None
    health_address: str = "127.0.0.1"
    # How long a worker keeps trying a claim, heartbeat or outcome that cannot
    # reach the database (a failover, a pooler restart) before it hands the
    # delivery back to the broker or keeps the outcome to write later.
    # PostgreSQL (psycopg 3): server-side prepared statements "auto" (on for
    # a connection that reaches the server directly, off through a pooler:
    # store/prepared.py), "on" or "off".
    prepared_statements: str = "auto"
    database_patience: float = 30.0
    # Where a worker keeps outcomes the database did not take yet, so a
    # restart writes them when it is back (worker/pending.py); "" keeps them
    # in memory only.
    outcome_spool: str = field(default_factory=lambda: default_outcome_spool())
    # Where notifications may go besides public addresses (policy/notify_hosts.py).
    notify_allowed_hosts: NotifyHosts = field(default_factory=NotifyHosts)

    def __post_init__(self) -> None:
        if self.prepared_statements not in PREPARED_STATEMENTS:
            raise ConfigurationError(
                "routines_prepared_statements must be one of "
                f"{', '.join(map(repr, PREPARED_STATEMENTS))}, got {self.prepared_statements!r}"
            )
        if self.publish not in PUBLISH_PATHS:
            raise ConfigurationError(
                f"routines_publish must be one of {', '.join(map(repr, PUBLISH_PATHS))},"
                f" got {self.publish!r}"
            )
        if not (isinstance(self.publish_processes, int) and 0 <= self.publish_processes <= 16):
            raise ConfigurationError(
                "routines_publish_processes must be a whole number from 0 (publish in beat's"
                f" own process) to 16, got {self.publish_processes!r}"
            )
        if self.health_port is not None and not 0 <= self.health_port <= 65535:
            raise ConfigurationError(
                f"routines_health_port must be between 0 and 65535, got {self.health_port!r}"
            )
        if self.redis_url and is_sentinel_url(self.redis_url):
            parse_sentinel_url(self.redis_url)  # a bad URL is a start-up error
            if not self.redis_sentinel_master:
                raise ConfigurationError(
                    "routines_redis_url is a Sentinel URL: set routines_redis_sentinel_master to "
                    "the master's name (as in `sentinel monitor <name> ...`), or "
                    "broker_transport_options['master_name']"
                )
        _require_positive("routines_refresh_seconds", self.refresh_seconds)
        _require_positive("routines_keep_runs_days", self.keep_runs_days)
        _require_positive("routines_prune_batch", self.prune_batch)
        if not self.owner or len(self.owner) > 200:
            raise ConfigurationError(
                f"routines_owner must be a name of 1 to 200 characters, got {self.owner!r}"
            )
        _require_positive("routines_lock_ttl", self.lock_ttl)
        _require_positive("routines_run_timeout", self.run_timeout)
        _require_positive("routines_start_timeout", self.start_timeout)
        _require_positive("routines_database_patience", self.database_patience)
        _require_positive("routines_batch_size", self.batch_size)
        if not (isinstance(self.catch_up_per_tick, int) and self.catch_up_per_tick >= 1):
            raise ConfigurationError(
                "routines_catch_up_per_tick must be a whole number of windows, at least 1, "
                f"got {self.catch_up_per_tick!r}"
            )
        if not self.database_url:
            raise ConfigurationError(
                "routines_database_url is empty: set a SQLAlchemy URL such as "
                "'sqlite:///routines.db' or 'postgresql://user@host/db'"
            )
        try:
            load_zone(self.timezone)
        except ValueError as exc:
            raise ConfigurationError(f"routines_timezone: {exc}") from exc


def _require_positive(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ConfigurationError(f"{name} must be a positive number, got {value!r}")


def _lookup(app: Celery | None, name: str) -> Any:
    if app is not None:
        value = app.conf.get(name)
        if value is not None:
            return value
    return os.environ.get(name.upper())


def setting(app: Celery | None, name: str) -> Any:
    """A setting outside :class:`Settings` (``routines_web_auth``,
    ``routines_flower_url``, the metrics port): ``app.conf``, then the environment."""
    return _lookup(app, name)


def _number(name: str, raw: Any, default: float | None, kind: type) -> Any:
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except (TypeError, ValueError):
        raise ConfigurationError(f"{name} must be a number, got {raw!r}") from None


def settings_from(app: Celery | None) -> Settings:
    """Read and validate every ``routines_*`` setting of ``app``."""
    app_timezone = app.conf.get("timezone") if app is not None else None
    return Settings(
        database_url=_lookup(app, "routines_database_url") or DEFAULT_DATABASE_URL,
        redis_url=_lookup(app, "routines_redis_url") or None,
        redis_sentinel_master=_optional_text(_lookup(app, "routines_redis_sentinel_master"))
        or _broker_master_name(app),
        lock_ttl=_number("routines_lock_ttl", _lookup(app, "routines_lock_ttl"), 60.0, float),
        batch_size=_number("routines_batch_size", _lookup(app, "routines_batch_size"), 1000, int),
        run_timeout=_number(
            "routines_run_timeout", _lookup(app, "routines_run_timeout"), 3600.0, float
        ),
        start_timeout=_number(
            "routines_start_timeout", _lookup(app, "routines_start_timeout"), 300.0, float
        ),
        timezone=_lookup(app, "routines_timezone") or app_timezone or "UTC",
        owner=str(
            _lookup(app, "routines_owner") or (app.main if app is not None else None) or "default"
        ),
        code_version=_optional_text(_lookup(app, "routines_code_version")),
        refresh_seconds=_number(
            "routines_refresh_seconds", _lookup(app, "routines_refresh_seconds"), 5.0, float
        ),
        keep_runs_days=_number(
            "routines_keep_runs_days", _lookup(app, "routines_keep_runs_days"), 30.0, float
        ),
        prune_batch=_number(
            "routines_prune_batch", _lookup(app, "routines_prune_batch"), 5000, int
        ),
        publish=_lookup(app, "routines_publish") or "send_task",
        publish_processes=_number(
            "routines_publish_processes", _lookup(app, "routines_publish_processes"), 0, int
        ),
        catch_up_per_tick=_number(
            "routines_catch_up_per_tick", _lookup(app, "routines_catch_up_per_tick"), 100, int
        ),
        health_port=_number(
            "routines_health_port", _lookup(app, "routines_health_port"), None, int
        ),
        health_address=_lookup(app, "routines_health_address") or "127.0.0.1",
        prepared_statements=str(_lookup(app, "routines_prepared_statements") or "auto").lower(),
        database_patience=_number(
            "routines_database_patience", _lookup(app, "routines_database_patience"), 30.0, float
        ),
        outcome_spool=_spool_setting(_lookup(app, "routines_outcome_spool")),
        notify_allowed_hosts=_notify_hosts(_lookup(app, NOTIFY_ALLOWED_HOSTS)),
    )


def _notify_hosts(raw: Any) -> NotifyHosts:
    try:
        return NotifyHosts.parse(raw)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


def default_outcome_spool() -> str:
    """A file per user in the system's temporary folder: it outlives a worker
    restart on the same host, which is what it is for."""
    user = getattr(os, "getuid", lambda: "user")()
    return os.path.join(tempfile.gettempdir(), f"celery-routines-outcomes-{user}.sqlite3")


def _spool_setting(raw: Any) -> str:
    if raw is None:
        return default_outcome_spool()
    return str(raw)


def _broker_master_name(app: Celery | None) -> str | None:
    """kombu's ``master_name`` transport option: the Sentinel master of a
    ``sentinel://`` broker, the gate's too unless it names its own."""
    options = app.conf.get("broker_transport_options") if app is not None else None
    return _optional_text((options or {}).get("master_name"))


def _optional_text(raw: object) -> str | None:
    return None if raw is None or str(raw) == "" else str(raw)
