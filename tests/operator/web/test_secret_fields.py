"""A notify_url's secret never makes the round trip through the panel: the
Edit and Clone forms do not hold the masked value (an empty input keeps the
stored URL and says so), and the API takes its own masked value back as
"unchanged", never as a URL."""

from __future__ import annotations

import re

from celery_routines.operator.admin import Routines
from celery_routines.store import Store
from tests.operator.web.conftest import client_for
from tests.operator.web.test_routine_forms import create, patch, prefilled

SECRET_URL = "https://user:s3cret@hooks.example.com/services/T0/B0/tok3n?key=k3y"
MASKED = "https://user:***@hooks.example.com/services/***?***"
PAYROLL = {"name": "payroll", "task": "proj.payroll", "cron": "0 9 25 * *"}


def posted_form(page: str) -> dict[str, str]:
    """What a browser posts from the page unchanged (hidden inputs included)."""
    hidden = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', page))
    return {**prefilled(page), **hidden}


def stored_url(store: Store, name: str) -> str | None:
    record = store.routines.by_name(name)
    assert record is not None
    return record.notify_url


def test_the_edit_form_keeps_the_stored_secret_unless_a_new_url_is_typed(
    admin: Routines, store: Store
) -> None:
    client = client_for(admin)
    assert create(client, {**PAYROLL, "notify_url": SECRET_URL}).status_code == 201
    page = client.get("/edit/payroll").text
    assert "s3cret" not in page and "tok3n" not in page and "k3y" not in page
    assert posted_form(page)["notify_url"] == ""  # the input never holds the masked value
    assert f"Stored: {MASKED}" in page.replace("&#34;", '"').replace("&#39;", "'")

    unchanged = client.post("/edit/payroll", data=posted_form(page), follow_redirects=False)
    assert unchanged.status_code == 303, unchanged.text
    assert stored_url(store, "payroll") == SECRET_URL
    assert [c.action for c in admin.history("payroll")] == ["added"]

    # The masked value typed back (copied from the page) is no new URL either.
    again = client.post("/edit/payroll", data={**posted_form(page), "notify_url": MASKED})
    assert again.status_code == 200 and stored_url(store, "payroll") == SECRET_URL

    new_url = "https://hooks.example.com/services/T1/B1/n3w"
    typed = client.post("/edit/payroll", data={**posted_form(page), "notify_url": new_url})
    assert typed.status_code == 200 and stored_url(store, "payroll") == new_url
    cleared = client.post("/edit/payroll", data={**posted_form(page), "notify_url": "none"})
    assert cleared.status_code == 200 and stored_url(store, "payroll") is None


def test_a_clone_keeps_the_sources_secret_without_showing_it(admin: Routines, store: Store) -> None:
    client = client_for(admin)
    assert create(client, {**PAYROLL, "notify_url": SECRET_URL}).status_code == 201
    page = client.get("/clone/payroll").text
    assert "s3cret" not in page and "tok3n" not in page
    form = posted_form(page)
    assert form["notify_url"] == "" and form["name"] == "payroll-copy"
    done = client.post("/new", data=form, follow_redirects=False)
    assert done.status_code == 303, done.text
    assert stored_url(store, "payroll-copy") == SECRET_URL
    # A clone with a URL of its own takes that one.
    own = "https://hooks.example.com/other"
    typed = {**form, "name": "payroll-own", "notify_url": own}
    assert client.post("/new", data=typed, follow_redirects=False).status_code == 303
    assert stored_url(store, "payroll-own") == own


def test_the_api_takes_its_masked_value_back_as_unchanged_and_never_stores_it(
    admin: Routines, store: Store
) -> None:
    client = client_for(admin)
    assert create(client, {**PAYROLL, "notify_url": SECRET_URL}).status_code == 201
    definition = client.get("/api/routines/payroll").json()["definition"]
    assert definition["notify_url"] == MASKED
    sent_back = patch(client, "payroll", {"notify_url": MASKED, "max_retries": 1})
    assert sent_back.status_code == 200, sent_back.text
    assert stored_url(store, "payroll") == SECRET_URL
    copied = create(client, {**PAYROLL, "name": "payroll-2", "notify_url": MASKED})
    assert copied.status_code == 422
    assert "notify_url holds '***'" in copied.json()["fields"]["notify_url"]
    assert store.routines.by_name("payroll-2") is None


def test_the_api_and_the_form_refuse_a_notify_url_inside_the_network(
    admin: Routines, store: Store
) -> None:
    client = client_for(admin)
    metadata = "http://169.254.169.254/latest/meta-data/"
    refused = create(client, {**PAYROLL, "notify_url": metadata})
    assert refused.status_code == 422
    assert refused.json()["fields"]["notify_url"].startswith(
        "routine 'payroll': notify_url 'http://169.254.169.254/latest/***' is refused: "
        "169.254.169.254 is a cloud metadata address"
    )
    assert store.routines.by_name("payroll") is None
    assert create(client, PAYROLL).status_code == 201
    page = client.get("/edit/payroll").text
    internal = "http://10.0.0.8:8080/admin/reset?confirm=yes"
    form = client.post("/edit/payroll", data={**posted_form(page), "notify_url": internal})
    assert form.status_code == 422 and "10.0.0.8 is a private address" in form.text
    assert patch(client, "payroll", {"notify_url": internal}).status_code == 422
    assert stored_url(store, "payroll") is None
