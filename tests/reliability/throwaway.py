"""Throwaway PostgreSQL clusters and Redis servers on free loopback ports, started and stopped by the tests.

A fault test stops, restarts and cuts the connections of these servers, never of the shared ones that
DATABASE_URL and REDIS_URL name. Both listen on 127.0.0.1 only and keep nothing on disk beyond a temporary
folder that ``close()`` removes.

PostgreSQL refuses to run as root, and CI runs as root: there the cluster belongs to the ``postgres``
account (present wherever Debian's PostgreSQL package is installed; else ``nobody``) and its commands run
through ``runuser``. Its folder lives in a fresh directory under the system temp dir (pytest's ``tmp_path``
is private to root, so that account could not reach it).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

STARTUP_TIMEOUT_SECONDS = 30


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def postgres_bindir() -> Path | None:
    """The folder holding initdb, pg_ctl and postgres: from PATH, else the newest Debian install."""
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(os.path.realpath(on_path)).parent
    installs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda path: int(Path(path).parent.name))
    return Path(installs[-1]) if installs and (Path(installs[-1]) / "initdb").exists() else None


def missing_binaries() -> str | None:
    """Why throwaway servers cannot start here, or None."""
    if postgres_bindir() is None:
        return "PostgreSQL server binaries (initdb, pg_ctl) not found"
    if shutil.which("redis-server") is None:
        return "redis-server not found"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser (PostgreSQL refuses to run as root)"
    return None


def _unprivileged_account() -> pwd.struct_passwd:
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError("no unprivileged account (postgres or nobody) to run PostgreSQL as")


class ThrowawayPostgres:
    """A PostgreSQL cluster of its own (trust auth, superuser ``postgres``) on a free port of 127.0.0.1."""

    def __init__(self) -> None:
        bindir = postgres_bindir()
        if bindir is None:
            raise RuntimeError("PostgreSQL server binaries not found")
        self.bindir = bindir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="gpuest-pg-"))
        self.data_dir = self.root / "data"
        self.log_path = self.root / "server.log"
        self._account = _unprivileged_account() if os.geteuid() == 0 else None
        if self._account is not None:
            os.chown(self.root, self._account.pw_uid, self._account.pw_gid)
        self._run("initdb", "-D", str(self.data_dir), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--no-sync", "--locale=C")
        self.start()

    def _run(self, program: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bindir / program), *args]
        if self._account is not None:
            argv = ["runuser", "-u", self._account.pw_name, "--", *argv]
        completed = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=self.root)
        if check and completed.returncode != 0:
            raise RuntimeError(f"{program} failed ({completed.returncode}): {completed.stderr[-2000:]}")
        return completed

    def start(self) -> None:
        # fsync off: a test cluster needs no durability, and syncing costs seconds on a busy disk.
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories='{self.root}' "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_path), "-o", options, "-w",
                  "-t", str(STARTUP_TIMEOUT_SECONDS), "start")

    def stop(self, mode: str = "fast") -> None:
        """``fast`` ends every session (a restart or failover as clients see it); ``immediate`` is a crash."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "stop")

    def is_running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data_dir), "status", check=False).returncode == 0

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str = "postgres") -> psycopg.Connection[Any]:
        """A superuser connection in autocommit mode (for the test's own statements)."""
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=database,
                               autocommit=True, connect_timeout=5)

    def create_database(self, name: str) -> str:
        with self.connect() as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def terminate_blocked_statements(self, database: str, lock_sql: str, params: tuple[Any, ...], matching: str,
                                     timeout: float = 15.0) -> list[str]:
        """Terminate sessions *in the middle of a statement*, deterministically: hold the row lock that
        ``lock_sql`` takes, wait until a statement containing ``matching`` queues behind it, terminate every
        session queued behind it, then release the lock. Returns the terminated statements."""
        terminated: list[str] = []
        with self.connect(database) as locker, self.connect(database) as killer, locker.transaction():
            locker.execute(lock_sql, params)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and not any(matching in query for query in terminated):
                blocked = killer.execute(
                    "SELECT pid, query FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                    (locker.info.backend_pid,),
                ).fetchall()
                for pid, query in blocked:
                    if killer.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,):
                        terminated.append(query)
                time.sleep(0.01)
        return terminated

    def terminate_backends(self, database: str) -> int:
        """``pg_terminate_backend`` on every session of ``database`` (as a failover does); how many ended."""
        with self.connect() as connection:
            rows = connection.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            ).fetchall()
        return sum(1 for (ended,) in rows if ended)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.is_running():
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class ThrowawayRedis:
    """A redis-server of its own on a free port of 127.0.0.1, keeping nothing on disk: a restart loses every
    message, the harshest broker outage."""

    def __init__(self) -> None:
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="gpuest-redis-"))
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = (self.root / "server.log").open("ab")
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.root)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
