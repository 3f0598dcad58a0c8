"""A fault cluster whose messages a real worker consumes (tests/topology)."""

from __future__ import annotations

import re

from tests.e2e.processes import CeleryProcess, environment
from tests.faults.cluster import Cluster

RECEIVED = re.compile(r"Task [\w.]+\[([0-9a-f-]{36})\] received")


class WorkerCluster(Cluster):
    """A cluster whose messages are consumed by a real worker: what reached
    the broker is what the worker received (its log), not a queue's contents."""

    worker: CeleryProcess | None = None

    def start_worker(self) -> CeleryProcess:
        self.worker = CeleryProcess(
            [
                "worker",
                "--pool",
                "prefork",
                "--concurrency",
                "2",
                "--loglevel",
                "INFO",
                "--hostname",
                "w@%h",
                "--without-heartbeat",
                "--without-mingle",
                "--without-gossip",
            ],
            environment(self.broker_url, self.database_url, **self.extra_env),
            self.tmp_path / "worker.log",
        )
        self.processes.append(self.worker)
        return self.worker

    def broker_task_ids(self) -> list[str]:
        assert self.worker is not None
        return RECEIVED.findall(self.worker.output())
