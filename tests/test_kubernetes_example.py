"""examples/kubernetes/beat.yaml, checked without a cluster: its probes ask
the paths beat serves, on the port and address its environment sets, and it
runs the same beat command as docker-compose.yml."""

from __future__ import annotations

from pathlib import Path

import yaml

from celery_routines.config import settings_from
from celery_routines.observe.health import PROBES
from tests.e2e import test_flower as e2e

MANIFEST = Path(__file__).resolve().parent.parent / "examples" / "kubernetes" / "beat.yaml"


def test_the_beat_deployment_probes_what_beat_serves(monkeypatch) -> None:
    deployment = yaml.safe_load(MANIFEST.read_text())
    assert deployment["kind"] == "Deployment"
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    [port] = container["ports"]
    assert str(port["containerPort"]) == env["ROUTINES_HEALTH_PORT"]
    probes = {
        kind: container[kind]["httpGet"]
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert probes["livenessProbe"]["path"] == "/livez"
    assert {p["path"] for p in probes.values()} <= set(PROBES)
    assert {p["port"] for p in probes.values()} == {port["name"]}
    # The environment is one beat accepts (the kubelet probes the pod's IP).
    for name, value in env.items():
        if name.startswith("ROUTINES_") and value is not None:
            monkeypatch.setenv(name, value)
    settings = settings_from(None)
    assert (settings.health_port, settings.health_address) == (8081, "0.0.0.0")
    command = container["command"]
    assert command[:3] == ["celery", "-A", "production"]
    assert command[3:7] == e2e.BEAT[:4]
