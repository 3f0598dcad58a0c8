"""Which extra brings which optional library, and the one-line error for a
path chosen without it.

A base install (``pip install celery-routines``) has celery, kombu,
SQLAlchemy, Alembic and croniter: beat runs on SQLite with any kombu broker.
Everything else is an extra, imported only on the path that uses it. A
setting that chooses such a path without its extra must fail when beat (or a
command) starts, in one line that names the extra, never as a traceback in a
background process: :func:`check_extras` is that start-up check.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import ConfigurationError

if TYPE_CHECKING:
    from celery import Celery

    from .config import Settings

# The top-level module an extra brings -> that extra.
EXTRA_OF_MODULE = {
    "psycopg": "postgres",
    "psycopg2": "postgres",
    "pymysql": "mysql",
    "redis": "redis",
    # kombu's Redis transport imports it; plain celery does not bring it.
    "packaging": "redis",
    "prometheus_client": "metrics",
    "starlette": "web",
    "jinja2": "web",
    "uvicorn": "web",
    "ephem": "solar",
    "holidays": "holidays",
    # PyYAML: `export --format yaml` and `import file *.yaml`.
    "yaml": "yaml",
}

# Broker URL schemes served by kombu's Redis transport.
REDIS_BROKER_SCHEMES = ("redis", "rediss", "sentinel")


class MissingExtra(ConfigurationError):
    """A chosen path needs an optional library that is not installed."""

    def __init__(self, extra: str, module: str, needed_for: str) -> None:
        self.extra = extra
        self.module = module
        super().__init__(
            f"{needed_for} needs the {extra!r} extra ({module} is not installed): "
            f"pip install 'celery-routines[{extra}]' "
            f"(from a checkout: pip install './celery-routines[{extra}]')"
        )


def missing_extra(exc: ImportError, needed_for: str) -> MissingExtra | None:
    """The :class:`MissingExtra` behind an import error, if an extra brings
    the missing module; None for any other import error."""
    name = (getattr(exc, "name", None) or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(name)
    return MissingExtra(extra, name, needed_for) if extra else None


def require(module: str, needed_for: str) -> Any:
    """Import ``module``, or raise :class:`MissingExtra` naming its extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        found = missing_extra(exc, needed_for)
        if found is None:
            raise
        raise found from None


def check_extras(app: Celery, settings: Settings) -> None:
    """Raise :class:`MissingExtra` for the first setting whose path lacks its
    extra: the store's driver, the Redis gate, a Redis broker, the metrics
    port. Imports only what the settings choose."""
    _check_database_driver(settings.database_url)
    if settings.redis_url:
        require("redis", f"routines_redis_url ({settings.redis_url.split('://')[0]}://)")
    scheme = _broker_scheme(app)
    if scheme in REDIS_BROKER_SCHEMES:
        # kombu raises its own error later, from the middle of a publish.
        for module in ("redis", "packaging", "kombu.transport.redis"):
            require(module, f"the {scheme}:// broker")
    from .observe.metrics import metrics_port  # light: prometheus_client is imported lazily

    if metrics_port(app) is not None:
        require("prometheus_client", "the metrics port (routines_metrics_port)")


def _check_database_driver(url: str) -> None:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        dialect = make_url(url).get_dialect()
    except (ArgumentError, NoSuchModuleError):
        return  # the store says what is wrong with the URL itself
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        found = missing_extra(exc, f"routines_database_url ({make_url(url).drivername}://)")
        if found is None:
            raise
        raise found from None


def _broker_scheme(app: Celery) -> str | None:
    url = app.conf.broker_url or app.conf.broker_write_url
    if not isinstance(url, str):
        return None
    # kombu accepts "redis://a;redis://b" failover lists: the first names the transport.
    head = url.split(";")[0]
    return head.split("://")[0].split("+")[0].lower() if "://" in head else head.lower()
