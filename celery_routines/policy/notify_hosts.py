"""Where notifications may go (``routines_notify_allowed_hosts``): the
decision, without I/O.

A notification is a POST that beat and the workers make from inside the
network, to a URL anyone who may edit a routine can set. Aimed at
``http://127.0.0.1:8080/internal-admin/...`` or the cloud's metadata service,
it is a server-side request forgery. So by default notifications go to
public addresses only: loopback, link-local, private, shared (CGNAT),
unspecified, multicast and reserved addresses, and the cloud metadata
addresses, are refused. ``routines_notify_allowed_hosts`` names the
exceptions, each one of:

- an address or a network (``127.0.0.1``, ``10.0.0.0/8``, ``fd00::/8``):
  a host whose addresses are all inside one of them;
- a host name, ``*`` matching any part (``hooks.internal``,
  ``*.corp.example.com``): that host, whatever it resolves to, except a cloud
  metadata address, which only an address or a network allows.

The doors (``add``/``edit``, the API, the panel) refuse a URL whose host is
itself a refused address or a local name; the sender resolves the host and
checks every address just before it posts, and connects to the address it
checked.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network
from urllib.parse import urlsplit

from celery_routines.policy.notify_urls import shown_notify_url

SETTING = "routines_notify_allowed_hosts"
# AWS and GCP and Azure (169.254.169.254), AWS ECS task metadata, AWS IPv6,
# Alibaba Cloud: answering any local process with the machine's credentials.
METADATA_ADDRESSES = frozenset(
    ip_address(a) for a in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200")
)
# Names that are local whatever DNS says (RFC 6761), and the metadata service's.
LOCAL_NAMES = ("localhost", "*.localhost", "metadata.google.internal")
NAME_PATTERN = re.compile(r"^[a-z0-9_*]([a-z0-9_*.-]*[a-z0-9_*])?$")

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network


def address_kind(address: Address) -> str | None:
    """Why ``address`` is refused by default (``"a loopback address"``...),
    or None for a public one."""
    if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_private:
        return "a private address"
    if not address.is_global or address.is_multicast:
        return "not a public address"
    return None


@dataclass(frozen=True)
class NotifyHosts:
    """The exceptions ``routines_notify_allowed_hosts`` names; empty: public
    addresses only."""

    networks: tuple[Network, ...] = ()
    names: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: object) -> NotifyHosts:
        """From the setting: a list, or a text of patterns separated by commas
        or spaces (as an environment variable holds it). Raises
        :class:`ValueError` naming the pattern that is none."""
        if raw is None or raw == "":
            return cls()
        if isinstance(raw, str):
            items: list[object] = re.split(r"[,\s]+", raw)
        elif isinstance(raw, list | tuple | set | frozenset):
            items = list(raw)
        else:
            raise ValueError(f"{SETTING} must be a list of host patterns, got {raw!r}")
        networks: list[Network] = []
        names: list[str] = []
        for item in items:
            if not isinstance(item, str):
                raise ValueError(f"{SETTING}: each pattern must be a text, got {item!r}")
            text = item.strip().lower()
            if not text:
                continue
            try:
                networks.append(ip_network(text.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            if text.strip("*.") == "":
                raise ValueError(
                    f"{SETTING}: {item!r} would let every host name reach the internal "
                    "network: name the hosts (hooks.internal) or networks (10.0.0.0/8)"
                )
            if not NAME_PATTERN.match(text):
                raise ValueError(
                    f"{SETTING}: {item!r} is not an address (127.0.0.1), a network "
                    "(10.0.0.0/8) or a host name pattern (hooks.internal, *.corp.example.com)"
                )
            names.append(text.rstrip("."))
        return cls(tuple(networks), tuple(names))

    def _named(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        return any(fnmatchcase(host, pattern) for pattern in self.names)

    def _in_networks(self, address: Address) -> bool:
        return any(address in network for network in self.networks)

    def address_refusal(self, host: str, address: Address) -> str | None:
        """Why a post to ``host`` at ``address`` is refused, or None."""
        kind = address_kind(address)
        if kind is None or self._in_networks(address):
            return None
        if kind != "a cloud metadata address" and _is_name(host) and self._named(host):
            return None
        shown = f"{host!r} resolves to {address}, which" if _is_name(host) else host
        return (
            f"{shown} is {kind}; notifications go to public addresses unless "
            f"{SETTING} allows it (e.g. {str(address)!r})"
        )

    def refusal(self, host: str, addresses: Sequence[str]) -> str | None:
        """Why a post to ``host``, which resolves to ``addresses``, is
        refused (the first address refused), or None: every one is allowed."""
        if not addresses:
            return f"{host!r} resolves to no address"
        for text in addresses:
            try:
                address = ip_address(text)
            except ValueError:
                return f"{host!r} resolves to {text!r}, which is not an address"
            why = self.address_refusal(host, address)
            if why is not None:
                return why
        return None

    def literal_refusal(self, url: str) -> str | None:
        """Why ``url`` is refused before any lookup: its host is an address
        refused by default, or a local name, and no pattern allows it."""
        try:
            host = urlsplit(url).hostname
        except ValueError:
            return None  # not a URL: check_notify_url says why
        if not host:
            return None
        if _is_name(host):
            local = any(fnmatchcase(host.lower().rstrip("."), name) for name in LOCAL_NAMES)
            if local and not self._named(host):
                return (
                    f"{host!r} is a local name; notifications go to public addresses unless "
                    f"{SETTING} allows it (e.g. {host!r})"
                )
            return None
        return self.address_refusal(host, ip_address(host))


def _is_name(host: str) -> bool:
    try:
        ip_address(host)
    except ValueError:
        return True
    return False


def door_refusal(url: str | None, allowed: NotifyHosts) -> str | None:
    """What ``add``, ``edit``, the API, the panel and ``import file`` say of
    a ``notify_url`` whose host is itself refused (the value masked), or None."""
    why = allowed.literal_refusal(url) if url else None
    return None if why is None else f"notify_url {shown_notify_url(url)!r} is refused: {why}"
