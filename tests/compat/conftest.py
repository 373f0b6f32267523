"""Fixtures of the compat tests that run the sample projects with a real worker."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from akadze_compat import Celery
from akadze_core import Worker
from tests.compat.cli_harness import PROJECTS, CompatWorker
from tests.conftest import create_database, database_url_for, drop_database
from tests.helpers import run_worker_until


@pytest.fixture(scope="module")
def module_database_url(admin_url: str, template_database: str) -> Iterator[str]:
    """A fresh database with the akadze schema, shared by the tests of one module."""
    name = create_database(admin_url, template_database)
    yield database_url_for(admin_url, name)
    drop_database(admin_url, name)


SpawnCompat = Callable[..., CompatWorker]


def _spawner(log_dir: Path) -> tuple[SpawnCompat, list[CompatWorker]]:
    started: list[CompatWorker] = []

    def spawn(*args: str, cwd: Path = PROJECTS, env: dict[str, str] | None = None) \
            -> CompatWorker:
        worker = CompatWorker(log_dir / f"worker-{len(started)}.log", list(args), cwd=cwd,
                              env=env)
        started.append(worker)
        return worker

    return spawn, started


@pytest.fixture
def spawn_compat(tmp_path: Path) -> Iterator[SpawnCompat]:
    """``spawn_compat(*args)`` starts ``akadze-compat *args``; all are stopped at teardown."""
    spawn, started = _spawner(tmp_path)
    yield spawn
    for worker in started:
        worker.stop()


@pytest.fixture(scope="module")
def module_spawn_compat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpawnCompat]:
    """``spawn_compat`` for workers shared by the tests of one module."""
    spawn, started = _spawner(tmp_path_factory.mktemp("compat-workers"))
    yield spawn
    for worker in started:
        worker.stop()


@pytest.fixture
async def celery(database_url: str) -> AsyncIterator[Celery]:
    """A Celery app on this test's database (its engine pools closed afterwards)."""
    app = Celery("proj", broker=database_url, set_as_current=False)
    yield app
    if app._core is not None:
        await app._core.close_async()
    app.close()


async def work(app: Celery, done: Callable[[], bool], queues: tuple[str, ...] = ("celery",),
               timeout: float = 20, slots: int = 4) -> None:
    """Run an in-process worker for ``app`` until ``done()``."""
    worker = Worker(app.prepare_worker(), queues=list(queues), slots=slots, poll_interval=0.05)
    assert await run_worker_until(worker, done, timeout) == 0
