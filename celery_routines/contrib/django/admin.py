"""The Django admin of celery-routines: read our tables, act through our API.

Lists routines as ``celery routines list`` shows them (schedule, zone, next
window, state, last outcome), a routine's runs and skips, and its change
history. Pause, resume, trigger, enable and disable are admin actions that
call :class:`celery_routines.operator.admin.Routines`, recorded in the
routine's history as the Django user (``by = "<username> (django admin)"``).
Django's permissions decide: ``view`` reads, ``change`` acts. Nothing here
writes our tables itself: there is no add, no delete, no save.

Settings: ``CELERY_ROUTINES_DATABASE`` (the Django alias holding the tables,
default ``"default"``); ``CELERY_ROUTINES_APP`` (``"proj.celery:app"``,
default Celery's current app), whose broker a trigger publishes to.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import import_module
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.forms import ModelForm
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from celery_routines.contrib.django import django_database_url
from celery_routines.contrib.django.models import Routine, RoutineRun
from celery_routines.errors import RoutinesError

if TYPE_CHECKING:
    from celery import Celery

    from celery_routines.operator.admin import Routines
    from celery_routines.operator.lifecycle_views import ChangeResult
    from celery_routines.operator.views import RoutineSummary
    from celery_routines.store import Store

# The summaries of the changelist being drawn (list_display callables get
# only the row): one admin-API read per page, per thread.
_page = threading.local()
_stores: dict[str, Store] = {}
_stores_lock = threading.Lock()


def database_alias() -> str:
    return str(getattr(settings, "CELERY_ROUTINES_DATABASE", "default"))


def celery_app() -> Celery:
    path = getattr(settings, "CELERY_ROUTINES_APP", None)
    if path:
        module, _, attribute = str(path).partition(":")
        return getattr(import_module(module), attribute or "app")
    from celery import current_app

    return current_app._get_current_object()


@contextmanager
def routines_api() -> Iterator[Routines]:
    """Our admin API on the alias's database (one engine per process)."""
    from celery_routines.operator.admin import Routines
    from celery_routines.store import Store

    url = django_database_url(database_alias())
    with _stores_lock:
        store = _stores.get(url)
        if store is None:
            store = _stores[url] = Store.from_url(url)
    api = Routines(celery_app(), store=store)
    try:
        yield api
    finally:
        api.close()


def who(request: HttpRequest) -> str:
    return f"{request.user.get_username()} (django admin)"


def _act(
    request: HttpRequest,
    queryset: QuerySet[Routine],
    verb: str,
    call: Callable[[Routines, str, str], str | None],
) -> None:
    """Run ``call(api, name, by)`` for each selected routine; one message each."""
    by = who(request)
    with routines_api() as api:
        for name in queryset.values_list("name", flat=True):
            try:
                done = call(api, name, by)
            except RoutinesError as exc:
                messages.error(request, f"{name}: not {verb}: {exc}")
                continue
            messages.success(request, done or f"{name}: {verb}")


@admin.action(description="Pause the selected routines", permissions=["change"])
def pause(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Routine]) -> None:
    _act(
        request,
        queryset,
        "paused",
        lambda api, name, by: None if api.pause(name, by=by).changed else f"{name}: already paused",
    )


@admin.action(description="Resume the selected routines", permissions=["change"])
def resume(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Routine]) -> None:
    def call(api: Routines, name: str, by: str) -> str | None:
        result = api.resume(name, by=by)
        if not result.changed:
            return f"{name}: was not paused"
        skipped = f" ({result.skipped_windows} missed window(s) recorded as skipped)"
        return f"{name}: resumed" + (skipped if result.skipped_windows else "")

    _act(request, queryset, "resumed", call)


@admin.action(description="Trigger the selected routines now", permissions=["change"])
def trigger(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Routine]
) -> None:
    def call(api: Routines, name: str, by: str) -> str:
        result = api.trigger(name, by=by)
        if result.outcome != "sent":
            raise RoutinesError(result.error or result.outcome)
        return f"{name}: sent as run {result.run_id}"

    _act(request, queryset, "triggered", call)


@admin.action(description="Enable the selected routines", permissions=["change"])
def enable(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Routine]) -> None:
    _act(request, queryset, "enabled", lambda api, name, by: _changed(api.enable(name, by=by)))


@admin.action(description="Disable the selected routines", permissions=["change"])
def disable(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Routine]
) -> None:
    _act(request, queryset, "disabled", lambda api, name, by: _changed(api.disable(name, by=by)))


def _changed(result: ChangeResult) -> str:
    if not result.changed:
        return f"{result.routine}: already {result.action}"
    return f"{result.routine}: {result.action}"


class ReadOnly(admin.ModelAdmin):
    """Reads our tables through the alias; writes nothing."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).using(database_alias())

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        return [f.name for f in self.model._meta.fields] + list(self.readonly_fields)

    def get_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        return self.get_readonly_fields(request, obj)

    def save_model(self, request: HttpRequest, obj: Model, form: ModelForm, change: bool) -> None:
        raise PermissionDenied("celery-routines' tables are changed through its API")


@admin.register(Routine)
class RoutineAdmin(ReadOnly):
    list_display = ("name", "schedule", "zone", "next_window", "state", "last_outcome")
    list_filter = ("enabled", "paused", "source")
    search_fields = ("name", "task")
    actions = (pause, resume, trigger, enable, disable)
    readonly_fields = ("runs_and_skips", "history")

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, object] | None = None
    ) -> HttpResponse:
        with routines_api() as api:
            _page.summaries = {s.name: s for s in api.list()}
        try:
            response = super().changelist_view(request, extra_context)
            if hasattr(response, "render"):
                response.render()  # while the summaries are set
            return response
        finally:
            _page.summaries = {}

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, object] | None = None,
    ) -> HttpResponse:
        if request.method == "POST":
            raise PermissionDenied("use the actions of the routines list")
        context = {
            **(extra_context or {}),
            "show_save": False,
            "show_save_and_continue": False,
            "show_save_and_add_another": False,
            "show_delete": False,
        }
        return super().change_view(request, object_id, form_url, context)

    def _summary(self, obj: Routine) -> RoutineSummary | None:
        return getattr(_page, "summaries", {}).get(obj.name)

    @admin.display(description="schedule")
    def schedule(self, obj: Routine) -> str:
        summary = self._summary(obj)
        return summary.schedule if summary else (obj.cron or "")

    @admin.display(description="zone")
    def zone(self, obj: Routine) -> str:
        summary = self._summary(obj)
        return summary.timezone if summary else (obj.timezone or "")

    @admin.display(description="next window (UTC)")
    def next_window(self, obj: Routine) -> str:
        summary = self._summary(obj)
        when = summary.next_run_utc if summary else None
        return when.strftime("%Y-%m-%d %H:%M:%S") if when else "-"

    @admin.display(description="state")
    def state(self, obj: Routine) -> str:
        summary = self._summary(obj)
        return summary.state if summary else "-"

    @admin.display(description="last outcome")
    def last_outcome(self, obj: Routine) -> str:
        summary = self._summary(obj)
        return (summary.last_outcome if summary else None) or "-"

    @admin.display(description="runs and skips")
    def runs_and_skips(self, obj: Routine) -> str:
        url = reverse("admin:celery_routines_routinerun_changelist")
        runs = urlencode({"routine__id__exact": obj.pk})
        skips = urlencode({"routine__id__exact": obj.pk, "state__exact": "skipped"})
        return format_html(
            '<a href="{}">runs</a> · <a href="{}">skips</a>', f"{url}?{runs}", f"{url}?{skips}"
        )

    @admin.display(description="history")
    def history(self, obj: Routine) -> str:
        with routines_api() as api:
            changes = api.history(obj.name, limit=20)
        return format_html_join(
            "",
            "<div>{} · {} · {}</div>",
            (
                (c.changed_at.strftime("%Y-%m-%d %H:%M:%S UTC"), c.action, c.changed_by or "-")
                for c in changes
            ),
        )


@admin.register(RoutineRun)
class RoutineRunAdmin(ReadOnly):
    list_display = (
        "routine",
        "idempotency_key",
        "attempt",
        "state",
        "reason",
        "skipped_count",
        "created_at",
        "finished_at",
    )
    list_filter = ("state",)
    search_fields = ("routine__name", "idempotency_key")
    list_select_related = ("routine",)

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False  # runs are read: replay is `celery routines replay RUN_ID`
