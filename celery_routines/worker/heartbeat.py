"""Heartbeats: while a run's body runs, its worker keeps pushing the run's
``deadline_at`` forward, so ``routines_run_timeout`` means "no sign of life
for this long" rather than "the whole body must end within this long".

One small daemon thread per running body whose first heartbeat comes due
(in the process that runs the body: the pool child under prefork, the worker
under solo, the body's own thread under the threads pool), stopped with the
body. The claim only registers the run with the process's one watcher
thread, which starts the run's own thread when its first beat is due: a body
shorter than a third of its timeout (most) never costs a thread start, which
took a few milliseconds on a busy machine (``Thread.start`` waits for the new
thread to be scheduled).
A killed process takes its thread with it; a frozen one (SIGSTOP, a VM pause)
freezes it too, so in both cases the deadline stops moving and beat's lost
sweep declares the run lost one ``run_timeout`` after the last beat.

The thread waits with ``time.sleep`` in short slices, never with a timed
``Event.wait``/``Lock.acquire``: those hang under libfaketime (see the field
notes), and the soak steps clocks with it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from celery_routines.store.faults import cause_of
from celery_routines.worker.outage import is_connection_fault

logger = logging.getLogger("celery_routines.worker")

# The thread checks whether its body ended this often (seconds).
SLICE = 0.2
# The fraction of the run timeout between two heartbeats.
BEATS_PER_TIMEOUT = 3

Beat = Callable[[str, datetime], bool]
"""``(run_id, deadline_at) -> still running``: one heartbeat's write."""


def heartbeat_interval(run_timeout: float) -> float:
    """Seconds between two heartbeats: a third of the run timeout."""
    return max(run_timeout / BEATS_PER_TIMEOUT, 0.05)


class Heartbeat:
    """The heartbeat of one run; :meth:`stop` ends it (idempotent)."""

    def __init__(
        self, run_id: str, run_timeout: float, beat: Beat, clock: Callable[[], datetime]
    ) -> None:
        self.run_id = run_id
        self.run_timeout = run_timeout
        self.interval = heartbeat_interval(run_timeout)
        self._beat = beat
        self._clock = clock
        self._stopped = threading.Event()  # only ever polled, never waited on
        self.beats = 0
        self.due = time.monotonic() + self.interval  # its first beat
        # Built at launch: most runs end before their first beat, and
        # building a thread cost every run more than the rest of this object.
        self._thread: threading.Thread | None = None

    def start(self) -> Heartbeat:
        """Hand it to the watcher, which starts its thread when its first
        beat is due (never, if it is stopped before)."""
        _watch(self)
        return self

    def stop(self) -> None:
        self._stopped.set()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    @property
    def alive(self) -> bool:
        if self._thread is None:
            return not self._stopped.is_set()  # waiting for its first beat
        return self._thread.is_alive()

    def launch(self) -> None:
        """Start beating (the watcher calls it when the first beat is due)."""
        thread = threading.Thread(
            target=self._run, name=f"routines-heartbeat-{self.run_id[:8]}", daemon=True
        )
        thread.start()
        # Set once started: a thread not yet started is not alive, and this
        # heartbeat would look ended in between.
        self._thread = thread

    def _run(self) -> None:
        next_at = self.due
        while not self._stopped.is_set():
            left = next_at - time.monotonic()
            if left > 0:
                time.sleep(min(SLICE, left))
                continue
            next_at = time.monotonic() + self.interval
            try:
                deadline = self._clock() + timedelta(seconds=self.run_timeout)
                running = self._beat(self.run_id, deadline)
            except Exception as error:
                # A database hiccup costs one heartbeat, not the body: the
                # next one (a third of the timeout later) tries again.
                if is_connection_fault(error):
                    logger.warning(
                        "heartbeat of run %s could not reach the database (%s); the next one "
                        "in %.0f s tries again",
                        self.run_id,
                        cause_of(error),
                        self.interval,
                    )
                else:
                    logger.warning("heartbeat of run %s failed", self.run_id, exc_info=True)
                continue
            self.beats += 1
            if not running:
                logger.warning(
                    "run %s is no longer running in the database (declared lost or replaced "
                    "while its body runs); its heartbeat stops",
                    self.run_id,
                )
                return


_running: dict[str, Heartbeat] = {}
_lock = threading.Lock()
# Heartbeats whose first beat is not due yet, and the thread watching them.
_waiting: list[Heartbeat] = []
_watcher: threading.Thread | None = None


def _watch(heartbeat: Heartbeat) -> None:
    global _watcher
    with _lock:
        _waiting.append(heartbeat)
        if _watcher is not None and _watcher.is_alive():
            return
        _watcher = threading.Thread(target=_watch_loop, name="routines-watcher", daemon=True)
    _watcher.start()


def _watch_loop() -> None:
    """Start each waiting heartbeat's thread when its first beat is due; drop
    the ones stopped before that. Sleeps in slices (see the module docstring)."""
    while True:
        now = time.monotonic()
        with _lock:
            due = [h for h in _waiting if h.stopped or h.due <= now]
            _waiting[:] = [h for h in _waiting if not (h.stopped or h.due <= now)]
            nearest = min((h.due for h in _waiting), default=now + SLICE)
        for heartbeat in due:
            if not heartbeat.stopped:
                try:
                    heartbeat.launch()
                except Exception:
                    logger.exception("could not start the heartbeat of run %s", heartbeat.run_id)
        time.sleep(min(SLICE, max(nearest - time.monotonic(), 0.001)))


def start(run_id: str, run_timeout: float, beat: Beat, clock: Callable[[], datetime]) -> Heartbeat:
    """Start the heartbeat of ``run_id`` (replacing a previous one of it)."""
    heartbeat = Heartbeat(run_id, run_timeout, beat, clock)
    with _lock:
        previous = _running.pop(run_id, None)
        _running[run_id] = heartbeat
    if previous is not None:
        previous.stop()
    return heartbeat.start()


def stop(run_id: str | None) -> None:
    """Stop the heartbeat of ``run_id`` if this process runs one."""
    if run_id is None:
        return
    with _lock:
        heartbeat = _running.pop(run_id, None)
    if heartbeat is not None:
        heartbeat.stop()


def forget_all() -> None:
    """In a freshly forked pool child: the parent's heartbeats are not ours
    (their threads did not survive the fork)."""
    global _watcher
    with _lock:
        _running.clear()
        _waiting.clear()
        _watcher = None
