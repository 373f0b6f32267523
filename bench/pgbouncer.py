"""The core drain through PgBouncer in transaction mode, for its ratio to the direct drain.

PgBouncer (Debian's package) runs on a free port in front of the bench's own server, in
transaction mode, with as many server connections as the worker's pool may open; the jobs
are filled over the direct URL and drained by one ``akadze worker`` whose every statement
goes through the pooler, unprepared (``AKADZE_PREPARE_THRESHOLD=off``, what PgBouncer before
1.21 needs), with LISTEN on the direct URL (``AKADZE_LISTEN_URL``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from . import db
from .apps.core_app import NOOP
from .core import worker_argv
from .drain import DrainResult, drain, worker_env

BINARY_CANDIDATES = ("pgbouncer", "/usr/sbin/pgbouncer")


class PgBouncerUnavailable(Exception):
    """No pgbouncer binary here (``apt-get install pgbouncer``)."""


def binary() -> str:
    """The pgbouncer executable, or PgBouncerUnavailable."""
    for candidate in BINARY_CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    raise PgBouncerUnavailable("no pgbouncer binary (apt-get install pgbouncer)")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Bouncer:
    """One pgbouncer process in transaction mode in front of ``url``'s server."""

    def __init__(self, url: str, run_dir: Path, pool_size: int) -> None:
        params = conninfo_to_dict(url)
        self.port = _free_port()
        self.url = make_conninfo(url, host="127.0.0.1", port=str(self.port))
        directory = run_dir / "pgbouncer"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "users.txt").write_text(f'"{params.get("user", "postgres")}" ""\n')
        (directory / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={params.get('host', '127.0.0.1')} port={params.get('port', 5432)}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {directory / 'users.txt'}\n"
            f"pool_mode = transaction\ndefault_pool_size = {pool_size}\n"
            "max_client_conn = 500\n"
            f"logfile = {directory / 'pgbouncer.log'}\n")
        user = None
        if os.geteuid() == 0:  # pgbouncer refuses to run as root
            user = "postgres"
            uid = pwd.getpwnam(user).pw_uid
            for path in (directory, *directory.iterdir()):
                os.chown(path, uid, -1)
            run_dir.chmod(run_dir.stat().st_mode | 0o011)
        self.process = subprocess.Popen([binary(), str(directory / "pgbouncer.ini")],
                                        user=user, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while True:
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                break
            except psycopg.Error:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise PgBouncerUnavailable("pgbouncer did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        """Stop the pooler."""
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


def pgbouncer_drain(url: str, jobs: int, *, slots: int, run_dir: Path,
                    timeout: float = 1800) -> DrainResult:
    """Fill ``jobs`` async no-ops over ``url``, then drain them with one ``akadze worker``
    connected through a PgBouncer in transaction mode."""
    db.reset(url)
    db.fill(url, jobs, task=NOOP)
    bouncer = Bouncer(url, run_dir, pool_size=min(slots, 16) + 8)
    try:
        env = worker_env(bouncer.url, {"AKADZE_PREPARE_THRESHOLD": "off",
                                       "AKADZE_LISTEN_URL": url})
        # Progress is watched over the direct URL; only the worker goes through the pooler.
        return drain(url, worker_argv(bouncer.url, slots), jobs=jobs,
                     log=run_dir / f"pgbouncer-drain-{jobs}-{slots}.log", timeout=timeout,
                     env=env)
    finally:
        bouncer.stop()
