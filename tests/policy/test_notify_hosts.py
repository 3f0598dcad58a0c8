"""Where notifications may go: by default public addresses only (no
loopback, link-local, private, shared or cloud metadata address);
``routines_notify_allowed_hosts`` names the exceptions. Decided without any
lookup or traffic: the addresses are given."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_routines.config import settings_from
from celery_routines.errors import ConfigurationError
from celery_routines.policy.notify_hosts import NotifyHosts, door_refusal

DEFAULT = NotifyHosts()


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        pytest.param("127.0.0.1", "a loopback address", id="loopback"),
        pytest.param("127.5.6.7", "a loopback address", id="loopback_net"),
        pytest.param("::1", "a loopback address", id="loopback_v6"),
        pytest.param("::ffff:127.0.0.1", "a loopback address", id="v4_mapped_loopback"),
        pytest.param("169.254.169.254", "a cloud metadata address", id="metadata"),
        pytest.param("fd00:ec2::254", "a cloud metadata address", id="metadata_v6"),
        pytest.param("169.254.1.1", "a link-local address", id="link_local"),
        pytest.param("fe80::1", "a link-local address", id="link_local_v6"),
        pytest.param("10.1.2.3", "a private address", id="private_10"),
        pytest.param("172.16.0.9", "a private address", id="private_172"),
        pytest.param("192.168.1.1", "a private address", id="private_192"),
        pytest.param("fd12::1", "a private address", id="unique_local_v6"),
        pytest.param("0.0.0.0", "a private address", id="unspecified"),
        pytest.param("100.64.0.1", "not a public address", id="shared_cgnat"),
        pytest.param("224.0.0.1", "not a public address", id="multicast"),
    ],
)
def test_the_default_refuses_every_address_inside_the_network(address: str, kind: str) -> None:
    refused = DEFAULT.refusal("hooks.example.com", [address])
    assert refused is not None and kind in refused
    assert "routines_notify_allowed_hosts" in refused
    # A host that is itself such an address is refused at the doors, before any lookup.
    host = f"[{address}]" if ":" in address else address
    assert DEFAULT.literal_refusal(f"http://{host}:18700/internal-admin/reset") is not None


def test_public_addresses_are_allowed_and_one_refused_address_refuses_the_host() -> None:
    assert DEFAULT.refusal("hooks.example.com", ["93.184.216.34", "2606:2800:220:1::1"]) is None
    assert DEFAULT.literal_refusal("https://hooks.example.com/services/x") is None
    assert DEFAULT.literal_refusal("http://8.8.8.8/hook") is None
    # DNS that answers a public and an internal address: refused.
    assert DEFAULT.refusal("mixed.example.com", ["93.184.216.34", "10.0.0.5"]) == (
        "'mixed.example.com' resolves to 10.0.0.5, which is a private address; notifications "
        "go to public addresses unless routines_notify_allowed_hosts allows it (e.g. '10.0.0.5')"
    )
    assert DEFAULT.refusal("empty.example.com", []) is not None


def test_local_names_are_refused_at_the_doors() -> None:
    for url in ("http://localhost:8080/x", "http://api.localhost/x",
                "http://metadata.google.internal/computeMetadata/v1/"):  # fmt: skip
        assert DEFAULT.literal_refusal(url) is not None, url
    assert NotifyHosts.parse("localhost").literal_refusal("http://localhost:8080/x") is None


def test_the_setting_allows_addresses_networks_and_host_names() -> None:
    allowed = NotifyHosts.parse("127.0.0.1, 10.0.0.0/8 hooks.internal *.corp.example.com")
    assert allowed.refusal("127.0.0.1", ["127.0.0.1"]) is None
    assert allowed.refusal("relay.example.com", ["10.20.30.40"]) is None
    assert allowed.refusal("relay.example.com", ["192.168.0.1"]) is not None
    assert allowed.refusal("hooks.internal", ["192.168.0.1"]) is None
    assert allowed.refusal("a.b.corp.example.com", ["172.16.0.1"]) is None
    # A name pattern never opens the metadata service: only its address does.
    assert "cloud metadata" in (allowed.refusal("hooks.internal", ["169.254.169.254"]) or "")
    metadata = NotifyHosts.parse(["169.254.169.254"])
    assert metadata.refusal("hooks.internal", ["169.254.169.254"]) is None
    assert NotifyHosts.parse(["::1"]).literal_refusal("http://[::1]:9/x") is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("hooks internal!", "'internal!' is not an address (127.0.0.1), a network"),
        ("*", "'*' would let every host name reach the internal network"),
        (42, "must be a list of host patterns, got 42"),
        ([1], "each pattern must be a text, got 1"),
    ],
)
def test_a_bad_pattern_is_named(raw: object, message: str) -> None:
    with pytest.raises(ValueError, match="routines_notify_allowed_hosts") as raised:
        NotifyHosts.parse(raw)
    assert message in str(raised.value)


def test_the_doors_name_the_value_masked() -> None:
    url = "http://admin:pw@127.0.0.1:18700/internal-admin/reset?confirm=yes"
    assert door_refusal(url, DEFAULT) == (
        "notify_url 'http://admin:***@127.0.0.1:18700/internal-admin/***?***' is refused: "
        "127.0.0.1 is a loopback address; notifications go to public addresses unless "
        "routines_notify_allowed_hosts allows it (e.g. '127.0.0.1')"
    )
    assert door_refusal(None, DEFAULT) is None


def test_a_bad_setting_stops_start_up_naming_the_pattern() -> None:
    app = Celery("hosts", set_as_current=False)
    app.conf.routines_notify_allowed_hosts = "10.0.0.0/8 hooks/internal"
    with pytest.raises(ConfigurationError, match="'hooks/internal' is not an address"):
        settings_from(app)
    app.conf.routines_notify_allowed_hosts = "10.0.0.0/8 hooks.internal"
    assert settings_from(app).notify_allowed_hosts.names == ("hooks.internal",)
