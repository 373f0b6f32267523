"""What the worker subprocess tests start and break: worker processes and private clusters."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

from akadze_core.store.migrations import migrate
from tests.helpers import wait_for

PROJECT_ROOT = Path(__file__).resolve().parents[2]

#: The worker's connections carry this name, so tests can find and kill them.
WORKER_APPLICATION_NAME = "akadze-test-worker"

RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS runs (
    job_id    bigint      NOT NULL,
    run_count integer     NOT NULL,
    pid       integer     NOT NULL,
    started   timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def with_application_name(url: str, name: str = WORKER_APPLICATION_NAME) -> str:
    """``url`` (a URL or a key/value DSN) with ``application_name`` set."""
    if "://" in url:
        return f"{url}{'&' if '?' in url else '?'}application_name={name}"
    return f"{url} application_name={name}"


def runs(db: psycopg.Connection, job_id: int) -> list[tuple[int, int]]:
    """(run_count, pid) of every recorded start of ``job_id``, in order."""
    return db.execute("SELECT run_count, pid FROM runs WHERE job_id = %s ORDER BY started",
                      (job_id,)).fetchall()


def db_now(db: psycopg.Connection) -> Any:
    """The database clock (the only clock that decides time)."""
    return db.execute("SELECT clock_timestamp()").fetchone()[0]


class WorkerProcess:
    """One ``python -m tests.workers.worker_app`` subprocess; stderr goes to a file.

    ``module`` runs another harness with the same command line (tests/faults has one with more
    tasks); ``env`` adds environment variables (e.g. a fake clock for that harness).
    """

    def __init__(self, url: str, log_path: Path, args: list[str], *,
                 module: str = "tests.workers.worker_app",
                 env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        env = {**os.environ, "AKADZE_DATABASE_URL": url, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        """The process id."""
        return self.proc.pid

    def log(self) -> str:
        """Everything the process wrote so far."""
        return self.log_path.read_text("utf-8", errors="replace")

    def wait_log(self, text: str, timeout: float = 60.0) -> None:
        """Wait until ``text`` appears in the log (fails early if the process died). The
        timeout is generous: a worker's start (interpreter, imports, the schema check)
        takes over 10 s on a loaded machine, and a line that comes costs no more."""
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if self.proc.poll() is not None and text not in self.log():
                raise AssertionError(f"worker exited ({self.proc.returncode}) before logging "
                                     f"{text!r}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} in the worker log after {timeout}s:\n"
                                     f"{self.log()}")
            time.sleep(0.02)

    def wait_started(self, timeout: float = 60.0) -> None:
        """Wait until the worker registered and logged its start line."""
        self.wait_log(") started: queues", timeout)

    def signal(self, signum: int) -> float:
        """Send ``signum``; returns the monotonic time it was sent."""
        self.proc.send_signal(signum)
        return time.monotonic()

    def wait_exit(self, timeout: float = 20.0) -> tuple[int, float]:
        """Wait for the process to end; returns (exit code, monotonic time it was seen)."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker still running after {timeout}s:\n{self.log()}") from None
        return code, time.monotonic()

    def stop(self) -> None:
        """Kill the process if it still runs, and close the log file."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self._log.close()


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _postgres_bin() -> Path | None:
    for candidate in [shutil.which("initdb"),
                      *sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)]:
        if candidate:
            return Path(candidate).resolve().parent
    with contextlib.suppress(ImportError):
        from pgserver._commands import POSTGRES_BIN_PATH  # type: ignore[import-untyped]

        if (POSTGRES_BIN_PATH / "initdb").exists():
            return Path(POSTGRES_BIN_PATH)
    return None


class PrivateCluster:
    """A Postgres cluster of the test's own (initdb + pg_ctl), which it may restart or stop.

    Postgres refuses to run as root: as root, the server runs as the ``postgres`` system user,
    in a temporary directory that user owns.

    ``replica_of=<running cluster>``: a streaming standby of that cluster (pg_basebackup),
    on a port of its own, asynchronous (no ``synchronous_standby_names``); ``promote()``
    makes it a primary.

    ``password_auth=True``: TCP connections must give a password (scram-sha-256; the
    ``postgres`` superuser's is ``PASSWORD``), so wrong passwords are refused for real.
    Local socket connections stay trusted.
    """

    PASSWORD = "S3cr3tPW"
    #: The server's ``max_connections``; a subclass raises it for a large fleet.
    MAX_CONNECTIONS = 50

    def __init__(self, password_auth: bool = False,
                 replica_of: PrivateCluster | None = None) -> None:
        self.bin = _postgres_bin()
        if self.bin is None:
            raise RuntimeError("no initdb found (system Postgres or pgserver)")
        self.user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("running as root without a postgres system user") from None
            self.user = "postgres"
        self.root = Path(tempfile.mkdtemp(prefix="akadze-cluster-"))
        self.root.chmod(0o755)
        if self.user:
            shutil.chown(self.root, self.user)
        self.data = self.root / "data"
        self.logfile = self.root / "server.log"
        self.port = free_port()
        self.password_auth = password_auth
        self.running = False
        if replica_of is not None:
            # initdb's pg_hba trusts replication connections from 127.0.0.1, and wal_level
            # (replica) and max_wal_senders (10) default to what streaming needs. -R writes
            # standby.signal and primary_conninfo; -X stream copies the WAL written meanwhile.
            self._pg(["pg_basebackup", "-D", str(self.data), "-h", "127.0.0.1",
                      "-p", str(replica_of.port), "-U", "postgres", "-R", "-X", "stream",
                      "--checkpoint=fast", "--no-sync"])
            return
        auth = ["-A", "trust"]
        if password_auth:
            pwfile = self.root / "pwfile"
            pwfile.write_text(self.PASSWORD + "\n")
            if self.user:
                shutil.chown(pwfile, self.user)
            auth = ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
        self._pg(["initdb", "-D", str(self.data), "-U", "postgres", *auth,
                  "--no-sync", "-E", "UTF8"])

    def _pg(self, command: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        program, *args = command
        return subprocess.run([str(self.bin / program), *args], user=self.user, check=check,
                              capture_output=True, text=True, timeout=60, cwd=self.root)

    def _options(self) -> str:
        return (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                f"-c fsync=off -c max_connections={self.MAX_CONNECTIONS}")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._pg(["pg_ctl", "-D", str(self.data), "-o", self._options(), "-l",
                  str(self.logfile), "-w", "-t", "30", "start"])
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast`` disconnects everyone and shuts down cleanly)."""
        self._pg(["pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop"])
        self.running = False

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every connection is dropped, the server comes back."""
        self._pg(["pg_ctl", "-D", str(self.data), "-o", self._options(), "-l",
                  str(self.logfile), "-m", "fast", "-w", "-t", "30", "restart"])
        self.running = True

    def promote(self) -> None:
        """``pg_ctl promote``: a standby (``replica_of=``) leaves recovery and takes writes;
        returns once it does."""
        self._pg(["pg_ctl", "-D", str(self.data), "-w", "-t", "30", "promote"])

    def url(self, password: bool = True) -> str:
        """A URL of the ``postgres`` database (with a password trust auth ignores)."""
        secret = f":{self.PASSWORD}" if password else ""
        return f"postgresql://postgres{secret}@127.0.0.1:{self.port}/postgres"

    def url_for(self, user: str, password: str | None = None,
                database: str = "postgres") -> str:
        """A URL of ``database`` as ``user`` (with ``password`` if given)."""
        secret = f":{password}" if password is not None else ""
        return f"postgresql://{user}{secret}@127.0.0.1:{self.port}/{database}"

    def destroy(self) -> None:
        """Stop the server at once (if it runs) and delete its files."""
        if (self.data / "postmaster.pid").exists():
            self._pg(["pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop"],
                     check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def wait_until(predicate: Callable[[], bool], timeout: float = 20.0, what: str = "") -> float:
    """``wait_for`` that says what it waited for; returns the monotonic time it became true."""
    try:
        wait_for(predicate, timeout, 0.02)
    except AssertionError:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}") from None
    return time.monotonic()


C = TypeVar("C", bound=PrivateCluster)


@contextlib.contextmanager
def started_cluster(kind: type[C] = PrivateCluster,  # type: ignore[assignment]
                    *setup: str) -> Iterator[C]:
    """A started cluster of ``kind`` with the akadze schema and the ``setup`` statements
    run, destroyed afterwards; skips the test when no cluster can be made here."""
    try:
        server = kind()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot create a private Postgres cluster: {exc}")
    try:
        server.start()
        with psycopg.connect(server.url(), autocommit=True) as connection:
            migrate(connection)
            for statement in setup:
                connection.execute(statement)  # type: ignore[arg-type]
        yield server
    finally:
        server.destroy()
