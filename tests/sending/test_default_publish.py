"""Issue 36, item 4: the default publish path stays ``send_task`` in beat's own
process (docs/performance.md, "Why the defaults are not the fastest path").

``routines_publish = "direct"`` puts on the broker the message ``send_task``
puts there *as Celery builds it* (tests/sending/test_direct_publish.py); what
other libraries add by wrapping ``Celery.send_task``, ``Task.apply_async`` or
kombu's ``Producer.publish`` never runs on it. Sentry's CeleryIntegration is
the common case: its ``send_task`` patch adds ``sentry-task-enqueued-time``
to every message (the worker reports queue latency from it) and, inside an
active trace, ``sentry-trace`` and ``baggage``; the direct path's Redis push
does not go through ``Producer.publish``, where Sentry records a publish
span. Sentry Crons' check-in headers are ours to add (integrations/sentry.py)
and are on both paths. That reason is pinned by
tests/integrations/test_sentry.py::test_direct_messages_miss_what_sentry_adds_around_send_task;
if it ever fails because direct messages gained what Sentry adds, revisit
this default.
"""

from __future__ import annotations

from celery import Celery

from celery_routines.config import settings_from
from celery_routines.sending.offload import beats_publisher
from celery_routines.sending.publish import CeleryPublisher


def test_defaults_publish_with_send_task_in_beats_own_process() -> None:
    app = Celery("defaults", set_as_current=False)
    settings = settings_from(app)
    assert (settings.publish, settings.publish_processes) == ("send_task", 0)
    publisher = beats_publisher(app, settings)
    try:
        # Not DirectPublisher, not ProcessPublisher, not wrapped (no Sentry here).
        assert type(publisher) is CeleryPublisher
    finally:
        publisher.close()
