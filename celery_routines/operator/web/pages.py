"""The panel's pages (server-rendered, usable without JavaScript) and the one
endpoint every form posts to, which checks the CSRF token before anything."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlencode

from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

import celery_routines.operator.web.present as present
import celery_routines.operator.web.stats as stats
from celery_routines.operator.bulk import (
    BULK_ACTIONS,
    MAX_REASON,
    BulkResult,
    check_action,
    pause_reason,
)
from celery_routines.operator.listing import STRIP
from celery_routines.operator.sending import BackfillPlan
from celery_routines.operator.web.auth import form_refusal
from celery_routines.operator.web.context import (
    HANDLED,
    Panel,
    error_status,
    error_text,
    name_after,
    panel_of,
    render,
)
from celery_routines.store.panel_queries import ROUTINE_STATES

from celery_routines.policy.states import RUN_STATES  # isort: skip

logger = logging.getLogger("celery_routines.web")

OPEN_STATES = ("pending", "sent", "running", "retrying")
LATENESS_HOURS = 24


def page(handler: Callable[[Request], Response]) -> Callable[[Request], Response]:
    """A page whose errors are shown as a page, in the CLI's words."""

    def endpoint(request: Request) -> Response:
        try:
            return handler(request)
        except HANDLED as exc:
            return render(
                request, "error.html", error_status(exc), error=error_text(exc, panel_of(request))
            )

    endpoint.__name__ = handler.__name__
    return endpoint


def home(request: Request) -> Response:
    return RedirectResponse(request.scope.get("root_path", "") + "/routines", status_code=307)


def healthz(request: Request) -> Response:
    """For health checks, without a login: the store answers (503 when it
    does not: the panel is up but cannot serve)."""
    panel = panel_of(request)
    try:
        # A read of the routines table: the database answers and has our
        # schema (on SQLite, db_now() would not even open the file).
        panel.admin.store.admin.routine_counts(panel.admin.clock())
    except SQLAlchemyError as exc:
        logger.warning("health check: the store does not answer: %s", error_text(exc, panel))
        return Response("store unavailable", status_code=503, media_type="text/plain")
    return Response("ok", media_type="text/plain")


def routines(request: Request) -> Response:
    q = request.query_params
    state, name = q.get("state") or None, q.get("name") or None
    sort = q.get("sort") or None
    number = q.get("page") or "1"
    if not number.isdigit():
        raise ValueError(f"page must be a whole number, got {number!r}")
    found = panel_of(request).admin.page(state=state, name=name, page=int(number), sort=sort)
    rows = [
        {
            "row": row,
            "state": present.state_text(
                row.summary, row.suspended_until, row.suspended_reason, row.error
            ),
        }
        for row in found.rows
    ]
    filters = {k: v for k, v in (("state", state), ("name", name), ("sort", sort)) if v}
    return render(
        request,
        "routines.html",
        found=found,
        rows=rows,
        states=ROUTINE_STATES,
        state=state or "",
        name=name or "",
        strip=STRIP,
        filters=urlencode(filters),
        bulk_actions=BULK_ACTIONS,
        max_reason=MAX_REASON,
        sort=sort or "",
        sorts=stats.SORT_CHOICES,
        figure_words=stats.figure_words,
    )


def routine(request: Request) -> Response:
    panel = panel_of(request)
    admin = panel.admin
    name = name_after(request, "/routines/")
    detail = admin.show(name, windows=10)
    record = admin.stats.of(name, request.query_params.get("days"))
    runs = admin.runs(name, limit=100)
    windows: dict[str, list[Any]] = {}
    for run in runs:
        if run.state != "skipped":
            windows.setdefault(run.idempotency_key, []).append(run)
    for attempts in windows.values():
        attempts.sort(key=lambda r: r.attempt)
    summary = detail.summary
    now = admin.clock()
    return render(
        request,
        "routine.html",
        detail=detail,
        summary=summary,
        state=present.state_text(
            summary, detail.suspended_until, detail.suspended_reason, detail.last_error
        ),
        owner=admin.owner(name),
        windows=list(windows.items())[:20],
        skips=admin.runs(name, state="skipped", limit=50),
        changes=admin.history(name, limit=10),
        plot=present.lateness_svg(admin.lateness(name, LATENESS_HOURS), now, LATENESS_HOURS),
        hours=LATENESS_HOURS,
        record=record,
        stats=stats,
        flower=lambda run_id: present.flower_link(panel.flower_url, run_id),
        # Wall times in the routine's zone, as the form reads them.
        default_from=present.local_input(now - timedelta(hours=1), summary.timezone),
        default_to=present.local_input(now, summary.timezone),
    )


def skips(request: Request) -> Response:
    q = request.query_params
    found = panel_of(request).admin.skips(since=q.get("since") or None, limit=500)
    return render(request, "skips.html", skips=found, since=q.get("since", ""))


def runs(request: Request) -> Response:
    q = request.query_params
    admin = panel_of(request).admin
    name = q.get("routine") or None
    state = q.get("state") or None
    since, until = q.get("since") or None, q.get("until") or None
    open_runs = []
    if state is None:
        open_runs = admin.runs(name, state=list(OPEN_STATES), since=since, until=until, limit=200)
    found = admin.runs(name, state=state, since=since, until=until, limit=200)
    if state is None:
        found = [r for r in found if r.state not in OPEN_STATES]
    return render(
        request,
        "runs.html",
        open_runs=open_runs,
        runs=found,
        states=RUN_STATES,
        routine=name or "",
        state=state or "",
        since=since or "",
        until=until or "",
        flower=lambda run_id: present.flower_link(panel_of(request).flower_url, run_id),
    )


# -- actions ---------------------------------------------------------------------


def _do(panel: Panel, action: str, form: dict[str, str], by: str) -> tuple[str, str]:
    """Carry out one action through the admin API, recording ``by`` (who did
    it); returns (where to go, what happened)."""
    admin = panel.admin
    name = form.get("name", "")
    back = f"/routines/{present.path_part(name)}"
    if action == "pause":
        reason = form.get("reason") or None
        result = admin.pause(name, reason=reason, by=by)
        if not result.changed:
            return back, f"{name} was already paused"
        return back, f"paused {name}" + (f": {reason}" if reason else "")
    if action == "resume":
        result = admin.resume(name, catch_up=form.get("catch_up") == "1", by=by)
        if not result.changed:
            return back, f"{name} was already running"
        text = f"resumed {name}; next window {present.utc(result.next_run_at)}"
        if result.skipped_windows:
            text += f"; {result.skipped_windows} window(s) missed while paused recorded as skipped"
        return back, text
    if action in ("enable", "disable"):
        change = admin.enable(name, by=by) if action == "enable" else admin.disable(name, by=by)
        if not change.changed:
            return back, f"{name} was already {change.action}"
        text = f"{change.action} {name}"
        if change.skipped_windows:
            text += (
                f"; {change.skipped_windows} window(s) missed while disabled recorded as skipped"
            )
        return back, text
    if action == "delete":
        deleted = admin.delete(name, by=by)
        return "/routines", f"deleted {name} and its {deleted.runs_deleted} run(s)"
    if action == "trigger":
        sent = admin.trigger(name, by=by)
        return back, f"{sent.outcome} {sent.idempotency_key} as run {sent.run_id}"
    if action == "replay":
        sent = admin.replay(form.get("run_id", ""), by=by)
        back = f"/routines/{present.path_part(sent.routine)}"
        return back, f"{sent.outcome} {sent.idempotency_key} attempt {sent.attempt}"
    if action == "backfill":
        done = admin.backfill(name, form.get("from", ""), form.get("to", ""), by=by)
        left = (
            f"; {done.left} left unsent (overlap={done.overlap} sends one at a time: "
            "backfill again once it has ended)"
            if done.left
            else ""
        )
        return back, (
            f"backfill of {name}: {done.window_count} window(s), {done.sent} sent, "
            f"{done.existing} already stored, {done.failed} failed{left}"
        )
    raise LookupError(f"no action named {action!r}")


# The most routine names a bulk action's message lists.
NAMES_SHOWN = 20


def _bulk(request: Request, panel: Panel, form: dict[str, str], names: list[str]) -> Response:
    """The list's bulk form: first a confirmation page saying how many
    routines and which (a filter is settled into names there), then, posted
    from it with ``confirm=1``, the action through the admin API."""
    admin = panel.admin
    what = form.get("bulk_action", "")
    reason = form.get("reason") or None
    if form.get("confirm") != "1":
        check_action(what)
        use_filter = form.get("scope") == "filter"
        state, part = form.get("filter_state") or None, form.get("filter_name") or None
        targets = admin.bulk.targets(
            [] if use_filter else names, state=state, name=part, use_filter=use_filter
        )
        if not targets:
            raise LookupError("no routine matches the filter")
        shown = ", ".join(f"{k} {v!r}" for k, v in (("state", state), ("name", part)) if v)
        scope = f"every routine matching {shown or 'no filter (all routines)'}"
        return render(
            request, "bulk.html", action=what, targets=targets, max_reason=MAX_REASON,
            reason=pause_reason(reason, required=False) or "" if what == "pause" else "",
            scope_text=scope if use_filter else None,
        )  # fmt: skip
    with panel.lock:
        result = admin.bulk.run(what, names, reason=reason, by=f"web:{request.state.principal}")
    return _redirect(request, "/routines", bulk_message(result))


def bulk_message(result: BulkResult) -> str:
    """``pause: 2 of 3 routine(s) changed (a, b, c); reason: ...; refused: c (why)``."""
    names = [item.routine for item in result.routines]
    listed = ", ".join(names[:NAMES_SHOWN])
    if len(names) > NAMES_SHOWN:
        listed += f" and {len(names) - NAMES_SHOWN} more"
    text = f"{result.action}: {result.changed} of {result.count} routine(s) changed ({listed})"
    if result.reason:
        text += f"; reason: {result.reason}"
    refused = [item for item in result.routines if item.error]
    if refused:
        text += "; refused: " + ", ".join(f"{i.routine} ({i.error})" for i in refused[:5])
    return text


def _redirect(request: Request, where: str, message: str) -> Response:
    target = request.scope.get("root_path", "") + where + "?" + urlencode({"msg": message})
    return RedirectResponse(target, status_code=303)


async def action(request: Request) -> Response:
    """Every form posts here: the CSRF token is checked before the action is
    even looked up."""
    panel = panel_of(request)
    raw = await request.body()
    fields = parse_qs(raw.decode("utf-8", "replace"))
    form = {k: v[0] for k, v in fields.items()}
    problem = panel.guard.csrf_problem(request.state.principal, form.get("csrf_token"))
    if problem is not None:
        return Response(form_refusal(problem), 403)
    what = request.path_params["action"]

    def run() -> Response:
        try:
            if what == "bulk":
                return _bulk(request, panel, form, fields.get("names", []))
            if what == "backfill" and form.get("confirm") != "1":
                plan: BackfillPlan = panel.admin.backfill_plan(
                    form.get("name", ""), form.get("from", ""), form.get("to", "")
                )
                return render(request, "backfill.html", plan=plan, form=form)
            if what == "delete" and form.get("confirm") != "1":
                record = panel.admin.show(form.get("name", ""), windows=1)
                return render(request, "delete.html", summary=record.summary)
            with panel.lock:
                where, message = _do(panel, what, form, f"web:{request.state.principal}")
        except HANDLED as exc:
            return render(request, "error.html", error_status(exc), error=error_text(exc, panel))
        return _redirect(request, where, message)

    return await run_in_threadpool(run)


def routes() -> list[Route]:
    return [
        Route("/", home),
        Route("/healthz", healthz),
        Route("/routines", page(routines)),
        Route("/routines/{name:path}", page(routine)),
        Route("/skips", page(skips)),
        Route("/runs", page(runs)),
        Route("/actions/{action}", action, methods=["POST"]),
    ]
