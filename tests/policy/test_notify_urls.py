"""What a notify_url may be and how it is printed: the masked value is never
taken as a URL, and no message prints a secret."""

from __future__ import annotations

import pytest

from celery_routines.errors import InvalidRoutine
from celery_routines.policy.notify_urls import shown_notify_url
from celery_routines.policy.routine import define
from celery_routines.policy.routine_rows import from_columns
from tests.policy.test_routine import _row


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        pytest.param(
            "https://user:pw@hooks.example.com/services/T/B/tok?x=1",
            "https://user:***@hooks.example.com/services/***?***",
            id="password_path_query",
        ),
        pytest.param(
            "https://t0k3n@hooks.example.com/in",
            "https://***@hooks.example.com/in",
            id="user_name_alone_is_a_token",
        ),
        pytest.param("hooks.example.com/x/t0k", "hooks.example.com/***", id="no_scheme"),
        pytest.param("http://[::1/t0k", "http://***", id="unreadable"),
        pytest.param("https://hooks.example.com/in", "https://hooks.example.com/in", id="plain"),
    ],
)
def test_a_notify_url_is_shown_without_its_secret(url: str, shown: str) -> None:
    assert shown_notify_url(url) == shown


@pytest.mark.parametrize(
    "masked",
    [
        "https://user:***@hooks.example.com/services/***?***",
        "https://hooks.example.com/services/***",
        "https://hooks.example.com/in?***",
    ],
)
def test_a_masked_notify_url_is_refused_at_every_door(masked: str) -> None:
    """The value show and the panel print comes back (a form, a copied
    definition): it is refused, naming the routine, never stored as a URL."""
    with pytest.raises(InvalidRoutine, match=r"routine 'payroll': notify_url holds '\*\*\*'"):
        define("tasks.p", "0 9 * * *", name="payroll", notify_url=masked)
    with pytest.raises(InvalidRoutine, match=r"notify_url holds '\*\*\*'"):
        from_columns(_row(notify_url=masked))


def test_a_bad_stored_url_is_named_masked_in_the_routines_error() -> None:
    """The error of a row with a bad notify_url is the routine's last_error:
    shown on its page, in /routines, the API, the log and the invalid
    notification, so it names the value as show does."""
    row = _row(notify_url="ftp://ops:s3cret@hooks.example.com/in/t0k3n?key=k3y")
    with pytest.raises(InvalidRoutine) as raised:
        from_columns(row)
    assert str(raised.value).endswith("got 'ftp://ops:***@hooks.example.com/in/***?***'")
    assert "s3cret" not in str(raised.value) and "t0k3n" not in str(raised.value)
