"""A fault cluster whose messages a real worker consumes (tests/topology)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tests.e2e.processes import CeleryProcess, environment
from tests.faults.cluster import Cluster

RECEIVED = re.compile(r"Task [\w.]+\[([0-9a-f-]{36})\] received")

# kombu 5.x: after a Sentinel failover the worker's consumer closes its
# connection, the Redis channel's close restores unacked messages through a
# pool it must rebuild from a transport already closed (``conninfo`` is None),
# and the AttributeError escapes ``ignore_errors``: the worker exits with
# "Unrecoverable error". Production restarts a worker that exits (systemd,
# Kubernetes); a test that fails over Redis does the same, for this death
# only. A worker killed by anything else, or with our code in the traceback,
# still fails the test.
KOMBU_SENTINEL_CLOSE = re.compile(
    r"kombu/transport/redis\.py\", line \d+, in _connparams\n.{0,300}?"
    r"AttributeError: 'NoneType' object has no attribute 'hostname'",
    re.S,
)


@dataclass
class WorkerCluster(Cluster):
    """A cluster whose messages are consumed by a real worker: what reached
    the broker is what the worker received (its log), not a queue's contents."""

    worker: CeleryProcess | None = None
    restart_on_kombu_close: bool = False
    workers: list[CeleryProcess] = field(default_factory=list)
    worker_restarts: list[str] = field(default_factory=list)

    def start_worker(self) -> CeleryProcess:
        label = "worker" if not self.workers else f"worker-{len(self.workers) + 1}"
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
                f"{label}@%h",
                "--without-heartbeat",
                "--without-mingle",
                "--without-gossip",
            ],
            environment(self.broker_url, self.database_url, **self.extra_env),
            self.tmp_path / f"{label}.log",
        )
        self.workers.append(self.worker)
        self.processes.append(self.worker)
        return self.worker

    def assert_alive(self) -> None:
        if self.restart_on_kombu_close:
            self._restart_worker_killed_by_kombu()
        super().assert_alive()

    def _restart_worker_killed_by_kombu(self) -> None:
        worker = self.worker
        if worker is None or worker.process.poll() in (None, 0):
            return
        output = worker.output()
        death = output[max(0, output.rfind("Unrecoverable error")) :]
        if not KOMBU_SENTINEL_CLOSE.search(death) or "/celery_routines/" in death:
            return
        worker.stop()
        self.processes.remove(worker)
        self.worker_restarts.append(worker.log.name)
        self.start_worker()

    def broker_task_ids(self) -> list[str]:
        """Every task id a worker received, across restarts."""
        return [task_id for worker in self.workers for task_id in RECEIVED.findall(worker.output())]
