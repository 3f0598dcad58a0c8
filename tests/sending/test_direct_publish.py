"""The direct publish path (``routines_publish = "direct"``) puts on a real
Redis broker the message ``send_task`` puts there, field for field.

Each case publishes the same ``OutgoingRun`` (same run id) once through
``CeleryPublisher`` and once through ``DirectPublisher``, reads the raw kombu
envelopes off every Redis list of the test's own database and compares them
whole: every header, every property, the decoded body, the delivery info.
Set aside, and only these:

- ``properties.delivery_tag``: a fresh uuid kombu's Redis transport gives
  each publish;
- ``properties.expiration`` and ``headers.expires`` when the ``expires`` they
  come from is relative (seconds, a task's ``expires`` attribute): Celery
  turns it into "now + n" at send time, so two sends differ by the time
  between them; they must agree within a second.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import kombu.messaging
import pytest
import redis
from celery import Celery, signals
from kombu import Exchange, Queue

from celery_routines.config import Settings, settings_from
from celery_routines.errors import ConfigurationError
from celery_routines.policy.routine import define
from celery_routines.sending.direct import DirectPublisher, publisher_for
from celery_routines.sending.publish import BatchingPublisher, CeleryPublisher, OutgoingRun
from celery_routines.sending.sender import outgoing_run
from celery_routines.store import NewRun

WINDOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
# Relative, so "now + n" at each send: compared within a second (see above).
TIME_DERIVED = ("expiration", "expires")


def app_for(broker_url: str, backend: bool = False) -> Celery:
    app = Celery("direct_test", set_as_current=False)
    app.conf.update(broker_url=broker_url, broker_connection_retry_on_startup=False)
    if backend:
        app.conf.result_backend = broker_url
    return app


def outgoing(task: str, options: dict[str, Any] | None = None, **fields: Any) -> OutgoingRun:
    values: dict[str, Any] = {
        "run_id": "run-1",
        "routine_name": "nightly",
        "task": task,
        "args": [1, "two"],
        "kwargs": {"day": "today"},
        "options": options or {},
        "window": WINDOW,
        "idempotency_key": "nightly@2026-11-30T03:00:00+00:00",
        "attempt": 1,
    }
    values.update(fields)
    return OutgoingRun(**values)


def late_run(task: str) -> OutgoingRun:
    """A window of a routine with ``max_lateness``: its message carries ``expires``."""
    window = datetime.now(UTC).replace(microsecond=0)
    routine = define(task, 60, name="late", max_lateness=300, options={"priority": 2})
    run = NewRun(
        id="run-late", routine_id=1, idempotency_key="late@w", attempt=1, scheduled_for=window
    )
    message = outgoing_run(routine, run)
    assert message.options["expires"] == window + timedelta(seconds=300)
    return message


def take_messages(url: str) -> dict[str, list[dict[str, Any]]]:
    """Every message on every Redis list of the test's database, by list,
    oldest first; the lists are emptied."""
    client = redis.Redis.from_url(url)
    try:
        found: dict[str, list[dict[str, Any]]] = {}
        for key in client.scan_iter():
            if client.type(key) == b"list":
                raw = client.lrange(key, 0, -1)
                client.delete(key)
                found[key.decode()] = [json.loads(r) for r in reversed(raw)]
        return found
    finally:
        client.close()


def decoded(envelope: dict[str, Any]) -> dict[str, Any]:
    assert envelope["properties"]["body_encoding"] == "base64"
    message = dict(envelope, body=json.loads(base64.b64decode(envelope["body"])))
    message["properties"] = dict(envelope["properties"])
    message["headers"] = dict(envelope["headers"])
    del message["properties"]["delivery_tag"]  # kombu's uuid per publish
    return message


def assert_same_messages(
    by_celery: dict[str, list[dict[str, Any]]], direct: dict[str, list[dict[str, Any]]]
) -> None:
    assert by_celery, "send_task put nothing on any list"
    assert by_celery.keys() == direct.keys()
    for queue in by_celery:
        assert len(by_celery[queue]) == len(direct[queue])
        for celery_envelope, direct_envelope in zip(by_celery[queue], direct[queue], strict=True):
            ours, theirs = decoded(direct_envelope), decoded(celery_envelope)
            for part, field in (("properties", "expiration"), ("headers", "expires")):
                a, b = ours[part].pop(field, None), theirs[part].pop(field, None)
                assert (a is None) == (b is None), (part, field, a, b)
                if a is not None and a != b:
                    assert abs(_seconds(a) - _seconds(b)) < 1.0, (part, field, a, b)
            assert ours == theirs


def _seconds(value: str) -> float:
    if "T" in value:
        return datetime.fromisoformat(value).timestamp()
    return float(value) / 1000  # kombu's expiration: milliseconds


def publish_both_ways(
    url: str, app: Celery, runs: list[OutgoingRun], many: bool | str = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    found = []
    for publisher in (CeleryPublisher(app), DirectPublisher(app)):
        try:
            if many:
                assert publisher.publish_many(runs) == [None] * len(runs)
            else:
                for run in runs:
                    publisher.publish(run)
        finally:
            publisher.close()
        found.append(take_messages(url))
    return found[0], found[1]


def routed_by_function(name: str, args: Any, kwargs: Any, options: Any, task: Any = None) -> Any:
    if name == "tasks.by_function":
        return {"queue": "from-function", "priority": 3}
    return None


def _plain(app: Celery) -> list[OutgoingRun]:
    return [
        outgoing("tasks.unknown"),
        outgoing("tasks.unknown", args=[], kwargs={}, run_id="run-2"),
    ]


def _registered(app: Celery) -> list[OutgoingRun]:
    @app.task(name="tasks.known", shared=False)
    def known(*args: Any, **kwargs: Any) -> None: ...

    return [outgoing("tasks.known", run_timeout=90.0)]


def _ignore_result(app: Celery) -> list[OutgoingRun]:
    @app.task(name="tasks.quiet", ignore_result=True, shared=False)
    def quiet(*args: Any, **kwargs: Any) -> None: ...

    return [outgoing("tasks.quiet")]


def _task_options(app: Celery) -> list[OutgoingRun]:
    # The registered task's own options: queue, priority, limits, a relative expires.
    @app.task(
        name="tasks.tuned",
        queue="tuned",
        priority=5,
        expires=600,
        time_limit=30,
        soft_time_limit=20,
        serializer="json",
        shared=False,
    )
    def tuned(*args: Any, **kwargs: Any) -> None: ...

    return [outgoing("tasks.tuned"), outgoing("tasks.tuned", {"priority": 1, "queue": "other"})]


def _routes_dict(app: Celery) -> list[OutgoingRun]:
    app.conf.task_routes = {
        "tasks.routed": {"queue": "routed", "priority": 4},
        "tasks.pattern.*": "by-pattern",
    }
    return [outgoing("tasks.routed"), outgoing("tasks.pattern.one", run_id="run-2")]


def _routes_function(app: Celery) -> list[OutgoingRun]:
    app.conf.task_routes = (routed_by_function,)
    return [outgoing("tasks.by_function"), outgoing("tasks.elsewhere", run_id="run-2")]


def _explicit(app: Celery) -> list[OutgoingRun]:
    return [
        outgoing("tasks.unknown", {"queue": "explicit", "priority": 9}),
        outgoing("tasks.unknown", {"routing_key": "explicit"}, run_id="run-2"),
    ]


def _expires(app: Celery) -> list[OutgoingRun]:
    return [late_run("tasks.unknown"), outgoing("tasks.unknown", {"expires": 120}, run_id="run-2")]


def _headers_and_reprs(app: Celery) -> list[OutgoingRun]:
    options = {
        "headers": {"tenant": "acme", "routine": "not ours"},
        "kwargsrepr": "{'secret': '***'}",
        "argsrepr": "(1, '...')",
        "shadow": "routine:nightly",
        "time_limit": 12,
    }
    return [outgoing("tasks.unknown", options, kwargs={"secret": "x"})]


def _topic_exchange(app: Celery) -> list[OutgoingRun]:
    exchange = Exchange("topics", type="topic")
    app.conf.task_queues = [
        Queue("celery", routing_key="celery"),
        Queue("topical", exchange, routing_key="reports.#"),
    ]
    with app.connection_for_write() as connection:
        app.amqp.queues["topical"].bind(connection.default_channel).declare()
    return [outgoing("tasks.unknown", {"queue": "topical", "routing_key": "reports.daily"})]


def _priorities(app: Celery) -> list[OutgoingRun]:
    # kombu's Redis transport keeps a list per priority step: "celery", "celery\x06\x163", ...
    priorities = [None, 0, 1, 3, 4, 6, 9, 12, 2]
    runs = [
        outgoing("tasks.unknown", {} if p is None else {"priority": p}, run_id=f"run-p{i}")
        for i, p in enumerate(priorities)
    ]
    runs.insert(3, outgoing("tasks.unknown", {"queue": "second", "priority": 5}, run_id="run-q"))
    return runs


def _several_queues(app: Celery) -> list[OutgoingRun]:
    # Interleaved: each list must keep its runs' order (one LPUSH per list on the direct path).
    queues = ["a", "b", "a", "celery", "b", "a"]
    return [
        outgoing("tasks.unknown", {"queue": q}, run_id=f"run-{i}") for i, q in enumerate(queues)
    ]


def _exchanges_mixed(app: Celery) -> list[OutgoingRun]:
    # A named exchange goes through kombu; the runs around it keep their order.
    runs = _topic_exchange(app)
    return [
        outgoing("tasks.unknown", run_id="run-before"),
        *runs,
        outgoing("tasks.unknown", run_id="run-after"),
    ]


CASES: dict[str, Callable[[Celery], list[OutgoingRun]]] = {
    "unknown_task": _plain,
    "registered_task": _registered,
    "ignore_result_task": _ignore_result,
    "task_options": _task_options,
    "task_routes_dict": _routes_dict,
    "task_routes_function": _routes_function,
    "explicit_queue_priority": _explicit,
    "expires": _expires,
    "custom_headers_and_reprs": _headers_and_reprs,
    "topic_exchange": _topic_exchange,
    "priorities": _priorities,
    "several_queues": _several_queues,
    "exchanges_mixed": _exchanges_mixed,
}


# Celery deprecates routing attributes on tasks (task_options); still honoured, so tested.
@pytest.mark.filterwarnings("ignore::celery.exceptions.CDeprecationWarning")
@pytest.mark.parametrize("backend", [False, True], ids=["no_backend", "redis_backend"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(
    "many", [False, True, "no_batch_api"], ids=["publish", "batched", "many_without_batches"]
)
def test_direct_message_equals_send_tasks(
    redis_url: str, case: str, backend: bool, many: bool | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if many == "no_batch_api":  # kombu before 5.7, or a broker without batches: one by one
        monkeypatch.delattr(kombu.messaging.Producer, "supports_batch_publish", raising=False)
    app = app_for(redis_url, backend=backend)
    runs = CASES[case](app)
    if many and len(runs) < 2:  # one run is sent on its own: make it a batch
        runs.append(outgoing("tasks.unknown", run_id="run-batch"))
    app.finalize()  # as in beat: the tasks declared above are in the registry
    by_celery, direct = publish_both_ways(redis_url, app, runs, many=many)
    assert_same_messages(by_celery, direct)


def test_a_closed_publisher_forgets_its_plans(redis_url: str) -> None:
    app = app_for(redis_url)
    publisher = DirectPublisher(app)
    publisher.publish(outgoing("tasks.unknown"))
    assert publisher._plans
    publisher.close()
    assert not publisher._plans
    publisher.publish(outgoing("tasks.unknown", run_id="run-2"))  # a fresh connection
    publisher.close()
    assert [m["headers"]["id"] for m in take_messages(redis_url)["celery"]] == ["run-1", "run-2"]


@pytest.fixture
def publish_signals() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    seen: list[tuple[str, dict[str, Any]]] = []

    def before(**kwargs: Any) -> None:
        kwargs.pop("signal", None)
        seen.append(("before", json.loads(json.dumps(kwargs, default=repr))))

    def after(**kwargs: Any) -> None:
        kwargs.pop("signal", None)
        seen.append(("after", json.loads(json.dumps(kwargs, default=repr))))

    signals.before_task_publish.connect(before, weak=False)
    signals.after_task_publish.connect(after, weak=False)
    yield seen
    signals.before_task_publish.disconnect(before)
    signals.after_task_publish.disconnect(after)


def test_publish_signals_fire_with_what_send_task_gives_them(
    redis_url: str, publish_signals: list[tuple[str, dict[str, Any]]]
) -> None:
    app = app_for(redis_url)
    app.conf.task_routes = {"tasks.routed": {"queue": "routed", "priority": 4}}
    runs = [
        outgoing("tasks.routed", {"headers": {"tenant": "acme"}}),
        outgoing("tasks.unknown", run_id="run-2"),
    ]
    fired = []
    for publisher in (CeleryPublisher(app), DirectPublisher(app)):
        try:
            assert publisher.publish_many(runs) == [None, None]
        finally:
            publisher.close()
        fired.append(list(publish_signals))
        publish_signals.clear()
    by_celery, direct = fired
    assert [kind for kind, _ in by_celery] == ["before", "after", "before", "after"]
    assert direct == by_celery
    assert by_celery[0][1]["sender"] == "tasks.routed"
    assert by_celery[0][1]["headers"]["tenant"] == "acme"


def test_an_unknown_publish_path_is_refused_by_name() -> None:
    app = Celery("direct_test", set_as_current=False)
    app.conf.routines_publish = "bogus"
    with pytest.raises(ConfigurationError, match=r"routines_publish .*'bogus'"):
        settings_from(app)


def test_the_setting_chooses_the_publisher(monkeypatch: pytest.MonkeyPatch) -> None:
    app = Celery("direct_test", set_as_current=False)
    assert settings_from(app).publish == "send_task"
    assert type(publisher_for(app, settings_from(app))) is CeleryPublisher
    app.conf.routines_publish = "direct"
    assert type(publisher_for(app, settings_from(app))) is DirectPublisher
    monkeypatch.setenv("ROUTINES_PUBLISH", "direct")
    assert settings_from(Celery("env", set_as_current=False)).publish == "direct"
    assert isinstance(publisher_for(app, Settings(publish="direct")), BatchingPublisher)
