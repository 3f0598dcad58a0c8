"""Runs as Flower shows them, checked against a real Flower process.

The end-to-end test starts the production set-up of ``docker-compose.yml``
with the same argv (after ``celery -A <app>``), the same environment variable
names and the same health-check commands, on real PostgreSQL and Redis:
``routines migrate``, two beats, two workers sending events, Flower. The
argv constants below are what ``tests/test_compose.py`` holds the compose
file to, so every command compose runs is one this suite runs.
"""

from __future__ import annotations

import ast
import base64
import importlib.util
import json
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from celery_routines import Scheduler, register
from celery_routines.store import Store
from tests import services
from tests.conftest import FakeClock
from tests.e2e.processes import HERE, CeleryProcess, environment, wait_until
from tests.harness import filesystem_app

# argv after ``celery -A <app>``, exactly as docker-compose.yml runs them.
MIGRATE = ["routines", "migrate"]
BEAT = ["beat", "-S", "celery_routines.Scheduler", "--loglevel", "INFO"]
WORKERS = {
    name: ["worker", "-E", "--loglevel", "INFO", "-n", f"{name}@%h"]
    for name in ("worker-1", "worker-2")
}
FLOWER = ["flower"]  # port and credentials come from FLOWER_PORT and FLOWER_BASIC_AUTH
# Health checks, as compose runs them (``$HOSTNAME``: the container's host name,
# which is what ``%h`` expands to).
WORKER_HEALTH = ["inspect", "ping", "-d", "{worker}@$HOSTNAME"]
BEAT_HEALTH = [
    "python",
    "-c",
    "import os, urllib.request; urllib.request.urlopen("
    "'http://127.0.0.1:%s/readyz' % os.environ['ROUTINES_METRICS_PORT'], timeout=5)",
]
FLOWER_HEALTH = [
    "python",
    "-c",
    "import os, urllib.request; urllib.request.urlopen("
    "'http://127.0.0.1:%s/healthcheck' % os.environ['FLOWER_PORT'], timeout=5)",
]
FLOWER_USER, FLOWER_PASSWORD = "routines", "flower-e2e"


# -- the message: what Flower will show --------------------------------------


def test_a_run_keeps_its_task_name_and_arguments_and_shows_the_routine_in_kwargsrepr(
    sqlite_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    register("tasks.report", timedelta(minutes=1), name="report", kwargs={"day": "today"}, args=[1])
    folder = tmp_path / "broker"
    scheduler = Scheduler(filesystem_app(folder, sqlite_url), clock=clock)
    try:
        scheduler.tick()
        clock.advance(minutes=1)
        scheduler.tick()
    finally:
        scheduler.close()
    [path] = sorted(folder.glob("*.msg"))
    envelope = json.loads(path.read_text())
    headers = envelope["headers"]
    args, kwargs, _ = json.loads(base64.b64decode(envelope["body"]))
    assert headers["task"] == "tasks.report"  # the real name: no shadow
    assert (args, kwargs) == ([1], {"day": "today"})  # the task's signature is untouched
    assert headers["argsrepr"] == "[1]"
    shown = ast.literal_eval(headers["kwargsrepr"])
    assert shown == {
        "routine": "report",
        "routine_window": "report@2026-11-30T12:01:00+00:00",
        "routine_attempt": 1,
        "day": "today",
    }
    assert list(shown)[:3] == ["routine", "routine_window", "routine_attempt"]


# -- a real Flower --------------------------------------------------------------


def require_flower() -> None:
    if importlib.util.find_spec("flower") is None:
        message = "flower is not installed (pip install flower; it belongs in the tests extra)"
        if services.services_required():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def flower_get(port: int, path: str, **query: str) -> Any:
    url = f"http://127.0.0.1:{port}{path}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    request = urllib.request.Request(url)
    token = base64.b64encode(f"{FLOWER_USER}:{FLOWER_PASSWORD}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def celery_command(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "e2e_app", *args],
        cwd=HERE, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def health_command(
    argv: list[str], env: dict[str, str], **names: str
) -> subprocess.CompletedProcess[str]:
    """Run a compose health check: ``python ...`` as is, anything else after
    ``celery -A <app>``; ``$HOSTNAME`` is this host's name, as in a container."""
    argv = [part.format(**names).replace("$HOSTNAME", socket.gethostname()) for part in argv]
    if argv[0] == "python":
        return subprocess.run(
            [sys.executable, *argv[1:]], env=env, capture_output=True, text=True, timeout=60
        )
    return celery_command(argv, env)


def beat_metric(port: int, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body = response.read().decode()
    return next(
        sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name == name
    )


def succeeded_runs(store: Store, name: str) -> set[str]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT r.id FROM routine_runs r JOIN routines t ON t.id = r.routine_id "
                "WHERE t.name = :name AND r.state = 'succeeded'"
            ),
            {"name": name},
        )
        return {row.id for row in rows}


def flower_sees_a_succeeded_run(port: int, store: Store) -> bool:
    try:
        tasks = flower_get(port, "/api/tasks", taskname="e2e_app.tick", state="SUCCESS")
    except OSError:
        return False
    return bool(set(tasks) & succeeded_runs(store, "tick"))


@pytest.mark.e2e
@pytest.mark.postgres
@pytest.mark.redis
def test_flower_lists_the_run_beat_sent_with_its_state_and_routine(
    tmp_path: Path, postgres_url: str, redis_url: str
) -> None:
    require_flower()
    env = environment(
        redis_url,
        postgres_url,
        E2E_INTERVAL="2",
        E2E_QUEUE=f"flower-{uuid.uuid4().hex[:8]}",
        ROUTINES_REDIS_URL=redis_url,
        FLOWER_BASIC_AUTH=f"{FLOWER_USER}:{FLOWER_PASSWORD}",
    )
    migrated = celery_command(MIGRATE, env)
    assert migrated.returncode == 0, migrated.stderr
    flower_port = free_port()
    flower_env = {**env, "FLOWER_PORT": str(flower_port)}
    beat_envs = [{**env, "ROUTINES_METRICS_PORT": str(free_port())} for _ in range(2)]
    processes = [CeleryProcess(FLOWER, flower_env, tmp_path / "flower.log")]
    processes += [
        CeleryProcess(argv, env, tmp_path / f"{name}.log") for name, argv in WORKERS.items()
    ]
    processes += [
        CeleryProcess(BEAT, beat_env, tmp_path / f"beat-{n}.log")
        for n, beat_env in enumerate(beat_envs, 1)
    ]
    store = Store.from_url(postgres_url)
    try:
        wait_until(
            lambda: flower_sees_a_succeeded_run(flower_port, store),
            timeout=90,
            what="Flower to list a run of 'tick' in state SUCCESS",
            logs=processes,
        )
        tasks = flower_get(flower_port, "/api/tasks", taskname="e2e_app.tick", state="SUCCESS")
        run_id = sorted(set(tasks) & succeeded_runs(store, "tick"))[0]
        task = tasks[run_id]
        assert task["name"] == "e2e_app.tick" and task["state"] == "SUCCESS"
        assert task["worker"].split("@")[0] in WORKERS
        shown = ast.literal_eval(task["kwargs"])
        assert shown["routine"] == "tick" and shown["routine_attempt"] == 1
        assert shown["routine_window"].startswith("tick@")
        # Flower's search finds a routine's runs by the shown kwargs.
        found = flower_get(flower_port, "/api/tasks", search="kwargs:routine=tick")
        assert run_id in found
        assert flower_get(flower_port, "/api/task/info/" + run_id)["state"] == "SUCCESS"

        # Both beats serve metrics; together they sent at least every run that
        # succeeded (read before scraping).
        done = len(succeeded_runs(store, "tick"))
        sent = sum(
            beat_metric(int(beat_env["ROUTINES_METRICS_PORT"]), "routines_windows_sent_total")
            for beat_env in beat_envs
        )
        assert sent >= done >= 1

        # The compose health checks pass against these processes.
        for name in WORKERS:
            pinged = health_command(WORKER_HEALTH, env, worker=name)
            assert pinged.returncode == 0, pinged.stdout + pinged.stderr
        for beat_env in beat_envs:
            checked = health_command(BEAT_HEALTH, beat_env)
            assert checked.returncode == 0, checked.stderr
        checked = health_command(FLOWER_HEALTH, flower_env)
        assert checked.returncode == 0, checked.stderr
    finally:
        for process in reversed(processes):
            process.stop()
        store.dispose()
