"""Fixtures of the worker subprocess tests: worker processes, a runs table, private clusters."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from akadze_core.store.migrations import migrate
from tests.workers.support import RUNS_TABLE, PrivateCluster, WorkerProcess

SpawnWorker = Callable[..., WorkerProcess]


@pytest.fixture
def spawn_worker(tmp_path: Path) -> Iterator[SpawnWorker]:
    """``spawn_worker(url, *args)`` starts a worker subprocess; all are killed at teardown."""
    started: list[WorkerProcess] = []

    def spawn(url: str, *args: str) -> WorkerProcess:
        process = WorkerProcess(url, tmp_path / f"worker-{len(started)}.log", list(args))
        started.append(process)
        return process

    yield spawn
    for process in started:
        process.stop()


@pytest.fixture
def runs_db(db: psycopg.Connection) -> psycopg.Connection:
    """``db`` (the shared server's test database) with the ``runs`` table the tasks write."""
    db.execute(RUNS_TABLE)
    return db


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    """A started private Postgres cluster with the akadze schema and the ``runs`` table."""
    try:
        server = PrivateCluster()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or ""
        pytest.skip(f"cannot create a private Postgres cluster: {exc} {detail}".strip())
    try:
        server.start()
        with psycopg.connect(server.url(), autocommit=True) as connection:
            migrate(connection)
            connection.execute(RUNS_TABLE)
        yield server
    finally:
        server.destroy()
