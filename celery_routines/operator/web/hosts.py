"""Which requests the panel answers at all, and which POSTs come from itself.

- **Host allow-list** (``routines_web_allowed_hosts``): a DNS-rebinding page
  reaches the panel under the attacker's name (``Host: evil.example:8555``)
  and controls the ``Origin`` too, so comparing the two proves nothing. Only
  the names the panel was told to answer to are served; any other ``Host`` is
  a 400 on every request, logged in or not.
- **Proxy headers** (``--forwarded-allow-ips``): ``X-Forwarded-Host``,
  ``X-Forwarded-Proto`` and ``X-Forwarded-For`` are read only from those peers
  (the ASGI servers' convention); from anyone else they are ignored.
- **Same origin** for POSTs: the request's public origin (scheme and host,
  forwarded when trusted), or one of ``routines_web_trusted_origins``.

Pure: no I/O; the middleware (:mod:`celery_routines.operator.web.app`) asks.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from celery_routines.errors import ConfigurationError

# The names loopback answers to: a browser on this machine uses one of them.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
DEFAULT_PORTS = {"http": 80, "https": 443}
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def names(value: object, setting: str) -> list[str]:
    """A setting holding names: a list, or a string split on commas and spaces."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [part for part in value.replace(",", " ").split() if part]
    if isinstance(value, Iterable) and all(isinstance(v, str) for v in value):
        return [v.strip() for v in value if v.strip()]
    raise ConfigurationError(f"{setting} must be a list of names or a string, got {value!r}")


def host_name(host: str) -> str:
    """``Evil.Example.:8555`` -> ``evil.example``; ``[::1]:8555`` -> ``::1``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def origin_of(scheme: str, host: str) -> str:
    """``scheme://host[:port]`` as a browser writes it in ``Origin`` (no
    default port, lower case)."""
    scheme = scheme.lower()
    parts = urlsplit(f"{scheme}://{host.strip().lower()}")
    try:
        port = parts.port
    except ValueError:
        port = None
    name = parts.hostname or ""
    shown = f"[{name}]" if ":" in name else name
    if port is None or port == DEFAULT_PORTS.get(scheme):
        return f"{scheme}://{shown}"
    return f"{scheme}://{shown}:{port}"


def normal_origin(origin: str, setting: str = "routines_web_trusted_origins") -> str:
    parts = urlsplit(origin.strip())
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/"):
        raise ConfigurationError(
            f"{setting}: {origin!r} is not an origin such as https://panel.example.com "
            "(scheme and host, with a port if it is not the default, no path)"
        )
    return origin_of(parts.scheme, parts.netloc)


def networks(value: object) -> tuple[IpNetwork, ...] | None:
    """``--forwarded-allow-ips``: addresses or networks; ``*`` trusts every
    peer (None); empty trusts none."""
    found: list[IpNetwork] = []
    for part in names(value, "--forwarded-allow-ips"):
        if part == "*":
            return None
        try:
            found.append(ipaddress.ip_network(part.strip("[]"), strict=False))
        except ValueError:
            raise ConfigurationError(
                f"--forwarded-allow-ips: {part!r} is not an IP address or network "
                "(such as 127.0.0.1 or 10.0.0.0/8), nor '*'"
            ) from None
    return tuple(found)


@dataclass(frozen=True)
class PublicView:
    """A request as its sender sees the panel: through the proxy when one is
    trusted."""

    scheme: str
    host: str | None
    client: str | None

    @property
    def origin(self) -> str | None:
        return origin_of(self.scheme, self.host) if self.host else None


@dataclass(frozen=True)
class Hosts:
    """The Host allow-list, the trusted proxies and origins of one panel."""

    allowed: frozenset[str] = frozenset(LOOPBACK_HOSTS)
    """Host names (no port) served; ``*`` serves any (only behind a proxy
    that checks the name itself)."""
    trusted_origins: frozenset[str] = frozenset()
    forwarded_allow: tuple[IpNetwork, ...] | None = field(default=())
    """Peers whose X-Forwarded-* headers are read; None: every peer."""

    @classmethod
    def configure(
        cls,
        allowed_hosts: object = None,
        *,
        bind_host: str | None = None,
        trusted_origins: object = None,
        forwarded_allow_ips: object = None,
    ) -> Hosts:
        """The default allow-list is the loopback names plus ``bind_host``;
        a set ``allowed_hosts`` replaces it. A trusted origin's host is
        always allowed (a proxy may pass it on as ``Host``)."""
        trusted = names(trusted_origins, "routines_web_trusted_origins")
        origins = frozenset(normal_origin(o) for o in trusted)
        chosen = names(allowed_hosts, "routines_web_allowed_hosts")
        if chosen:
            allowed = {host_name(h) if h != "*" else "*" for h in chosen}
        else:
            allowed = set(LOOPBACK_HOSTS)
            if bind_host and bind_host not in ("0.0.0.0", "::", "[::]"):
                allowed.add(host_name(bind_host))
        allowed |= {host_name(urlsplit(o).netloc) for o in origins}
        return cls(frozenset(allowed), origins, networks(forwarded_allow_ips))

    def trusts_peer(self, peer: str | None) -> bool:
        if self.forwarded_allow is None:
            return True
        if not peer or not self.forwarded_allow:
            return False
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False  # a Unix socket path: not an address we were told to trust
        return any(address in network for network in self.forwarded_allow)

    def view(self, scope: Mapping[str, Any], headers: Mapping[str, str]) -> PublicView:
        peer = (scope.get("client") or (None,))[0]
        scheme = str(scope.get("scheme", "http"))
        host, client = headers.get("host"), peer
        if self.trusts_peer(peer):
            forwarded_host = headers.get("x-forwarded-host", "").split(",")[0].strip()
            forwarded_proto = headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
            forwarded_for = headers.get("x-forwarded-for", "").split(",")[-1].strip()
            host = forwarded_host or host
            scheme = forwarded_proto if forwarded_proto in DEFAULT_PORTS else scheme
            client = forwarded_for or client
        return PublicView(scheme, host, client)

    def allows(self, view: PublicView) -> bool:
        if not view.host:
            return False  # HTTP/1.0 without Host: nothing to check it against
        return "*" in self.allowed or host_name(view.host) in self.allowed

    def cross_site(self, headers: Mapping[str, str], view: PublicView) -> bool:
        """True for a request another site made the browser send."""
        if headers.get("sec-fetch-site", "") == "cross-site":
            return True
        origin = headers.get("origin")
        if origin is None:
            return False  # not a browser's cross-origin POST (they all send Origin)
        if origin == "null":
            return True
        try:
            sent = normal_origin(origin, "Origin")
        except ConfigurationError:
            return True
        return sent not in self.trusted_origins and sent != view.origin
