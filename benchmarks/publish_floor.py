"""What publishing N Celery task messages costs before any scheduler work.

    python -m benchmarks.publish_floor [--n 10] [--publishers [--baseline DIR]]

Prints the median time to put N task messages on a Redis broker, by the ways
a scheduler could: Celery's ``send_task`` one by one (what RedBeat and Celery
beat do), ``send_task`` inside kombu's publish batch (what celery-routines
does), and, for reference, the pieces underneath (``create_task_message``
alone; ``create_task_message`` + ``send_task_message`` batched, which skips
``send_task``'s routing and option handling). It is the floor under any
"tick with N due" figure of a scheduler that publishes through Celery.

``--publishers`` adds, after the floors, ``publish_many`` of N runs by
celery-routines' two publishers (``CeleryPublisher``: ``send_task`` in a
batch; ``DirectPublisher``: ``routines_publish = "direct"``), best of two
each, and ``--baseline DIR`` the same for the code checked out in DIR (say
``git worktree add /tmp/base main``), run in a subprocess that imports DIR's
``celery_routines``, alternated with this tree's ``--rounds`` times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery

from .common import claim_redis_db, clear_redis_db, redis_url


def median_ms(action: Callable[[], object], repeat: int) -> float:
    action()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


HEADERS = {"routine": "r", "routine_window": "r@2026-11-30T03:00:00+00:00"}


def send_tasks(app: Celery, producer: Any, n: int, retry: bool = True) -> None:
    """``n`` messages by ``send_task`` on one reused producer."""
    for _ in range(n):
        app.send_task(
            "bench.noop",
            task_id=str(uuid.uuid4()),
            producer=producer,
            add_to_parent=False,
            headers=HEADERS,
            retry=retry,
        )


def send_task_batched_ms(db: int, n: int, repeat: int) -> float:
    """Median ms to publish ``n`` messages by ``send_task`` inside kombu's
    publish batch, one reused producer: the floor under celery-routines'
    publishing (the Redis database is emptied after)."""
    app = Celery("floor", set_as_current=False)
    app.conf.broker_url = redis_url(db)
    connection = app.connection_for_write()
    producer = app.amqp.Producer(connection, auto_declare=False)

    def send() -> None:
        with producer.batch():
            send_tasks(app, producer, n, retry=False)

    try:
        return median_ms(send, repeat)
    finally:
        connection.release()
        clear_redis_db(db)


def apply_async_loop_ms(db: int, n: int, repeat: int) -> float:
    """Median ms for Celery's own per-message loop: ``apply_async`` of a
    registered task, ``n`` times, one reused producer, a round trip each
    (the Redis database is emptied after)."""
    app = Celery("floor", set_as_current=False)
    app.conf.broker_url = redis_url(db)

    @app.task(name="bench.noop", shared=False)
    def noop() -> None: ...

    app.finalize()
    connection = app.connection_for_write()
    producer = app.amqp.Producer(connection, auto_declare=False)

    def send() -> None:
        for _ in range(n):
            noop.apply_async(task_id=str(uuid.uuid4()), producer=producer, headers=HEADERS)

    try:
        return median_ms(send, repeat)
    finally:
        connection.release()
        clear_redis_db(db)


def publishers_ms(db: int, n: int) -> dict[str, float]:
    """ms for ``publish_many`` of ``n`` runs (no args, no kwargs, one task) by
    celery-routines' two publishers, alternated, best of two each: the
    publishing part of the burst alone (the Redis database is emptied after)."""
    from datetime import UTC, datetime

    from celery_routines.sending.direct import DirectPublisher
    from celery_routines.sending.publish import CeleryPublisher, OutgoingRun

    app = Celery("floor", set_as_current=False)
    app.conf.broker_url = redis_url(db)
    window = datetime(2026, 11, 30, tzinfo=UTC)
    runs = [
        OutgoingRun(
            str(uuid.uuid4()), f"bench-{i}", "bench.noop", [], {}, {}, window, f"bench-{i}@w", 1
        )
        for i in range(n)
    ]
    found: dict[str, float] = {}
    try:
        for publisher in [CeleryPublisher(app), DirectPublisher(app)] * 2:
            publisher.publish_many(runs[:10])  # connect and plan outside the timing
            started = time.perf_counter()
            if publisher.publish_many(runs) != [None] * n:
                raise RuntimeError(f"{type(publisher).__name__} failed to publish")
            took = (time.perf_counter() - started) * 1000
            publisher.close()
            clear_redis_db(db)
            name = type(publisher).__name__
            found[name] = min(took, found.get(name, took))
    finally:
        clear_redis_db(db)
    return found


# Runs the other tree's own publishers_ms with that tree first on sys.path.
_IN_TREE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from benchmarks.publish_floor import publishers_ms
import celery_routines.sending.direct as direct
assert direct.__file__.startswith(sys.argv[1]), direct.__file__
print(json.dumps(publishers_ms(int(sys.argv[2]), int(sys.argv[3]))))
"""


def publishers_in(tree: Path, db: int, n: int) -> dict[str, float]:
    """``publishers_ms`` of the checkout in ``tree``, in a subprocess."""
    done = subprocess.run(
        [sys.executable, "-c", _IN_TREE, str(tree), str(db), str(n)],
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    found: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def print_publishers(db: int, n: int, baseline: str | None, rounds: int) -> None:
    here = Path(__file__).resolve().parent.parent
    trees = [("this tree", here)]
    if baseline:
        trees.append(("baseline", Path(baseline).resolve()))
    print(f"publish_many of {n} runs (one task, no args), ms, best of two; one round a line:")
    for _ in range(rounds):
        cells = []
        for label, tree in trees:
            found = publishers_in(tree, db, n)
            cells.append(
                f"{label}: CeleryPublisher {found['CeleryPublisher']:8.1f}"
                f"  DirectPublisher {found['DirectPublisher']:8.1f}"
            )
        print("  " + "  |  ".join(cells), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--publishers", action="store_true", help="celery-routines' publishers")
    parser.add_argument("--baseline", help="another checkout's publishers, in the same run")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of --publishers")
    args = parser.parse_args()

    db = claim_redis_db()
    app = Celery("floor", set_as_current=False)
    app.conf.broker_url = redis_url(db)
    connection = app.connection_for_write()
    producer = app.amqp.Producer(connection, auto_declare=False)
    queue = app.amqp.queues[app.conf.task_default_queue]

    def send_task() -> None:
        send_tasks(app, producer, args.n)

    def send_task_batched() -> None:
        with producer.batch():
            send_tasks(app, producer, args.n, retry=False)

    def messages_only() -> None:
        for _ in range(args.n):
            app.amqp.create_task_message(str(uuid.uuid4()), "bench.noop", [], {})

    def messages_batched() -> None:
        with producer.batch():
            for _ in range(args.n):
                message = app.amqp.create_task_message(str(uuid.uuid4()), "bench.noop", [], {})
                send = app.amqp.send_task_message
                send(producer, "bench.noop", message, queue=queue, retry=False)

    rows = [
        ("send_task, one round trip each (RedBeat, Celery beat)", send_task),
        ("send_task in a kombu publish batch (celery-routines)", send_task_batched),
        ("create_task_message + send_task_message, batched", messages_batched),
        ("create_task_message alone (no serialising, no I/O)", messages_only),
    ]
    try:
        print(f"{args.n} task messages to Redis db {db}, median of {args.repeat}:")
        for label, action in rows:
            print(f"  {median_ms(action, args.repeat):8.3f} ms  {label}", flush=True)
            clear_redis_db(db)
        if args.publishers:
            print_publishers(db, args.n, args.baseline, args.rounds)
    finally:
        connection.release()
        clear_redis_db(db, keep_owner=False)


if __name__ == "__main__":
    main()
