"""A private PgBouncer in front of the test PostgreSQL (issue 29).

Debian's ``pgbouncer`` refuses to run as root, so it runs as the
``postgres`` user (FIELD-NOTES), in the foreground, as this test's own
process: its configuration, pid and log files live in a directory of its
own (readable by that user), it listens on a free loopback port, lets
``postgres`` in without a password (``auth_type = trust``) and forwards every
database name to the PostgreSQL on 127.0.0.1:5432. Stopped at teardown.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy.engine import make_url

from tests.faults.cluster import free_port

PGBOUNCER = "/usr/sbin/pgbouncer"
RUN_AS = "postgres"


class PgBouncer:
    def __init__(self, pool_mode: str = "transaction", pool_size: int = 20) -> None:
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="routines-pgbouncer-"))
        self.process: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> str | None:
        """Why it cannot run here, or None."""
        if not Path(PGBOUNCER).exists():
            return f"{PGBOUNCER} is not installed (apt-get install pgbouncer)"
        try:
            pwd.getpwnam(RUN_AS)
        except KeyError:
            return f"no {RUN_AS!r} user to run pgbouncer as"
        return None

    @property
    def log(self) -> Path:
        return self.dir / "pgbouncer.log"

    def url(self, database_url: str) -> str:
        """``database_url`` (the test PostgreSQL) through this PgBouncer."""
        return (
            make_url(database_url)
            .set(host="127.0.0.1", port=self.port)
            .render_as_string(hide_password=False)
        )

    def start(self) -> None:
        user = pwd.getpwnam(RUN_AS)
        config = self.dir / "pgbouncer.ini"
        (self.dir / "users.txt").write_text(f'"{RUN_AS}" ""\n')
        config.write_text(
            "[databases]\n"
            "* = host=127.0.0.1 port=5432\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'users.txt'}\n"
            f"pool_mode = {self.pool_mode}\n"
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 1000\n"
            # psycopg2 and some clients send these start-up parameters.
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.log}\n"
            f"pidfile = {self.dir / 'pgbouncer.pid'}\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
        )
        os.chown(self.dir, user.pw_uid, user.pw_gid)
        for path in self.dir.iterdir():
            os.chown(path, user.pw_uid, user.pw_gid)
        self.process = subprocess.Popen(
            [PGBOUNCER, str(config)],
            user=user.pw_uid,
            group=user.pw_gid,
            extra_groups=[],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.dir,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"pgbouncer exited: {self.log_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"pgbouncer did not listen on {self.port}: {self.log_text()}")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def errors(self) -> list[str]:
        """PgBouncer's own ERROR/WARNING lines (a client or server protocol
        error, a pool exhausted...)."""
        return [
            line
            for line in self.log_text().splitlines()
            if " ERROR " in line or " WARNING " in line
        ]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)
