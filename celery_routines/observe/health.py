"""Health probes for beat: ``GET /livez`` and ``GET /readyz``.

Kubernetes and compose ask two questions, and they have different answers:

- **alive** (``/livez``): is the tick loop turning? 200 while a tick finished
  (successfully or not: a tick that fails on a database outage still turns
  the loop, and restarting beat would not bring the database back) within
  ``3 x max(beat_max_loop_interval, 5 s)``; 503 otherwise, for a loop stuck
  in a statement that never returns or a broker call without a timeout.
  A beat that just started counts from its start.
- **ready** (``/readyz``): can this beat do its job? 200 when the store
  answers, its schema is the revision this code needs, every routine
  declared in this beat's code is stored, and this beat has finished a tick
  without error; otherwise 503 with one line saying which.

Served from a daemon thread with the standard library's ``http.server``, on
``routines_health_port`` (``127.0.0.1`` unless ``routines_health_address``
says otherwise) and also on the metrics port when that is set. The store is
asked at most once a second, at most ``STORE_ANSWER_SECONDS`` per question:
a database that hangs makes ``/readyz`` say so instead of hanging the probe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from celery_routines.errors import ConfigurationError

if TYPE_CHECKING:
    from celery_routines.store import Store

logger = logging.getLogger("celery_routines.health")

PORT_SETTING = "routines_health_port"
# A tick may take this many loop intervals before beat counts as stuck.
STALE_LOOPS = 3
# ... and never less than this many seconds per loop interval.
MIN_LOOP_SECONDS = 5.0
# The store's answer is reused this long (probes of several kubelets, the metrics port).
STORE_ANSWER_REUSED = 1.0
STORE_ANSWER_SECONDS = 3.0
PROBES = ("/livez", "/readyz")


class BeatHealth:
    """What the probes answer, fed by the tick loop (:meth:`tick_finished`)."""

    def __init__(
        self,
        max_loop_interval: float,
        check_store: Callable[[], str | None],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stale_after = STALE_LOOPS * max(float(max_loop_interval), MIN_LOOP_SECONDS)
        self._check_store = check_store  # None when fine, else why not
        self._monotonic = monotonic
        self._last_tick = monotonic()  # a starting beat is given its first ticks' time
        self._ticked_ok = False
        self._lock = threading.Lock()
        self._store_answer: tuple[float, str | None] | None = None
        self._store_check: threading.Thread | None = None

    def tick_finished(self, ok: bool) -> None:
        self._last_tick = self._monotonic()
        if ok:
            self._ticked_ok = True

    def live(self) -> tuple[bool, str]:
        idle = self._monotonic() - self._last_tick
        if idle <= self.stale_after:
            return True, f"ok: last tick finished {idle:.1f} s ago"
        return False, (
            f"tick loop stuck: no tick finished for {idle:.0f} s "
            f"(limit {self.stale_after:.0f} s = {STALE_LOOPS} x max(beat_max_loop_interval, "
            f"{MIN_LOOP_SECONDS:.0f} s))"
        )

    def ready(self) -> tuple[bool, str]:
        problem = self._store_problem()
        if problem is not None:
            return False, problem
        if not self._ticked_ok:
            return False, "this beat has not finished a tick yet"
        return True, "ok"

    def _store_problem(self) -> str | None:
        with self._lock:
            answer, now = self._store_answer, self._monotonic()
            if answer is not None and now - answer[0] < STORE_ANSWER_REUSED:
                return answer[1]
            check = self._store_check
            if check is None or not check.is_alive():
                check = self._store_check = threading.Thread(
                    target=self._ask_store, name="routines-health-store", daemon=True
                )
                check.start()
        check.join(STORE_ANSWER_SECONDS)
        if check.is_alive():
            return f"store did not answer within {STORE_ANSWER_SECONDS:g} s"
        answer = self._store_answer
        return answer[1] if answer is not None else "store not asked"

    def _ask_store(self) -> None:
        try:
            problem = self._check_store()
        except Exception as exc:
            problem = f"store unreachable: {type(exc).__name__}: {_first_line(exc)}"
        self._store_answer = (self._monotonic(), problem)

    def answer(self, path: str) -> tuple[int, str] | None:
        """The status and one-line body for a probe path, or None for another path."""
        path = path.split("?", 1)[0]
        if path == "/livez":
            ok, text = self.live()
        elif path == "/readyz":
            ok, text = self.ready()
        else:
            return None
        return (200 if ok else 503), text


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


def store_checker(
    store: Store,
    head_revision: str,
    declared_problem: Callable[[], str | None] | None = None,
) -> Callable[[], str | None]:
    """``None`` when ``store`` answers at the schema revision ``head_revision``
    and (``declared_problem``: beat's view) holds every routine declared in
    code; else why not."""
    from celery_routines.store.engine import app_argument
    from celery_routines.store.migrate import current_revision

    def check() -> str | None:
        revision = current_revision(store.engine)
        if revision is None:
            return (
                "the store's tables are missing (the database was dropped or recreated "
                "empty?): beat creates them and declares the code's routines at its next "
                f"tick; or run `celery -A {app_argument()} routines migrate` then "
                f"`celery -A {app_argument()} routines sync`"
            )
        if revision != head_revision:
            return f"schema is at {revision}, this code needs {head_revision}"
        if declared_problem is not None:
            return declared_problem()
        return None

    return check


def probe_handler(health: BeatHealth, base: type[BaseHTTPRequestHandler]) -> type:
    """A request handler answering the probes and handing other paths to ``base``
    (Prometheus' handler on the metrics port; 404 on the health port)."""

    class ProbeHandler(base):  # type: ignore[misc,valid-type]
        def do_GET(self) -> None:
            answered = health.answer(self.path)
            if answered is None:
                if base is BaseHTTPRequestHandler:
                    self._reply(404, f"not found; the probes are {' and '.join(PROBES)}")
                else:
                    super().do_GET()
                return
            self._reply(*answered)

        def _reply(self, status: int, text: str) -> None:
            body = (text + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a probe every few seconds is not news

    return ProbeHandler


class ProbeServer:
    """An HTTP server in a daemon thread (``serve`` binds, ``close`` stops)."""

    def __init__(
        self, handler: type, address: str, port: int, setting: str, what: str = "health probes"
    ) -> None:
        try:
            self.server = ThreadingHTTPServer((address, port), handler)
        except OSError as exc:
            raise ConfigurationError(
                f"{setting}: cannot serve {what} on {address}:{port}: {exc.strerror or exc}"
            ) from exc
        self.server.daemon_threads = True
        self.port = int(self.server.server_port)
        self.thread = threading.Thread(
            target=self.server.serve_forever, name=f"routines-{setting}", daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_health(health: BeatHealth, port: int, address: str) -> ProbeServer:
    server = ProbeServer(probe_handler(health, BaseHTTPRequestHandler), address, port, PORT_SETTING)
    logger.info(
        "celery-routines health probes on http://%s:%d/livez and /readyz", address, server.port
    )
    return server
