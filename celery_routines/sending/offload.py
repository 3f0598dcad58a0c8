"""Publishing in other processes: ``routines_publish_processes``.

One beat is one Python interpreter: claiming, deciding and writing a burst's
runs and Celery's ``send_task`` for each take turns on one core. With this
set, beat forks that many publishing processes when its tick engine is
built; each chunk of messages is handed to one of them through a pipe, in
turn. A publishing process sends its chunk with the publisher
``routines_publish`` names (``send_task`` by default: the same messages,
signals and routing, since it is a fork of beat with beat's app) and answers
with each message's error or none. While they publish, beat prepares the
next chunk and writes the next batch.

The guarantees do not move: a chunk's run rows are committed before it is
handed over and marked sent only after its answer comes back, as with a
publisher in beat's own process. If a publishing process is gone (killed,
ended by a signal between chunks, or it died), beat stops handing it chunks,
and publishes in its own process once none is left; a chunk whose answer
never came is sent again from beat's
process, since nobody knows which of its messages the broker took (one that
arrives twice is refused by the worker's claim on its run row).
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from multiprocessing.connection import Connection, Pipe
from types import FrameType
from typing import NoReturn

from celery import Celery, signals
from celery.platforms import close_open_fds
from celery.utils.log import iter_open_logger_fds

from celery_routines.config import Settings
from celery_routines.sending.direct import publisher_for
from celery_routines.sending.publish import OutgoingRun, PendingErrors, Publisher

logger = logging.getLogger("celery_routines.beat")

# How long closing waits for a publishing process to finish its chunk.
CLOSE_TIMEOUT_SECONDS = 10.0


class ProcessPublisher(Publisher):
    """A :class:`Publisher` whose sends happen in forked processes.

    ``make_inner`` builds the publisher that sends: in each child, after the
    fork (so it opens its own broker connection), and in this process once
    no child is left.
    """

    # The tick hands it the next chunk before this one's answer (tick/send.py).
    in_background = True

    def __init__(
        self, app: Celery, make_inner: Callable[[], Publisher], processes: int = 1
    ) -> None:
        # The tick engine revokes through its publisher's app (overlap=replace).
        self.app = app
        self._make_inner = make_inner
        self._local: Publisher | None = None
        self._children: list[_Child] = []
        for number in range(processes):
            self._children.append(_Child(make_inner, number, self._children))
        # Every fork before any thread of ours: a fork copies a thread's locks
        # as they are (Python 3.12 warns of it), never the thread.
        for child in self._children:
            child.start_writing()
        logger.info(
            "forked %d publishing process(es) (pid %s): each chunk of a tick's messages is"
            " sent by one of them",
            processes,
            ", ".join(str(child.pid) for child in self._children),
        )
        self._turn = 0

    @property
    def pids(self) -> list[int]:
        """The publishing processes beat still hands chunks to."""
        return [child.pid for child in self._children if child.alive]

    def publish(self, run: OutgoingRun) -> None:
        self._in_process().publish(run)

    def publish_many(self, runs: Sequence[OutgoingRun]) -> list[Exception | None]:
        return self.begin_publish_many(runs)()

    def begin_publish_many(self, runs: Sequence[OutgoingRun]) -> PendingErrors:
        """Hand ``runs`` to the next publishing process; the call returned
        waits for its answer (or, that process gone, sends them from here)."""
        children = [child for child in self._children if child.alive]
        if not children or not runs:
            return self._sent_here(runs)
        self._turn += 1
        child = children[self._turn % len(children)]
        try:
            pending = child.ask(runs)
        except Exception as exc:
            # Arguments that only Celery's own serializer (say, pickle of a
            # local class) can encode go out from beat's process.
            logger.debug("%d run(s) sent from beat's own process: %s", len(runs), exc)
            return self._sent_here(runs)

        def answer() -> list[Exception | None]:
            errors = pending()
            if errors is None:
                # Unanswered: beat sends them. A child told to stop answers the
                # chunk it holds, so none of these went out; one that died may
                # have sent some (the worker's claim refuses a second message).
                logger.log(
                    logging.INFO if child.stopped else logging.WARNING,
                    "sending %d run(s) from beat's own process%s",
                    len(runs),
                    "" if child.stopped else " (again: its publishing process died with them)",
                )
                return self._in_process().publish_many(runs)
            return errors

        return answer

    def _sent_here(self, runs: Sequence[OutgoingRun]) -> PendingErrors:
        errors = self._in_process().publish_many(runs) if runs else []
        return lambda: errors

    def _in_process(self) -> Publisher:
        if self._local is None:
            self._local = self._make_inner()
        return self._local

    def close(self) -> None:
        for child in self._children:
            child.close()
        if self._local is not None:
            self._local.close()
            self._local = None


STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


class _Child:
    """One publishing process, its pipe, and the thread that writes to it."""

    def __init__(
        self, make_inner: Callable[[], Publisher], number: int, older: list[_Child]
    ) -> None:
        ours, theirs = Pipe(duplex=True)
        # The child closes beat's ends of every pipe: an older child reads
        # end-of-file only once no process holds beat's end of its pipe.
        beats_ends = [ours, *(child._pipe for child in older if child._pipe is not None)]
        self.name = f"celery-routines-publisher-{number}"
        # A bare fork, not multiprocessing's Process: that one runs every
        # after-fork hook registered with multiprocessing in the child, and
        # multiprocessing's exit handler in beat would wait for the children.
        # A stop signal sent to the group right after the fork would reach the
        # child before it sets its handlers (Python's own: exit 1 on Ctrl-C,
        # killed on SIGTERM), and look like a crash. Held back across the
        # fork; the child takes them once its handlers are set.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            self.pid = os.fork()
            if self.pid == 0:
                _run_child(make_inner, theirs, beats_ends, held)  # never returns
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        theirs.close()  # the child holds it now: end-of-file here means the child is gone
        self._exited = False
        self._status: int | None = None
        self._pipe: Connection | None = ours
        self._asked = 0
        self._answers: dict[int, list[Exception | None]] = {}
        self._reading = threading.Lock()
        # A chunk is written to the pipe on a thread: the pipe holds less than
        # a chunk, and beat must not wait on the child to hand over the next.
        self._to_write: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._writer = threading.Thread(
            target=self._write_requests, name=f"{self.name}-pipe", daemon=True
        )

    def start_writing(self) -> None:
        self._writer.start()

    @property
    def alive(self) -> bool:
        return self._pipe is not None

    def ask(self, runs: Sequence[OutgoingRun]) -> Callable[[], list[Exception | None] | None]:
        """Hand ``runs`` over (raises if they cannot be pickled); the call
        returned waits for the answer, None if the child is gone first."""
        self._asked += 1
        asked = self._asked
        payload = pickle.dumps((asked, list(runs)), protocol=pickle.HIGHEST_PROTOCOL)
        self._to_write.put(payload)
        return lambda: self._answer(asked)

    def _answer(self, asked: int) -> list[Exception | None] | None:
        with self._reading:
            while asked not in self._answers and self._pipe is not None:
                try:
                    answered, errors = pickle.loads(self._pipe.recv_bytes())
                except (EOFError, OSError) as exc:
                    self._gone(exc)
                    break
                self._answers[answered] = errors
            errors = self._answers.pop(asked, None)
            for stale in [n for n in self._answers if n < asked]:
                del self._answers[stale]  # asked by a tick that failed before it read them
        return errors

    def _write_requests(self) -> None:
        while (payload := self._to_write.get()) is not None:
            pipe = self._pipe
            if pipe is None:
                continue  # the reader finds the child gone and sends from beat
            try:
                pipe.send_bytes(payload)
            except OSError:
                continue  # the same: the reader sees its end-of-file

    @property
    def stopped(self) -> bool:
        """Ended by a stop signal between chunks (exit status 0)."""
        return self._exited and self._status == 0

    def _gone(self, exc: BaseException) -> None:
        self._drop_pipe()
        self._reap(timeout=1.0)  # its pipe closes as it exits: the status follows
        if self.stopped:
            # Told to stop (SIGTERM, Ctrl-C to the group) between two chunks.
            logger.info(
                "the publishing process %s (pid %s) stopped; beat sends from its own process",
                self.name,
                self.pid,
            )
            return
        logger.error(
            "the publishing process %s (pid %s) is gone (%s: %s; exit status %s); beat hands"
            " it no more chunks",
            self.name,
            self.pid,
            type(exc).__name__,
            exc,
            "unknown" if self._status is None else self._status,
        )

    def _drop_pipe(self) -> None:
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            pipe.close()

    def close(self) -> None:
        self._to_write.put(None)
        self._writer.join(timeout=CLOSE_TIMEOUT_SECONDS)
        with self._reading:
            # End-of-file for the child: it closes its broker connection and exits.
            self._drop_pipe()
        if not self._reap(timeout=CLOSE_TIMEOUT_SECONDS):
            with suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self._reap(timeout=CLOSE_TIMEOUT_SECONDS)

    def _reap(self, timeout: float) -> bool:
        """Wait (up to ``timeout``) for the child's exit; True once it exited."""
        deadline = time.monotonic() + timeout
        while not self._exited:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler)
                pid, status = self.pid, None
            if pid == self.pid:
                self._exited = True
                # A negative code is the signal that killed it.
                self._status = None if status is None else os.waitstatus_to_exitcode(status)
            elif time.monotonic() >= deadline:
                return False
            else:
                time.sleep(0.02)
        return True


def _run_child(
    make_inner: Callable[[], Publisher],
    pipe: Connection,
    beats_ends: list[Connection],
    mask: Iterable[int],
) -> NoReturn:
    """The forked child: serve, then leave without running beat's exit
    handlers or finalizers (they are beat's, for beat's connections)."""
    code = 1
    try:
        _serve(make_inner, pipe, beats_ends, mask)
        code = 0
    except SystemExit as stopped:
        code = 0 if stopped.code in (None, 0) else 1
    except BaseException:
        logger.exception("publishing process %d failed", os.getpid())
    finally:
        os._exit(code)


def _serve(
    make_inner: Callable[[], Publisher],
    pipe: Connection,
    beats_ends: list[Connection],
    mask: Iterable[int],
) -> None:
    """A publishing process: answers each chunk until beat closes its end."""
    for end in beats_ends:
        end.close()
    # Every other descriptor beat held is closed, as Celery does for a beat it
    # embeds in a worker: stdio, the log handlers' streams and this pipe stay;
    # beat's database and broker sockets, its metrics port, are beat's alone.
    close_open_fds(
        [sys.__stdin__, sys.__stdout__, sys.__stderr__, pipe.fileno(), *iter_open_logger_fds()]
    )
    # A SIGTERM or Ctrl-C (sent to the whole process group by systemd or a
    # terminal) ends it between chunks, never inside one: the chunk it holds is
    # answered first. Beat sends whatever it hands over later itself.
    busy = threading.Event()
    told_to_stop = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        told_to_stop.set()
        if not busy.is_set():
            raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a signal held back arrives now
    publisher = make_inner()
    try:
        while not told_to_stop.is_set():
            try:
                asked, runs = pickle.loads(pipe.recv_bytes())
            except EOFError:
                return
            busy.set()
            try:
                errors = [_portable(e) for e in publisher.publish_many(runs)]
            except Exception as exc:
                errors = [_portable(exc)] * len(runs)
            pipe.send_bytes(pickle.dumps((asked, errors), protocol=pickle.HIGHEST_PROTOCOL))
            busy.clear()
    finally:
        publisher.close()


def _portable(error: Exception | None) -> Exception | None:
    """The error as beat can unpickle it, its text kept."""
    if error is None:
        return None
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


def beats_publisher(app: Celery, settings: Settings) -> Publisher:
    """Beat's publisher: the one ``routines_publish`` names, in
    ``routines_publish_processes`` forked processes when that is set."""

    def in_this_process() -> Publisher:
        # Beat never reads a result (see publish.results_never_awaited).
        return publisher_for(app, settings, subscribe_to_results=False)

    if settings.publish_processes and not publishing_processes(settings):
        logger.warning(
            "routines_publish_processes = %d ignored: this beat is embedded in a worker"
            " (celery worker -B), and publishes in its own process",
            settings.publish_processes,
        )
    elif settings.publish_processes:
        return monitored(
            ProcessPublisher(app, in_this_process, settings.publish_processes), settings
        )
    return monitored(in_this_process(), settings)


def publishing_processes(settings: Settings) -> int:
    """How many processes beat publishes in: ``routines_publish_processes``,
    or none in a beat embedded in a worker (what the Beats page shows)."""
    return 0 if _embedded_in_a_worker else settings.publish_processes


def monitored(publisher: Publisher, settings: Settings) -> Publisher:
    """With sentry_sdk loaded by the application, every run gets its Sentry
    Crons check-in in beat's own process (integrations/sentry.py)."""
    if "sentry_sdk" not in sys.modules:
        return publisher
    from celery_routines.integrations.sentry import CronsPublisher

    return CronsPublisher(publisher, settings)


# A beat embedded in a worker (`celery worker -B`, Celery's development set-up)
# forks no publishing process. A worker -B stopped by a SIGTERM to its process
# group can hang at exit in billiard's pool finalizer (a lock held by a pool
# process the signal killed): 2 of 3 tries without publishing processes, 5
# of 5 with them. Not ours to fix; not made likelier by us either.
_embedded_in_a_worker = False


@signals.beat_embedded_init.connect(weak=False)
def _note_embedded(**_: object) -> None:
    global _embedded_in_a_worker
    _embedded_in_a_worker = True
