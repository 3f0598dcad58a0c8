"""The Redis idempotency gate in front of the database's unique key.

``SET key holder NX PX ttl`` lets one beat through per window cheaply. It is
never the only record of a claim: its TTL is no longer than the routine claim,
and the run row in the database is the truth. When Redis is unreachable the
gate steps aside (logged once) and the database arbitrates alone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from celery_routines.sending.redis_connect import redis_client

logger = logging.getLogger("celery_routines.gate")

KEY_PREFIX = "celery_routines:window:"

# Every key of a tick in one command: a pipeline of a thousand SETs cost the
# beat more to pack and parse than Redis took to run them (41 ms against 6-12
# ms per 1,000 keys here). The script is atomic, and each key keeps its own
# SET NX answer: 1 if this beat holds it, 0 if another holder has it. A key
# already holding this beat's id is this beat's: the answer of a command
# that ran was lost with its connection and redis-py sent it again, or a
# tick failed after the gate and before its rows; refused, this beat's own
# key held the window back from every beat until it expired.
ACQUIRE_SCRIPT = """
local answers = {}
for i, key in ipairs(KEYS) do
  local set = redis.call('SET', key, ARGV[1], 'NX', 'PX', ARGV[2])
  answers[i] = (set or redis.call('GET', key) == ARGV[1]) and 1 or 0
end
return answers
"""
# Keys per script call: bounds how long one call keeps Redis busy.
KEYS_PER_CALL = 1000


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
    def __init__(
        self,
        url: str,
        holder: str,
        ttl_seconds: float,
        client: Any = None,
        sentinel_master: str | None = None,
    ) -> None:
        if client is None:
            # One server, or the master of a Sentinel group (sentinel://...):
            # after a failover the next call finds the new master.
            client = redis_client(url, sentinel_master)
        self.client = client
        self.holder = holder
        self.ttl_ms = max(1, int(ttl_seconds * 1000))
        self.degraded = False
        self._acquire = client.register_script(ACQUIRE_SCRIPT)

    def acquire(self, keys: Sequence[str]) -> list[bool]:
        if not keys:
            return []
        import redis

        try:
            answers = []
            for start in range(0, len(keys), KEYS_PER_CALL):
                answers.extend(
                    self._acquire(
                        keys=[KEY_PREFIX + key for key in keys[start : start + KEYS_PER_CALL]],
                        args=[self.holder, self.ttl_ms],
                    )
                )
        except redis.RedisError as exc:
            # Drop the pool's connections: the next call connects afresh and,
            # behind Sentinel, asks again which server is the master. A
            # master demoted by a failover keeps its clients connected and
            # fails the script with a READONLY *script* error, which redis-py
            # does not take for a failover (the gate stayed on the replica).
            self.client.connection_pool.disconnect()
            if not self.degraded:
                logger.warning(
                    "idempotency gate degraded: Redis unreachable or not the master (%s); "
                    "the database's unique key arbitrates alone until it returns",
                    _said(exc),
                )
                self.degraded = True
            return [True] * len(keys)
        if self.degraded:
            logger.warning("idempotency gate restored: Redis answers again")
            self.degraded = False
        return [bool(answer) for answer in answers]

    def close(self) -> None:
        self.client.close()


def _said(exc: Exception) -> str:
    """``exc`` in a few words, after its class: redis-py's MasterNotFoundError appends the
    repr of every Sentinel client it asked (kilobytes per line)."""
    return f"{type(exc).__name__}: " + str(exc).split(" : <redis", 1)[0][:300]
