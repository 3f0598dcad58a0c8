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
carries. Without a ``bearer:`` entry there is no token at all: an API POST
then needs the ``X-CSRF-Token`` of a page (made for the logged-in user).

The whole setting may live in a file instead (a Docker secret):
``ROUTINES_WEB_AUTH_FILE``; a ``bearer:NAME`` token likewise in the file named
by ``NAME_FILE`` when ``NAME`` is unset.

Passwords are checked off the event loop (PBKDF2 takes tens of milliseconds),
at most two at a time, after the per-client and per-user limit on failed
logins (:mod:`celery_routines.operator.web.attempts`); an unknown user name
is hashed against a dummy so it takes as long as a wrong password.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import ipaddress
import os
import re
import secrets
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from celery_routines.clock import Clock, utc_now
from celery_routines.errors import ConfigurationError
from celery_routines.operator.web.attempts import FailedLogins

SCHEME = "pbkdf2_sha256"
ITERATIONS = 240_000
# Below this a hash is cheap to brute-force offline; above it one login costs
# seconds of CPU (and an int this size would overflow OpenSSL).
MIN_ITERATIONS = 1_000
MAX_ITERATIONS = 10_000_000
LOOPBACK_NAMES = ("localhost",)
# A page's CSRF token is good for this long: one copied out of an old tab or a
# log stops working, and a working day on one page is never cut short.
CSRF_MAX_AGE_SECONDS = 12 * 3600
# The token is the issue time (seconds, this many hex digits) and its MAC.
_ISSUED_DIGITS = 10
# How an environment variable is conventionally named. Anything else after
# ``bearer:`` is more likely the token itself pasted in, and is never quoted.
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")


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
        if scheme != SCHEME or not MIN_ITERATIONS <= int(iterations) <= MAX_ITERATIONS:
            return False
        computed = hashlib.pbkdf2_hmac("sha256", password.encode(), _unb64(salt), int(iterations))
    except (ValueError, OverflowError, binascii.Error):
        return False
    return hmac.compare_digest(computed, _unb64(digest))


def hash_problem(hashed: str) -> str | None:
    """Why ``hashed`` cannot be a password hash of ours, without quoting it."""
    if not hashed.startswith(SCHEME + "$") or hashed.count("$") != 3:
        return f"is not a {SCHEME} hash"
    _, iterations, salt, digest = hashed.split("$")
    if not iterations.isdigit() or not MIN_ITERATIONS <= int(iterations) <= MAX_ITERATIONS:
        return (
            f"has an iteration count of {iterations[:12]!r}; it must be a whole number from "
            f"{MIN_ITERATIONS:,} to {MAX_ITERATIONS:,}"
        )
    try:
        if not _unb64(salt) or not _unb64(digest):
            return "has an empty salt or hash"
    except (ValueError, binascii.Error):
        return "has a salt or hash that is not base64"
    return None


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


def parse_web_auth(value: object, environ: Mapping[str, str] | None = None) -> WebAuth:
    """``routines_web_auth`` as a :class:`WebAuth`; a clear error naming the
    bad entry otherwise."""
    env = os.environ if environ is None else environ
    if (value is None or value == "") and env.get("ROUTINES_WEB_AUTH_FILE"):
        value = _secret_file("ROUTINES_WEB_AUTH_FILE", env["ROUTINES_WEB_AUTH_FILE"])
    if value is None or value == "":
        return WebAuth()
    if isinstance(value, Mapping):
        entries = [f"{user}:{hashed}" for user, hashed in value.get("users", {}).items()]
        if value.get("bearer_env"):
            entries.append(f"bearer:{value['bearer_env']}")
    elif isinstance(value, str):
        entries = value.replace(",", " ").split()
    else:
        # The type only: a list or bytes here may hold a token or a hash.
        raise ConfigurationError(
            f"routines_web_auth must be a string or a dict, got a {type(value).__name__}"
        )
    users: dict[str, str] = {}
    token = None
    for number, entry in enumerate(entries, 1):
        kind, sep, rest = entry.partition(":")
        if not sep or not kind or not rest:
            # Never quoted: a token or password pasted here would reach the logs.
            raise ConfigurationError(
                f"routines_web_auth entry {number} ({len(entry)} characters) is not "
                f"'user:{SCHEME}$...' or 'bearer:ENV_NAME'"
            )
        if kind == "bearer":
            token = env.get(rest)
            if not token and env.get(f"{rest}_FILE"):
                token = _secret_file(f"{rest}_FILE", env[f"{rest}_FILE"])
            if not token:
                shown = _variable(rest)
                file = f"{rest}_FILE" if shown == repr(rest) else "its _FILE"
                raise ConfigurationError(
                    f"routines_web_auth names the bearer token variable {shown}, "
                    f"which is unset or empty in the environment (and so is {file})"
                )
            continue
        problem = hash_problem(rest)
        if problem:
            raise ConfigurationError(
                f"routines_web_auth: the password of user {kind!r} {problem} "
                "(make one with: celery -A proj routines web --hash-password)"
            )
        users[kind] = rest
    return WebAuth(users, token)


def _variable(name: str) -> str:
    """The variable after ``bearer:`` as an error may show it: quoted when it
    is named like one, else only its length (a token pasted in by mistake
    would otherwise reach the logs)."""
    if _ENV_NAME.fullmatch(name):
        return repr(name)
    return f"of {len(name)} characters (not shown: not named like a variable, so maybe a token)"


def _secret_file(variable: str, path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigurationError(
            f"{variable} names {path!r}, which cannot be read: {exc.strerror}"
        ) from None


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


@dataclass(frozen=True)
class Principal:
    """Who is behind a request. The scheme is part of it: a basic-auth user
    named ``token`` is not the bearer token."""

    kind: Literal["local", "basic", "bearer"]
    name: str

    def __str__(self) -> str:
        """How actions are recorded (``web:<this>``) and the page names it."""
        return self.name

    @property
    def is_bearer(self) -> bool:
        return self.kind == "bearer"


LOCAL = Principal("local", "local")
# Recorded as ``web:bearer``: no basic-auth user can have that name (a
# ``bearer:`` entry of the setting is the token), so the audit trail never
# mixes the token with a person.
BEARER = Principal("bearer", "bearer")


class Guard:
    """Authentication and CSRF for one running panel."""

    def __init__(
        self,
        auth: WebAuth,
        *,
        secret: bytes | None = None,
        failed_logins: FailedLogins | None = None,
        clock: Clock = utc_now,
    ) -> None:
        self.auth = auth
        self._clock = clock
        secret_env = os.environ.get("ROUTINES_WEB_SECRET")
        self._secret = secret or (secret_env.encode() if secret_env else secrets.token_bytes(32))
        # A token exists only when configured (bearer:ENV_NAME): one made up
        # here would have to be shown to be used, and shown it ends in logs.
        self.api_token = auth.token
        self.failed_logins = failed_logins or FailedLogins()
        # PBKDF2 off the event loop, two at a time: a flood of logins costs at
        # most two cores' worth and never stalls other requests.
        self._hashing = ThreadPoolExecutor(max_workers=2, thread_name_prefix="routines-pbkdf2")
        # An unknown user is hashed too, with the costliest configured count.
        most = max((_iterations(h) for h in auth.users.values()), default=ITERATIONS)
        self._dummy = f"{SCHEME}${most}${_b64(b'dummy-salt-1234')}${_b64(bytes(32))}"
        # Checked passwords, so a page refreshing every few seconds does not
        # pay PBKDF2 each time (keyed by a digest, never the password).
        self._verified: set[str] = set()

    def close(self) -> None:
        self._hashing.shutdown(wait=False, cancel_futures=True)

    async def authenticate(self, authorization: str | None, client: str | None) -> Principal | None:
        """The principal behind an Authorization header; :data:`LOCAL` when
        the panel has no authentication; None when refused.
        :class:`~celery_routines.operator.web.attempts.Throttled` past the
        limit of failed logins."""
        scheme, _, credentials = (authorization or "").partition(" ")
        if scheme.lower() == "bearer" and self.token_matches(credentials.strip()):
            return BEARER
        if not self.auth.configured:
            return LOCAL
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(credentials, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        known = self._known(user, password)
        if known in self._verified:
            return Principal("basic", user)
        attempt = self.failed_logins.begin(client, user)
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(self._hashing, self._check_user, user, password):
            return None
        self.failed_logins.succeeded(attempt)
        if len(self._verified) > 1000:
            self._verified.clear()
        self._verified.add(known)
        return Principal("basic", user)

    def _known(self, user: str, password: str) -> str:
        hashed = self.auth.users.get(user, "")
        text = f"{user}\0{password}\0{hashed}"
        return hmac.new(self._secret, text.encode(), "sha256").hexdigest()

    def _check_user(self, user: str, password: str) -> bool:
        hashed = self.auth.users.get(user)
        if hashed is None:
            # As long as a wrong password: the time must not say who exists.
            check_password(password, self._dummy)
            return False
        return check_password(password, hashed)

    def token_matches(self, token: str) -> bool:
        if not token or self.api_token is None:
            return False
        return hmac.compare_digest(token.encode(), self.api_token.encode())

    def csrf_token(self, principal: Principal) -> str:
        """A token for this principal's forms, stamped with the time it was
        made (hex digits only, as pages and scripts read it)."""
        issued = int(self._clock().timestamp())
        return f"{issued:0{_ISSUED_DIGITS}x}{self._csrf_mac(principal, issued)}"

    def _csrf_mac(self, principal: Principal, issued: int) -> str:
        message = f"csrf\0{principal.kind}\0{principal.name}\0{issued}"
        return hmac.new(self._secret, message.encode(), "sha256").hexdigest()

    def csrf_problem(self, principal: Principal, token: str | None) -> CsrfProblem | None:
        """None for a token this panel made for ``principal`` within
        :data:`CSRF_MAX_AGE_SECONDS`; else why it is refused."""
        text = token or ""
        stamp, mac = text[:_ISSUED_DIGITS], text[_ISSUED_DIGITS:]
        try:
            issued = int(stamp, 16)
        except ValueError:
            return "wrong"
        expected = self._csrf_mac(principal, issued)
        if len(stamp) != _ISSUED_DIGITS or not hmac.compare_digest(expected, mac):
            return "wrong"
        if self._clock().timestamp() - issued > CSRF_MAX_AGE_SECONDS:
            return "expired"
        return None

    def csrf_matches(self, principal: Principal, token: str | None) -> bool:
        return self.csrf_problem(principal, token) is None


CsrfProblem = Literal["wrong", "expired"]


def form_refusal(problem: CsrfProblem) -> str:
    """The 403's text for a form whose CSRF token is refused."""
    if problem == "expired":
        return (
            "POST refused: the page's CSRF token has expired (a page's token is good for "
            f"{CSRF_MAX_AGE_SECONDS // 3600} hours): reload the page and send the form again"
        )
    return "POST refused: the form's CSRF token is missing or wrong"


def _iterations(hashed: str) -> int:
    try:
        return int(hashed.split("$")[1])
    except (IndexError, ValueError):
        return ITERATIONS
