"""The Redis gate's connection cut mid-command: the window is sent once, on
time, and beat goes on.

Two in-process beats with the gate on a real Redis and their store on a real
PostgreSQL (kombu's filesystem transport, an injected clock). At a window,
the first beat's gate connection is reset after its command reached Redis and
before the answer came back: Redis set the window's key for that beat, and
redis-py, told the connection was lost, sends the command again on a new one
(``answers_lost=1``); or that answer is lost too and the gate steps aside
for the tick (``answers_lost=2``).
"""

from __future__ import annotations

import logging
import select
import socket
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from celery_routines import Scheduler, register
from celery_routines.sending.gate import RedisGate
from tests.conftest import FakeClock
from tests.harness import filesystem_app, published

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

ROUTINES = ("poll-a", "poll-b")


class AnswerLost:
    """Resets the socket of the gate's next command once Redis has run it,
    before its answer is read."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import redis.connection

        self.armed = 0  # the next commands whose answers are lost
        self.cuts = 0
        original = redis.connection.Connection.read_response

        def read_response(connection: Any, *args: Any, **kwargs: Any) -> Any:
            if self.armed:
                self.armed -= 1
                self.cuts += 1
                sock = connection._sock
                # The answer, on its way back (here, over loopback, already in
                # the socket's buffer), is dropped with the connection.
                select.select([sock], [], [], 5)
                sock.recv(65536)
                sock.shutdown(socket.SHUT_RDWR)
            return original(connection, *args, **kwargs)

        monkeypatch.setattr(redis.connection.Connection, "read_response", read_response)


@pytest.fixture
def beats(tmp_path: Path, postgres_url: str, redis_url: str) -> Iterator[list[Scheduler]]:
    clock = FakeClock(datetime(2026, 11, 30, 12, 0, tzinfo=UTC))
    for name in ROUTINES:
        register("tasks.poll", timedelta(minutes=1), name=name, overlap="overlap")
    conf = {"routines_redis_url": redis_url, "routines_lock_ttl": 30}
    app = filesystem_app(tmp_path / "broker", postgres_url, **conf)
    running = [Scheduler(app, clock=clock) for _ in range(2)]
    running[0].clock = clock  # type: ignore[attr-defined]  # for the test's own use
    try:
        yield running
    finally:
        for beat in running:
            beat.close()


@pytest.mark.parametrize("answers_lost", [1, 2])
def test_a_gate_answer_lost_mid_command_neither_doubles_nor_delays_the_window(
    answers_lost: int,
    beats: list[Scheduler],
    tmp_path: Path,
    postgres_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock: FakeClock = beats[0].clock  # type: ignore[attr-defined]
    beats[0].tick()  # adopts: the first windows are 12:01
    gate = beats[0].engine.gate
    assert isinstance(gate, RedisGate)
    gate.acquire(["warm-up"])  # the script loaded: the cut meets the window's command
    cut = AnswerLost(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="celery_routines"):
        for minute in range(1, 4):
            clock.now = datetime(2026, 11, 30, 12, minute, tzinfo=UTC)
            cut.armed = answers_lost if minute == 1 else 0
            for beat in beats:
                beat.tick()
            sent = Counter(m["id"] for m in published(tmp_path / "broker"))
            # Every window of this minute went out in this minute, once.
            assert sum(sent.values()) == len(ROUTINES) * minute, (minute, sent)
    assert cut.cuts == answers_lost
    assert set(sent.values()) == {1}
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    if answers_lost == 1:  # redis-py sent it again at once, and this beat's keys let it through
        assert said == []
    else:  # the second try lost too: the gate steps aside, said in one line with the cause
        assert said == [
            (
                logging.WARNING,
                "idempotency gate degraded: Redis unreachable or not the master "
                "(ConnectionError: Connection closed by server.); the database's unique key "
                "arbitrates alone until it returns",
            ),
            (logging.WARNING, "idempotency gate restored: Redis answers again"),
        ]
        assert not [r for r in caplog.records if r.exc_info]
    engine = create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            late = conn.execute(
                text("SELECT count(*) FROM routine_runs WHERE sent_at > scheduled_for")
            ).scalar_one()
            runs = conn.execute(text("SELECT count(*) FROM routine_runs")).scalar_one()
    finally:
        engine.dispose()
    assert (runs, late) == (len(ROUTINES) * 3, 0)
