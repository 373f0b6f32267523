"""A Patroni cluster of the test's own: one etcd and three Patroni-managed Postgres nodes on
free loopback ports, in a temporary directory, every process stopped by its pid.

Debian's ``patroni`` (3.0) and ``etcd-server`` (3.4) packages, and the Postgres 15 binaries
in /usr/lib/postgresql/15/bin. As root, everything runs as the ``postgres`` system user
(Postgres refuses root). The configuration files are JSON (YAML's subset: no YAML library
needed here).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.workers.support import free_port

POSTGRES_BIN = Path("/usr/lib/postgresql/15/bin")


def missing() -> str | None:
    """Why a Patroni cluster cannot be started here (None: it can)."""
    for program in ("patroni", "etcd"):
        if shutil.which(program) is None:
            return f"no {program} (Debian's patroni and etcd-server packages)"
    if not (POSTGRES_BIN / "postgres").exists():
        return f"no Postgres 15 binaries in {POSTGRES_BIN}"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a postgres system user"
    return None


class PatroniCluster:
    """etcd and three Patroni nodes; ``start()`` waits for a leader and two streaming
    replicas. ``synchronous``: Patroni's ``synchronous_mode`` (a commit waits for one
    standby, and only that standby may be promoted)."""

    NODES = 3

    def __init__(self, *, synchronous: bool = True, ttl: int = 10) -> None:
        self.user = "postgres" if os.geteuid() == 0 else None
        self.root = Path(tempfile.mkdtemp(prefix="akadze-patroni-"))
        self.root.chmod(0o755)
        self._own(self.root)
        self.synchronous = synchronous
        self.ttl = ttl
        self.etcd_port, self.etcd_peer = free_port(), free_port()
        self.names = [f"node{i}" for i in range(self.NODES)]
        self.pg_ports = {name: free_port() for name in self.names}
        self.api_ports = {name: free_port() for name in self.names}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.scope = f"akadze-{os.getpid()}-{self.etcd_port}"

    def _own(self, path: Path) -> None:
        if self.user:
            shutil.chown(path, self.user)

    def _spawn(self, key: str, argv: list[str]) -> None:
        log = open(self.root / f"{key}.log", "wb")  # noqa: SIM115 - the child keeps it
        try:
            self.processes[key] = subprocess.Popen(
                argv, cwd=self.root, user=self.user, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()

    # --- start ---------------------------------------------------------------------------------

    def _config(self, name: str) -> dict[str, Any]:
        home = self.root / name
        home.mkdir(mode=0o700)
        self._own(home)
        return {
            "scope": self.scope, "name": name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{self.api_ports[name]}",
                        "connect_address": f"127.0.0.1:{self.api_ports[name]}"},
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": self.ttl, "loop_wait": 1, "retry_timeout": 3,
                    "maximum_lag_on_failover": 1048576,
                    "synchronous_mode": self.synchronous,
                    "postgresql": {"use_pg_rewind": False, "parameters": {
                        # A process crash keeps what the OS has: fsync only costs time here.
                        "fsync": "off", "max_connections": 60, "wal_keep_size": "128MB"}},
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}],
                "pg_hba": ["local all all trust", "host all all 127.0.0.1/32 trust",
                           "host replication all 127.0.0.1/32 trust"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.pg_ports[name]}",
                "connect_address": f"127.0.0.1:{self.pg_ports[name]}",
                "data_dir": str(home / "data"), "bin_dir": str(POSTGRES_BIN),
                "pgpass": str(home / "pgpass"),
                "authentication": {"superuser": {"username": "postgres", "password": "unused"},
                                   "replication": {"username": "postgres",
                                                   "password": "unused"}},
                "parameters": {"unix_socket_directories": str(home)},
            },
        }

    def start(self, timeout: float = 60.0) -> None:
        """Start etcd, then the nodes; wait for one leader and two streaming replicas."""
        etcd_data = self.root / "etcd"
        self._spawn("etcd", [
            "etcd", "--name", "etcd0", "--data-dir", str(etcd_data),
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{self.etcd_peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.etcd_peer}",
            "--initial-cluster", f"etcd0=http://127.0.0.1:{self.etcd_peer}",
            "--initial-cluster-state", "new", "--logger", "zap", "--log-level", "warn"])
        self._wait(lambda: self._get(f"http://127.0.0.1:{self.etcd_port}/health") is not None,
                   15, "etcd")
        for name in self.names:
            config = self.root / f"{name}.yml"
            config.write_text(json.dumps(self._config(name), indent=1))
            self._own(config)
            self._spawn(name, ["patroni", str(config)])
            if name == self.names[0]:  # the first one bootstraps: the others copy it
                self._wait(lambda: self.leader() is not None, timeout, "a leader")
        self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Wait for a leader, two replicas caught up, and (synchronous) a sync standby."""
        self._wait(lambda: self.leader() is not None and self.streaming() == self.NODES - 1
                   and (not self.synchronous or self.sync_standby() is not None),
                   timeout, "a leader, two replicas caught up and a sync standby")

    # --- state ---------------------------------------------------------------------------------

    def _get(self, url: str) -> Any:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return json.loads(response.read() or b"null")
        except (OSError, ValueError, urllib.error.URLError):
            return None

    def members(self) -> list[dict[str, Any]]:
        """The members as a live node's REST API lists them ([] when none answers)."""
        for name in self.names:
            if self.alive(name):
                found = self._get(f"http://127.0.0.1:{self.api_ports[name]}/cluster")
                if found and found.get("members"):
                    return list(found["members"])
        return []

    def leader(self) -> str | None:
        """The running leader's name."""
        for member in self.members():
            if member.get("role") == "leader" and member.get("state") == "running":
                return str(member["name"])
        return None

    def streaming(self) -> int:
        """How many replicas stream from the leader."""
        return sum(1 for member in self.members()
                   if member.get("role") in ("replica", "sync_standby")
                   and member.get("state") in ("streaming", "running")
                   and member.get("lag", 1) == 0)

    def sync_standby(self) -> str | None:
        """The synchronous standby's name."""
        for member in self.members():
            if member.get("role") == "sync_standby":
                return str(member["name"])
        return None

    def alive(self, name: str) -> bool:
        process = self.processes.get(name)
        return process is not None and process.poll() is None

    def dsn(self, **extra: str) -> str:
        """A multi-host key/value DSN over the three nodes, writable server first found."""
        ports = ",".join(str(self.pg_ports[name]) for name in self.names)
        hosts = ",".join("127.0.0.1" for _ in self.names)
        params = {"host": hosts, "port": ports, "user": "postgres", "dbname": "postgres",
                  "target_session_attrs": "read-write", "connect_timeout": "2", **extra}
        return " ".join(f"{key}={value}" for key, value in params.items())

    # --- faults --------------------------------------------------------------------------------

    def switchover(self, timeout: float = 30.0) -> tuple[str, str]:
        """A planned switchover through the leader's REST API, to the synchronous standby in
        synchronous mode (the only member Patroni lets take over); returns (old, new)."""
        old = self.leader()
        assert old is not None
        wanted: dict[str, str] = {"leader": old}
        if self.synchronous:
            self._wait(lambda: self.sync_standby() is not None, timeout, "a sync standby")
            wanted["candidate"] = str(self.sync_standby())
        else:
            wanted["candidate"] = next(name for name in self.names if name != old)
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.api_ports[old]}/switchover",
            data=json.dumps(wanted).encode(), method="POST",
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"switchover refused ({exc.code}): {exc.read()!r}") from None
        self._wait(lambda: self.leader() not in (None, old), timeout, "the new leader")
        new = self.leader()
        assert new is not None
        return old, new

    def postmaster_pid(self, name: str) -> int | None:
        """The pid of the node's postmaster (its postmaster.pid), None when not running."""
        try:
            return int((self.root / name / "data" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def crash(self, name: str) -> None:
        """SIGKILL the node's Patroni and its postmaster, as a host lost would."""
        postmaster = self.postmaster_pid(name)
        self.processes[name].send_signal(signal.SIGKILL)
        self.processes[name].wait(10)
        if postmaster is not None:
            self._kill_postmaster(postmaster)

    def _kill_postmaster(self, pid: int) -> None:
        # Only a postmaster of this cluster: its command line names a data directory here.
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return
        if str(self.root).encode() in command:
            _kill(pid, signal.SIGKILL)

    def wait_leader_other_than(self, old: str, timeout: float = 60.0) -> str:
        """Wait for a leader that is not ``old``; returns its name."""
        self._wait(lambda: self.leader() not in (None, old), timeout, "a new leader")
        new = self.leader()
        assert new is not None
        return new

    def _wait(self, predicate: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}; "
                                     f"logs in {self.root}:\n{self.logs()}")
            time.sleep(0.1)

    def logs(self) -> str:
        """The tail of every process's log."""
        parts = []
        for key in ["etcd", *self.names]:
            path = self.root / f"{key}.log"
            if path.exists():
                lines = path.read_text("utf-8", "replace").splitlines()[-15:]
                parts.append(f"--- {key}\n" + "\n".join(lines))
        return "\n".join(parts)

    # --- stop ----------------------------------------------------------------------------------

    def destroy(self) -> None:
        """Stop every process this cluster started, by pid (the nodes' Patroni first, which
        stops its Postgres; what is left after a grace is killed), and remove the files."""
        postmasters = [self.postmaster_pid(name) for name in self.names]
        for name in self.names:
            if self.alive(name):
                self.processes[name].send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for name in self.names:
            process = self.processes.get(name)
            if process is not None:
                try:
                    process.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    process.send_signal(signal.SIGKILL)
                    process.wait(5)
        for pid in postmasters:
            if pid is not None:
                self._kill_postmaster(pid)
        etcd = self.processes.get("etcd")
        if etcd is not None and etcd.poll() is None:
            etcd.send_signal(signal.SIGTERM)
            try:
                etcd.wait(10)
            except subprocess.TimeoutExpired:
                etcd.send_signal(signal.SIGKILL)
                etcd.wait(5)
        shutil.rmtree(self.root, ignore_errors=True)


def _kill(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)
