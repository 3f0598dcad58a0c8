"""A ``celery worker -B`` that always stops: with its beat, and on a signal.

Two ways a worker with an embedded beat used to run on or hang:

- **Its beat died.** ``worker -B`` runs beat in a billiard child process. A
  beat that cannot start (a missing extra, an unreachable database) ends that
  child with its one-line error, and Celery's worker runs on without a beat:
  nothing is ever sent again and nothing says so. :func:`watch_embedded_beat`
  watches the child from the worker's main process; when it ends on its own
  (not because the worker is stopping), the worker stops with status 1.

- **A SIGTERM to the whole process group.** ``timeout``, systemd's default
  ``KillMode=control-group`` and supervisord's ``stopasgroup`` signal every
  process of the group, the pool's processes too, which die at once
  (celery/celery#2700). A pool process killed while it holds the pool's
  queue lock never releases it, and billiard's pool finalizer, run at exit,
  waits on that lock forever (``Pool._help_stuff_finish``; the same bug as
  ``multiprocessing.Pool``'s python/cpython#96062), as does, earlier, the
  pool's stop joining its task handler (``Pool._stop_task_handler``), or,
  once the other pool processes block on that lock as they exit, its
  processes (``Pool.join``) or a free slot (``Pool.apply_async``, on a
  transport read synchronously); those two count as stuck only once a pool
  process has been seen killed by a signal with the stop, so a warm shutdown
  still waits for running tasks. A plain
  Celery ``worker -B`` hangs the same way. A watcher started when the worker
  is ready sees the main thread wait there once the worker is stopping, and
  ends the process with the worker's exit status, its logs flushed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

from billiard.process import BaseProcess
from celery import signals
from celery.bootsteps import RUN
from celery.worker import WorkController
from celery.worker import state as worker_state

logger = logging.getLogger("celery_routines.worker")

# How often the watchers look.
POLL_SECONDS = 0.5
SIGNAL_GRACE_SECONDS = 1.0
# How long the main thread may wait on the dead lock before the process ends:
# the finalizer drains the queue in a few milliseconds when the lock is free.
STUCK_SECONDS = 3.0
# billiard's frames that wait on a lock no live process will release: the
# finalizer draining the queue at exit, and, earlier, the pool's stop joining
# its task handler thread, which waits on that lock to put its sentinel.
STUCK_IN = frozenset({"_help_stuff_finish", "_stop_task_handler"})
STUCK_IN_LIBRARY = "billiard"
# Where a warm shutdown rightly waits for running tasks to free the pool, and
# where it waits forever once a group SIGTERM killed a pool process holding
# the result queue's lock: the others then block as they exit, no slot ever
# frees, and the main thread waits in the pool's stop joining its processes
# or, on a transport read synchronously (kombu's filesystem, for one), in
# apply_async for a free slot. Stuck there only once a pool process has
# been seen killed by a signal with the stop.
WAITS_ON_THE_POOL = frozenset({("join", "pool.py"), ("apply_async", "pool.py")})

_connected = False


def connect() -> None:
    """Connect both watchers (idempotent), in the worker's main process."""
    global _connected
    if _connected:
        return
    signals.worker_ready.connect(watch_embedded_beat, weak=False)
    signals.worker_shutdown.connect(watch_exit, weak=False)
    _connected = True


def runs_our_beat(worker: object) -> bool:
    """Whether this worker embeds celery-routines' beat (``-B`` with our
    scheduler): a worker with Celery's own beat is left as Celery made it."""
    if getattr(worker, "beat", None) is None:
        return False
    scheduler = getattr(worker, "scheduler", None)
    if not isinstance(scheduler, str):
        scheduler = f"{getattr(scheduler, '__module__', '')}.{getattr(scheduler, '__name__', '')}"
    return scheduler == "routines" or scheduler.startswith("celery_routines")


def watch_embedded_beat(sender: object = None, **_: object) -> None:
    """``worker_ready``: watch the embedded beat process, if it is ours."""
    worker = getattr(sender, "controller", None)
    beat = getattr(worker, "beat", None)
    # A threaded beat dies with the worker; a billiard child has an exit code.
    if not runs_our_beat(worker):
        return
    # From now on: the pool can get stuck before the worker says it has shut down.
    _start_exit_watch(worker, exitcode=None)
    if not hasattr(beat, "exitcode"):
        return
    threading.Thread(
        target=_watch_beat, args=(worker, beat), name="routines-beat-watch", daemon=True
    ).start()


def _stopping(worker: object) -> bool:
    blueprint = getattr(worker, "blueprint", None)
    # Celery's own test: a warm shutdown's status is 0, which is falsy.
    return (
        _set(worker_state.should_stop)
        or _set(worker_state.should_terminate)
        or (blueprint is not None and blueprint.state != RUN)
    )


def _set(flag: object) -> bool:
    # Not `flag not in (None, False)`: 0 == False.
    return flag is not None and flag is not False


def _watch_beat(worker: WorkController, beat: BaseProcess) -> None:
    while True:
        status = beat.exitcode  # polls the child (WNOHANG), never blocks
        if _stopping(worker):
            return
        if status is not None:
            # A signal sent to the whole group reaches beat and the worker at
            # once: give the worker's handler time to say it is stopping.
            time.sleep(SIGNAL_GRACE_SECONDS)
            if _stopping(worker):
                return
            break
        time.sleep(POLL_SECONDS)
    logger.error(
        "the embedded beat (celery worker -B) ended with status %s (its error is above): "
        "stopping the worker with status 1 rather than running on with no beat",
        status,
    )
    # Read by the worker's event loop within a second: a warm shutdown, then exit 1.
    worker_state.should_stop = 1


def watch_exit(sender: WorkController | None = None, **_: object) -> None:
    """``worker_shutdown``: the worker has stopped; from here the process only
    exits. Watch that it does (in a worker that embeds our beat)."""
    if not runs_our_beat(sender):
        return
    exitcode = getattr(sender, "exitcode", None)
    _start_exit_watch(sender, exitcode=0 if exitcode is None else int(exitcode))


_exit_watch_started = threading.Lock()


def _start_exit_watch(worker: WorkController, exitcode: int | None) -> None:
    """One watcher per process, from ``worker_ready`` (or, when the worker
    never got ready, from ``worker_shutdown``)."""
    if not _exit_watch_started.acquire(blocking=False):
        return
    threading.Thread(
        target=_watch_exit,
        args=(threading.main_thread(), worker, exitcode),
        name="routines-exit-watch",
        daemon=True,
    ).start()


def _exit_status(worker: WorkController) -> int:
    """The status the worker exits with: its own, else the one its signal
    handler chose (warm shutdown: 0 for SIGTERM, 1 for SIGINT)."""
    for value in (getattr(worker, "exitcode", None), worker_state.should_stop):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def _watch_exit(main: threading.Thread, worker: WorkController, exitcode: int | None) -> None:
    stuck_since: float | None = None
    stop_began: float | None = None
    pool = PoolProcesses(worker)
    while True:
        pool.look()
        stopping = _stopping(worker)
        if stopping and stop_began is None:
            stop_began = time.monotonic()
        if (
            stopping
            and stop_began is not None
            and main.ident is not None
            and _waits_on_dead_lock(main.ident, pool.killed_with_the_stop(stop_began))
        ):
            stuck_since = stuck_since or time.monotonic()
            if time.monotonic() - stuck_since >= STUCK_SECONDS:
                break
        else:
            stuck_since = None
        time.sleep(POLL_SECONDS)
    exitcode = _exit_status(worker) if exitcode is None else exitcode
    logger.warning(
        "worker exit stuck in billiard's pool shutdown for %.0f s: a pool process was "
        "killed while holding the pool's queue lock (a SIGTERM sent to the whole process "
        "group reaches the pool's processes too; send it to the main process, or SIGINT: "
        "celery/celery#2700); ending the process with status %d",
        STUCK_SECONDS,
        exitcode,
    )
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exitcode)


def _waits_on_dead_lock(ident: int, pool_process_killed: bool) -> bool:
    frame = sys._current_frames().get(ident)
    while frame is not None:
        code = frame.f_code
        if STUCK_IN_LIBRARY in code.co_filename:
            if code.co_name in STUCK_IN:
                return True
            if (
                pool_process_killed
                and (code.co_name, os.path.basename(code.co_filename)) in WAITS_ON_THE_POOL
            ):
                return True
        frame = frame.f_back
    return False


class PoolProcesses:
    """The prefork pool's live processes, and when one was last seen ended by
    a signal: a process the OOM killer ended an hour ago says nothing of this
    stop; one killed with the stop's signal does. An ended process is let go
    once looked at, so a pool that recycles its processes keeps nothing."""

    def __init__(self, worker: WorkController, clock: Callable[[], float] = time.monotonic) -> None:
        self._worker = worker
        self._clock = clock
        self._live: dict[int, BaseProcess] = {}
        # Ended, but still in the pool's list until the pool joins them.
        self._ended: set[int] = set()
        self._last_killed_at: float | None = None

    def look(self) -> None:
        billiard_pool = getattr(getattr(self._worker, "pool", None), "_pool", None)
        listed = {p.pid: p for p in list(getattr(billiard_pool, "_pool", None) or ()) if p.pid}
        self._ended &= listed.keys()
        for pid, process in listed.items():
            if pid not in self._ended:
                self._live.setdefault(pid, process)
        for pid, process in list(self._live.items()):
            code = _exit_code(process)
            if code is None:
                continue
            del self._live[pid]
            self._ended.add(pid)
            if code < 0:  # billiard's exit code of a process a signal ended: minus its number
                self._last_killed_at = self._clock()

    def killed_with_the_stop(self, stop_began: float) -> bool:
        """Whether a pool process was seen killed by a signal since shortly
        before the stop began (a group signal reaches them together)."""
        killed = self._last_killed_at
        return killed is not None and killed >= stop_began - SIGNAL_GRACE_SECONDS


def _exit_code(process: BaseProcess) -> int | None:
    with contextlib.suppress(Exception):
        code = process.exitcode
        return code if isinstance(code, int) else None
    return None
