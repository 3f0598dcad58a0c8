"""JSON notifications to ``routines_notify_url``: someone is told.

Metrics and events feed a dashboard; a notification reaches a person (a
Slack or PagerDuty webhook relay, Alertmanager's generic receiver, a small
service of your own). Each is one ``POST`` of a JSON object:

.. code-block:: json

    {"version": 1, "event": "final_failure", "routine": "nightly",
     "window": "2026-12-02T01:30:00+00:00", "run_id": "6f1c...", "state": "failed",
     "reason": "RuntimeError: boom", "at": "2026-12-02T01:30:04.120000+00:00",
     "panel_url": "https://ops.example.com/routines/routines/nightly", "details": {...}}

``event`` is one of :data:`EVENTS`. ``window``, ``run_id`` and ``state`` are
null when the event is about the routine, not one run. ``panel_url`` is
present when ``routines_panel_url`` is set.

Delivery is never on the caller's path: :meth:`Notifier.notify` puts the
payload on the URL's bounded queue and returns; a few daemon threads shared
by every URL of the process (:data:`SENDERS`) post them, one URL's in order
(one thread at a time serves a URL, one notification per turn), retrying a
failed post with backoff (1, 2, 4, ... 60 s, six tries), then dropping it.
A broken endpoint is logged at most once a minute (with how many
notifications it cost), never once per event; a full queue drops the newest
and says so the same way.

Posts go only where ``routines_notify_allowed_hosts`` allows
(:mod:`celery_routines.observe.notify_post`): a refused host or a redirect
is dropped at once, not retried. Every URL is logged masked
(:func:`~celery_routines.policy.notify_urls.shown_notify_url`).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

from celery_routines.clock import Clock, utc_now
from celery_routines.errors import NotifyRefused
from celery_routines.observe.notify_post import GuardedPoster
from celery_routines.policy.notify_hosts import SETTING as ALLOWED_HOSTS_SETTING
from celery_routines.policy.notify_hosts import NotifyHosts
from celery_routines.policy.notify_urls import shown_notify_url, usable_notify_url

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger("celery_routines.notify")

URL_SETTING = "routines_notify_url"
PANEL_SETTING = "routines_panel_url"
FINAL_FAILURE = "final_failure"
PAUSED = "paused"
SUSPENDED = "suspended"
INVALID = "invalid"
LOST = "lost"
DROPPED_WINDOWS = "dropped_windows"
EVENTS = (FINAL_FAILURE, PAUSED, SUSPENDED, INVALID, LOST, DROPPED_WINDOWS)
# Skip reasons that are a catch-up dropping windows (not an overlap or a lateness).
DROPPING_REASONS = frozenset({"catch_up_cap", "skip_to_next", "latest"})

QUEUE_LIMIT = 1000
# Threads that post for every URL of a process: one thread per URL made 301
# threads for 300 routines' own URLs. A broken endpoint holds one of them for
# at most its backoff (31 s) per notification, then the other URLs take turns.
SENDERS = 4
TRIES = 6
BACKOFF_START = 1.0
BACKOFF_CAP = 60.0
SAY_AT_MOST_EVERY = 60.0
# How long a routine's own notify_url, once read, is used without reading it again.
CACHE_SECONDS = 5.0
CACHE_LIMIT = 10_000

Poster = Callable[[str, bytes], None]
# Public addresses only: the default of routines_notify_allowed_hosts.
PUBLIC_ONLY = NotifyHosts()


def _iso(value: object) -> object:
    return value.isoformat() if isinstance(value, datetime) else value


class Notifier:
    """Posts one URL's notifications from the shared senders, in order, with
    retries."""

    def __init__(
        self,
        url: str,
        panel_url: str | None = None,
        *,
        clock: Clock = utc_now,
        post: Poster | None = None,
        allowed: NotifyHosts = PUBLIC_ONLY,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.shown_url = shown_notify_url(url)
        self.panel_url = panel_url.rstrip("/") if panel_url else None
        self._clock = clock
        self._post = post if post is not None else GuardedPoster(allowed)
        self._sleep = sleep
        self._monotonic = monotonic
        self._queue: queue.Queue[dict[str, object]] = queue.Queue(QUEUE_LIMIT)
        # True while the URL waits for a sender or one serves it: never two
        # senders at once, so its notifications go out in order.
        self._scheduled = False
        self._lock = threading.Lock()
        self._said_at: float | None = None
        self._unsaid_losses = 0
        self.delivered = 0
        self.dropped = 0

    def notify(
        self,
        event: str,
        routine: str,
        *,
        window: datetime | None = None,
        run_id: str | None = None,
        state: str | None = None,
        reason: str | None = None,
        **details: object,
    ) -> None:
        """Queue one notification; never blocks and never raises."""
        try:
            payload: dict[str, object] = {
                "version": 1,
                "event": event,
                "routine": routine,
                "window": _iso(window),
                "run_id": run_id,
                "state": state,
                "reason": reason,
                "at": self._clock().isoformat(),
            }
            if self.panel_url:
                payload["panel_url"] = f"{self.panel_url}/routines/{quote(routine, safe='')}"
            payload["details"] = {key: _iso(value) for key, value in details.items()}
            self._queue.put_nowait(payload)
            self._wake()
        except queue.Full:
            self._lost(1, "the queue is full (the endpoint is slower than the events)")
        except Exception:
            logger.exception("could not queue the %s notification of %s", event, routine)

    def _wake(self) -> None:
        with self._lock:
            if not self._scheduled:
                self._scheduled = True
                _senders.submit(self)

    def _serve_one(self) -> None:
        """Post the oldest notification (with its retries), then hand the
        URL back to the senders while more wait: a turn each."""
        try:
            payload = self._queue.get_nowait()
        except queue.Empty:
            payload = None
        if payload is not None:
            try:
                self._deliver(payload)
            except Exception:
                logger.exception("could not post a notification to %s", self.shown_url)
            finally:
                self._queue.task_done()
        with self._lock:
            # Checked under the lock notify() takes after its put: a
            # notification queued now is either seen here or wakes the URL.
            if self._queue.empty():
                self._scheduled = False
            else:
                _senders.submit(self)

    def _deliver(self, payload: dict[str, object]) -> None:
        body = json.dumps(payload).encode()
        wait = BACKOFF_START
        for attempt in range(1, TRIES + 1):
            try:
                self._post(self.url, body)
            except NotifyRefused as exc:  # trying again would not post it
                self._lost(1, str(exc))
                return
            except Exception as exc:
                if attempt == TRIES:
                    self._lost(1, f"{type(exc).__name__}: {exc}")
                    return
                self._say_failing(exc, wait)
                self._sleep(wait)
                wait = min(wait * 2, BACKOFF_CAP)
                continue
            self.delivered += 1
            if self._said_at is not None:
                logger.info("notifications reach %s again", self.shown_url)
                self._said_at = None
            return

    def _say_failing(self, exc: Exception, wait: float) -> None:
        now = self._monotonic()
        if self._said_at is not None and now - self._said_at < SAY_AT_MOST_EVERY:
            return
        self._said_at = now
        logger.warning(
            "could not post a notification to %s: %s: %s; retrying with backoff (next in "
            "%.0f s), this is said at most once a minute",
            self.shown_url,
            type(exc).__name__,
            exc,
            wait,
        )

    def _lost(self, count: int, why: str) -> None:
        self.dropped += count
        self._unsaid_losses += count
        now = self._monotonic()
        if self._said_at is not None and now - self._said_at < SAY_AT_MOST_EVERY:
            return
        self._said_at = now
        logger.error(
            "%d notification(s) to %s dropped: %s", self._unsaid_losses, self.shown_url, why
        )
        self._unsaid_losses = 0

    def flush(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until the queue is empty; True if it is."""
        deadline = self._monotonic() + timeout
        while self._queue.unfinished_tasks:
            if self._monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True


class Notifies(Protocol):
    """What is told of a moment a person must know (:class:`Notifier`, or
    :class:`Notifications`, which picks each routine's endpoint)."""

    def notify(
        self,
        event: str,
        routine: str,
        *,
        window: datetime | None = None,
        run_id: str | None = None,
        state: str | None = None,
        reason: str | None = None,
        **details: object,
    ) -> None: ...


class Notifications:
    """Each notification to its routine's own ``notify_url`` when it has one,
    else to ``routines_notify_url`` (``default``); none when neither is set.

    ``url_of`` reads a routine's ``notify_url`` (the store's
    ``streaks.notify_url``); a routine's answer is kept ``CACHE_SECONDS``,
    so a burst of events costs one read, and an edit is followed within
    that. A read that fails, or a stored value that is not a usable URL (the
    routine is then invalid, and says why), falls back to the default: a
    notification is never lost to its own configuration. Posting is the
    :class:`Notifier` of that URL (its own queue; the process's few sender
    threads take the URLs in turn), so a broken endpoint of one routine
    holds back another's notifications by one backoff at most, not for good.
    An own URL whose host is a refused address (``allowed``) falls back too.
    """

    def __init__(
        self,
        default: str | None,
        panel_url: str | None = None,
        url_of: Callable[[str], str | None] | None = None,
        *,
        allowed: NotifyHosts = PUBLIC_ONLY,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.default = default
        self.panel_url = panel_url
        self.allowed = allowed
        self._url_of = url_of
        self._monotonic = monotonic
        self._known: dict[str, tuple[float, str | None]] = {}
        self._said_at: float | None = None

    def url_for(self, routine: str) -> str | None:
        """Where ``routine``'s notifications go now, or None: nowhere."""
        if self._url_of is None:
            return self.default
        now = self._monotonic()
        known = self._known.get(routine)
        if known is not None and now - known[0] < CACHE_SECONDS:
            return known[1] or self.default
        fallback = shown_notify_url(self.default) or "nobody"
        try:
            own = usable_notify_url(self._url_of(routine))
        except Exception as exc:
            self._say(now, "could not read the notify_url of %s (%s: %s); notifying %s",
                      routine, type(exc).__name__, exc, fallback)  # fmt: skip
            return self.default
        refused = self.allowed.literal_refusal(own) if own else None
        if refused is not None:
            self._say(now, "the notify_url of %s is not used: %s; notifying %s",
                      routine, refused, fallback)  # fmt: skip
            own = None
        if len(self._known) >= CACHE_LIMIT:
            self._known.clear()
        self._known[routine] = (now, own)
        return own or self.default

    def _say(self, now: float, message: str, *args: object) -> None:
        if self._said_at is None or now - self._said_at >= SAY_AT_MOST_EVERY:
            self._said_at = now
            logger.warning(message, *args)

    def notify(self, event: str, routine: str, **fields: Any) -> None:
        """Queue one notification for ``routine``'s endpoint; never raises."""
        try:
            url = self.url_for(routine)
            if url is not None:
                notifier(url, self.panel_url, self.allowed).notify(event, routine, **fields)
        except Exception:
            logger.exception("could not queue the %s notification of %s", event, routine)


class _Senders:
    """The process's :data:`SENDERS` threads, started when first needed,
    taking the URLs that have notifications waiting in turn. Daemon threads
    rather than a ThreadPoolExecutor: its workers are joined at exit, so a
    post in its backoff would hold a stopping beat or worker for up to 31 s."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._ready: queue.Queue[Notifier] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def submit(self, notifier: Notifier) -> None:
        with self._lock:
            self._threads = [thread for thread in self._threads if thread.is_alive()]
            if len(self._threads) < self._size:
                thread = threading.Thread(target=self._run, name="routines-notify", daemon=True)
                self._threads.append(thread)
                thread.start()
        self._ready.put(notifier)

    def _run(self) -> None:
        while True:
            self._ready.get()._serve_one()


_senders = _Senders(SENDERS)
_notifiers: dict[tuple[str, str | None, NotifyHosts], Notifier] = {}
_notifiers_lock = threading.Lock()


def notifier(
    url: str, panel_url: str | None = None, allowed: NotifyHosts = PUBLIC_ONLY
) -> Notifier:
    """The process's notifier for ``url`` (one queue per URL)."""
    key = (url, panel_url, allowed)
    with _notifiers_lock:
        found = _notifiers.get(key)
        if found is None:
            found = _notifiers[key] = Notifier(url, panel_url, allowed=allowed)
    return found


def notifier_for(
    app: Celery | None, url_of: Callable[[str], str | None] | None = None
) -> Notifies | None:
    """Who notifies for ``app``: None when ``routines_notify_url`` is not set
    and no routine's own ``notify_url`` can be read (``url_of``: a store's
    ``streaks.notify_url``)."""
    from celery_routines.config import setting

    url = setting(app, URL_SETTING) or None
    panel = setting(app, PANEL_SETTING) or None
    if url is None and url_of is None:
        return None
    return Notifications(
        str(url) if url else None,
        str(panel) if panel else None,
        url_of,
        allowed=allowed_hosts(app),
    )


def allowed_hosts(app: Celery | None) -> NotifyHosts:
    """``routines_notify_allowed_hosts`` of ``app``; a value that does not
    read (beat refuses to start with it) allows public addresses only."""
    from celery_routines.config import setting

    try:
        return NotifyHosts.parse(setting(app, ALLOWED_HOSTS_SETTING))
    except ValueError as exc:
        logger.error("%s; notifications go to public addresses only", exc)
        return PUBLIC_ONLY


def forget_all() -> None:
    """A forked child starts without its parent's delivery threads."""
    global _senders
    with _notifiers_lock:
        _notifiers.clear()
        _senders = _Senders(SENDERS)
