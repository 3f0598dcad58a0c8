"""``routines_redis_url`` as kombu writes a Sentinel broker URL, and the
errors a bad one gets at start-up (the failovers: tests/topology/test_sentinel.py)."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_routines.config import settings_from
from celery_routines.errors import ConfigurationError
from celery_routines.sending.redis_connect import describe, parse_sentinel_url, redis_client


def test_every_sentinel_and_the_database_after_the_last() -> None:
    found = parse_sentinel_url("sentinel://10.0.0.1:26379;sentinel://10.0.0.2;sentinel://h3:5/2")
    assert found.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379), ("h3", 5))
    assert found.db == 2
    assert (found.username, found.password) == (None, None)


def test_a_password_is_the_masters_and_never_shown() -> None:
    url = "sentinel://:s%40cret@h1:26379;sentinel://h2:26379/1"
    found = parse_sentinel_url(url)
    assert found.password == "s@cret" and found.db == 1
    assert "cret" not in describe(url, "mymaster")
    assert describe(url, "mymaster") == "master 'mymaster' of Sentinels h1:26379, h2:26379, db 1"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sentinel://h1:26379;redis://h2:6379/0", "each ';'-separated part must be"),
        ("sentinel://h1:26379/x", "the database must be a number, got 'x'"),
        ("sentinel://h1:26379/1;sentinel://h2:26379/2", "different databases [1, 2]"),
        ("sentinel://h1:notaport", "bad port"),
        ("sentinel://:pw@h1:99999", "bad port"),
    ],
)
def test_a_bad_sentinel_url_is_named_with_what_is_wrong(url: str, says: str) -> None:
    app = Celery("t", set_as_current=False)
    app.conf.routines_redis_url = url
    app.conf.routines_redis_sentinel_master = "mymaster"
    with pytest.raises(ConfigurationError) as caught:
        settings_from(app)
    assert "routines_redis_url" in str(caught.value) and says in str(caught.value)
    assert "pw@" not in str(caught.value)


def test_a_sentinel_url_needs_the_masters_name() -> None:
    app = Celery("t", set_as_current=False)
    app.conf.routines_redis_url = "sentinel://h1:26379/0"
    with pytest.raises(ConfigurationError, match="routines_redis_sentinel_master"):
        settings_from(app)
    with pytest.raises(ConfigurationError, match="routines_redis_sentinel_master"):
        redis_client("sentinel://h1:26379/0", None)


def test_the_masters_name_defaults_to_the_brokers_and_the_setting_wins() -> None:
    app = Celery("t", set_as_current=False)
    app.conf.routines_redis_url = "sentinel://h1:26379/0"
    app.conf.broker_transport_options = {"master_name": "from-broker"}
    assert settings_from(app).redis_sentinel_master == "from-broker"
    app.conf.routines_redis_sentinel_master = "own"
    assert settings_from(app).redis_sentinel_master == "own"


def test_a_plain_redis_url_needs_no_master(monkeypatch: pytest.MonkeyPatch) -> None:
    app = Celery("t", set_as_current=False)
    app.conf.routines_redis_url = "redis://127.0.0.1:6379/0"
    assert settings_from(app).redis_sentinel_master is None
