"""A private, throw-away PostgreSQL cluster: ``agentledger chaos --pg-private`` restarts
it under the workers, and tests that restart or break the server use it.

Neither restarts, stops or reconfigures a server it did not start. A private cluster is
``initdb`` into a temporary directory with the installed binaries, trust authentication,
a free port on 127.0.0.1 and its socket in the same directory.
:meth:`PrivateCluster.destroy` stops the postmaster (SIGKILL if it will not stop) and
removes the directory; the tests' ``pg_cluster`` fixture calls it also when a test fails.

``initdb`` refuses to run as root: as root, the cluster runs as the ``postgres`` OS user
(``runuser``), with the directory handed to that user. Needs the ``postgres`` extra
(psycopg) and the server's binaries.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg import sql

from agentledger import _envsettings as envsettings


class ClusterUnavailable(RuntimeError):
    """No PostgreSQL binaries here, or no user to run them as."""


def find_bindir() -> Path:
    """The newest installed PostgreSQL's bin directory (``pg_bindir`` of the settings wins)."""
    chosen = envsettings.current().pg_bindir
    candidates = [chosen] if chosen else sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    found = [Path(c) for c in candidates if c and (Path(c) / "initdb").exists()]
    if not found:
        on_path = shutil.which("initdb")
        if on_path is None:
            raise ClusterUnavailable("no PostgreSQL binaries (initdb) found")
        return Path(on_path).parent
    return max(found, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateCluster:
    """One initdb'd cluster in a temporary directory; ``start()``/``stop()`` at will."""

    def __init__(self, bindir: Path | None = None) -> None:
        self.bindir = bindir or find_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="al_pgcluster_"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self._runas: list[str] = []
        self._uid: int | None = None
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                shutil.rmtree(self.root, ignore_errors=True)
                raise ClusterUnavailable("running as root and no 'postgres' user") from None
            self._runas = ["runuser", "-u", "postgres", "--"]
            self._uid = user.pw_uid
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )

    @property
    def admin_url(self) -> str:
        """The cluster's ``postgres`` database, as superuser ``postgres``."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> str:
        """Create database ``name`` on the (running) cluster and return its URL."""
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def _run(self, tool: str, *args: str, timeout: float = 60) -> None:
        result = subprocess.run(
            [*self._runas, str(self.bindir / tool), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=self.root,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{tool} failed: {result.stdout}{result.stderr}")

    def start(self, timeout: float = 30) -> None:
        """Start the postmaster and wait until it accepts connections."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
            "-c fsync=off -c max_connections=60 -c shared_buffers=16MB"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.admin_url, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self, mode: str = "fast") -> None:
        """Stop the postmaster (``fast``: disconnect everyone; ``immediate``: crash-like)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.data / "postmaster.pid").read_text().splitlines()[0])
        return None

    def destroy(self) -> None:
        """Stop the server however it is (SIGKILL as the last resort) and remove it all."""
        pid = self.postmaster_pid()
        if pid is not None:
            with contextlib.suppress(Exception):
                self.stop("immediate")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)
