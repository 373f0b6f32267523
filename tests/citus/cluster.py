"""A Citus cluster of the tests' own: a coordinator and two workers on loopback.

Built from the PostgreSQL tree ``shared/tools/citus-build`` prints (or ``AKADZE_CITUS_BIN``),
each node initdb'd in a temporary directory on a free port, started with pg_ctl and stopped
by the pid in its ``postmaster.pid``. The system server on 5432 is never touched.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from tests.workers.support import free_port

#: The build script, relative to the checkout's parent (where the project's tools live).
BUILD_SCRIPTS = ("../shared/tools/citus-build", "../../shared/tools/citus-build")


def citus_bin() -> tuple[Path | None, str]:
    """The bin dir of a PostgreSQL with Citus, or None and the one-line reason it has none."""
    given = os.environ.get("AKADZE_CITUS_BIN")
    if given:
        path = Path(given)
        if (path / "initdb").exists():
            return path, ""
        return None, f"AKADZE_CITUS_BIN={given} has no initdb"
    checkout = Path(__file__).resolve().parents[2]
    script = next((checkout / s for s in BUILD_SCRIPTS if (checkout / s).exists()), None)
    if script is None:
        return None, "Citus cannot be built here: no shared/tools/citus-build next to the checkout"
    # The first build takes minutes; later runs print the cached bin dir at once.
    done = subprocess.run([str(script)], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["no reason given"])[-1]
        return None, f"Citus cannot be built here: {reason}"
    return Path(done.stdout.strip().splitlines()[-1]), ""


class Node:
    """One PostgreSQL server with Citus preloaded, in a temporary directory of its own."""

    def __init__(self, bin_dir: Path, root: Path, name: str) -> None:
        self.bin = bin_dir
        self.root = root / name
        self.root.mkdir()
        # Postgres refuses to run as root: then the node runs as the postgres system user.
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user:
            pwd.getpwnam(self.user)
            shutil.chown(self.root, self.user)
        self.data = self.root / "data"
        self.port = free_port()
        self.run(["initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
                  "--no-sync", "-E", "UTF8"])
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n".join([
                "shared_preload_libraries = 'citus'",
                "wal_level = logical",
                "max_prepared_transactions = 100",
                "max_connections = 200",
                "fsync = off",
                "synchronous_commit = off",
                "full_page_writes = off",
                f"port = {self.port}",
                "listen_addresses = '127.0.0.1'",
                f"unix_socket_directories = '{self.root}'",
                # Small nodes on a shared machine: the defaults would claim memory for nothing.
                "shared_buffers = 32MB",
                "citus.shard_count = 8",
                # The nodes talk over loopback without TLS (the server runs as postgres, whose
                # environment may point libpq at another user's certificate files).
                "citus.node_conninfo = 'sslmode=disable'",
                ""]))

    def run(self, command: list[str]) -> None:
        program, *args = command
        subprocess.run([str(self.bin / program), *args], user=self.user, check=True,
                       capture_output=True, text=True, timeout=120, cwd=self.root)

    def start(self) -> None:
        self.run(["pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"),
                  "-w", "-t", "60", "start"])

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError):
            return None

    def stop(self) -> None:
        """Fast shutdown by the postmaster's pid; immediate if it lingers."""
        pid = self.pid()
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGINT)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                os.kill(pid, 0)
                time.sleep(0.1)
            os.kill(pid, signal.SIGQUIT)
        except ProcessLookupError:
            pass


class CitusCluster:
    """A coordinator and two workers, Citus created in database ``postgres`` on each."""

    def __init__(self, bin_dir: Path) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="akadze-citus-"))
        self.root.chmod(0o755)
        self.nodes: list[Node] = []
        self.coordinator = self._node(bin_dir, "coordinator")
        self.workers = [self._node(bin_dir, "worker1"), self._node(bin_dir, "worker2")]

    def __enter__(self) -> CitusCluster:
        try:
            self.start()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def _node(self, bin_dir: Path, name: str) -> Node:
        node = Node(bin_dir, self.root, name)
        self.nodes.append(node)
        return node

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            with psycopg.connect(node.url(), autocommit=True) as connection:
                connection.execute("CREATE EXTENSION IF NOT EXISTS citus")
        with psycopg.connect(self.coordinator.url(), autocommit=True) as connection:
            connection.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)",
                               (self.coordinator.port,))
            for worker in self.workers:
                connection.execute("SELECT citus_add_node('127.0.0.1', %s)", (worker.port,))

    def url(self) -> str:
        """The coordinator's URL: every akadze connection goes there."""
        return self.coordinator.url()

    def worker_url(self, index: int) -> str:
        return self.workers[index].url()

    def destroy(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.root, ignore_errors=True)
