"""Creating and editing routines over HTTP: ``POST /api/routines`` (201),
``PATCH /api/routines/{name}`` (200; 409 for a routine declared in code) and
``POST /api/routines/validate`` (what the form asks as the user types).

Bodies use the names ``GET /api/routines/{name}`` answers with
(:mod:`celery_routines.operator.routine_form`); a bad body is 422
``{"error": ..., "fields": {field: message}}`` naming every bad field in the
CLI's words. Changes go through the admin API's ``add``/``edit``, the CLI's,
each one audited entry with the person (``web:<user>``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import celery_routines.operator.web.present as present
from celery_routines.errors import InvalidRoutine
from celery_routines.operator.admin import Routines
from celery_routines.operator.manage import OwnedByCode, fires_within_bound
from celery_routines.operator.output import jsonable
from celery_routines.operator.routine_form import (
    REFUSALS,
    FieldErrors,
    blamed,
    check_new,
    field_errors,
    from_form,
    from_json,
    options_of,
    refusal,
    stored_values,
    without_masked,
)
from celery_routines.operator.web.api import body, routine_path, who
from celery_routines.operator.web.context import HANDLED, jsonable_error, panel_of
from celery_routines.operator.web.window_preview import preview_windows

PREVIEW_WINDOWS = 10


def invalid(fields: dict[str, str]) -> JSONResponse:
    return JSONResponse(
        {"error": "; ".join(dict.fromkeys(fields.values())), "fields": fields}, status_code=422
    )


def create(request: Request) -> Response:
    admin = panel_of(request).admin
    values, errors = from_json(body(request))
    errors = new_routine_errors(admin, values, errors)
    if errors:
        return invalid(errors)
    try:
        result = admin.add(values["name"], values["task"], by=who(request), **options_of(values))
    except FieldErrors as exc:
        return invalid(exc.fields)
    except InvalidRoutine as exc:
        return invalid(dict.fromkeys(blamed(str(exc), values), str(exc)))
    return JSONResponse(jsonable(result), status_code=201)


def patch(request: Request) -> Response:
    admin = panel_of(request).admin
    name, what = routine_path(request)
    if what is not None:
        return JSONResponse({"error": f"nothing to change at {what!r}"}, status_code=404)
    try:
        admin.check_editable(name)
    except OwnedByCode as exc:
        return JSONResponse({"error": str(exc)}, status_code=409)
    values, errors = from_json(body(request))
    # A body read from GET and sent back holds the masked notify_url: unchanged.
    values = without_masked(stored(admin, name)[1], values)
    if "name" in values and values.pop("name") != name:
        errors["name"] = (
            f"routine {name!r}: a routine is not renamed; clone it as a new routine instead"
        )
    if "task" in values:
        errors["task"] = f"routine {name!r}: its task is not changed here; clone it instead"
    zone = zone_of(admin, name)
    _, before = stored(admin, name)
    if errors:  # values that do not read: each other field named as well
        return invalid({**field_errors(values, zone, name=name, stored=before), **errors})
    try:  # the edit decides, as `celery routines edit` does
        result = admin.edit(name, by=who(request), **options_of(values))
    except REFUSALS as exc:
        return invalid(refusal(exc, values, zone, name=name, stored=before).fields)
    return JSONResponse(jsonable(result))


def validate(request: Request) -> Response:
    """``{"fields": {field: text as typed}, "editing": name or null}``:
    ``{"ok", "fields": {field: message}, "timezone", "windows": [...]}``,
    the next windows when the whole definition reads."""
    admin = panel_of(request).admin
    data = body(request)
    typed = data.get("fields")
    if not isinstance(typed, dict) or not all(isinstance(v, str) for v in typed.values()):
        raise ValueError("validate needs 'fields': an object of texts, as the form holds them")
    editing = data.get("editing")
    if editing is not None and not isinstance(editing, str):
        raise ValueError(f"'editing' must be a routine's name, got {editing!r}")
    values, errors = from_form(typed)
    definition = None
    try:
        if editing:
            values["name"] = editing
        definition = check_new(values, admin.settings.timezone)
    except FieldErrors as exc:
        errors = {**exc.fields, **errors}
    name = values.get("name")
    if not editing and "name" not in errors and name and admin.store.routines.by_name(name):
        errors["name"] = already_stored(name)
    windows: list[Any] = []
    if definition is not None and not errors:
        try:
            fires_within_bound(definition, admin.settings.timezone, admin.clock())
        except InvalidRoutine as exc:  # what a create would answer
            errors = dict.fromkeys(blamed(str(exc), values), str(exc))
        else:
            windows = preview(admin, definition)
    zone = (definition.timezone if definition else None) or admin.settings.timezone
    return JSONResponse(
        {
            "ok": not errors,
            "fields": errors,
            "timezone": zone,
            "windows": [window_json(w) for w in windows],
        }
    )


# -- shared with the pages ---------------------------------------------------------


def preview(admin: Routines, definition: Any) -> list[Any]:
    try:
        return preview_windows(definition, admin.settings.timezone, admin.clock(), PREVIEW_WINDOWS)
    except (ValueError, OverflowError):
        return []  # a schedule with no window left: nothing to list


def window_json(window: Any) -> dict[str, Any]:
    """A preview window with the texts the page shows."""
    return {
        **jsonable(window),
        "local_text": present.local(window.local),
        "utc_text": present.utc(window.utc),
    }


def new_routine_errors(
    admin: Routines, values: dict[str, Any], errors: dict[str, str]
) -> dict[str, str]:
    """Every bad field of a new routine (the API's and the form's), the
    reading errors first found kept, and a name already stored named."""
    try:
        check_new(values, admin.settings.timezone)
    except FieldErrors as exc:
        errors = {**exc.fields, **errors}
    if not errors and admin.store.routines.by_name(values["name"]) is not None:
        errors["name"] = already_stored(values["name"])
    return errors


def already_stored(name: str) -> str:
    return (
        f"routine {name!r}: a routine with this name is already stored; "
        "change it with `celery routines edit`"
    )


def zone_of(admin: Routines, name: str) -> str:
    definition = admin.show(name, windows=1).definition
    return str(definition.get("timezone") or admin.settings.timezone)


def stored(admin: Routines, name: str) -> tuple[Any, dict[str, Any]]:
    """(the routine's detail, its values as the form shows them)."""
    detail = admin.show(name, windows=1)
    return detail, stored_values(detail.summary.task, detail.definition)


def json_endpoint(handler: Callable[[Request], Response]) -> Callable[[Request], Any]:
    """The body read here, the handler run in a worker thread, one change
    at a time (actions share the publisher), errors in the CLI's words."""

    def run(request: Request) -> Response:
        try:
            with panel_of(request).lock:
                return handler(request)
        except FieldErrors as exc:
            return invalid(exc.fields)
        except HANDLED as exc:
            return jsonable_error(exc, panel_of(request))

    async def endpoint(request: Request) -> Response:
        request.state.body = await request.body()
        return await run_in_threadpool(run, request)

    endpoint.__name__ = handler.__name__
    return endpoint


def routes() -> list[Route]:
    """Before the API's own: ``/api/routines/validate`` is not a routine."""
    return [
        Route("/api/routines", json_endpoint(create), methods=["POST"]),
        Route("/api/routines/validate", json_endpoint(validate), methods=["POST"]),
        Route("/api/routines/{rest:path}", json_endpoint(patch), methods=["PATCH"]),
    ]
