"""What ``send_task`` works out for one task and one set of options, worked
out once for the direct path (``direct.py``): routing, queue, exchange,
delivery mode, serializer, retry policy, and Celery's message as a template.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery import Celery
from celery.utils.functional import maybe_list
from kombu import Exchange, Producer, Queue
from kombu.common import Broadcast

from celery_routines.sending.publish import OutgoingRun
from celery_routines.sending.task_template import TaskTemplate

if TYPE_CHECKING:
    from celery.events import EventDispatcher

# send_task's own keywords, which a routine's options may carry (apply_async's).
SEND_TASK_KEYWORDS = (
    "link",
    "link_error",
    "group_id",
    "group_index",
    "retries",
    "chord",
    "reply_to",
    "time_limit",
    "soft_time_limit",
    "root_id",
    "parent_id",
    "route_name",
    "shadow",
    "chain",
    "replaced_task_nesting",
)
# send_task_message's named parameters: every other option becomes a property.
SEND_MESSAGE_KEYWORDS = (
    "exchange",
    "routing_key",
    "queue",
    "event_dispatcher",
    "retry",
    "retry_policy",
    "serializer",
    "delivery_mode",
    "compression",
    "declare",
    "headers",
    "exchange_type",
    "timeout",
    "confirm_timeout",
)


@dataclass
class Plan:
    """What send_task works out for one task with one set of routine options."""

    # create_task_message's arguments but the run's own, ``expires`` and ``reply_to``.
    create_args: tuple[Any, ...]
    create_options: dict[str, Any]
    argsrepr_free: bool  # the options set no argsrepr
    reply_to: str | None
    default_expires: float | datetime | None  # seconds, or an instant
    retries: int
    properties: dict[str, Any]  # options send_task_message makes message properties
    exchange: str | Exchange | None
    routing_key: Any
    qname: str | None
    declare: list[Queue | Exchange] | None
    # kombu's declaration-cache keys of ``declare``; None: not cacheable.
    declared_keys: list[int] | None
    retry: bool
    retry_policy: dict[str, Any]
    publish_options: dict[str, Any]
    event_dispatcher: EventDispatcher | None
    # create_task_message's message, made once (None: made for every message).
    template: TaskTemplate | None = None
    # Can go in a Redis batch's LPUSH (redis_push): the nameless exchange, no compression.
    pushable: bool = False
    delivery_mode: int | str | None = None  # as Producer.publish resolves it


def make_plan(
    app: Celery,
    producer: Producer,
    run: OutgoingRun,
    options: dict[str, Any],
    templated: bool = True,
) -> Plan:
    """send_task and send_task_message, up to the message (celery/app/base.py,
    celery/app/amqp.py), for one task and one set of routine options; with
    ``templated``, Celery's message too (``task_template``)."""
    amqp, conf, name = app.amqp, app.conf, run.task
    given = {k: options.pop(k) for k in SEND_TASK_KEYWORDS if k in options}
    task_type = app._tasks.get(name)
    get_exec_options = getattr(task_type, "_get_exec_options", None)
    if get_exec_options is not None and inspect.ismethod(get_exec_options):
        task_options = {k: v for k, v in (get_exec_options() or {}).items() if v is not None}
        options = dict(task_options, **options)
    limits = []
    for limit in ("time_limit", "soft_time_limit"):
        from_task = options.pop(limit, None)
        limits.append(given.get(limit, from_task))
    default_expires = options.pop("expires", None)
    ignore_result = options.pop("ignore_result", None)
    options = amqp.router.route(
        options, given.get("route_name") or name, run.args, run.kwargs, task_type
    )
    create_options = dict(options, ignore_result=ignore_result)
    create_options["replaced_task_nesting"] = given.get("replaced_task_nesting", 0)
    for stamp in options.pop("stamped_headers", None) or []:
        options.pop(stamp)
    sent = {k: options.pop(k) for k in SEND_MESSAGE_KEYWORDS if k in options}
    sent.pop("headers", None)  # the run's own headers win, as in send_task
    exchange, routing_key, queue = (
        sent.get("exchange"),
        sent.get("routing_key"),
        sent.get("queue"),
    )
    qname = queue
    if queue is None and exchange is None:
        queue = amqp.default_queue
    if queue is not None:
        if isinstance(queue, str):
            qname, queue = queue, amqp.queues[queue]
        else:
            qname = queue.name
    delivery_mode = sent.get("delivery_mode")
    if delivery_mode is None:
        delivery_mode = getattr(getattr(queue, "exchange", None), "delivery_mode", None)
        delivery_mode = delivery_mode or conf.task_default_delivery_mode
    exchange_type = sent.get("exchange_type")
    if exchange_type is None:
        exchange_type = getattr(getattr(queue, "exchange", None), "type", "direct")
    if (not exchange or not routing_key) and exchange_type == "direct":
        exchange, routing_key = "", qname
    elif exchange is None:
        # Neither queue nor exchange given took the default queue above.
        assert queue is not None
        exchange = queue.exchange.name or amqp.default_exchange
        routing_key = routing_key or queue.routing_key or conf.task_default_routing_key
    declare = sent.get("declare")
    if declare is None and queue and not isinstance(queue, Broadcast):
        declare = [queue]
    retry = sent.get("retry")
    policy = sent.get("retry_policy")
    default_policy = conf.task_publish_retry_policy
    plan = Plan(
        create_args=(
            given.get("group_id"),
            given.get("group_index"),
            given.get("chord"),
            maybe_list(given.get("link")),
            maybe_list(given.get("link_error")),
            *limits,
            conf.task_send_sent_event,
            given.get("root_id"),
            given.get("parent_id"),
            given.get("shadow"),
            given.get("chain"),
        ),
        create_options=create_options,
        argsrepr_free="argsrepr" not in create_options,
        reply_to=given.get("reply_to"),
        default_expires=default_expires,
        retries=given.get("retries", 0),
        properties=options,
        exchange=exchange,
        routing_key=routing_key,
        qname=qname,
        declare=declare,
        declared_keys=(
            [hash(entity) for entity in declare]
            if declare and all(getattr(e, "can_cache_declaration", False) for e in declare)
            else None
        ),
        retry=conf.task_publish_retry if retry is None else retry,
        retry_policy=dict(default_policy, **policy) if policy else dict(default_policy),
        publish_options={
            "exchange": exchange,
            "routing_key": routing_key,
            "serializer": sent.get("serializer") or conf.task_serializer,
            "compression": sent.get("compression") or conf.task_compression,
            "delivery_mode": delivery_mode,
            "timeout": sent.get("timeout"),
            "confirm_timeout": sent.get("confirm_timeout"),
        },
        event_dispatcher=sent.get("event_dispatcher"),
    )
    if templated:
        plan.template = TaskTemplate.for_plan(
            app, name, plan.create_args, plan.retries, plan.reply_to, plan.create_options
        )
    exchange_name, plan.delivery_mode = producer._delivery_details(
        exchange or producer.exchange, delivery_mode
    )
    plan.pushable = exchange_name == "" and not plan.publish_options["compression"]
    return plan
