"""The opt-in direct publish path: ``routines_publish = "direct"``.

Each message is still Celery's own: built by ``app.amqp.create_task_message``,
routed by ``app.amqp.router`` (``task_routes``, the registered task's options),
given the fields Celery's ``send_task_message`` gives it, published between
``before_task_publish`` and ``after_task_publish``. What ``send_task`` works
out again for every message (the task's options, the route, the queue, the
exchange, the delivery mode, the serializer, the retry policy, whether the
queue was declared, and the message itself but for its per-run fields) is
worked out once per task and routine options (``direct_plan``,
``task_template``), until the publisher is closed.

On Redis a batch (``publish_many``) does not go through kombu's publish batch:
each envelope is built by kombu's own channel methods and the batch is pushed
with one ``LPUSH`` per list in one round trip (``redis_push``); a message to
a named exchange or to a queue with ``x-expires`` goes through kombu between
them, after what came before it. A task-sent event (``task_send_sent_event``)
goes out as its message is buffered, not after the batch's push.

``tests/sending/test_direct_publish.py`` publishes the same runs both ways to
a real Redis and compares every header, property and body field;
``test_direct_push.py`` the raw envelopes and the batch's failures.

It does not call the result backend's ``on_task_call`` (beat's ``send_task``
path does not either: ``publish.results_never_awaited``): with a Redis backend
that subscribes the sender to every task's result channel, for results a
scheduler never reads. Runs this path does not mirror go through
``send_task`` instead: ``countdown``/``eta`` (native delayed delivery may
reroute them), a router, connection or producer given in a routine's options,
a send from inside a worker task (parent ids, inherited priority) and a worker
callback's retried publish.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import nullcontext
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery import Celery, signals
from celery.app import amqp as celery_amqp
from celery.app.routes import MapRoute

from celery_routines.sending.direct_plan import Plan, make_plan
from celery_routines.sending.publish import (
    BatchingPublisher,
    CeleryPublisher,
    OutgoingRun,
    Publisher,
    broker_down,
    message_options,
    send_with_celery,
)
from celery_routines.sending.redis_push import RedisPushes, redis_channel

if TYPE_CHECKING:
    from celery_routines.config import Settings

logger = logging.getLogger("celery_routines.beat")

# Options this path leaves to send_task (see the module's docstring); the last
# four clash with send_task's own arguments, so Celery refuses them too.
NOT_MIRRORED = frozenset(
    {"countdown", "eta", "router", "connection", "producer", "publisher", "result_cls"}
    | {"task_type", "task_id", "add_to_parent", "args", "kwargs"}
)
_OMITTED = object()
# Run options that vary per run and do not change the plan (see _plan).
_PER_RUN_OPTIONS = frozenset({"expires", "kwargsrepr"})
# Set by Celery around a worker callback's publish, which it retries its own way.
_callback_retry = getattr(celery_amqp, "_callback_publish_retry", None)


def publisher_for(
    app: Celery, settings: Settings, *, subscribe_to_results: bool = True
) -> Publisher:
    """The publisher ``routines_publish`` names, for beat and the operator's
    sends alike (beat's: ``subscribe_to_results=False``, it never reads one)."""
    if settings.publish == "direct":
        return DirectPublisher(app, subscribe_to_results=subscribe_to_results)
    return CeleryPublisher(app, subscribe_to_results=subscribe_to_results)


class DirectPublisher(BatchingPublisher):
    """Celery's message, published without ``send_task`` around each one."""

    def __init__(self, app: Celery, *, subscribe_to_results: bool = True) -> None:
        super().__init__(app, subscribe_to_results=subscribe_to_results)
        self._plans: dict[tuple[str, str], Plan] = {}

    def close(self) -> None:
        super().close()
        self._plans.clear()

    def _publish_batch(self, runs: Sequence[OutgoingRun]) -> list[Exception | None]:
        """BatchingPublisher's batch, but on Redis one ``LPUSH`` per list
        (``redis_push``) instead of kombu's publish batch; the same errors."""
        try:
            channel = redis_channel(self._connected_producer())
        except Exception as exc:
            return broker_down(runs, exc)
        if (
            channel is None
            # Checked once per batch (one thread publishes it) instead of per message.
            or self.app.current_worker_task is not None
            or (_callback_retry is not None and _callback_retry.get())
        ):
            return super()._publish_batch(runs)
        errors: list[Exception | None] = []
        pushes = RedisPushes(channel)
        try:
            self._send_each(runs, lambda run: self._send(run, batched=True, pushes=pushes), errors)
            pushes.flush()
        except Exception as exc:
            return self._resend_one_by_one(runs, errors, exc)
        return errors

    def _send(
        self, run: OutgoingRun, batched: bool = False, pushes: RedisPushes | None = None
    ) -> None:
        app = self.app
        options, headers = message_options(run, batched, self._repr_limits)
        if not NOT_MIRRORED.isdisjoint(options) or (
            pushes is None  # a batch of pushes has checked these once
            and (
                app.current_worker_task is not None
                or (_callback_retry is not None and _callback_retry.get())
            )
        ):
            if pushes is not None:
                pushes.flush()  # what came before goes first
            send_with_celery(app, self.producer, run, options, headers, self.subscribe_to_results)
            return
        kwargsrepr = options.pop("kwargsrepr")
        expires = options.pop("expires", _OMITTED)
        plan = self._plan(run, options, batched)
        if expires is _OMITTED:
            expires = plan.default_expires
        name = run.task
        producer = self.producer if pushes is not None else self._connected_producer()
        properties = dict(plan.properties, kwargsrepr=kwargsrepr)
        if expires is not None:
            properties["expiration"] = self._expiration(run.run_id, expires)
        if plan.template is not None:
            headers2, message_properties, body = plan.template.message(
                app, run, expires, kwargsrepr, plan.reply_to or app.thread_oid
            )
        else:
            headers2, message_properties, body, sent_event = self._created(
                run, plan, expires, kwargsrepr
            )
        headers2.update(headers)
        message_properties.update(properties)
        exchange, routing_key, retry = plan.exchange, plan.routing_key, plan.retry
        retry_policy = dict(plan.retry_policy)
        declare = plan.declare
        if pushes is not None and not plan.pushable:
            pushes.flush()  # what came before goes first; this one goes through kombu
            pushes = None
        # kombu's errors as Celery raises them; a push does no I/O until the flush.
        reraise = producer.connection._reraise_as_library_errors
        with nullcontext() if pushes is not None else reraise():
            where = {"sender": name, "body": body, "exchange": exchange, "routing_key": routing_key}
            signals.before_task_publish.send(
                **where,
                declare=declare,
                headers=headers2,
                properties=message_properties,
                retry_policy=retry_policy,
            )
            if pushes is not None:
                if pushes.to_declare(plan.declared_keys):
                    with reraise():
                        # As kombu's batch: declared at once, not batched.
                        for entity in self._still_to_declare(plan) or ():
                            producer.maybe_declare(entity, retry=retry, **retry_policy)
                pushed = pushes.put(
                    body,
                    plan.publish_options["serializer"],
                    headers2,
                    message_properties,
                    plan.delivery_mode,
                    routing_key,
                )
            else:
                pushed = False
            if not pushed:
                if pushes is not None:
                    pushes.flush()  # what came before goes first
                producer.publish(
                    body,
                    **plan.publish_options,
                    retry=retry,
                    retry_policy=retry_policy,
                    declare=self._still_to_declare(plan),
                    headers=headers2,
                    **message_properties,
                )
            signals.after_task_publish.send(**where, headers=headers2)
            if signals.task_sent.receivers:  # Celery's deprecated signal, kept while it is
                signals.task_sent.send(
                    sender=name,
                    task_id=headers2["id"],
                    task=name,
                    args=body[0],
                    kwargs=body[1],
                    eta=headers2["eta"],
                    taskset=headers2["group"],
                )
            if plan.template is None and sent_event:
                dispatcher = plan.event_dispatcher or app.amqp._event_dispatcher
                sent_event.update(
                    {
                        "queue": plan.qname,
                        "exchange": getattr(exchange, "name", exchange),
                        "routing_key": routing_key,
                    }
                )
                dispatcher.publish(
                    "task-sent", sent_event, producer, retry=retry, retry_policy=retry_policy
                )

    def _created(
        self, run: OutgoingRun, plan: Plan, expires: Any, kwargsrepr: str
    ) -> tuple[dict[str, Any], dict[str, Any], Any, Any]:
        """create_task_message for this run, as send_task calls it."""
        app = self.app
        if not run.args and plan.argsrepr_free:
            # Celery's saferepr of no arguments, without the walk (empty args become ()).
            create_options = dict(plan.create_options, argsrepr="()")
        else:
            create_options = plan.create_options
        return app.amqp.create_task_message(
            run.run_id,
            run.task,
            run.args,
            run.kwargs,
            None,
            None,
            *plan.create_args[:2],
            expires,
            plan.retries,
            *plan.create_args[2:5],
            plan.reply_to or app.thread_oid,  # per thread, as in send_task
            *plan.create_args[5:],
            **create_options,
            kwargsrepr=kwargsrepr,
        )

    def _still_to_declare(self, plan: Plan) -> list[Any] | None:
        """``plan.declare``, or None once kombu has them in this connection's
        declaration cache: kombu would skip them, after copying each entity."""
        if not plan.declare or plan.declared_keys is None:
            return plan.declare
        declared = self.producer.channel.connection.client.declared_entities
        if all(key in declared for key in plan.declared_keys):
            return None
        return plan.declare

    def _expiration(self, task_id: str, expires: Any) -> float:
        """send_task's ``expiration`` property: seconds from now, never negative."""
        if isinstance(expires, datetime | str):
            instant = datetime.fromisoformat(expires) if isinstance(expires, str) else expires
            seconds = (instant - self.app.now()).total_seconds()
        else:
            seconds = expires
        if seconds < 0:
            logger.warning(
                "%s has an expiration in the past (%ss ago); sent with 0", task_id, -seconds
            )
            seconds = 0
        return seconds

    def _plan(self, run: OutgoingRun, options: dict[str, Any], batched: bool) -> Plan:
        # ``options`` follow from the run's options but its expires and
        # kwargsrepr (taken out of them) and ``batched``: key on those, which
        # is cheaper than on ``options`` (most runs have no options at all).
        given = run.options
        if not given:
            key: tuple[Any, ...] = (run.task, batched)
        else:
            # Dict items sort by key alone (keys are unique), whatever the values.
            kept = sorted((k, v) for k, v in given.items() if k not in _PER_RUN_OPTIONS)
            key = (run.task, batched, repr(kept))
        plan = self._plans.get(key)
        if plan is None:
            # A router function may route on the arguments: not cached, and
            # then not worth a template either (made for one message).
            cached = all(isinstance(route, MapRoute) for route in self.app.amqp.router.routes)
            plan = make_plan(self.app, self.producer, run, dict(options), templated=cached)
            if cached:
                self._plans[key] = plan
        return plan
