"""The sample projects end to end: a real ``akadze-compat worker`` subprocess runs them, and
this test sends their tasks with the projects' own API and reads the outcomes back.

One database serves the module: the projects' apps are module-level objects bound to one
database once they connect. Each worker works on its own queues, so they never share jobs.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

import akadze_compat
from akadze_compat import _state, group, states
from akadze_compat.exceptions import TimeoutError as CeleryTimeoutError
from akadze_compat.result import AsyncResult
from tests.compat.cli_harness import DJANGO_PROJECT, PROJECTS, CompatWorker, wait_until
from tests.compat.conftest import SpawnCompat
from tests.helpers import children_of, job, job_of_task

pytestmark = pytest.mark.slow

HOST = socket.gethostname()


@pytest.fixture(scope="module")
def projects(module_database_url: str) -> Iterator[dict[str, Any]]:
    """Both projects imported here, their apps bound to the module's database."""
    previous_path, previous_app = list(sys.path), _state._current_app
    previous_settings = os.environ.get("DJANGO_SETTINGS_MODULE")
    sys.path[:0] = [str(PROJECTS), str(DJANGO_PROJECT)]
    import djangoproj.celery
    import plainproj.celery

    apps = {"plain": plainproj.celery.app, "django": djangoproj.celery.app}
    for app in apps.values():
        app.conf.broker_url = module_database_url  # this process only; workers get -b/env
        _ = app.core.database_url
    yield apps
    for app in apps.values():
        app.close()
    sys.path[:] = previous_path
    _state.set_current_app(previous_app)  # type: ignore[arg-type]
    if previous_settings is None:
        os.environ.pop("DJANGO_SETTINGS_MODULE", None)


@pytest.fixture(scope="module")
def plain_worker(module_database_url: str, module_spawn_compat: SpawnCompat) -> CompatWorker:
    """``-P threads -c 4`` on the queues of plainproj's task_queues (celery, hipri, lopri)."""
    worker = module_spawn_compat("-A", "plainproj", "worker", "-P", "threads", "-c", "4",
                                 "-l", "INFO", env={"CELERY_BROKER_URL": module_database_url})
    worker.wait_ready()
    return worker


@pytest.fixture
def plain(projects: dict[str, Any], plain_worker: CompatWorker) -> Any:
    projects["plain"].set_current()
    return projects["plain"]


@pytest.fixture
def db(module_database_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(module_database_url, autocommit=True) as connection:
        yield connection


# --- plainproj on a threads worker -------------------------------------------------------------

def test_shared_task_delay_and_get(plain: Any, db: psycopg.Connection,
                                   plain_worker: CompatWorker) -> None:
    from plainproj.billing.tasks import add

    result = add.delay(2, 3)
    assert result.get(timeout=20) == 5
    assert result.state == states.SUCCESS
    assert job(db, result.job_id)["queue"] == "celery"
    plain_worker.wait_log("plainproj-signal task_success", timeout=5)


def test_app_task_runs_with_the_worker_request(plain: Any) -> None:
    from plainproj.celery import debug_task

    info = debug_task.delay().get(timeout=20)
    assert info["hostname"] == f"celery@{HOST}" and info["queue"] == "celery"


def test_retries_then_success(plain: Any, db: psycopg.Connection) -> None:
    from plainproj import api

    task_id = api.checkout("o-1", fail_times=2)
    assert api.wait_for(task_id) == {"order": "o-1", "retries": 2, "queue": "hipri",
                                     "hostname": f"celery@{HOST}"}
    row = job_of_task(db, task_id)
    assert row["queue"] == "hipri" and row["attempt"] == 3
    assert [error["type"] for error in row["errors"]] == ["PaymentGatewayTimeout"] * 2


def test_autoretry_gives_up_with_the_original_exception(plain: Any,
                                                        db: psycopg.Connection) -> None:
    from plainproj import api
    from plainproj.billing.tasks import LedgerUnavailable

    task_id = api.sync("acct-9")
    with pytest.raises(LedgerUnavailable, match="ledger unreachable for acct-9"):
        api.wait_for(task_id)
    result = AsyncResult(task_id)
    assert result.state == states.FAILURE and isinstance(result.result, LedgerUnavailable)
    assert "LedgerUnavailable" in (result.traceback or "")
    assert job_of_task(db, task_id)["attempt"] == 3  # max_retries=2


def test_progress_state_is_visible_while_running(plain: Any, tmp_path: Path,
                                                 db: psycopg.Connection) -> None:
    from plainproj import api

    release = tmp_path / "release"
    task_id = api.start_report("r-7", str(release))
    result = AsyncResult(task_id)
    wait_until(lambda: result.state == "PROGRESS", timeout=20)
    assert result.info == {"report": "r-7", "step": 1, "of": 2}
    assert not result.ready()
    release.touch()
    assert result.get(timeout=20) == {"report": "r-7", "pages": 2}
    assert result.state == states.SUCCESS
    assert job_of_task(db, task_id)["queue"] == "lopri"  # routed by the glob


def test_countdown_and_eta_are_respected(plain: Any, db: psycopg.Connection) -> None:
    from plainproj import api

    later = api.remind_later("in 1.5s", 1.5)
    at = api.remind_at("at +1.5s", datetime.now(timezone.utc) + timedelta(seconds=1.5))
    time.sleep(0.8)
    for result in (later, at):
        assert result.state == states.PENDING
        assert job(db, result.job_id)["started_at"] is None
    for result in (later, at):
        assert result.get(timeout=20)["message"] in ("in 1.5s", "at +1.5s")
        row = job(db, result.job_id)
        assert row["started_at"] - row["created_at"] >= timedelta(seconds=1.4)
    with pytest.raises(CeleryTimeoutError):
        api.remind_later("never waited for", 60).get(timeout=0.2)


def test_explicit_queue_beats_the_routes(plain: Any, db: psycopg.Connection) -> None:
    from plainproj.billing.tasks import add, charge

    assert job(db, add.apply_async((1, 1), queue="lopri").job_id)["queue"] == "lopri"
    result = charge.apply_async(("o-2",), queue="celery")
    assert result.get(timeout=20)["queue"] == "celery"


def test_transactional_enqueue_commits_and_rolls_back(plain: Any, module_database_url: str,
                                                      db: psycopg.Connection) -> None:
    from plainproj.billing.tasks import add

    with psycopg.connect(module_database_url) as connection:
        with pytest.raises(RuntimeError), akadze_compat.transaction(connection):
            lost = add.delay(1, 2)
            raise RuntimeError("the order was not saved")
        with akadze_compat.transaction(connection):
            kept = add.delay(2, 2)
    assert db.execute("SELECT count(*) FROM akadze.jobs WHERE id = %s",
                      (lost.job_id,)).fetchone() == (0,)
    assert kept.get(timeout=20) == 4


def test_worker_signals_fire_in_celery_order(plain_worker: CompatWorker) -> None:
    names = re.findall(r"plainproj-signal (\w+)", plain_worker.log())
    assert names[:3] == ["celeryd_init", "worker_init", "worker_ready"]
    assert "worker_process_init" not in names  # Celery's threads pool does not send it


# --- stopping, solo and prefork ------------------------------------------------------------------

def test_sigterm_lets_the_running_task_finish_then_exits_0(
        projects: dict[str, Any], module_database_url: str, spawn_compat: SpawnCompat,
        db: psycopg.Connection) -> None:
    from plainproj.reports.tasks import nap

    projects["plain"].set_current()
    worker = spawn_compat("-b", module_database_url, "-A", "plainproj", "worker", "-P", "solo",
                          "-Q", "slowq", "-l", "INFO")
    worker.wait_ready()
    result = nap.apply_async((1.5,), queue="slowq")
    wait_until(lambda: job(db, result.job_id)["state"] == "running", timeout=20)
    worker.terminate(signal.SIGTERM)
    assert worker.wait_exit() == 0, worker.log()
    assert result.get(timeout=5) == "slept 1.5"
    log = worker.log()
    assert "worker: Warm shutdown (MainProcess)" in log
    assert "worker_shutting_down" in log and "how=Warm" in log and "sig=SIGTERM" in log
    names = re.findall(r"plainproj-signal (\w+)", log)
    assert names == ["celeryd_init", "worker_init", "worker_process_init", "worker_ready",
                     "worker_shutting_down", "worker_shutdown"]


def test_prefork_runs_tasks_in_two_processes(projects: dict[str, Any], module_database_url: str,
                                             spawn_compat: SpawnCompat) -> None:
    from plainproj.reports.tasks import whoami

    projects["plain"].set_current()
    worker = spawn_compat("-A", "plainproj", "worker", "-P", "prefork", "-c", "2", "-Q", "cpu",
                          "-l", "INFO", env={"CELERY_BROKER_URL": module_database_url})
    worker.wait_ready()
    children = children_of(worker.pid)
    assert len(children) == 2
    results = [whoami.apply_async((0.4,), queue="cpu") for _ in range(6)]
    pids = {result.get(timeout=30)["pid"] for result in results}
    assert pids == children
    # A child killed from outside is replaced; the pool goes on, and no task is lost.
    victim = min(children)
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: len(children_of(worker.pid) - children) == 1, timeout=30)
    wait_until(lambda: worker.log().count("worker_process_init") == 3, timeout=30)
    after = [whoami.apply_async(queue="cpu") for _ in range(4)]
    assert victim not in {result.get(timeout=30)["pid"] for result in after}
    # A group's plain members, known by ids derived from their job ids: the children
    # (handed the database's key with each job) run them under those ids, and with their
    # group index (their job's position, but the last one's, in its meta).
    grouped = group(whoami.s() for _ in range(4)).apply_async(queue="cpu")
    replies = [result.get(timeout=30) for result in grouped.results]
    assert [reply["id"] for reply in replies] == [result.id for result in grouped.results]
    assert [reply["group_index"] for reply in replies] == [0, 1, 2, 3]
    worker.terminate(signal.SIGTERM)
    assert worker.wait_exit() == 0, worker.log()
    log = worker.log()
    assert f"worker process {victim} was ended by SIGKILL while idle: replacing it" in log
    assert log.count("worker_process_init") == 3
    assert log.count("worker_process_shutdown") == 2  # the killed one could not say it
    names = re.findall(r"plainproj-signal (\w+)", log)
    assert names[:2] == ["celeryd_init", "worker_init"] and names[-1] == "worker_shutdown"


def test_prefork_replaces_a_child_after_max_tasks(projects: dict[str, Any],
                                                  module_database_url: str,
                                                  spawn_compat: SpawnCompat) -> None:
    from plainproj.reports.tasks import whoami

    projects["plain"].set_current()
    worker = spawn_compat("-b", module_database_url, "-A", "plainproj", "worker", "-c", "1",
                          "--max-tasks-per-child", "2", "-Q", "recycle", "-l", "INFO")
    worker.wait_ready()
    pids = [whoami.apply_async(queue="recycle").get(timeout=30)["pid"] for _ in range(5)]
    assert pids[0] == pids[1] and pids[2] == pids[3] and len(set(pids)) == 3, pids
    assert worker.log().count("ran 2 tasks (max_tasks_per_child)") == 2
    # Children stop by themselves when the worker process is killed.
    last = pids[-1]
    assert children_of(worker.pid) == {last}
    worker.terminate(signal.SIGKILL)
    wait_until(lambda: not os.path.exists(f"/proc/{last}"), timeout=15)
    # The child writes it after its parent is gone: wait on the log, not on the parent.
    gone = f"the worker process (pid {worker.pid}) is gone: exiting"
    wait_until(lambda: gone in worker.log(), timeout=10)


def _running(db: psycopg.Connection, queue: str) -> int:
    return db.execute("SELECT count(*) FROM akadze.jobs WHERE queue = %s AND state = 'running'",
                      (queue,)).fetchone()[0]


def test_prefork_prefetches_but_a_claimed_task_waits_for_a_free_process(
        projects: dict[str, Any], module_database_url: str, spawn_compat: SpawnCompat,
        db: psycopg.Connection) -> None:
    from plainproj.reports.tasks import whoami

    projects["plain"].set_current()
    worker = spawn_compat("-b", module_database_url, "-A", "plainproj", "worker", "-c", "2",
                          "--prefetch-multiplier", "4", "-Q", "fairq", "-l", "INFO")
    worker.wait_ready()
    slow = whoami.apply_async((4.0,), queue="fairq")
    wait_until(lambda: _running(db, "fairq") == 1, timeout=20)
    quick = [whoami.apply_async((0.05,), queue="fairq") for _ in range(8)]
    # Claimed ahead (up to 4 per process), they all run in the free process meanwhile.
    assert "slots 8" in worker.log()
    pids = {result.get(timeout=10)["pid"] for result in quick}
    assert job(db, slow.job_id)["state"] == "running"
    assert len(pids) == 1 and slow.get(timeout=10)["pid"] not in pids


# plainproj's celeryconfig sets worker_prefetch_multiplier = 1 and task_acks_late = True; the
# option overrides the first, PLAINPROJ_ACKS_LATE the second. As in Celery, with early
# acknowledgement the running task is outside the window: one process holds multiplier + 1.
@pytest.mark.parametrize("pool", ["prefork", "threads"])
@pytest.mark.parametrize(("multiplier", "acks_late", "claimed"),
                         [(None, True, 1), ("3", True, 3), (None, False, 2)])
def test_prefetch_multiplier_bounds_the_claimed_tasks(
        projects: dict[str, Any], module_database_url: str, spawn_compat: SpawnCompat,
        db: psycopg.Connection, multiplier: str | None, acks_late: bool, claimed: int,
        pool: str) -> None:
    from plainproj.reports.tasks import nap

    projects["plain"].set_current()
    queue = f"prefetch{multiplier or 'conf'}{'late' if acks_late else 'early'}{pool}"
    options = ["--prefetch-multiplier", multiplier] if multiplier else []
    worker = spawn_compat("-b", module_database_url, "-A", "plainproj", "worker", "-P", pool,
                          "-c", "1", *options, "-Q", queue, "-l", "INFO",
                          env={"PLAINPROJ_ACKS_LATE": "1" if acks_late else "0"})
    worker.wait_ready()
    results = [nap.apply_async((0.6,), queue=queue) for _ in range(4)]
    wait_until(lambda: _running(db, queue) == claimed, timeout=20)
    assert max(_running(db, queue) for _ in range(20)) == claimed
    assert [result.get(timeout=20) for result in results] == ["slept 0.6"] * 4
    # One line per task at INFO, Celery's (the engine's own is at DEBUG here).
    log = worker.log()
    assert log.count("Task plainproj.reports.tasks.nap[") == 4
    assert "(attempt 1, success)" not in log


@pytest.mark.parametrize(("mode", "error"), [("die", "ProcessLost"),
                                             ("hang", "TimeLimitExceeded")])
def test_prefork_short_tasks_sent_behind_one_that_ends_its_process_run_elsewhere_unspent(
        projects: dict[str, Any], module_database_url: str, spawn_compat: SpawnCompat,
        db: psycopg.Connection, mode: str, error: str) -> None:
    from plainproj.reports.tasks import flaky

    projects["plain"].set_current()
    queue = f"behind{mode}"
    worker = spawn_compat("-b", module_database_url, "-A", "plainproj", "worker", "-c", "1",
                          "--prefetch-multiplier", "4", "-Q", queue, "-l", "DEBUG")
    worker.wait_ready()
    # One at a time until flaky is a short task: its last three bodies each under 10 ms (on
    # a loaded machine one may take longer, and the count starts again).
    for tries in range(40):
        assert isinstance(flaky.apply_async(queue=queue).get(timeout=20), int)
        took = [float(seconds) for seconds in
                re.findall(r"flaky succeeded in ([0-9.]+)s", worker.log())]
        if tries >= 7 and len(took) >= 3 and max(took[-3:]) < 0.01:
            break
    assert "behind job" not in worker.log()  # unknown tasks wait for a free process
    with psycopg.connect(module_database_url) as connection, \
            akadze_compat.transaction(connection):  # claimed together, in this order
        ending = flaky.apply_async((mode,), queue=queue)
        behind = [flaky.apply_async(queue=queue) for _ in range(2)]
    ids = [result.job_id for result in (ending, *behind)]
    wait_until(lambda: all(job(db, job_id)["state"] in ("succeeded", "failed")
                           for job_id in ids), timeout=30)
    assert f"job {ids[1]} sent to process" in worker.log()  # it waited in the pipe
    row = job(db, ids[0])
    assert (row["state"], row["errors"][0]["type"]) == ("failed", error), row
    for job_id in ids[1:]:  # never started there: run by the replacement, attempt unspent
        row = job(db, job_id)
        assert (row["state"], row["run_count"], row["attempt"], row["errors"]) == (
            "succeeded", 1, 1, []), row


def test_threads_pool_holds_the_prefetch_window_and_runs_c_bodies_at_once(
        projects: dict[str, Any], module_database_url: str, spawn_compat: SpawnCompat,
        db: psycopg.Connection) -> None:
    from plainproj.reports.tasks import nap

    projects["plain"].set_current()
    worker = spawn_compat("-b", module_database_url, "-A", "plainproj", "worker", "-P",
                          "threads", "-c", "1", "--prefetch-multiplier", "3", "-Q", "threadq",
                          "-l", "INFO")
    worker.wait_ready()
    results = [nap.apply_async((0.5,), queue="threadq") for _ in range(5)]
    # plainproj acknowledges late: the window of 3 holds the running one and two claimed
    # ahead, as Celery's threads pool reserves them.
    wait_until(lambda: _running(db, "threadq") == 3, timeout=20)
    assert max(_running(db, "threadq") for _ in range(20)) == 3
    assert [result.get(timeout=20) for result in results] == ["slept 0.5"] * 5
    # One body at a time: each outcome lands about a body's time after the one before.
    ended = sorted(job(db, result.job_id)["finished_at"] for result in results)
    assert all(later - earlier > timedelta(seconds=0.4)
               for earlier, later in itertools.pairwise(ended)), ended


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_warm_shutdown_hands_back_the_tasks_claimed_ahead(
        projects: dict[str, Any], module_database_url: str, spawn_compat: SpawnCompat,
        db: psycopg.Connection, pool: str) -> None:
    from plainproj.reports.tasks import nap

    projects["plain"].set_current()
    queue = f"warm{pool}"
    worker = spawn_compat("-b", module_database_url, "-A", "plainproj", "worker", "-P", pool,
                          "-c", "1", "--prefetch-multiplier", "3", "-Q", queue, "-l", "INFO")
    worker.wait_ready()
    results = [nap.apply_async((1.5,), queue=queue) for _ in range(3)]
    wait_until(lambda: _running(db, queue) == 3, timeout=20)
    worker.terminate(signal.SIGTERM)
    assert worker.wait_exit() == 0, worker.log()
    # The running task finished; the two claimed ahead went back unspent, never started.
    rows = sorted((job(db, r.job_id) for r in results), key=lambda row: row["state"])
    assert [row["state"] for row in rows] == ["queued", "queued", "succeeded"]
    for row in rows[:2]:
        assert (row["attempt"], row["run_count"], row["errors"]) == (0, 1, []), row
    assert worker.log().count("Task plainproj.reports.tasks.nap[") == 1


@pytest.mark.parametrize("how", ["revoke", "expires"])
@pytest.mark.parametrize("pool", ["prefork", "threads", "solo"])
def test_a_task_claimed_ahead_is_revoked_without_running_when_revoked_or_expired(
        projects: dict[str, Any], module_database_url: str, spawn_compat: SpawnCompat,
        db: psycopg.Connection, tmp_path: Path, pool: str, how: str) -> None:
    # As Celery checks revokes and expiry right before running a reserved task: the second
    # task waits in the prefetch window behind the first, is revoked (or expires) there, and
    # never runs once the first ends. Seed 003: cancelled, no attempt spent.
    from plainproj.reports.tasks import build_report, mark

    projects["plain"].set_current()
    queue = f"ahead{how}{pool}"
    worker = spawn_compat("-b", module_database_url, "-A", "plainproj", "worker", "-P", pool,
                          "-c", "1", "--prefetch-multiplier", "2", "-Q", queue, "-l", "INFO")
    worker.wait_ready()
    release, marker = tmp_path / "release", tmp_path / "ran"
    first = build_report.apply_async((1, str(release)), queue=queue)
    wait_until(lambda: _running(db, queue) == 1, timeout=20)
    second = mark.apply_async((str(marker),), queue=queue,
                              expires=1.0 if how == "expires" else None)
    wait_until(lambda: job(db, second.job_id)["state"] != "queued", timeout=20)
    assert job(db, second.job_id)["state"] == "running"  # claimed ahead, waiting
    if how == "revoke":
        second.revoke()
    else:
        wait_until(lambda: db.execute("SELECT expires_at <= now() FROM akadze.jobs "
                                      "WHERE id = %s", (second.job_id,)).fetchone()[0],
                   timeout=10)
    time.sleep(0.3)  # the worker hears of it while the first task still runs
    release.touch()
    assert first.get(timeout=20) == {"report": 1, "pages": 2}
    wait_until(lambda: job(db, second.job_id)["state"] != "running", timeout=20)
    row = job(db, second.job_id)
    assert not marker.exists(), "the task claimed ahead must not run"
    assert (row["state"], row["attempt"], row["errors"], row["result"]) == (
        "cancelled", 0, [], None), row
    assert AsyncResult(second.id).state == states.REVOKED
    assert f"Task plainproj.reports.tasks.mark[{second.id}] succeeded" not in worker.log()


# --- the Django project -------------------------------------------------------------------------

@pytest.fixture
def django_app(projects: dict[str, Any], module_database_url: str,
               spawn_compat: SpawnCompat) -> Iterator[CompatWorker]:
    projects["django"].set_current()
    worker = spawn_compat("-A", "djangoproj", "worker", "-P", "threads", "-Q", "django,orders",
                          "-l", "INFO", cwd=DJANGO_PROJECT,
                          env={"DJANGOPROJ_DATABASE_URL": module_database_url})
    worker.wait_ready()
    yield worker
    worker.terminate()
    assert worker.wait_exit() == 0, worker.log()


def test_django_project_runs_with_celery_namespace_settings(django_app: CompatWorker,
                                                            db: psycopg.Connection) -> None:
    from shop.tasks import process_order, send_receipt

    receipt = send_receipt.delay(7, "ann@example.com")
    assert receipt.get(timeout=20) == "receipt for order 7 sent to ann@example.com"
    assert job(db, receipt.job_id)["queue"] == "django"  # CELERY_TASK_DEFAULT_QUEUE
    order = process_order.delay(8).get(timeout=20)
    assert order["queue"] == "orders" and order["time_zone"] == "Europe/Paris"
    log = django_app.log()
    # The project's setup_logging receiver took logging over (Django's LOGGING).
    assert "djangoproj-log INFO celery.worker: celery@" in log
    assert "INFO/MainProcess]" not in log
    assert "pool:        threads (concurrency 2)" in log  # CELERY_WORKER_CONCURRENCY
