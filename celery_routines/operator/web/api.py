"""The panel's HTTP API: the admin API's answers as JSON.

``GET /api/routines``, ``/api/routines/{name}``, ``/api/routines/{name}/runs``,
``/api/routines/{name}/stats``,
``/api/skips``, ``/api/runs``; ``POST /api/routines/{name}/pause|resume|
trigger|backfill|enable|disable|delete``, ``POST /api/runs/{id}/replay`` and
``POST /api/routines/bulk/pause|resume|enable|disable|trigger``.
Every action records who did it (``web:<user>``). Errors are
``{"error": "..."}`` in the CLI's words; ``/api/openapi.json`` documents it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import unquote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from celery_routines.operator.output import jsonable
from celery_routines.operator.web.context import HANDLED, jsonable_error, panel_of, sent_path
from celery_routines.operator.web.openapi import OPENAPI
from celery_routines.operator.web.stats import routine_stats

# A handler's value is answered through jsonable (a dataclass, a dict, a list...).
Handler = Callable[[Request], object]


def answer(handler: Handler) -> Callable[[Request], Response]:
    """Run ``handler`` and answer its value as JSON, or the error as
    ``{"error": ...}`` with a status that says what kind it is."""

    def endpoint(request: Request) -> Response:
        try:
            return JSONResponse(jsonable(handler(request)))
        except HANDLED as exc:
            return jsonable_error(exc, panel_of(request))

    endpoint.__name__ = handler.__name__
    return endpoint


def number(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {raw!r}") from None


def body(request: Request) -> dict[str, Any]:
    """The JSON body of a POST (an empty body is ``{}``)."""
    raw = getattr(request.state, "body", b"")
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except RecursionError:
        raise ValueError("the request body is nested too deep") from None
    except ValueError:
        raise ValueError("the request body is not JSON") from None
    if not isinstance(data, dict):
        raise ValueError("the request body must be a JSON object")
    return data


def flag(data: Mapping[str, object], name: str) -> bool:
    value = data.get(name, False)
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def who(request: Request) -> str:
    return f"web:{request.state.principal}"


# -- reads -----------------------------------------------------------------------


def list_routines(request: Request) -> object:
    q = request.query_params
    page = panel_of(request).admin.page(
        state=q.get("state") or None,
        name=q.get("name") or None,
        page=number(request, "page", 1),
        per_page=number(request, "per_page", 50),
        sort=q.get("sort") or None,
    )
    return {
        "total": page.total,
        "page": page.page,
        "per_page": page.per_page,
        "pages": page.pages,
        # Each item's name at the top level too, where a client looks for it.
        "routines": [{"name": row.summary.name, **jsonable(row)} for row in page.rows],
    }


def show_routine(request: Request) -> object:
    admin = panel_of(request).admin
    name = request.path_params["name"]
    detail = admin.show(name, windows=number(request, "windows", 10))
    return {**jsonable(detail), "owner": admin.owner(name)}


def routine_runs(request: Request) -> object:
    return _runs(request, request.path_params["name"])


def all_runs(request: Request) -> object:
    return _runs(request, request.query_params.get("routine") or None)


def _runs(request: Request, name: str | None) -> object:
    q = request.query_params
    return panel_of(request).admin.runs(
        name,
        state=q.getlist("state"),
        since=q.get("since") or None,
        until=q.get("until") or None,
        limit=number(request, "limit", 50),
    )


def skips(request: Request) -> object:
    q = request.query_params
    return panel_of(request).admin.skips(
        since=q.get("since") or None, limit=number(request, "limit", 1000)
    )


def openapi(request: Request) -> object:
    return OPENAPI


# -- actions ---------------------------------------------------------------------


def pause(request: Request) -> object:
    """``{"reason": "..."}`` (optional here, required by a bulk pause)."""
    reason = body(request).get("reason")
    name = request.path_params["name"]
    return panel_of(request).admin.pause(name, reason=reason, by=who(request))


BULK_FIELDS = ("names", "filter", "reason")
FILTER_FIELDS = ("state", "name")


def bulk(request: Request) -> object:
    """``POST /api/routines/bulk/{action}`` with ``{"names": [...]}`` or
    ``{"filter": {"state": ..., "name": ...}}`` (the list's filters; ``{}``
    is every routine), plus ``"reason"`` for a pause."""
    data = body(request)
    unknown = [key for key in data if key not in BULK_FIELDS]
    if unknown:
        raise ValueError(
            f"unknown field {unknown[0]!r} in a bulk action; give {', '.join(BULK_FIELDS)}"
        )
    found = data.get("filter")
    if found is not None and not isinstance(found, dict):
        raise ValueError(f"filter must be an object such as {{'state': 'paused'}}, got {found!r}")
    found = found if found is not None else {}
    for key, value in found.items():
        if key not in FILTER_FIELDS:
            raise ValueError(f"unknown filter {key!r}; filter by {' or '.join(FILTER_FIELDS)}")
        if value is not None and not isinstance(value, str):
            raise ValueError(f"filter {key!r} must be a text, got {value!r}")
    result = panel_of(request).admin.bulk.run(
        request.path_params["action"],
        data.get("names"),
        state=found.get("state"),
        name=found.get("name"),
        use_filter="filter" in data,
        reason=data.get("reason"),
        by=who(request),
    )
    return {
        **jsonable(result),
        "count": result.count,
        "changed": result.changed,
        "refused": result.refused,
    }


def resume(request: Request) -> object:
    catch_up = flag(body(request), "catch_up")
    return panel_of(request).admin.resume(
        request.path_params["name"], catch_up=catch_up, by=who(request)
    )


def enable(request: Request) -> object:
    return panel_of(request).admin.enable(request.path_params["name"], by=who(request))


def disable(request: Request) -> object:
    return panel_of(request).admin.disable(request.path_params["name"], by=who(request))


def delete(request: Request) -> object:
    return panel_of(request).admin.delete(request.path_params["name"], by=who(request))


def trigger(request: Request) -> object:
    panel = panel_of(request)
    force = flag(body(request), "force")
    return panel.admin.trigger(request.path_params["name"], force=force, by=who(request))


def backfill(request: Request) -> object:
    """``{"from": ..., "to": ..., "max": 1000, "force": false, "preview": false,
    "overlap": null}``; with ``preview`` it only counts the windows; ``overlap``
    (default: the routine's) is the overlap policy the backfill follows."""
    panel = panel_of(request)
    data = body(request)
    for key in ("from", "to"):
        if not isinstance(data.get(key), str):
            raise ValueError(f"backfill needs {key!r}: a date such as 2026-11-30T08:00")
    name = request.path_params["name"]
    most = data.get("max", 1000)
    if flag(data, "preview"):
        # A preview sends nothing: it does not hold up the actions.
        plan = panel.admin.backfill_plan(name, data["from"], data["to"], max_windows=most)
        return {**jsonable(plan), "to_send": plan.to_send}
    overlap = data.get("overlap")
    if overlap is not None and not isinstance(overlap, str):
        raise ValueError(f"backfill's 'overlap' must be a policy name, got {overlap!r}")
    with panel.lock:
        return panel.admin.backfill(
            name, data["from"], data["to"], max_windows=most, force=flag(data, "force"),
            by=who(request), overlap=overlap,
        )  # fmt: skip


def replay(request: Request) -> object:
    panel = panel_of(request)
    force = flag(body(request), "force")
    return panel.admin.replay(request.path_params["run_id"], force=force, by=who(request))


def with_body(handler: Handler, *, locks: bool = True) -> Callable[[Request], Awaitable[Response]]:
    """A POST endpoint: the body is read here (async), the action runs in
    a worker thread (the admin API blocks), one action at a time (they
    share the publisher and the events connection); ``locks=False`` for a
    handler that takes the lock itself, only around what sends."""
    from starlette.concurrency import run_in_threadpool

    sync = answer(handler)

    def one_at_a_time(request: Request) -> Response:
        if not locks:
            return sync(request)
        with panel_of(request).lock:
            return sync(request)

    async def endpoint(request: Request) -> Response:
        request.state.body = await request.body()
        return await run_in_threadpool(one_at_a_time, request)

    endpoint.__name__ = handler.__name__
    return endpoint


ROUTINE_READS: dict[str | None, Handler] = {
    None: show_routine,
    "runs": routine_runs,
    "stats": routine_stats,
}
ROUTINE_ACTIONS: dict[str, Handler] = {
    "pause": pause,
    "resume": resume,
    "trigger": trigger,
    "backfill": backfill,
    "enable": enable,
    "disable": disable,
    "delete": delete,
}


def routine_path(request: Request) -> tuple[str, str | None]:
    """(routine name, what after it) from the path as sent: the name is one
    quoted segment, so ``rep%2Fruns`` is the routine ``rep/runs``, while
    ``rep/runs`` is the runs of ``rep``. An unquoted ``/`` inside a name is
    still read as part of it when no known word follows."""
    path = sent_path(request)
    prefix = request.scope.get("root_path", "") + "/api/routines/"
    rest = path[path.find(prefix) + len(prefix) :] if prefix in path else path
    head, _, last = rest.rpartition("/")
    known = set(ROUTINE_READS) | set(ROUTINE_ACTIONS)
    if head and last in known:
        return unquote(head), last
    return unquote(rest), None


def routine_endpoint() -> Callable[[Request], Awaitable[Response]]:
    reads = {what: answer(handler) for what, handler in ROUTINE_READS.items()}
    actions = {
        what: with_body(handler, locks=handler is not backfill)
        for what, handler in ROUTINE_ACTIONS.items()
    }

    async def endpoint(request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        name, what = routine_path(request)
        request.scope.setdefault("path_params", {})["name"] = name
        if request.method == "POST":
            action = actions.get(what or "")
            if action is None:
                return JSONResponse({"error": f"no action named {what!r}"}, status_code=404)
            return await action(request)
        read = reads.get(what)
        if read is None:
            return JSONResponse({"error": f"nothing to read at {what!r}"}, status_code=404)
        return await run_in_threadpool(read, request)

    return endpoint


def routes() -> list[Route]:
    return [
        Route("/api/openapi.json", answer(openapi)),
        Route("/api/routines", answer(list_routines)),
        Route("/api/skips", answer(skips)),
        Route("/api/runs", answer(all_runs)),
        Route("/api/runs/{run_id}/replay", with_body(replay), methods=["POST"]),
        # Before the routine's own paths: a routine named "bulk" is paused
        # here with {"names": ["bulk"]}.
        Route("/api/routines/bulk/{action}", with_body(bulk), methods=["POST"]),
        Route("/api/routines/{rest:path}", routine_endpoint(), methods=["GET", "POST"]),
    ]
