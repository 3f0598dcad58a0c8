"""One notification ``POST``, made only where notifications may go.

The host is resolved here, every address it resolves to is checked against
``routines_notify_allowed_hosts`` (:mod:`celery_routines.policy.notify_hosts`),
and the connection is made to the address that was checked, so a name that
resolves elsewhere a moment later (DNS rebinding) reaches nothing new. HTTPS
still verifies the certificate against the host's name. Redirects are not
followed: a 3xx answer is refused, naming where it pointed (masked), since
following it would post to a URL nobody checked.
"""

from __future__ import annotations

import base64
import socket
from collections.abc import Callable, Sequence
from urllib.parse import unquote, urlsplit, urlunsplit

from celery_routines.errors import NotifyRefused
from celery_routines.policy.notify_hosts import NotifyHosts
from celery_routines.policy.notify_urls import shown_notify_url

POST_TIMEOUT = 5.0
DEFAULT_PORTS = {"http": 80, "https": 443}

Resolver = Callable[[str, int], Sequence[str]]


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (raises ``OSError`` when none)."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in found))


class GuardedPoster:
    """Posts a JSON body to a URL whose every address is allowed."""

    def __init__(
        self,
        allowed: NotifyHosts,
        *,
        resolver: Resolver = resolve,
        timeout: float = POST_TIMEOUT,
    ) -> None:
        self.allowed = allowed
        self._resolve = resolver
        self._timeout = timeout

    def address_for(self, url: str) -> tuple[str, int, str]:
        """(host, port, the address to connect to); :class:`NotifyRefused`
        when an address the host resolves to is not allowed."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or DEFAULT_PORTS.get(parts.scheme.lower(), 80)
        addresses = self._resolve(host, port)
        why = self.allowed.refusal(host, addresses)
        if why is not None:
            raise NotifyRefused(f"not posted to {shown_notify_url(url)}: {why}")
        return host, port, addresses[0]

    def __call__(self, url: str, body: bytes) -> None:
        """POST ``body``; raises on a refused connection, a timeout or a
        non-2xx answer, and :class:`NotifyRefused` on a host not allowed or
        a redirect."""
        import http.client  # only in a process that has somewhere to post

        host, port, address = self.address_for(url)
        parts = urlsplit(url)
        https = parts.scheme.lower() == "https"
        kind = http.client.HTTPSConnection if https else http.client.HTTPConnection
        connection = kind(host, port, timeout=self._timeout)
        try:
            connection.sock = self._connect(address, port, host if https else None)
            connection.request("POST", urlunsplit(("", "", parts.path or "/", parts.query, "")),
                               body, _headers(parts.username, parts.password))  # fmt: skip
            reply = connection.getresponse()
            reply.read()
        finally:
            connection.close()
        if 300 <= reply.status < 400:
            where = shown_notify_url(reply.getheader("Location") or "") or "nowhere"
            raise NotifyRefused(
                f"{shown_notify_url(url)} answered {reply.status} (a redirect to {where}), "
                "which notifications do not follow: set notify_url to the URL it points at"
            )
        if not 200 <= reply.status < 300:
            raise OSError(f"HTTP {reply.status} {reply.reason}")

    def _connect(self, address: str, port: int, tls_name: str | None) -> socket.socket:
        sock = socket.create_connection((address, port), self._timeout)
        if tls_name is None:
            return sock
        import ssl

        return ssl.create_default_context().wrap_socket(sock, server_hostname=tls_name)


def _headers(user: str | None, password: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "User-Agent": "celery-routines"}
    if user is not None:  # https://user:password@host/: HTTP basic authentication
        pair = f"{unquote(user)}:{unquote(password or '')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    return headers
