"""``Task.replace`` with a real ``akadze-compat worker`` SIGKILLed between the replacement's
insert and the commit that ends the task: nothing of the first attempt survives (the
replacement, the hand-over and the task's end are one transaction), the rescued task runs
again, replaces once, and the chain's rest runs once with the replacement's result.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from akadze_compat import _state, chain
from tests.compat.cli_harness import PROJECTS
from tests.compat.conftest import SpawnCompat

pytestmark = pytest.mark.slow

ROWS = "SELECT task, state FROM akadze.jobs WHERE task LIKE 'replaceproj.%' ORDER BY id"


@pytest.fixture
def project(module_database_url: str) -> Iterator[Any]:
    previous_path, previous_app = list(sys.path), _state._current_app
    sys.path[:0] = [str(PROJECTS)]
    import replaceproj
    replaceproj.app.conf.broker_url = module_database_url
    replaceproj.app.set_current()
    yield replaceproj
    replaceproj.app.close()
    sys.path[:] = previous_path
    _state.set_current_app(previous_app)  # type: ignore[arg-type]


def test_a_worker_killed_mid_replace_leaves_one_replacement(
        project: Any, module_database_url: str, spawn_compat: SpawnCompat,
        tmp_path: Path) -> None:
    mark, runs = tmp_path / "killed", tmp_path / "runs"
    env = {"CELERY_BROKER_URL": module_database_url, "REPLACEPROJ_KILL_MARK": str(mark),
           "REPLACEPROJ_RUNS": str(runs), "AKADZE_HEARTBEAT_INTERVAL": "0.2",
           "AKADZE_HEARTBEAT_TTL": "1.5"}
    args = ("-A", "replaceproj", "worker", "-P", "threads", "-c", "2", "-Q", "replace,celery",
            "-l", "INFO")
    first = spawn_compat(*args, env=env)
    first.wait_ready(60)
    result = chain(project.replaced.s(2, 3), project.mul.s(10)).apply_async(queue="replace")
    # (the queue goes to the first step, as in Celery; the rest and the replacement go to
    # "celery", which the worker consumes too)
    assert first.wait_exit(30) == -9  # killed itself inside the replacing transaction
    with psycopg.connect(module_database_url, autocommit=True) as db:
        # The rolled-back attempt inserted nothing; the task is still running (to rescue).
        assert db.execute(ROWS).fetchall() == [
            ("replaceproj.replaced", "running"), ("replaceproj.mul", "waiting")]
        second = spawn_compat(*args, env=env)
        second.wait_ready(60)
        assert result.get(timeout=30) == 50
        assert result.parent.get(timeout=5) == 5
        rows = db.execute(ROWS).fetchall()
    assert rows == [("replaceproj.replaced", "succeeded"), ("replaceproj.mul", "succeeded"),
                    ("replaceproj.add", "succeeded")]
    time.sleep(0.3)
    lines = runs.read_text().split()
    assert sorted(lines) == ["add", "mul", "replaced", "replaced"], lines


def test_a_prefork_child_replaces_its_task(
        project: Any, module_database_url: str, spawn_compat: SpawnCompat) -> None:
    worker = spawn_compat("-A", "replaceproj", "worker", "-P", "prefork", "-c", "1", "-Q",
                          "replace,celery", "-l", "INFO",
                          env={"CELERY_BROKER_URL": module_database_url})
    worker.wait_ready(60)
    result = chain(project.replaced.s(4, 5), project.mul.s(3)).apply_async(queue="replace")
    assert result.get(timeout=30) == 27
    assert project.app.AsyncResult(result.parent.id).get(timeout=5) == 9
