"""Workers that die or freeze mid-job.

Seed 000, "Аренда": a worker that stops heartbeating for longer than its TTL is dead; a live
worker returns its running jobs to the queue and spends their attempt (failed when none is
left). Fencing by run_count rejects whatever the dead run writes later.
"""

from __future__ import annotations

import signal
import time

import psycopg
import pytest

from akadze_core import App
from tests.faults.conftest import SpawnWorker
from tests.faults.support import Fleet, error_types, job, rows_by_id, wait_until
from tests.workers.support import runs

pytestmark = pytest.mark.slow

TTL = 1.5
FAST = ("--heartbeat-interval", "0.2", "--heartbeat-ttl", str(TTL), "--poll-interval", "0.1")


def worker_id_of(db: psycopg.Connection, pid: int) -> int | None:
    """The id of the worker row registered by process ``pid``, if any."""
    row = db.execute("SELECT id FROM akadze.workers WHERE pid = %s", (pid,)).fetchone()
    return None if row is None else int(row[0])


# --- scenario 2 --------------------------------------------------------------------------------


@pytest.mark.parametrize("max_attempts", [1, 2], ids=["only attempt", "second of two"])
def test_sigkill_on_the_last_allowed_attempt_fails_the_job_and_never_reruns_it(
    app: App, database_url: str, runs_db: psycopg.Connection, spawn_worker: SpawnWorker,
    max_attempts: int,
) -> None:
    # flaky_sleep's first attempt raises (retried 0.1 s later): with two attempts the kill
    # lands on the second run, the last one allowed.
    task = app.tasks["sleep" if max_attempts == 1 else "flaky_sleep"]
    job_id = task.configure(max_attempts=max_attempts).enqueue(seconds=60)
    doomed = spawn_worker(database_url, *FAST)
    wait_until(lambda: (max_attempts, doomed.pid) in runs(runs_db, job_id),
               what="the last allowed run to start")
    doomed.signal(signal.SIGKILL)
    assert doomed.wait_exit()[0] == -signal.SIGKILL

    rescuer = spawn_worker(database_url, *FAST)
    rescuer.wait_started()  # its start, seconds under load, is not part of the 15 s
    wait_until(lambda: job(runs_db, job_id)["state"] == "failed", timeout=15,
               what="the rescue to fail the job")
    # The rescuer is alive and claiming: a job enqueued now runs; the failed one never does.
    canary = app.tasks["quick"].enqueue()
    wait_until(lambda: job(runs_db, canary)["state"] == "succeeded", what="the canary")

    row = job(runs_db, job_id)
    assert (row["attempt"], row["max_attempts"], row["run_count"]) == \
        (max_attempts, max_attempts, max_attempts), row
    assert error_types(row)[-1] == "WorkerLost" and len(row["errors"]) == max_attempts, row
    assert row["worker_id"] is None and row["finished_at"] is not None
    assert [pid for _, pid in runs(runs_db, job_id)] == [doomed.pid] * max_attempts
    assert f"rescued job {job_id} from a dead worker: now failed" in rescuer.log()


# --- scenario 3 --------------------------------------------------------------------------------


def test_a_poison_pill_is_bounded_by_max_attempts_and_the_fleet_survives(
    app: App, database_url: str, runs_db: psycopg.Connection, spawn_worker: SpawnWorker
) -> None:
    """``suicide`` SIGKILLs the process that runs it, every time. A supervisor restarts dead
    workers; each death costs one attempt (rescued as WorkerLost), so the third one fails the
    job, and the other jobs, enqueued all along, all succeed."""
    fleet = Fleet(spawn_worker, database_url, 2, *FAST)
    for member in fleet.members:
        member.wait_started()
    pill = app.tasks["suicide"].enqueue()
    others: list[int] = []
    deadline = time.monotonic() + 40
    while True:
        fleet.supervise()
        if len(others) < 40:
            others += app.tasks["quick"].enqueue_many([{}] * 2)
        rows = rows_by_id(runs_db, [pill, *others])
        if rows[pill]["state"] == "failed" and len(others) >= 40 and \
                all(rows[i]["state"] == "succeeded" for i in others):
            break
        assert time.monotonic() < deadline, (rows[pill], fleet.logs())
        time.sleep(0.1)
    # After the pill is gone the fleet works on, with no more deaths.
    later = app.tasks["quick"].enqueue_many([{}] * 5)
    wait_until(lambda: all(r["state"] == "succeeded" for r in rows_by_id(runs_db, later).values()),
               what="jobs enqueued after the pill failed")
    assert fleet.supervise() == 0

    row = job(runs_db, pill)
    assert (row["state"], row["attempt"], row["run_count"]) == ("failed", 3, 3), row
    assert error_types(row) == ["WorkerLost"] * 3, row
    pill_pids = [pid for _, pid in runs(runs_db, pill)]
    assert len(pill_pids) == 3 == len(set(pill_pids))  # three runs, three processes
    assert fleet.deaths_by_signal() == {-signal.SIGKILL: 3}, fleet.deaths_by_signal()
    assert {member.pid for member in fleet.ended} == set(pill_pids)
    assert len(fleet.alive()) == 2
    for job_id, other in rows_by_id(runs_db, others + later).items():
        # At least once: a job whose outcome had not landed when its worker died runs again,
        # and then (only then) carries a WorkerLost entry per lost run.
        assert other["run_count"] == 1 + error_types(other).count("WorkerLost"), other
        assert len(runs(runs_db, job_id)) <= other["run_count"]
    assert fleet.stop() == [0, 0]


# --- scenario 4 --------------------------------------------------------------------------------


def test_a_frozen_worker_that_wakes_up_after_the_rescue_changes_nothing(
    app: App, database_url: str, runs_db: psycopg.Connection, spawn_worker: SpawnWorker
) -> None:
    """SIGSTOP past the TTL: another worker rescues the job and finishes it. On SIGCONT the
    old run's outcome is rejected by fencing, its heartbeat does not bring its worker row
    back; it says it was declared dead and goes on under a new worker id."""
    # Frozen after at most a fraction of its first run's 3 s; by SIGCONT the rescue and the
    # rerun took longer than that, so the woken run ends at once and writes its outcome.
    job_id = app.tasks["slow_first_run"].enqueue(seconds=3.0)
    frozen = spawn_worker(database_url, *FAST)
    wait_until(lambda: len(runs(runs_db, job_id)) == 1, what="the first run to start")
    old_id = worker_id_of(runs_db, frozen.pid)
    assert old_id is not None and job(runs_db, job_id)["worker_id"] == old_id
    frozen.signal(signal.SIGSTOP)
    try:
        rescuer = spawn_worker(database_url, *FAST)
        wait_until(lambda: job(runs_db, job_id)["state"] == "succeeded", timeout=15,
                   what="the rescuer to rescue and finish the job")
        finished = job(runs_db, job_id)
        assert finished["run_count"] == 2 and finished["attempt"] == 2, finished
        assert error_types(finished) == ["WorkerLost"]
        assert worker_id_of(runs_db, frozen.pid) is None  # its row went with the rescue
    finally:
        frozen.signal(signal.SIGCONT)

    frozen.wait_log("outcome of run 1 rejected, the run no longer owns the job")
    frozen.wait_log(f"worker id {old_id} was declared dead by another worker")
    assert job(runs_db, job_id) == finished  # the late write changed nothing at all
    new_id = worker_id_of(runs_db, frozen.pid)
    assert new_id is not None and new_id != old_id
    assert runs_db.execute("SELECT count(*) FROM akadze.workers WHERE id = %s",
                           (old_id,)).fetchone() == (0,)  # not resurrected
    assert [pid for _, pid in runs(runs_db, job_id)] == [frozen.pid, rescuer.pid]

    # It goes on: with the rescuer gone, the woken worker runs new jobs.
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait_exit()[0] == 0
    later = app.tasks["quick"].enqueue()
    wait_until(lambda: job(runs_db, later)["state"] == "succeeded", what="a new job")
    assert runs(runs_db, later) == [(1, frozen.pid)]
    assert job(runs_db, job_id) == finished
    frozen.signal(signal.SIGTERM)
    assert frozen.wait_exit()[0] == 0, frozen.log()


# --- scenario 6 --------------------------------------------------------------------------------


def test_several_worker_processes_rescuing_at_once_rescue_each_job_once(
    app: App, database_url: str, runs_db: psycopg.Connection, spawn_worker: SpawnWorker
) -> None:
    doomed = [spawn_worker(database_url, *FAST, "--slots", "4") for _ in range(2)]
    for worker in doomed:
        worker.wait_started()
    ids = app.tasks["slow_first_run"].enqueue_many([{"seconds": 60.0}] * 8)
    wait_until(lambda: len(runs_db.execute("SELECT * FROM runs").fetchall()) == 8,
               what="both doomed workers to start all eight jobs")
    # Three rescuers, all idle and heartbeating every 0.2 s: each of them tries to rescue
    # right after every heartbeat, so they race for the dead workers' jobs.
    rescuers = [spawn_worker(database_url, *FAST, "--slots", "4") for _ in range(3)]
    for worker in rescuers:
        worker.wait_started()
    for worker in doomed:
        worker.signal(signal.SIGKILL)
    for worker in doomed:
        assert worker.wait_exit()[0] == -signal.SIGKILL

    wait_until(lambda: all(r["state"] == "succeeded" for r in rows_by_id(runs_db, ids).values()),
               timeout=20, what="every rescued job to run again and succeed")
    doomed_pids = {worker.pid for worker in doomed}
    rescuer_pids = {worker.pid for worker in rescuers}
    for job_id, row in rows_by_id(runs_db, ids).items():
        assert (row["run_count"], row["attempt"]) == (2, 2), row  # rescued once: + 1 exactly
        assert error_types(row) == ["WorkerLost"], row
        (first, first_pid), (second, second_pid) = runs(runs_db, job_id)
        assert (first, second) == (1, 2)
        assert first_pid in doomed_pids and second_pid in rescuer_pids
    rescued = [line for worker in rescuers for line in worker.log().splitlines()
               if "from a dead worker" in line]
    assert len(rescued) == len(ids), rescued  # each job rescued by exactly one of them
    assert {int(line.split("rescued job ")[1].split()[0]) for line in rescued} == set(ids)
    for worker in rescuers:
        worker.signal(signal.SIGTERM)
    assert [worker.wait_exit()[0] for worker in rescuers] == [0, 0, 0]
