"""The routine form's pages: "New routine" (``/new``), "Edit" (``/edit/NAME``)
and "Clone as a new routine" (``/clone/NAME``), rendered from the fields
declared in :mod:`celery_routines.operator.routine_form`.

Without JavaScript the form is a plain POST with the CSRF token, answered
by the same page with each error next to its field (422); with it, panel.js
checks each field as the user types (``POST /api/routines/validate``) and
keeps the next windows beside the form. A routine declared in code is shown
read-only, saying so and where, with "Clone as a new routine".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import parse_qs, urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

import celery_routines.operator.web.present as present
from celery_routines.errors import InvalidRoutine
from celery_routines.operator.admin import Routines
from celery_routines.operator.manage import OwnedByCode
from celery_routines.operator.routine_form import (
    FIELDS,
    REFUSALS,
    FieldErrors,
    blamed,
    check_new,
    edit_options,
    field_errors,
    form_text,
    from_form,
    hide_secrets,
    options_of,
    refusal,
)
from celery_routines.operator.web.auth import form_refusal
from celery_routines.operator.web.context import (
    HANDLED,
    error_status,
    error_text,
    name_after,
    panel_of,
    render,
)
from celery_routines.operator.web.definitions_api import (
    new_routine_errors,
    preview,
    stored,
)
from celery_routines.policy.routine import OPTIONS

CLONE_SUFFIX = "-copy"


def new_page(request: Request) -> Response:
    return show_form(request, mode="new", values={})


def clone_page(request: Request) -> Response:
    """The form filled in from a stored routine; its secrets stay on the
    server: the clone keeps them unless the user types new ones."""
    name = name_after(request, "/clone/")
    _, values = stored(panel_of(request).admin, name)
    shown, kept = hide_secrets(values)
    return show_form(
        request,
        mode="new",
        values={**shown, "name": name + CLONE_SUFFIX},
        kept=kept,
        clone_of=name,
    )


def edit_page(request: Request) -> Response:
    name = name_after(request, "/edit/")
    admin = panel_of(request).admin
    _, values = stored(admin, name)
    shown, kept = hide_secrets(values)
    return show_form(
        request,
        mode="edit",
        values={**shown, "name": name},
        kept=kept,
        owner=code_owner(admin, name),
    )


def cloned_secrets(
    admin: Routines, form: Mapping[str, str], values: dict[str, Any]
) -> dict[str, str]:
    """A clone's secret fields the user left empty take the source's stored
    values (never shown, so never posted); answers what the form says is kept."""
    source = form.get("clone_of") or ""
    record = admin.store.routines.by_name(source) if source else None
    if record is None:
        return {}
    kept: dict[str, str] = {}
    for declared in OPTIONS:
        key = str(declared.keyword_name)
        stored_value = getattr(record, declared.column_name)
        if declared.secret and stored_value and key not in values:
            values[key] = stored_value
            kept[key] = str(declared.shown(stored_value))
    return kept


def code_owner(admin: Routines, name: str) -> str | None:
    """Where a live code routine is declared (``app proj, task t``), else None."""
    try:
        admin.check_editable(name)
    except OwnedByCode:
        detail = admin.show(name, windows=1)
        return f"{admin.owner(name)}, task {detail.summary.task}"
    return None


def show_form(
    request: Request,
    *,
    mode: str,
    values: Mapping[str, Any],
    texts: Mapping[str, str] | None = None,
    errors: Mapping[str, str] | None = None,
    owner: str | None = None,
    status: int = 200,
    kept: Mapping[str, str] | None = None,
    clone_of: str | None = None,
) -> Response:
    """The form, from values (the API's) or from the texts as posted;
    ``kept``: the masked stored values of secret fields, said beside their
    empty inputs (an empty input keeps them)."""
    admin = panel_of(request).admin
    shown = dict(texts) if texts is not None else {
        field.name: form_text(field, values.get(field.name)) for field in FIELDS
    }  # fmt: skip
    windows: list[Any] = []
    zone = values.get("timezone") or admin.settings.timezone
    if not errors and values.get("task"):
        try:
            definition = check_new({**values, "name": values.get("name") or "new"}, zone)
            windows = preview(admin, definition)
        except FieldErrors:
            windows = []
    name = str(values.get("name") or shown.get("name") or "")
    return render(
        request,
        "routine_form.html",
        status,
        mode=mode,
        fields=FIELDS,
        texts=shown,
        errors=errors or {},
        owner=owner,
        routine=name,
        kept=kept or {},
        clone_of=clone_of,
        windows=windows,
        zone=zone,
        action_path=("/new" if mode == "new" else "/edit/" + present.path_part(name)),
    )


async def post_form(request: Request) -> Response:
    """The form without JavaScript: the CSRF token first, then a create or
    an edit through the admin API; errors re-render the form (422)."""
    panel = panel_of(request)
    raw = await request.body()
    form = {k: v[0] for k, v in parse_qs(raw.decode("utf-8", "replace")).items()}
    problem = panel.guard.csrf_problem(request.state.principal, form.get("csrf_token"))
    if problem is not None:
        return Response(form_refusal(problem), 403)
    editing = name_after(request, "/edit/") if "name" in request.path_params else None

    def run() -> Response:
        try:
            with panel.lock:
                if editing is None:
                    return save_new(request, form)
                return save_edit(request, editing, form)
        except HANDLED as exc:
            status = error_status(exc)
            return render(request, "error.html", status, error=error_text(exc, panel))

    return await run_in_threadpool(run)


def save_new(request: Request, form: dict[str, str]) -> Response:
    admin = panel_of(request).admin
    values, errors = from_form(form)
    kept = cloned_secrets(admin, form, values)
    errors = new_routine_errors(admin, values, errors)
    if not errors:
        try:
            admin.add(values["name"], values["task"], by=by(request), **options_of(values))
            return redirect(request, values["name"], f"added {values['name']}")
        except FieldErrors as exc:
            errors = exc.fields
        except InvalidRoutine as exc:
            errors = dict.fromkeys(blamed(str(exc), values), str(exc))
    texts = {**form, **dict.fromkeys(kept, "")}
    return show_form(
        request, mode="new", values=values, texts=texts, errors=errors, status=422,
        kept=kept, clone_of=form.get("clone_of") or None,
    )  # fmt: skip


def save_edit(request: Request, name: str, form: dict[str, str]) -> Response:
    admin = panel_of(request).admin
    try:
        admin.check_editable(name)
    except OwnedByCode as exc:
        return render(request, "error.html", 409, error=str(exc))
    _, before = stored(admin, name)
    kept = hide_secrets(before)[1]
    values, errors = from_form({**form, "name": name, "task": before["task"]})
    changes = edit_options(before, values)
    zone = str(values.get("timezone") or admin.settings.timezone)
    if errors:  # inputs that do not read: each other field named as well
        errors = {**field_errors(changes, zone, name=name, stored=before), **errors}
    else:
        try:  # the edit decides, as `celery routines edit` does
            result = admin.edit(name, by=by(request), **options_of(changes))
            said = f"edited {name}" if result.changed else f"{name}: nothing changed"
            return redirect(request, name, said)
        except REFUSALS as exc:
            errors = refusal(exc, changes, zone, name=name, stored=before).fields
    return show_form(
        request, mode="edit", values=values, texts=form, errors=errors, status=422, kept=kept
    )


def by(request: Request) -> str:
    return f"web:{request.state.principal}"


def redirect(request: Request, name: str, message: str) -> Response:
    where = f"/routines/{present.path_part(name)}"
    target = request.scope.get("root_path", "") + where + "?" + urlencode({"msg": message})
    return RedirectResponse(target, status_code=303)


def page(handler: Callable[[Request], Response]) -> Callable[[Request], Awaitable[Response]]:
    def run(request: Request) -> Response:
        try:
            return handler(request)
        except HANDLED as exc:
            status = error_status(exc)
            return render(request, "error.html", status, error=error_text(exc, panel_of(request)))

    async def endpoint(request: Request) -> Response:
        return await run_in_threadpool(run, request)

    endpoint.__name__ = handler.__name__
    return endpoint


def routes() -> list[Route]:
    return [
        Route("/new", page(new_page)),
        Route("/new", post_form, methods=["POST"]),
        Route("/edit/{name:path}", page(edit_page)),
        Route("/edit/{name:path}", post_form, methods=["POST"]),
        Route("/clone/{name:path}", page(clone_page)),
    ]
