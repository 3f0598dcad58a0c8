"""The README's first command: the quickstart runs with no server at all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.e2e.processes import REPO

pytestmark = pytest.mark.e2e


def succeeded(database: Path) -> dict[str, int]:
    if not database.exists():
        return {}
    engine = create_engine(f"sqlite:///{database}")
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT t.name, count(*) FROM routine_runs r JOIN routines t "
                    "ON t.id = r.routine_id WHERE r.state = 'succeeded' GROUP BY t.name"
                )
            ).all()
    except Exception:
        return {}
    finally:
        engine.dispose()
    return dict(rows)


@pytest.mark.parametrize("publishing_processes", ["0", "2"], ids=["in_beat", "two_processes"])
def test_quickstart_worker_with_embedded_beat_runs_routines(
    tmp_path: Path, publishing_processes: str
) -> None:
    # A beat embedded in a worker ignores routines_publish_processes, and
    # says so: with publishing processes, the worker's shutdown hung.
    env = {
        **os.environ,
        "QUICKSTART_VAR": str(tmp_path),
        "ROUTINES_PUBLISH_PROCESSES": publishing_processes,
    }
    log = (tmp_path / "quickstart.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "--workdir",
            "examples",
            "-A",
            "quickstart",
            "worker",
            "-B",
            "--loglevel=INFO",
            "--concurrency",
            "2",
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            counts = succeeded(tmp_path / "routines.db")
            if counts.get("quickstart.heartbeat", 0) >= 1 and counts.get("greeter", 0) >= 1:
                break
            assert process.poll() is None, (tmp_path / "quickstart.log").read_text()
            time.sleep(0.5)
        else:
            pytest.fail(
                "quickstart ran nothing in 45 s:\n"
                + (tmp_path / "quickstart.log").read_text()[-4000:]
            )
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()
    output = (tmp_path / "quickstart.log").read_text()
    assert "sent quickstart.heartbeat@" in output
    if publishing_processes != "0":
        assert "routines_publish_processes = 2 ignored: this beat is embedded" in output
        assert "forked" not in output
