"""The panel in process: Starlette's TestClient over a real store (SQLite
and PostgreSQL), a filesystem broker and an injected clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the panel needs the web extra")

from starlette.testclient import TestClient

from celery_routines.operator.admin import Routines
from celery_routines.operator.web import create_app
from celery_routines.operator.web.auth import WebAuth
from celery_routines.store import Store
from tests.conftest import FakeClock
from tests.operators import make_app

TOKEN = "test-token-0123456789"
# A name the panel answers to by default (a loopback name).
BASE_URL = "http://localhost"


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> str:
    """The panel's tests run on SQLite and PostgreSQL (the store's own tests
    cover MariaDB); ``store`` (tests/conftest.py) is built on this."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "postgres_url")


@pytest.fixture
def admin(store: Store, database_url: str, tmp_path: Path, clock: FakeClock) -> Iterator[Routines]:
    routines = Routines(make_app(tmp_path / "broker", database_url), clock=clock, store=store)
    yield routines
    routines.close()


def client_for(admin: Routines, **options: object) -> TestClient:
    """No authentication (the loopback default) unless ``auth`` is given;
    the API token is always ``TOKEN``."""
    peer = options.pop("peer", ("testclient", 50000))
    auth = options.pop("auth", WebAuth())
    assert isinstance(auth, WebAuth)
    auth = WebAuth(auth.users, auth.token or TOKEN) if auth.users else auth
    app = create_app(admin.app, routines=admin, auth=auth, **options)  # type: ignore[arg-type]
    app.state.panel.guard.api_token = auth.token or TOKEN
    return TestClient(app, base_url=BASE_URL, client=peer)  # type: ignore[arg-type]


@pytest.fixture
def client(admin: Routines) -> TestClient:
    return client_for(admin)


BEARER = {"Authorization": f"Bearer {TOKEN}"}
