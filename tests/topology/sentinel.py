"""A Redis master, two replicas and three Sentinels of the test's own, on
free loopback ports (Debian's redis-server and redis-sentinel): never the
shared Redis, so failing it over hurts nobody."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis

from tests import services
from tests.faults.cluster import BrokerServer, free_port

MASTER_NAME = "routines-test"
REPLICAS = 2
SENTINELS = 3


def sentinel_installed() -> None:
    """Skip without redis-sentinel (``apt-get install redis-sentinel``; .ci/run
    installs it), or fail under ROUTINES_REQUIRE_SERVICES=1."""
    if shutil.which("redis-sentinel") and shutil.which("redis-server"):
        return
    message = "redis-sentinel is not installed: apt-get install redis-sentinel"
    if services.services_required():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _node(tmp_path: Path, name: str, *extra: str) -> BrokerServer:
    folder = tmp_path / name
    folder.mkdir()
    # Diskless full sync without the default 5 s wait for more replicas.
    return BrokerServer(
        folder, "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0", *extra
    )


class SentinelGroup:
    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path / "redis-group"
        self.dir.mkdir()
        self.nodes = [_node(self.dir, "node0")]
        for n in range(1, REPLICAS + 1):
            self.nodes.append(
                _node(self.dir, f"node{n}", "--replicaof", "127.0.0.1", str(self.nodes[0].port))
            )
        self.sentinel_ports = [free_port() for _ in range(SENTINELS)]
        self.sentinels: list[subprocess.Popen[bytes]] = []
        self.failovers: list[dict[str, object]] = []

    def url(self, db: int) -> str:
        """kombu's form: every Sentinel, the database number after the last."""
        return ";".join(f"sentinel://127.0.0.1:{p}" for p in self.sentinel_ports) + f"/{db}"

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        self._wait_for(lambda: self._replicas_of(self.nodes[0].port) == REPLICAS, "replicas")
        for number, port in enumerate(self.sentinel_ports):
            config = self.dir / f"sentinel{number}.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.nodes[0].port} 2\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} 1000\n"
                f"sentinel failover-timeout {MASTER_NAME} 4000\n"
                f"sentinel parallel-syncs {MASTER_NAME} 2\n"
            )
            log = open(self.dir / f"sentinel{number}.log", "ab")  # noqa: SIM115 - the process's
            self.sentinels.append(
                subprocess.Popen(["redis-sentinel", str(config)], stdout=log, stderr=log)
            )
            log.close()
        self._wait_until_settled()

    def _wait_for(self, condition, what: str, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                if condition():
                    return
            time.sleep(0.1)
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(self.dir.glob("*.log"))
        )
        raise AssertionError(f"Sentinel group: timed out waiting for {what}\n{logs}")

    def _client(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)

    def _replicas_of(self, port: int) -> int:
        with self._client(port) as client:
            info = client.info("replication")
        return sum(
            1
            for key, value in info.items()
            if key.startswith("slave") and isinstance(value, dict) and value["state"] == "online"
        )

    def master_port(self) -> int:
        """The master's port as the first Sentinel says it."""
        with self._client(self.sentinel_ports[0]) as client:
            _host, port = client.sentinel_get_master_addr_by_name(MASTER_NAME)
        return int(port)

    def _agreed_master(self) -> int | None:
        seen = set()
        for port in self.sentinel_ports:
            with self._client(port) as client:
                seen.add(int(client.sentinel_get_master_addr_by_name(MASTER_NAME)[1]))
        return seen.pop() if len(seen) == 1 else None

    def _wait_until_settled(self, expect_replicas: int = REPLICAS) -> int:
        """Every Sentinel names the same master, knows the others and the
        replicas, and the master answers as one: ready for a failover."""

        def settled() -> bool:
            master = self._agreed_master()
            if master is None:
                return False
            with self._client(master) as client:
                if client.info("replication")["role"] != "master":
                    return False
            if self._replicas_of(master) < expect_replicas:
                return False
            for port in self.sentinel_ports:
                with self._client(port) as client:
                    state = client.sentinel_master(MASTER_NAME)
                    if state["num-other-sentinels"] < SENTINELS - 1:
                        return False
                    if state["num-slaves"] < expect_replicas:
                        return False
                    flags = state["flags"]
                    if "failover_in_progress" in flags or "s_down" in flags:
                        return False
            return True

        self._wait_for(settled, "the Sentinels to agree on a master with its replicas", 60)
        return self.master_port()

    def failover(self) -> float:
        """``SENTINEL FAILOVER``: a replica promoted, the old master made its
        replica. Returns seconds until every Sentinel names the new master."""
        old = self.master_port()
        started = time.monotonic()
        with self._client(self.sentinel_ports[0]) as client:
            client.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)
        self._wait_for(lambda: self._agreed_master() not in (None, old), "the failover", 60)
        took = time.monotonic() - started
        self.failovers.append({"how": "SENTINEL FAILOVER", "from": old, "seconds": took})
        self._wait_until_settled()
        return took

    def kill_master(self) -> float:
        """SIGKILL the master: the Sentinels find it down (1 s) and promote a
        replica. Returns seconds from the kill until every Sentinel names it."""
        old = self.master_port()
        (node,) = [n for n in self.nodes if n.port == old]
        started = time.monotonic()
        node.kill()
        self._wait_for(lambda: self._agreed_master() not in (None, old), "the failover", 60)
        took = time.monotonic() - started
        self.failovers.append({"how": "master killed", "from": old, "seconds": took})
        self._wait_until_settled(expect_replicas=REPLICAS - 1)
        return took

    def describe(self, db: int) -> dict[int, object]:
        """Each server's role and key count in ``db`` (for failure messages)."""
        found: dict[int, object] = {}
        for node in self.nodes:
            try:
                with redis.Redis(host="127.0.0.1", port=node.port, db=db) as client:
                    found[node.port] = (client.info("replication")["role"], client.dbsize())
            except redis.RedisError:
                found[node.port] = "down"
        return found

    def stop(self) -> None:
        for process in self.sentinels:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        for node in self.nodes:
            node.kill()
