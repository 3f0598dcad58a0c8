"""The panel's browser tests share one headless Chromium and one running
panel (beat, worker and ``celery routines web`` on PostgreSQL and Redis)
per module; a module that needs another panel defines its own ``cluster``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests import services
from tests.e2e.panel_cluster import PanelCluster, chromium


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    driver = chromium()
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory,
    postgres_databases: services.PostgresDatabases,
    redis_db: int,
) -> Iterator[PanelCluster]:
    redis_url = f"redis://{services.REDIS_HOST}:{services.REDIS_PORT}/{redis_db}"
    with PanelCluster(
        tmp_path_factory.mktemp("panel"), postgres_databases.create(), redis_url
    ) as running:
        yield running
