"""The optional Django app: its admin reads our tables in PostgreSQL and acts
only through the admin API, as the Django user, within Django's permissions.
Driven with Django's test client."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import text

from celery_routines.config import Settings
from celery_routines.operator.admin import Routines
from celery_routines.store import Store
from tests.harness import published
from tests.operators import add_routine, add_run, make_app

# The Celery app a trigger publishes with (CELERY_ROUTINES_APP points here).
APP: Celery | None = None
LIST = "/admin/celery_routines/routine/"
RUNS = "/admin/celery_routines/routinerun/"


@pytest.fixture
def routines_url(dcb_databases: dict[str, str]) -> Iterator[str]:
    """Our tables in the PostgreSQL database Django's default alias uses."""
    url = dcb_databases["postgresql"]
    store = Store.from_url(url)
    store.migrate()
    with store.engine.begin() as conn:
        for table in ("routine_runs", "routine_changes", "routines"):
            conn.execute(text(f"DELETE FROM {table}"))
    store.dispose()
    yield url


@pytest.fixture
def broker(tmp_path: Path, routines_url: str) -> Iterator[Path]:
    from django.test import override_settings

    global APP
    folder = tmp_path / "broker"
    APP = make_app(folder, routines_url)
    with override_settings(CELERY_ROUTINES_APP=f"{__name__}:APP"):
        yield folder
    APP = None


@pytest.fixture
def api(routines_url: str) -> Iterator[Routines]:
    with Routines(Settings(database_url=routines_url)) as api:
        yield api


def user(name: str, *codenames: str) -> Any:
    from django.contrib.auth.models import Permission, User

    User.objects.filter(username=name).delete()
    person = User.objects.create_user(name, password="x", is_staff=True)
    for codename in codenames:
        person.user_permissions.add(
            Permission.objects.get(content_type__app_label="celery_routines", codename=codename)
        )
    return person


def client_for(person: Any) -> Any:
    from django.test import Client

    client = Client()
    client.force_login(person)
    return client


@pytest.fixture
def operator(broker: Path) -> Any:
    return client_for(user("ops", "view_routine", "change_routine", "view_routinerun"))


@pytest.fixture
def viewer(broker: Path) -> Any:
    return client_for(user("viewer", "view_routine", "view_routinerun"))


def some_routines(api: Routines) -> None:
    api.add("nightly", "tasks.report", cron="30 2 * * *", timezone="Europe/Rome")
    api.add("poll", "tasks.poll", every="5m")
    add_routine(api.store, "from-code", cron="0 * * * *", source="code", owner="proj")
    poll = api.store.routines.by_name("poll")
    window = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    add_run(api.store, poll, "poll@2026-12-01T08:00:00+00:00", "failed", window, window)
    add_run(
        api.store,
        poll,
        "poll@2026-12-01T08:05:00+00:00",
        "skipped",
        window + timedelta(minutes=5),
        window + timedelta(minutes=5),
        reason="overlap",
    )


def pk(api: Routines, name: str) -> int:
    record = api.store.routines.by_name(name)
    assert record is not None
    return record.id


def act(client: Any, action: str, *ids: int) -> str:
    """The page after the action, lower-cased (the admin capitalises messages)."""
    page = client.post(
        LIST, {"action": action, "_selected_action": [str(i) for i in ids]}, follow=True
    )
    assert page.status_code == 200
    return str(page.content.decode().lower())


def test_the_list_shows_schedule_zone_next_window_state_and_last_outcome(
    api: Routines, viewer: Any
) -> None:
    some_routines(api)
    api.pause("nightly", by="ana")
    page = viewer.get(LIST)
    assert page.status_code == 200
    html = page.content.decode()
    for shown in (
        "nightly",
        "30 2 * * *",
        "Europe/Rome",
        "paused",
        "every 300s",
        "skipped (overlap)",
        "from-code",
    ):
        assert shown in html, shown


def test_a_routines_page_links_its_runs_and_skips_and_shows_its_history(
    api: Routines, viewer: Any
) -> None:
    some_routines(api)
    poll = pk(api, "poll")
    page = viewer.get(f"{LIST}{poll}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f"{RUNS}?routine__id__exact={poll}&amp;state__exact=skipped" in html
    assert "added" in html and 'name="_save"' not in html
    runs = viewer.get(RUNS, {"routine__id__exact": poll}).content.decode()
    assert "poll@2026-12-01T08:00:00+00:00" in runs and "poll@2026-12-01T08:05:00+00:00" in runs
    skips = viewer.get(RUNS, {"routine__id__exact": poll, "state__exact": "skipped"})
    assert "08:05:00" in skips.content.decode() and "08:00:00+00:00" not in skips.content.decode()


def test_actions_go_through_the_api_as_the_django_user(
    api: Routines, operator: Any, broker: Path
) -> None:
    some_routines(api)
    nightly, poll = pk(api, "nightly"), pk(api, "poll")
    page = act(operator, "pause", nightly, poll)
    assert "nightly: paused" in page
    assert api.store.routines.by_name("nightly").paused
    assert next((c.action, c.changed_by) for c in api.history("poll")) == (
        "paused",
        "ops (django admin)",
    )
    act(operator, "resume", nightly)
    assert not api.store.routines.by_name("nightly").paused
    act(operator, "disable", poll)
    assert api.store.routines.by_name("poll").enabled is False
    act(operator, "enable", poll)
    assert api.store.routines.by_name("poll").enabled is True
    page = act(operator, "trigger", nightly)
    assert "nightly: sent as run" in page
    assert [m["task"] for m in published(broker)] == ["tasks.report"]
    assert api.history("nightly")[0].changed_by == "ops (django admin)"
    # A routine declared in code is changed in the code: the API refuses, the admin says why.
    page = act(operator, "disable", pk(api, "from-code"))
    assert "from-code: not disabled" in page and "declared in the code" in page
    assert api.store.routines.by_name("from-code").enabled is True


def test_view_permission_reads_change_permission_acts(api: Routines, viewer: Any) -> None:
    some_routines(api)
    nightly = pk(api, "nightly")
    assert viewer.get(LIST).status_code == 200
    act(viewer, "pause", nightly)
    assert not api.store.routines.by_name("nightly").paused  # no change permission
    assert api.history("nightly")[0].action == "added"
    nobody = client_for(user("nobody"))
    assert nobody.get(LIST).status_code == 403


def test_the_admin_never_writes_our_tables_itself(api: Routines, operator: Any) -> None:
    some_routines(api)
    nightly = pk(api, "nightly")
    before = api.store.routines.by_name("nightly")
    assert operator.post(f"{LIST}{nightly}/change/", {"name": "renamed"}).status_code == 403
    assert operator.get(f"{LIST}add/").status_code == 403
    assert operator.post(f"{LIST}{nightly}/delete/", {"post": "yes"}).status_code == 403
    assert api.store.routines.by_name("nightly") == before
