"""Celery's task message for one task and one set of options, made once.

``app.amqp.create_task_message`` (Celery's ``as_task_v2``) builds the same
headers for every message of one task sent with the same options, but for
a handful of fields: the task id (also ``root_id`` and ``correlation_id``),
``expires``, the reprs of the arguments, ``reply_to`` (per thread) and
``origin`` (per process). A ``TaskTemplate`` calls it once and, per message,
copies its result with those fields set the way ``as_task_v2`` sets them;
the copy keeps Celery's key order, so the serialised message is the same
bytes. Only Celery's own ``as_task_v2`` is templated (``for_plan`` says
when): task protocol 1, a subclassed ``AMQP`` or task-sent events go
through ``create_task_message`` for every message.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery import Celery
from celery.app import amqp as celery_amqp
from celery.utils.nodenames import anon_nodename
from celery.utils.saferepr import saferepr
from celery.utils.time import add_seconds_to_datetime, maybe_make_aware

from celery_routines.sending.publish import OutgoingRun

# Options of as_task_v2 that change how a message's own fields are computed.
_PER_MESSAGE_OPTIONS = frozenset({"now", "timezone", "countdown", "eta", "origin"})
_PLACEHOLDER_ID = "\x00celery-routines-template\x00"


@dataclass(frozen=True)
class TaskTemplate:
    headers: dict[str, Any]
    embed: dict[str, Any]  # the body's third part: callbacks, errbacks, chain, chord
    root_is_id: bool  # no root_id given: it is the task id
    argsrepr_free: bool  # no argsrepr given: saferepr of the arguments
    argsrepr_limits: tuple[int, int]

    @classmethod
    def for_plan(
        cls,
        app: Celery,
        name: str,
        create_args: tuple[Any, ...],
        retries: int,
        reply_to: str | None,
        create_options: dict[str, Any],
    ) -> TaskTemplate | None:
        """The template of create_task_message's message for these arguments
        (the direct path's plan), or None when it cannot be templated."""
        amqp = app.amqp
        send_event, root_id = create_args[7], create_args[8]
        if (
            getattr(amqp.create_task_message, "__func__", None) is not celery_amqp.AMQP.as_task_v2
            or send_event
            or not _PER_MESSAGE_OPTIONS.isdisjoint(create_options)
        ):
            return None
        headers, _properties, body, _event = amqp.create_task_message(
            _PLACEHOLDER_ID,
            name,
            (),
            {},
            None,
            None,
            *create_args[:2],
            None,
            retries,
            *create_args[2:5],
            reply_to,
            *create_args[5:],
            **create_options,
            kwargsrepr="",
        )
        return cls(
            headers=headers,
            embed=body[2],
            root_is_id=not root_id,
            argsrepr_free=create_options.get("argsrepr") is None,
            argsrepr_limits=(amqp.argsrepr_maxsize, app.conf.task_repr_maxlevels),
        )

    def message(
        self, app: Celery, run: OutgoingRun, expires: Any, kwargsrepr: str, reply_to: str
    ) -> tuple[dict[str, Any], dict[str, Any], tuple[Any, Any, dict[str, Any]]]:
        """What ``create_task_message`` returns for this run (no sent event)."""
        args = run.args or ()
        kwargs = run.kwargs or {}
        if not isinstance(args, list | tuple):
            raise TypeError("task args must be a list or tuple")
        if not isinstance(kwargs, dict | Mapping):  # dict first: the common, quick case
            raise TypeError("task keyword arguments must be a mapping")
        task_id = run.run_id
        headers = dict(self.headers)  # Celery's order of keys, kept
        headers["id"] = task_id
        if self.root_is_id:
            headers["root_id"] = task_id
        if expires is not None:
            headers["expires"] = _expires_iso(app, expires)
        if self.argsrepr_free:
            maxsize, maxlevels = self.argsrepr_limits
            headers["argsrepr"] = saferepr(args, maxsize, maxlevels=maxlevels) if args else "()"
        headers["kwargsrepr"] = kwargsrepr
        headers["origin"] = _origin()
        properties = {"correlation_id": task_id, "reply_to": reply_to or ""}
        return headers, properties, (args, kwargs, dict(self.embed))


def _expires_iso(app: Celery, expires: Any) -> Any:
    """as_task_v2's ``expires`` header: seconds from now, or an instant, as ISO 8601."""
    if isinstance(expires, numbers.Real):
        app.amqp._verify_seconds(expires, "expires")
        expires = maybe_make_aware(add_seconds_to_datetime(app.now(), expires), tz=app.timezone)
    if not isinstance(expires, str):
        expires = expires and expires.isoformat()
    return expires


_origins: dict[int, str] = {}


def _origin() -> str:
    """as_task_v2's ``origin``: this process's anonymous node name (read once per process)."""
    pid = os.getpid()
    found = _origins.get(pid)
    if found is None:
        found = _origins[pid] = anon_nodename()
    return found
