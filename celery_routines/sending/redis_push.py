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

import os
import sys
from typing import TYPE_CHECKING, Any

from kombu import Producer, Queue
from kombu.serialization import registry
from kombu.transport.virtual import Channel as _VirtualChannel
from kombu.utils.json import JSONEncoder

if TYPE_CHECKING:
    # Only named: kombu's Redis transport needs the redis extra (see redis_channel).
    from kombu.transport.redis import Channel as RedisChannel

# kombu.utils.json.dumps makes a new encoder per call; its defaults, made once.
_encode = JSONEncoder().encode

# Producer.publish's named arguments but priority and expiration (handled in
# ``put``): kombu would take them out of the message properties, or refuse
# them twice. A message whose properties hold one goes through kombu.
_PUBLISH_ARGUMENTS = frozenset(
    {"body", "routing_key", "delivery_mode", "mandatory", "immediate", "content_type"}
    | {"content_encoding", "serializer", "headers", "compression", "exchange", "retry"}
    | {"retry_policy", "declare", "timeout", "confirm_timeout"}
)


def redis_channel(producer: Producer) -> RedisChannel | None:
    """The producer's kombu Redis channel if a batch can go out as ``LPUSH``
    es without retries (kombu's own test for batching), else None."""
    channel = producer.channel
    # Not imported here: kombu's Redis transport needs the redis extra
    # (redis-py and packaging). A Redis channel exists only once kombu has
    # imported its transport, so a module not imported yet means "not Redis".
    kombu_redis = sys.modules.get("kombu.transport.redis")
    if kombu_redis is None or not isinstance(channel, kombu_redis.Channel):
        return None
    return channel if channel.supports_batch_publish else None


class RedisPushes:
    """Envelopes of one batch, by Redis list, until ``flush``."""

    def __init__(self, channel: RedisChannel) -> None:
        self.channel = channel
        self._lists: dict[str, list[str]] = {}
        # Per batch: the serialised body of a message with no args and no kwargs.
        self._bodies: dict[tuple[str, ...], tuple[str, str, Any, Any]] = {}
        # kombu's own augmenting (every Redis channel but a subclass that
        # changes it) is done here, the body's encoding once per batch.
        self._own_augment = (
            type(channel)._inplace_augment_message is _VirtualChannel._inplace_augment_message
            and type(channel).encode_body is _VirtualChannel.encode_body
        )
        self._body_encoding = channel.body_encoding
        self._tags = _DeliveryTags()
        self._asked: set[tuple[int, ...]] = set()

    def to_declare(self, declared_keys: list[int] | None) -> bool:
        """Whether to ask kombu's declaration cache about these entities:
        the first time in this batch (kombu caches a declaration for the
        connection, so once per batch is enough), always for entities kombu
        does not cache (``declared_keys`` None)."""
        if declared_keys is None:
            return True
        keys = tuple(declared_keys)
        if keys in self._asked:
            return False
        self._asked.add(keys)
        return True

    def put(
        self,
        body: Any,
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
        content_type, content_encoding, payload, encoded = self._serialised(body, serializer)
        message = channel.prepare_message(
            payload, priority, content_type, content_encoding, headers, props
        )
        reply_to = props.get("reply_to")
        if isinstance(reply_to, Queue):  # as Producer._publish does
            props["reply_to"] = reply_to.name
        if self._own_augment:
            # Channel._inplace_augment_message, with the body encoded once per batch.
            message["body"] = encoded
            props["body_encoding"] = self._body_encoding
            props["delivery_tag"] = self._tags.next()
            props["delivery_info"].update(exchange="", routing_key=routing_key)
        else:
            channel._inplace_augment_message(message, "", routing_key)
        key = channel._q_for_pri(routing_key, channel._get_message_priority(message))
        envelope = _encode(message)  # a TypeError here fails this message only
        pushed = self._lists.get(key)
        if pushed is None:
            self._lists[key] = [envelope]
        else:
            pushed.append(envelope)
        return True

    def _serialised(self, body: object, serializer: str) -> tuple[str, str, Any, Any]:
        """content type, content encoding, payload and the payload encoded
        for the channel (base64), as Producer._prepare and the channel make them."""
        if not isinstance(body, tuple) or len(body) != 3 or serializer != "json":
            return self._encoded(body, serializer)  # task protocol 1: a dict
        args, kwargs, embed = body
        if args or kwargs or not isinstance(embed, dict) or _any_set(embed):
            return self._encoded(body, serializer)
        # Most runs have no arguments, no callbacks, no chain, no chord: one body per batch.
        key = tuple(embed)
        found = self._bodies.get(key)
        if found is None:
            found = self._bodies[key] = self._encoded(body, serializer)
        return found

    def _encoded(self, body: object, serializer: str) -> tuple[str, str, Any, Any]:
        content_type, content_encoding, payload = registry.dumps(body, serializer=serializer)
        if not self._own_augment:
            return content_type, content_encoding, payload, None
        encoded, _ = self.channel.encode_body(payload, self._body_encoding)
        return content_type, content_encoding, payload, encoded

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


def _any_set(embed: dict[str, object]) -> bool:
    return any(value is not None for value in embed.values())


class _DeliveryTags:
    """Delivery tags as kombu makes them (``str(uuid4())``), from one read of
    the system's random source per batch of 256 instead of one per message."""

    def __init__(self) -> None:
        self._hex = ""
        self._at = 0

    def next(self) -> str:
        at, h = self._at, self._hex
        if at >= len(h):
            h, at = self._hex, self._at = os.urandom(16 * 256).hex(), 0
        self._at = at + 32
        # RFC 4122 version 4: the version nibble 4, the variant bits 10.
        variant = _VARIANT[int(h[at + 16], 16) & 3]
        return (
            f"{h[at : at + 8]}-{h[at + 8 : at + 12]}-4{h[at + 13 : at + 16]}-"
            f"{variant}{h[at + 17 : at + 20]}-{h[at + 20 : at + 32]}"
        )


_VARIANT = "89ab"
