"""The panel: web pages and an HTTP API over the admin API (the ``web`` extra).

``create_app(celery_app)`` is the ASGI application; ``celery -A proj routines
web`` serves it.
"""

from celery_routines.operator.web.app import create_app

__all__ = ["create_app"]
