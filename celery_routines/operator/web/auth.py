"""Who may use the panel, and which POSTs it accepts.

``routines_web_auth`` (a Celery setting, or ``ROUTINES_WEB_AUTH``) lists, by
commas or spaces:

- ``user:pbkdf2_sha256$<iterations>$<salt>$<hash>``: a basic-auth user and
  the hash of the password (``celery routines web --hash-password`` makes one;
  the password itself is never stored);
- ``bearer:ENV_NAME``: a bearer token, read from the environment variable
  ``ENV_NAME`` when the panel starts.

Unset, the panel serves loopback only (the ``web`` command refuses any other
address). Every POST needs the CSRF token of the page it came from (forms) or
the bearer token (API), and a POST from another site is refused whatever it
carries. With no ``bearer:`` entry, the API token is made up at start and
printed by the ``web`` command.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_routines.errors import ConfigurationError

SCHEME = "pbkdf2_sha256"
ITERATIONS = 240_000
LOOPBACK_NAMES = ("localhost",)


def hash_password(password: str, *, iterations: int = ITERATIONS, salt: bytes | None = None) -> str:
    """``pbkdf2_sha256$<iterations>$<salt>$<hash>`` (hashlib only)."""
    if not password:
        raise ValueError("the password is empty")
    salt = salt or secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    return f"{SCHEME}${iterations}${_b64(salt)}${_b64(digest)}"


def check_password(password: str, hashed: str) -> bool:
    try:
        scheme, iterations, salt, digest = hashed.split("$")
        if scheme != SCHEME:
            return False
        computed = hashlib.pbkdf2_hmac("sha256", password.encode(), _unb64(salt), int(iterations))
    except ValueError:
        return False
    return hmac.compare_digest(computed, _unb64(digest))


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class WebAuth:
    users: Mapping[str, str] = field(default_factory=dict)
    """User name -> password hash."""
    token: str | None = None
    """The bearer token, when one is configured."""

    @property
    def configured(self) -> bool:
        return bool(self.users) or self.token is not None


def parse_web_auth(value: Any, environ: Mapping[str, str] | None = None) -> WebAuth:
    """``routines_web_auth`` as a :class:`WebAuth`; a clear error naming the
    bad entry otherwise."""
    env = os.environ if environ is None else environ
    if value is None or value == "":
        return WebAuth()
    if isinstance(value, Mapping):
        entries = [f"{user}:{hashed}" for user, hashed in value.get("users", {}).items()]
        if value.get("bearer_env"):
            entries.append(f"bearer:{value['bearer_env']}")
    elif isinstance(value, str):
        entries = value.replace(",", " ").split()
    else:
        raise ConfigurationError(f"routines_web_auth must be a string or a dict, got {value!r}")
    users: dict[str, str] = {}
    token = None
    for entry in entries:
        kind, sep, rest = entry.partition(":")
        if not sep or not kind or not rest:
            raise ConfigurationError(
                f"routines_web_auth entry {_masked(entry)!r} is not 'user:{SCHEME}$...' "
                "or 'bearer:ENV_NAME'"
            )
        if kind == "bearer":
            token = env.get(rest)
            if not token:
                raise ConfigurationError(
                    f"routines_web_auth names the bearer token variable {rest!r}, "
                    "which is unset or empty in the environment"
                )
        elif not rest.startswith(SCHEME + "$") or rest.count("$") != 3:
            raise ConfigurationError(
                f"routines_web_auth: the password of user {kind!r} is not a {SCHEME} hash "
                "(make one with: celery -A proj routines web --hash-password)"
            )
        else:
            users[kind] = rest
    return WebAuth(users, token)


def _masked(entry: str) -> str:
    kind, _, rest = entry.partition(":")
    return f"{kind}:{'*' * 3}" if rest else entry


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, auth: WebAuth) -> None:
    """Refuse to serve anything but loopback without authentication."""
    if is_loopback(host) or auth.configured:
        return
    raise ConfigurationError(
        f"refusing to serve the panel on {host} without authentication: anyone who reaches "
        "that address could pause and send routines. Set routines_web_auth (or "
        "ROUTINES_WEB_AUTH) to 'user:<hash>' (make the hash with: celery -A proj routines "
        "web --hash-password) and/or 'bearer:ENV_NAME' (a token in that environment "
        "variable), or bind 127.0.0.1 and reach it through an SSH tunnel or a proxy"
    )


class Guard:
    """Authentication and CSRF for one running panel."""

    def __init__(self, auth: WebAuth, *, secret: bytes | None = None) -> None:
        self.auth = auth
        secret_env = os.environ.get("ROUTINES_WEB_SECRET")
        self._secret = secret or (secret_env.encode() if secret_env else secrets.token_bytes(32))
        # Without a configured token the API token is made up for this process.
        self.api_token = auth.token or secrets.token_urlsafe(24)
        # Checked passwords, so a page refreshing every few seconds does not
        # pay PBKDF2 each time (keyed by a digest, never the password).
        self._verified: set[str] = set()

    def principal(self, authorization: str | None) -> str | None:
        """The user behind an Authorization header; ``local`` when the panel
        has no authentication; None when it is refused."""
        scheme, _, credentials = (authorization or "").partition(" ")
        if scheme.lower() == "bearer" and self.token_matches(credentials.strip()):
            return "token"
        if not self.auth.configured:
            return "local"
        if scheme.lower() == "basic":
            try:
                user, _, password = base64.b64decode(credentials).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return None
            return user if self._check_user(user, password) else None
        return None

    def _check_user(self, user: str, password: str) -> bool:
        hashed = self.auth.users.get(user)
        if hashed is None:
            return False
        key = hmac.new(self._secret, f"{user}\0{password}\0{hashed}".encode(), "sha256")
        if key.hexdigest() in self._verified:
            return True
        if not check_password(password, hashed):
            return False
        if len(self._verified) > 1000:
            self._verified.clear()
        self._verified.add(key.hexdigest())
        return True

    def token_matches(self, token: str) -> bool:
        return bool(token) and hmac.compare_digest(token.encode(), self.api_token.encode())

    def csrf_token(self, principal: str) -> str:
        return hmac.new(self._secret, f"csrf\0{principal}".encode(), "sha256").hexdigest()

    def csrf_matches(self, principal: str, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(
            self.csrf_token(principal).encode(), (token or "").encode()
        )


def cross_site(headers: Mapping[str, str], host: str | None) -> bool:
    """True for a request another site made the browser send."""
    if headers.get("sec-fetch-site", "") == "cross-site":
        return True
    origin = headers.get("origin")
    if origin and origin != "null" and host:
        return origin.split("://", 1)[-1].rstrip("/") != host
    return origin == "null"
