"""The direct path's Redis batch: one ``LPUSH`` per list for a whole batch.

kombu's own publish batch (kombu 5.7) sends one ``LPUSH`` per message in a
pipeline, after building each envelope through ``Producer.publish``. Here the
envelope is built by the same kombu pieces (``Channel.prepare_message``,
``Channel._inplace_augment_message``, the priority list of ``Channel._put``,
kombu's JSON), so what lands in the list is what kombu would write, byte for
byte, but for the fresh ``delivery_tag``; the messages of one list then go in
one ``LPUSH key v1 v2 ...``. Redis pushes the values left to right, so the
list ends exactly as one ``LPUSH`` each would leave it.

Only messages to the default (nameless) exchange are pushed here: a named
exchange needs kombu's binding lookup, a round trip per message, and a queue
with ``x-expires`` needs its ``PEXPIRE`` s. ``put`` says when a message is
not one of these, and the caller sends that one through kombu.
"""

from __future__ import annotations

from typing import Any

from kombu import Queue
from kombu.serialization import registry
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps

# Producer.publish's named arguments the direct path does not set itself and
# that kombu would take out of the message properties (priority, expiration:
# handled in ``put``).
_PUBLISH_ARGUMENTS = frozenset({"mandatory", "immediate", "content_type", "content_encoding"})


def redis_channel(producer: Any) -> Any:
    """The producer's kombu Redis channel if a batch can go out as ``LPUSH``
    es without retries (kombu's own test for batching), else None."""
    channel = producer.channel
    if not isinstance(channel, kombu_redis.Channel):
        return None
    return channel if channel.supports_batch_publish else None


class RedisPushes:
    """Envelopes of one batch, by Redis list, until ``flush``."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self._lists: dict[str, list[str]] = {}
        # Per batch: the serialised body of a message with no args and no kwargs.
        self._bodies: dict[tuple[Any, ...], tuple[str, str, Any]] = {}

    def put(
        self,
        body: tuple[Any, Any, dict[str, Any]],
        serializer: str,
        headers: dict[str, Any],
        properties: dict[str, Any],
        delivery_mode: Any,
        routing_key: str,
    ) -> bool:
        """Buffer what ``Producer.publish(body, exchange="", routing_key=...,
        headers=..., serializer=..., delivery_mode=..., **properties)`` puts
        on Redis; False (nothing buffered) when kombu must send it."""
        channel = self.channel
        if not _PUBLISH_ARGUMENTS.isdisjoint(properties) or (
            channel._expires and routing_key in channel._expires
        ):
            return False
        props = dict(properties)  # Producer.publish's **properties: a fresh dict
        priority = props.pop("priority", 0)
        expiration = props.pop("expiration", None)
        props["delivery_mode"] = delivery_mode
        if expiration is not None:
            props["expiration"] = str(int(expiration * 1000))
        content_type, content_encoding, payload = self._serialised(body, serializer)
        message = channel.prepare_message(
            payload, priority, content_type, content_encoding, headers, props
        )
        reply_to = props.get("reply_to")
        if isinstance(reply_to, Queue):  # as Producer._publish does
            props["reply_to"] = reply_to.name
        channel._inplace_augment_message(message, "", routing_key)
        key = channel._q_for_pri(routing_key, channel._get_message_priority(message))
        envelope = dumps(message)  # a TypeError here fails this message only
        pushed = self._lists.get(key)
        if pushed is None:
            self._lists[key] = [envelope]
        else:
            pushed.append(envelope)
        return True

    def _serialised(self, body: tuple[Any, Any, dict[str, Any]], serializer: str) -> Any:
        args, kwargs, embed = body
        if args or kwargs or serializer != "json":
            return registry.dumps(body, serializer=serializer)
        # Most runs have neither: one body per batch and embed (the callbacks, chain, chord).
        key = tuple(embed.items())
        try:
            found = self._bodies.get(key)
        except TypeError:  # an unhashable callback signature
            return registry.dumps(body, serializer=serializer)
        if found is None:
            found = self._bodies[key] = registry.dumps(body, serializer=serializer)
        return found

    def __len__(self) -> int:
        return sum(len(values) for values in self._lists.values())

    def flush(self) -> None:
        """Push everything buffered: one ``LPUSH`` per list, one round trip,
        no retry (a failure leaves it unknown which lists Redis took)."""
        if not self._lists:
            return
        lists, self._lists = self._lists, {}
        with (
            self.channel.conn_or_acquire() as client,
            client.pipeline(transaction=False) as pipe,
        ):
            for key, values in lists.items():
                pipe.lpush(key, *values)
            pipe.execute()
