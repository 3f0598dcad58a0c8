"""Real ``celery beat`` and ``celery worker`` subprocesses for end-to-end tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


class CeleryProcess:
    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.handle = log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "e2e_app", *args],
            cwd=HERE,
            env=env,
            stdout=self.handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        if not self.handle.closed:
            self.handle.flush()
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)
        self.handle.close()


def environment(broker_url: str, database_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CELERY_BROKER_URL=broker_url,
        ROUTINES_DATABASE_URL=database_url,
        PYTHONPATH=os.pathsep.join([str(HERE), str(REPO), env.get("PYTHONPATH", "")]),
        **extra,
    )
    return env


def wait_until(condition: Callable[[], bool], timeout: float, what: str, logs: list) -> None:
    """Poll a condition on real processes (bounded), failing with their logs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        for proc in logs:
            if proc.process.poll() is not None:
                raise AssertionError(f"{proc.log.name} exited early:\n{proc.output()[-4000:]}")
        time.sleep(0.25)
    tails = "\n".join(f"--- {p.log.name}\n{p.output()[-3000:]}" for p in logs)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{tails}")
