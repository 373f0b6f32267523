"""Fixtures of the fault suite: fault_app worker processes, private clusters, the runs table.

Worker processes run ``tests.faults.fault_app`` (worker_app's tasks plus the fault tasks);
every process a test starts is SIGKILLed at teardown, every private cluster destroyed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from akadze_core import App
from akadze_core.store.migrations import migrate
from tests.faults.fault_app import build_fault_app
from tests.workers.support import RUNS_TABLE, PrivateCluster, WorkerProcess

SpawnWorker = Callable[..., WorkerProcess]
FAULT_APP = "tests.faults.fault_app"


@pytest.fixture
def spawn_worker(tmp_path: Path) -> Iterator[SpawnWorker]:
    """``spawn_worker(url, *args, env=None)`` starts a fault_app worker; killed at teardown."""
    started: list[WorkerProcess] = []

    def spawn(url: str, *args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        process = WorkerProcess(url, tmp_path / f"worker-{len(started)}.log", list(args),
                                module=FAULT_APP, env=env)
        started.append(process)
        return process

    yield spawn
    for process in started:
        process.stop()


@pytest.fixture
def runs_db(db: psycopg.Connection) -> psycopg.Connection:
    """``db`` (a fresh database on the test server) with the ``runs`` table."""
    db.execute(RUNS_TABLE)
    return db


@pytest.fixture
def app(database_url: str) -> Iterator[App]:
    """The fault harness's App on the test database, used to enqueue."""
    application = build_fault_app(database_url)
    yield application
    application.close()


def start_cluster(password_auth: bool = False) -> PrivateCluster:
    """A started private cluster with the schema and the runs table (skips if impossible)."""
    try:
        server = PrivateCluster(password_auth=password_auth)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or ""
        pytest.skip(f"cannot create a private Postgres cluster: {exc} {detail}".strip())
    try:
        server.start()
        with psycopg.connect(server.url(), autocommit=True) as connection:
            migrate(connection)
            connection.execute(RUNS_TABLE)
    except BaseException:
        server.destroy()
        raise
    return server


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    """A private cluster (trust auth) this test may break."""
    server = start_cluster()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="module")
def password_cluster() -> Iterator[PrivateCluster]:
    """A private cluster whose TCP connections need the right password (scram-sha-256).

    Shared by the tests of a module (each creates roles of its own names): these tests
    refuse connections, they do not break the server."""
    server = start_cluster(password_auth=True)
    try:
        yield server
    finally:
        server.destroy()
