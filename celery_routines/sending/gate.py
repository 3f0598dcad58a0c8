"""The Redis idempotency gate in front of the database's unique key.

``SET key holder NX EX ttl`` lets one beat through per window cheaply. It is
never the only record of a claim: its TTL is no longer than the routine claim,
and the run row in the database is the truth. When Redis is unreachable the
gate steps aside (logged once) and the database arbitrates alone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

logger = logging.getLogger("celery_routines.gate")

KEY_PREFIX = "celery_routines:window:"


class Gate(Protocol):
    def acquire(self, keys: Sequence[str]) -> list[bool]:
        """For each key: True if this beat may go ahead with that window."""
        ...

    def close(self) -> None: ...


class OpenGate:
    """No Redis configured: every window goes on to the database's unique key."""

    def acquire(self, keys: Sequence[str]) -> list[bool]:
        return [True] * len(keys)

    def close(self) -> None:
        pass


class RedisGate:
    def __init__(self, url: str, holder: str, ttl_seconds: float, client: Any = None) -> None:
        if client is None:
            import redis

            client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self.client = client
        self.holder = holder
        self.ttl_ms = max(1, int(ttl_seconds * 1000))
        self.degraded = False

    def acquire(self, keys: Sequence[str]) -> list[bool]:
        if not keys:
            return []
        import redis

        try:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.set(KEY_PREFIX + key, self.holder, nx=True, px=self.ttl_ms)
            answers = pipe.execute()
        except redis.RedisError as exc:
            if not self.degraded:
                logger.warning(
                    "idempotency gate degraded: Redis unreachable (%s); "
                    "the database's unique key arbitrates alone until it returns",
                    exc,
                )
                self.degraded = True
            return [True] * len(keys)
        if self.degraded:
            logger.warning("idempotency gate restored: Redis answers again")
            self.degraded = False
        return [bool(answer) for answer in answers]

    def close(self) -> None:
        self.client.close()
