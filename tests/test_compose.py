"""docker-compose.yml, checked without Docker: it parses, has the services,
health checks and start-up order of a production set-up, and every command it
runs (health checks included) is one the test suite runs too, with the same
argv (tests/e2e/test_flower.py)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from celery_routines.operator.web.auth import parse_web_auth
from tests.e2e import panel_cluster as panel
from tests.e2e import test_flower as e2e

REPO = Path(__file__).resolve().parent.parent
COMPOSE = REPO / "docker-compose.yml"
APP = "production"
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
# The keys of the Compose specification this file may use (a typo in a key is
# silently ignored by some compose versions; here it fails).
TOP_LEVEL = {"services", "volumes", "networks", "configs", "secrets", "name"}
SERVICE_KEYS = {
    "build", "image", "command", "entrypoint", "environment", "env_file", "depends_on",
    "healthcheck", "ports", "volumes", "restart", "networks", "deploy", "labels", "pull_policy",
}  # fmt: skip
HEALTHCHECK_KEYS = {"test", "interval", "timeout", "retries", "start_period", "start_interval"}
DURATION = re.compile(r"^\d+(ms|s|m|h)$")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def app_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The services that run our image (all but PostgreSQL and Redis)."""
    return {name: s for name, s in services.items() if name not in ("postgres", "redis")}


def celery_argv(service: dict[str, Any]) -> list[str]:
    """The argv after ``celery -A production``; fails for any other command."""
    command = service["command"]
    assert isinstance(command, list), "use the exec (list) form: no shell in between"
    assert command[:3] == ["celery", "-A", APP], command
    return command[3:]


def interpolate(value: str) -> str:
    """Compose's ``${NAME:-default}`` with NAME unset, and ``$$`` -> ``$``."""
    value = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)
    return value.replace("$$", "$")


def health_argv(service: dict[str, Any]) -> list[str]:
    test = service["healthcheck"]["test"]
    assert isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL"), test
    if test[0] == "CMD-SHELL":
        assert len(test) == 2
        return shlex.split(interpolate(test[1]))
    return test[1:]


def test_the_file_uses_only_compose_keys(compose: dict[str, Any]) -> None:
    extra = {key for key in compose if not key.startswith("x-")} - TOP_LEVEL
    assert not extra
    for name, service in compose["services"].items():
        assert set(service) <= SERVICE_KEYS, (name, set(service) - SERVICE_KEYS)
        assert "image" in service or "build" in service, name
        if "healthcheck" in service:
            check = service["healthcheck"]
            assert set(check) <= HEALTHCHECK_KEYS, name
            for key in ("interval", "timeout", "start_period"):
                if key in check:
                    assert DURATION.match(check[key]), (name, key, check[key])
        for port in service.get("ports", []):
            assert re.fullmatch(r"(127\.0\.0\.1:)?\d+:\d+", port), port
    for volume in compose.get("volumes", {}):
        assert any(
            str(v).startswith(f"{volume}:")
            for service in compose["services"].values()
            for v in service.get("volumes", [])
        ), f"volume {volume} is declared but unused"


def test_the_services_of_a_production_set_up(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == {
        "postgres", "redis", "migrate", "beat-1", "beat-2", "worker-1", "worker-2", "flower",
        "web",
    }  # fmt: skip
    assert services["postgres"]["image"].startswith("postgres:")
    assert services["redis"]["image"].startswith("redis:")
    roles = [celery_argv(s)[0] for s in app_services(services).values()]
    assert sorted(roles) == ["beat", "beat", "flower", "routines", "routines", "worker", "worker"]


def test_every_long_running_service_has_a_health_check(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        if name == "migrate":
            assert "healthcheck" not in service and service["restart"] == "no"
            continue
        assert service["healthcheck"]["test"], name
        assert service["restart"] == "unless-stopped", name


def test_start_up_order_waits_for_healthy_services_and_the_migration(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        for dependency, spec in service.get("depends_on", {}).items():
            assert dependency in services, (name, dependency)
            assert spec["condition"] in CONDITIONS, (name, spec)
            if dependency in ("postgres", "redis"):
                assert spec["condition"] == "service_healthy", (name, dependency)
    for name in ("migrate", "beat-1", "beat-2", "worker-1", "worker-2", "flower", "web"):
        assert {"postgres", "redis"} <= set(services[name]["depends_on"]), name
    for name in ("beat-1", "beat-2", "worker-1", "worker-2", "web"):
        # Two beats must not race each other through the migrations.
        assert services[name]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"
        }
    assert "migrate" not in services["migrate"]["depends_on"]


def test_beats_use_the_scheduler_and_serve_metrics(services: dict[str, dict[str, Any]]) -> None:
    host_ports = set()
    for name in ("beat-1", "beat-2"):
        argv = celery_argv(services[name])
        assert argv[0] == "beat"
        assert argv[argv.index("-S") + 1] == "celery_routines.Scheduler"
        port = services[name]["environment"]["ROUTINES_METRICS_PORT"]
        [mapping] = services[name]["ports"]
        # Published on the host's loopback only: /metrics has no auth.
        address, host, container = mapping.split(":")
        assert address == "127.0.0.1" and container == port, mapping
        host_ports.add(host)
    assert len(host_ports) == 2


def test_every_command_is_one_the_e2e_test_runs(services: dict[str, dict[str, Any]]) -> None:
    assert celery_argv(services["migrate"]) == e2e.MIGRATE
    assert celery_argv(services["beat-1"]) == celery_argv(services["beat-2"]) == e2e.BEAT
    for name in ("worker-1", "worker-2"):
        assert celery_argv(services[name]) == e2e.WORKERS[name]
    assert celery_argv(services["flower"]) == e2e.FLOWER
    assert celery_argv(services["web"]) == panel.WEB


def test_every_health_check_is_one_the_e2e_test_runs(
    services: dict[str, dict[str, Any]],
) -> None:
    assert health_argv(services["beat-1"]) == health_argv(services["beat-2"]) == e2e.BEAT_HEALTH
    assert health_argv(services["flower"]) == e2e.FLOWER_HEALTH
    assert health_argv(services["web"]) == panel.WEB_HEALTH
    for name in ("worker-1", "worker-2"):
        argv = health_argv(services[name])
        assert argv[:3] == ["celery", "-A", APP]
        assert argv[3:] == [part.format(worker=name) for part in e2e.WORKER_HEALTH]


def test_the_environment_names_are_the_ones_the_e2e_test_sets(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in app_services(services).items():
        env = service["environment"]
        assert env["CELERY_BROKER_URL"].startswith("redis://redis:6379/")
        assert env["ROUTINES_DATABASE_URL"].startswith("postgresql://")
        assert "@postgres:5432/" in env["ROUTINES_DATABASE_URL"]
        assert env["ROUTINES_REDIS_URL"].startswith("redis://redis:6379/")
        # The gate lives in its own Redis database, apart from the broker's keys.
        assert env["ROUTINES_REDIS_URL"] != env["CELERY_BROKER_URL"], name
    flower = services["flower"]
    assert flower["environment"]["FLOWER_PORT"] == flower["ports"][0].split(":")[1]
    # Flower's login comes from the environment, never from this file, and
    # Flower is published on the host's loopback only.
    assert flower["environment"]["FLOWER_BASIC_AUTH"] == "${FLOWER_BASIC_AUTH:-}"
    assert all(port.startswith("127.0.0.1:") for port in flower["ports"])
    # The panel binds every address in its container: only with a login, and
    # the port it serves is the one published and health-checked.
    web = services["web"]["environment"]
    assert web["ROUTINES_WEB_HOST"] == "0.0.0.0"
    [published] = services["web"]["ports"]
    # Published on the host's loopback only, on the port the panel serves.
    host, _, container_port = published.split(":")
    assert host == "127.0.0.1" and container_port == web["ROUTINES_WEB_PORT"]
    # No password ships with the file: unset, the panel refuses to start.
    assert interpolate(web["ROUTINES_WEB_AUTH"]) == ""
    assert interpolate(web["ROUTINES_WEB_TOKEN"]) == ""
    assert "pbkdf2_sha256$" not in COMPOSE.read_text()
    assert not parse_web_auth(interpolate(web["ROUTINES_WEB_AUTH"]), {}).configured


def test_the_app_compose_runs_imports_and_declares_routines() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "PYTHONPATH=/app/examples" in dockerfile
    # The image runs Flower; beat's metrics need prometheus-client, which the
    # metrics extra brings (and Flower 2 depends on it too).
    install = next(line for line in dockerfile.splitlines() if "pip install" in line)
    assert "flower" in install
    done = subprocess.run(
        [
            sys.executable, "-c",
            "import production; from celery_routines.registry import declared; "
            "print(production.app.main, production.app.conf.beat_scheduler, "
            "len(declared()))",
        ],
        cwd=REPO / "examples",
        env={**os.environ, "PYTHONPATH": str(REPO / "examples")},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    main, scheduler, count = done.stdout.split()
    assert (main, scheduler) == (APP, "celery_routines.Scheduler") and int(count) >= 1


def test_one_image_built_once_runs_every_app_service(services: dict[str, dict[str, Any]]) -> None:
    ours = app_services(services)
    assert {s["image"] for s in ours.values()} == {"celery-routines-production"}
    # Only migrate builds it (compose builds every image before it starts any
    # container); the others run that image and never try to pull it.
    assert [name for name, s in ours.items() if "build" in s] == ["migrate"]
    for name, service in ours.items():
        if name != "migrate":
            assert service["pull_policy"] == "never", name


def test_the_image_runs_as_a_non_root_user() -> None:
    lines = [line.strip() for line in (REPO / "Dockerfile").read_text().splitlines()]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), users
    # The last USER comes after every RUN: nothing runs as root at run time.
    last_user = max(i for i, line in enumerate(lines) if line.startswith("USER "))
    assert all(i < last_user for i, line in enumerate(lines) if line.startswith("RUN "))


def test_the_build_context_leaves_out_history_environments_and_databases() -> None:
    ignored = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "venv", "*.db", "examples/var", "**/__pycache__"} <= ignored
    # What `pip install .` in the Dockerfile needs stays in.
    for needed in ("pyproject.toml", "README.md", "celery_routines", "examples"):
        assert needed not in ignored, needed
