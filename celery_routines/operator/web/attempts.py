"""Failed logins, counted per user name, per client and user name, and per
client, so a password cannot be guessed at the speed of the network and a
flood of wrong passwords cannot keep the CPU busy with PBKDF2.

The client is the peer's address, or the forwarded one where the proxy's
headers are trusted (``routines_web_forwarded_allow_ips``). Behind a proxy
whose headers are not trusted every person is the same client: so a client
is held back at ``limit`` failures for one user name, and across all names
only at :data:`SPRAY_FACTOR` times that (one password tried on many names).
One person typing a wrong password no longer locks everyone behind the same
proxy out.

An attempt is counted when it starts (so twenty parallel guesses cannot all
slip in before the first one fails) and handed back when it succeeds. Past
``limit`` failures within ``window`` seconds, a client or a user name is
answered 429 with ``Retry-After`` until its oldest failure leaves the window,
without hashing anything. Durations come from a monotonic clock (injectable).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

LIMIT = 10
WINDOW_SECONDS = 60.0
# Bounds the memory a flood from many addresses can take: the keys not seen
# for longest are forgotten first.
MAX_KEYS = 10_000
# A client's failures across every user name may reach this many times the
# limit: enough for the people behind one untrusted proxy, still a bound.
SPRAY_FACTOR = 5


class Throttled(Exception):
    """Too many failed logins: answer 429 with ``Retry-After``."""

    def __init__(self, retry_after: int, who: str, first: bool = True) -> None:
        super().__init__(f"too many failed logins for {who}; retry in {retry_after} s")
        self.retry_after = retry_after
        self.first = first
        """The first refusal of this key in its window (the one worth a log line)."""


@dataclass
class FailedLogins:
    limit: int = LIMIT
    window: float = WINDOW_SECONDS
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        # Keys refused since their oldest failure: a flood logs once, not per request.
        self._refused: dict[str, float] = {}
        self._lock = threading.Lock()

    def begin(self, client: str | None, user: str) -> tuple[str, ...]:
        """Count an attempt for ``client`` and ``user`` as failed until
        :meth:`succeeded`; :class:`Throttled` when either is over the limit."""
        where = f"client {client or 'unknown'}"
        keys = (f"user {user!r}", f"{where} as user {user!r}", where)
        with self._lock:
            now = self.clock()
            for key in keys:
                recent = self._recent(key, now)
                if len(recent) >= self.limit * (SPRAY_FACTOR if key == where else 1):
                    retry = max(1, math.ceil(recent[0] + self.window - now))
                    first = self._refused.get(key) != recent[0]
                    self._refused[key] = recent[0]
                    if len(self._refused) > MAX_KEYS:
                        self._refused.clear()
                    raise Throttled(retry, key, first)
            for key in keys:
                self._recent(key, now).append(now)
                self._failures.move_to_end(key)
            while len(self._failures) > MAX_KEYS:
                self._failures.popitem(last=False)
        return keys

    def succeeded(self, keys: tuple[str, ...]) -> None:
        """Hand back the attempt :meth:`begin` counted."""
        with self._lock:
            for key in keys:
                recent = self._failures.get(key)
                if recent:
                    recent.pop()

    def _recent(self, key: str, now: float) -> deque[float]:
        recent = self._failures.setdefault(key, deque())
        while recent and recent[0] <= now - self.window:
            recent.popleft()
        return recent
