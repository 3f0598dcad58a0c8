"""A private PostgreSQL primary and a streaming standby (issue 36, item 1).

Both clusters are this test's own, never the shared server on 5432: the
primary is made with ``initdb``, the standby with ``pg_basebackup`` from it,
each on a free loopback port, in a directory of their own, run as the
``postgres`` user (PostgreSQL refuses to run as root) with Debian's binaries
(``/usr/lib/postgresql/<version>/bin``). Loopback connections are trusted,
replication included.

``synchronous=True`` names the standby in the primary's
``synchronous_standby_names`` (set once the base backup is taken, so the
standby does not inherit it and a promoted standby does not wait for a
standby of its own): a commit returns only once the standby has the WAL.
``synchronous=False`` is streaming replication as it comes by default:
a commit returns when the primary has it, the standby a moment later.

Clients reach whichever is the primary through one libpq multi-host URL
(:meth:`PrimaryAndStandby.url`): ``host=a,b`` with
``target_session_attrs=read-write`` skips the server that is down or read
only.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.faults.cluster import free_port

RUN_AS = "postgres"
STANDBY_NAME = "standby"
DATABASE = "routines"


def postgres_bin() -> Path | None:
    """The newest Debian PostgreSQL's binaries, or None."""
    root = Path("/usr/lib/postgresql")
    versions = (
        sorted(
            (p for p in root.iterdir() if (p / "bin" / "pg_basebackup").exists()),
            key=lambda p: int(p.name) if p.name.isdigit() else 0,
        )
        if root.exists()
        else []
    )
    return versions[-1] / "bin" if versions else None


def unavailable() -> str | None:
    """Why a primary and standby cannot run here, or None."""
    if postgres_bin() is None:
        return "no PostgreSQL server binaries in /usr/lib/postgresql (apt-get install postgresql)"
    try:
        pwd.getpwnam(RUN_AS)
    except KeyError:
        return f"no {RUN_AS!r} user to run PostgreSQL as"
    return None


class Server:
    """One PostgreSQL cluster of the test's own."""

    def __init__(self, root: Path, name: str) -> None:
        self.name = name
        self.port = free_port()
        self.data = root / name
        self.log = root / f"{name}.log"
        found = postgres_bin()
        assert found is not None, unavailable()
        self.bin: Path = found

    def run(self, program: str, *args: str, timeout: float = 120) -> str:
        user = pwd.getpwnam(RUN_AS)
        done = subprocess.run(
            [str(self.bin / program), *args],
            user=user.pw_uid,
            group=user.pw_gid,
            extra_groups=[],
            cwd=self.data.parent,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode:
            raise AssertionError(
                f"{program} {' '.join(args)} failed ({done.returncode}):\n"
                f"{done.stdout}{done.stderr}\n{self.log_text()[-3000:]}"
            )
        return done.stdout

    def start(self) -> None:
        """``pg_ctl start``, waiting until it accepts connections."""
        options = f"-p {self.port}"
        self.run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")
        wait_listening(self.port)

    def stop_immediately(self) -> None:
        """``pg_ctl stop -m immediate``: every process killed, no checkpoint, no
        goodbye to clients or to the standby; as a crash, recovered at the next start."""
        self.run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
                self.stop_immediately()

    def promote(self) -> None:
        """``pg_ctl promote``, waiting until the server takes writes."""
        self.run("pg_ctl", "-D", str(self.data), "-w", "promote")

    def sql(self, statement: str, database: str = "postgres") -> str:
        return self.run(
            "psql",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            RUN_AS,
            "-d",
            database,
            "-AtX",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            statement,
        ).strip()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class PrimaryAndStandby:
    """A primary, a standby streaming from it, and a database ``routines``."""

    def __init__(self, synchronous: bool = True) -> None:
        self.synchronous = synchronous
        # Not the test's tmp_path: the postgres user must be able to enter it.
        self.root = Path(tempfile.mkdtemp(prefix="routines-pg-failover-"))
        user = pwd.getpwnam(RUN_AS)
        os.chown(self.root, user.pw_uid, user.pw_gid)
        self.primary = Server(self.root, "primary")
        self.standby = Server(self.root, "standby")

    def start(self) -> None:
        primary, standby = self.primary, self.standby
        primary.run(
            "initdb",
            "-D",
            str(primary.data),
            "-U",
            RUN_AS,
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )
        with open(primary.data / "postgresql.conf", "a") as conf:
            conf.write(
                "\n# tests/topology/pg_standby.py\n"
                "listen_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.root}'\n"
                "wal_level = replica\n"
                "max_wal_senders = 5\n"
                "hot_standby = on\n"
                "max_connections = 60\n"
                "shared_buffers = 16MB\n"
                # The machine's disk is shared: an OS crash is not what
                # this tests (an immediate stop keeps what the OS was given).
                "fsync = off\n"
                "full_page_writes = off\n"
                "wal_receiver_status_interval = 1s\n"
            )
        with open(primary.data / "pg_hba.conf", "a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")
        primary.start()
        primary.sql(f"CREATE DATABASE {DATABASE}")
        standby.run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            RUN_AS,
            "-D",
            str(standby.data),
            "-X",
            "stream",
            "-R",
            "--no-sync",
            "--checkpoint=fast",
        )
        with open(standby.data / "postgresql.auto.conf", "a") as conf:
            # -R wrote primary_conninfo; the standby's name is what the
            # primary's synchronous_standby_names waits for.
            conf.write(
                f"primary_conninfo = 'host=127.0.0.1 port={primary.port} user={RUN_AS} "
                f"application_name={STANDBY_NAME}'\n"
            )
        standby.start()
        if self.synchronous:
            primary.sql(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
            primary.sql("ALTER SYSTEM SET synchronous_commit = on")
            primary.sql("SELECT pg_reload_conf()")
        self.wait_streaming()

    def wait_streaming(self, timeout: float = 30) -> None:
        """Until the primary sees its standby streaming (and, synchronous,
        counts it as its synchronous standby)."""
        wanted = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.primary.sql(
                "SELECT state || ' ' || sync_state FROM pg_stat_replication "
                f"WHERE application_name = '{STANDBY_NAME}'"
            )
            if state == f"streaming {wanted}":
                return
            time.sleep(0.2)
        raise AssertionError(f"standby not streaming ({state!r}):\n{self.standby.log_text()}")

    def url(self, driver: str = "postgresql+psycopg") -> str:
        """One SQLAlchemy URL for both servers: libpq tries them in order and
        keeps the first that takes writes."""
        hosts = "&".join(f"host=127.0.0.1:{server.port}" for server in (self.primary, self.standby))
        return f"{driver}://{RUN_AS}@/{DATABASE}?{hosts}&target_session_attrs=read-write"

    def detach_standby(self) -> None:
        """Cut the standby off its primary (an empty ``primary_conninfo``,
        reloaded), as a lagging network would: from here on, what the
        primary commits is not on the standby. With synchronous replication
        the primary's commits wait instead (nothing is acknowledged that the
        standby lacks); with asynchronous replication they return."""
        with open(self.standby.data / "postgresql.auto.conf", "a") as conf:
            conf.write("primary_conninfo = ''\n")
        self.standby.run("pg_ctl", "-D", str(self.standby.data), "reload")
        deadline = time.monotonic() + 30
        while self.standby.sql("SELECT count(*) FROM pg_stat_wal_receiver") != "0":
            if time.monotonic() > deadline:
                raise AssertionError("the standby's WAL receiver did not stop")
            time.sleep(0.05)

    def fail_over(self, lag: float = 0.0, gap: float = 0.0) -> float:
        """Stop the primary hard, then promote the standby; with ``lag``, the
        standby is cut off that many seconds before the primary stops (the
        hard case: what the primary committed in that span is not on the
        standby). Returns the ``time.monotonic()`` at which the standby
        took writes; ``gap``: seconds between the primary's stop and the
        promotion, when no server takes writes."""
        if lag:
            self.detach_standby()
            time.sleep(lag)
        self.primary.stop_immediately()
        time.sleep(gap)
        self.standby.promote()
        return time.monotonic()

    def stop(self) -> None:
        for server in (self.standby, self.primary):
            server.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def wait_listening(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"PostgreSQL did not listen on {port}")
