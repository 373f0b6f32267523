"""Time limits and ``revoke(terminate=True)`` with real ``akadze-compat worker`` processes.

Prefork works as Celery's: the soft limit is SIGUSR1 to the child (a blocking ``time.sleep``
or socket read is interrupted), the hard limit kills and replaces the child and fails the
task with TimeLimitExceeded, and terminate signals the child running the task. Threads and
solo pools cannot signal one body: there terminate is a plain revoke.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from akadze_compat import _state, states
from akadze_compat.exceptions import TaskRevokedError, TimeLimitExceeded
from tests.compat.cli_harness import PROJECTS, CompatWorker, wait_until
from tests.compat.conftest import SpawnCompat
from tests.helpers import children_of, job

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def limits(module_database_url: str) -> Iterator[Any]:
    """limitsproj imported here, its app bound to the module's database."""
    previous_path, previous_app = list(sys.path), _state._current_app
    sys.path[:0] = [str(PROJECTS)]
    import limitsproj

    limitsproj.app.conf.broker_url = module_database_url
    _ = limitsproj.app.core.database_url
    limitsproj.app.set_current()
    yield limitsproj
    limitsproj.app.close()
    sys.path[:] = previous_path
    _state.set_current_app(previous_app)  # type: ignore[arg-type]


@pytest.fixture
def db(module_database_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(module_database_url, autocommit=True) as connection:
        yield connection


_queues = iter(range(1_000_000))


def worker_for(spawn_compat: SpawnCompat, url: str, pool: str,
               env: dict[str, str] | None = None) -> tuple[CompatWorker, str]:
    queue = f"limits{next(_queues)}{pool}"
    worker = spawn_compat("-A", "limitsproj", "worker", "-P", pool, "-c", "1", "-Q", queue,
                          "-l", "INFO", env={"CELERY_BROKER_URL": url, **(env or {})})
    worker.wait_ready(60)
    return worker, queue


def body_pid(path: Path) -> int:
    wait_until(lambda: path.exists() and path.read_text() != "", timeout=30)
    return int(path.read_text())


def gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")


# --- soft limit by signal ------------------------------------------------------------------

@pytest.mark.parametrize("where", ["task", "call", "setting"])
def test_prefork_soft_limit_interrupts_time_sleep(limits: Any, module_database_url: str,
                                                  spawn_compat: SpawnCompat, tmp_path: Path,
                                                  where: str) -> None:
    env = {"LIMITSPROJ_SOFT": "1"} if where == "setting" else None
    worker, queue = worker_for(spawn_compat, module_database_url, "prefork", env)
    path = str(tmp_path / "pid")
    if where == "task":
        result = limits.soft_sleeper.apply_async((path,), queue=queue)
    else:
        options = {"soft_time_limit": 1} if where == "call" else {}
        result = limits.sleeper.apply_async((path,), queue=queue, **options)
    value = result.get(timeout=20)
    assert value["soft"] is True, value
    assert 0.9 < value["after"] < 5, value  # not the 30 s sleep
    assert value["pid"] in children_of(worker.pid)  # the same child: it was not replaced
    assert result.state == states.SUCCESS
    name = "limitsproj.soft_sleeper" if where == "task" else "limitsproj.sleeper"
    assert f"Soft time limit (1.0s) exceeded for {name}[{result.id}]" in worker.log()


def test_prefork_soft_limit_interrupts_a_blocking_socket_read(
        limits: Any, module_database_url: str, spawn_compat: SpawnCompat,
        tmp_path: Path) -> None:
    _, queue = worker_for(spawn_compat, module_database_url, "prefork")
    with socket.create_server(("127.0.0.1", 0)) as server:  # accepts, never sends
        port = server.getsockname()[1]
        result = limits.soft_reader.apply_async((str(tmp_path / "pid"), port), queue=queue)
        value = result.get(timeout=20)
    assert value["soft"] is True, value
    assert 0.9 < value["after"] < 5, value


def test_threads_soft_limit_waits_for_the_blocking_call(
        limits: Any, module_database_url: str, spawn_compat: SpawnCompat,
        tmp_path: Path) -> None:
    # The contrast the migration guide describes: in a thread the exception is delivered at
    # the next bytecode, so a 3 s sleep ends first.
    _, queue = worker_for(spawn_compat, module_database_url, "threads")
    result = limits.sleeper.apply_async((str(tmp_path / "pid"), 3), queue=queue,
                                        soft_time_limit=1)
    value = result.get(timeout=20, propagate=False)
    assert result.state == states.FAILURE or value["after"] >= 2.9, value


def test_prefork_async_body_gets_the_soft_limit_at_its_await_and_is_killed_at_the_hard(
        limits: Any, module_database_url: str, spawn_compat: SpawnCompat,
        tmp_path: Path) -> None:
    worker, queue = worker_for(spawn_compat, module_database_url, "prefork")
    value = limits.async_sleeper.apply_async((str(tmp_path / "a"),), queue=queue).get(
        timeout=20)
    assert value["soft"] is True and 0.9 < value["after"] < 3, value
    path = tmp_path / "b"
    stuck = limits.async_sleeper.apply_async((str(path),), {"swallow": True}, queue=queue)
    pid = body_pid(path)
    with pytest.raises(TimeLimitExceeded):
        stuck.get(timeout=20)
    wait_until(lambda: gone(pid), timeout=15)
    assert limits.whoami.apply_async(queue=queue).get(timeout=30)["pid"] \
        in children_of(worker.pid)


# --- hard limit ----------------------------------------------------------------------------

def test_prefork_hard_limit_kills_the_child_fails_at_once_and_the_next_task_runs(
        limits: Any, module_database_url: str, spawn_compat: SpawnCompat, tmp_path: Path,
        db: psycopg.Connection) -> None:
    worker, queue = worker_for(spawn_compat, module_database_url, "prefork")
    path = tmp_path / "pid"
    started = time.monotonic()
    result = limits.hard_sleeper.apply_async((str(path),), queue=queue)
    pid = body_pid(path)
    with pytest.raises(TimeLimitExceeded):
        result.get(timeout=20)
    assert time.monotonic() - started < 10  # the 1 s limit, not the 30 s sleep
    assert result.state == states.FAILURE
    assert isinstance(result.result, TimeLimitExceeded)
    row = job(db, result.job_id)
    # FAILURE at once, as Celery: no retry, one run, the error is TimeLimitExceeded.
    assert (row["state"], row["run_count"]) == ("failed", 1), row
    assert [entry["type"] for entry in row["errors"]] == ["TimeLimitExceeded"], row["errors"]
    wait_until(lambda: gone(pid), timeout=15)
    after = limits.whoami.apply_async(queue=queue).get(timeout=30)
    assert after["pid"] != pid and after["pid"] in children_of(worker.pid)
    log = worker.log()
    assert f"Hard time limit (1.0s) exceeded for limitsproj.hard_sleeper[{result.id}]" in log
    # The failure hooks ran in the worker process, as Celery's Request.on_timeout runs them.
    assert (f"limitsproj-hook on_failure pid={worker.pid} task_id={result.id} "
            f"exc=TimeLimitExceeded") in log
    assert (f"limitsproj-signal task_failure pid={worker.pid} id={result.id} "
            f"exception=TimeLimitExceeded") in log


def test_prefork_per_call_hard_limit(limits: Any, module_database_url: str,
                                     spawn_compat: SpawnCompat, tmp_path: Path) -> None:
    _, queue = worker_for(spawn_compat, module_database_url, "prefork")
    path = tmp_path / "pid"
    result = limits.sleeper.apply_async((str(path),), queue=queue, time_limit=1)
    pid = body_pid(path)
    with pytest.raises(TimeLimitExceeded):
        result.get(timeout=20)
    wait_until(lambda: gone(pid), timeout=15)


# --- revoke(terminate=True) ----------------------------------------------------------------

@pytest.mark.parametrize(("signal_arg", "signum", "died"),
                         [(None, 15, "SIGTERM"), ("KILL", 9, "SIGKILL"), (9, 9, "SIGKILL")])
def test_prefork_terminate_signals_the_child_and_revokes_unspent(
        limits: Any, module_database_url: str, spawn_compat: SpawnCompat, tmp_path: Path,
        db: psycopg.Connection, signal_arg: Any, signum: int, died: str) -> None:
    worker, queue = worker_for(spawn_compat, module_database_url, "prefork")
    path = tmp_path / "pid"
    result = limits.sleeper.apply_async((str(path),), queue=queue)
    pid = body_pid(path)
    asked = time.monotonic()
    if signal_arg is None:
        result.revoke(terminate=True)
    else:
        limits.app.control.revoke(result.id, terminate=True, signal=signal_arg)
    wait_until(lambda: result.state == states.REVOKED, timeout=20)
    assert time.monotonic() - asked < 10
    assert isinstance(result.result, TaskRevokedError)
    assert result.result.args == ("terminated",)  # Celery's reason for a terminate
    row = job(db, result.job_id)
    assert (row["state"], row["attempt"], row["cancel_signal"]) == ("cancelled", 0, signum)
    assert died in row["errors"][-1]["message"]
    wait_until(lambda: gone(pid), timeout=15)
    worker.wait_log(f"limitsproj-signal task_revoked pid={worker.pid} id={result.id} "
                    f"terminated=True signum={signum} expired=False")
    # The child was replaced; the next task runs, its retries untouched.
    after = limits.whoami.apply_async(queue=queue).get(timeout=30)
    assert after == {"pid": after["pid"], "retries": 0} and after["pid"] != pid


def test_prefork_terminate_with_sigusr1_raises_the_soft_limit_in_the_body(
        limits: Any, module_database_url: str, spawn_compat: SpawnCompat,
        tmp_path: Path) -> None:
    # As in Celery, where SIGUSR1 is the soft time limit's signal: the body sees
    # SoftTimeLimitExceeded, its process survives, and what it returns stands.
    _, queue = worker_for(spawn_compat, module_database_url, "prefork")
    path = tmp_path / "pid"
    result = limits.sleeper.apply_async((str(path),), queue=queue)
    pid = body_pid(path)
    result.revoke(terminate=True, signal="SIGUSR1")
    value = result.get(timeout=20)
    assert value["soft"] is True and value["pid"] == pid
    assert not gone(pid)


@pytest.mark.parametrize("pool", ["threads", "solo"])
def test_threads_and_solo_terminate_is_a_revoke_of_a_body_that_runs_on(
        limits: Any, module_database_url: str, spawn_compat: SpawnCompat, tmp_path: Path,
        pool: str) -> None:
    worker, queue = worker_for(spawn_compat, module_database_url, pool)
    path = tmp_path / "pid"
    result = limits.sleeper.apply_async((str(path), 2), queue=queue)
    assert body_pid(path) == worker.pid  # a thread of the worker process
    result.revoke(terminate=True)
    worker.wait_log("terminate requested, but this worker runs bodies in threads")
    value = result.get(timeout=20)  # it ran on and returned: SUCCESS, as a plain revoke
    assert value["soft"] is False and value["after"] >= 1.9
    assert result.state == states.SUCCESS
    assert worker.proc.poll() is None
    assert not re.search(r"task_revoked .* terminated=True", worker.log())


def test_terminate_before_start_keeps_it_from_running(
        limits: Any, module_database_url: str, spawn_compat: SpawnCompat, tmp_path: Path,
        db: psycopg.Connection) -> None:
    _, queue = worker_for(spawn_compat, module_database_url, "prefork")
    first, second = tmp_path / "first", tmp_path / "second"
    running = limits.sleeper.apply_async((str(first), 2), queue=queue)
    body_pid(first)
    waiting = limits.sleeper.apply_async((str(second), 2), queue=queue)
    waiting.revoke(terminate=True)
    assert running.get(timeout=20)["soft"] is False
    wait_until(lambda: waiting.state == states.REVOKED, timeout=20)
    time.sleep(0.5)
    assert not second.exists()
    assert job(db, waiting.job_id)["attempt"] == 0


# --- results too large to store --------------------------------------------------------------

@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_result_over_max_result_bytes_fails_that_task_alone_and_the_pool_goes_on(
        limits: Any, module_database_url: str, spawn_compat: SpawnCompat,
        db: psycopg.Connection, pool: str) -> None:
    """Seed 000: a result that can never be stored fails its task at once (no retry, one
    run); tasks beside it succeed, and the pool's children live on (a prefork child checks
    the size before the result crosses its pipe). AKADZE_MAX_RESULT_BYTES sets the limit."""
    worker, queue = worker_for(spawn_compat, module_database_url, pool,
                               {"AKADZE_MAX_RESULT_BYTES": str(1024 * 1024)})
    children = sorted(children_of(worker.pid)) if pool == "prefork" else []
    big = limits.big_result.apply_async((2 * 1024 * 1024,), queue=queue)
    beside = [limits.whoami.apply_async(queue=queue) for _ in range(3)]
    fits = limits.big_result.apply_async((1024 * 1024 - 2,), queue=queue)
    big.get(timeout=30, propagate=False)
    assert big.state == states.FAILURE
    row = job(db, big.job_id)
    assert (row["state"], row["run_count"], row["result"]) == ("failed", 1, None), row
    assert [entry["type"] for entry in row["errors"]] == ["ResultTooLarge"], row["errors"]
    assert "max_result_bytes" in row["errors"][0]["message"]
    for result in beside:
        assert result.get(timeout=30)["retries"] == 0
    assert len(fits.get(timeout=30)) == 1024 * 1024 - 2
    after = limits.whoami.apply_async(queue=queue).get(timeout=30)
    if pool == "prefork":
        assert sorted(children_of(worker.pid)) == children  # no child died or was replaced
        assert after["pid"] in children
    assert worker.proc.poll() is None
