"""Soak under chaos: not run by default.

``AKADZE_SOAK_JOBS`` jobs (default 100,000) across 4 worker processes (8 slots each) while a
chaos loop SIGKILLs a random worker every ``AKADZE_SOAK_KILL_EVERY`` seconds (default 3) and a
supervisor restarts it. Every job must end succeeded; a job may have run more than once only
because a run of it was on a worker that was killed: every run but a job's last belongs to a
killed process, and each extra run is matched by exactly one WorkerLost rescue.

Run it with ``AKADZE_SOAK_JOBS=5000 python -m pytest -m soak tests/faults -s`` (``-m soak``
overrides the ``-m "not soak"`` of pyproject's addopts).
"""

from __future__ import annotations

import os
import random
import time

import psycopg
import pytest

from tests.faults.conftest import SpawnWorker
from tests.faults.fault_app import build_fault_app
from tests.faults.support import Fleet, count

SOAK_JOBS = int(os.environ.get("AKADZE_SOAK_JOBS", "100000"))
KILL_EVERY = float(os.environ.get("AKADZE_SOAK_KILL_EVERY", "3"))
WORKERS = 4
ARGS = ("--slots", "8", "--heartbeat-interval", "0.5", "--heartbeat-ttl", "2",
        "--poll-interval", "0.2", "--shutdown-timeout", "5")

pytestmark = [pytest.mark.soak, pytest.mark.slow]


@pytest.mark.timeout(300 + SOAK_JOBS // 20)
def test_soak_under_chaos_every_job_succeeds_and_duplicates_only_follow_kills(
    database_url: str, runs_db: psycopg.Connection, spawn_worker: SpawnWorker
) -> None:
    app = build_fault_app(database_url)
    try:
        for start in range(0, SOAK_JOBS, 5000):
            app.tasks["soak"].enqueue_many(
                [{"n": n} for n in range(start, min(start + 5000, SOAK_JOBS))])
    finally:
        app.close()
    started = time.monotonic()
    fleet = Fleet(spawn_worker, database_url, WORKERS, *ARGS)
    rng = random.Random(int(os.environ.get("AKADZE_SOAK_SEED", "5")))
    next_kill = started + KILL_EVERY
    next_report = started + 10
    deadline = started + 240 + SOAK_JOBS // 25
    done = 0
    while done < SOAK_JOBS:
        now = time.monotonic()
        assert now < deadline, f"{done}/{SOAK_JOBS} succeeded by the deadline\n{fleet.logs()}"
        fleet.supervise()
        if now >= next_kill:
            alive = [i for i, member in enumerate(fleet.members) if member.proc.poll() is None]
            if alive:
                fleet.kill(rng.choice(alive))
            next_kill = now + KILL_EVERY
        done = count(runs_db, "SELECT count(*) FROM akadze.jobs WHERE state = 'succeeded'")
        if now >= next_report:
            print(f"soak: {done}/{SOAK_JOBS} succeeded after {now - started:.0f}s, "
                  f"{len(fleet.killed)} kills", flush=True)
            next_report = now + 10
        time.sleep(0.2)
    took = time.monotonic() - started
    codes = fleet.stop()
    assert codes == [0] * len(codes), codes

    # Every process that ended early was one the chaos loop killed: nothing else died.
    assert {member.pid for member in fleet.ended} <= fleet.killed
    states = dict(runs_db.execute("SELECT state, count(*) FROM akadze.jobs GROUP BY state"))
    assert states == {"succeeded": SOAK_JOBS}, states
    # Each claim of a job counts one run; all but the last were lost with a killed worker and
    # rescued, leaving one WorkerLost entry each (and no other error).
    assert count(runs_db, """
        SELECT count(*) FROM akadze.jobs
        WHERE run_count <> 1 + jsonb_array_length(errors)
           OR EXISTS (SELECT 1 FROM jsonb_array_elements(errors) AS e
                      WHERE e->>'type' <> 'WorkerLost')""") == 0
    # No run was recorded twice, and every job's last run was recorded.
    assert count(runs_db, "SELECT count(*) FROM (SELECT 1 FROM runs GROUP BY job_id, run_count"
                          " HAVING count(*) > 1) AS twice") == 0
    assert count(runs_db, "SELECT count(*) FROM akadze.jobs AS j WHERE NOT EXISTS (SELECT 1"
                          " FROM runs AS r WHERE r.job_id = j.id AND r.run_count = j.run_count)"
                          ) == 0
    # Duplicates only for runs that were killed: every earlier run is a killed process's.
    earlier = {row[0] for row in runs_db.execute(
        "SELECT DISTINCT r.pid FROM runs AS r JOIN akadze.jobs AS j ON j.id = r.job_id"
        " WHERE r.run_count < j.run_count")}
    assert earlier <= fleet.killed, earlier - fleet.killed

    ran_twice = count(runs_db, "SELECT count(*) FROM (SELECT job_id FROM runs GROUP BY job_id"
                               " HAVING count(*) > 1) AS dup")
    extra_runs = count(runs_db, "SELECT count(*) FROM runs") - SOAK_JOBS
    rescued = count(runs_db, "SELECT count(*) FROM akadze.jobs WHERE run_count > 1")
    lost_claims = count(runs_db, "SELECT coalesce(sum(run_count - 1), 0) FROM akadze.jobs")
    print(f"\nsoak: {SOAK_JOBS} jobs succeeded in {took:.1f}s ({SOAK_JOBS / took:.0f} jobs/s) "
          f"with {WORKERS} workers; {len(fleet.killed)} SIGKILLs, {len(fleet.ended)} restarts; "
          f"{rescued} jobs rescued ({lost_claims} lost claims), {ran_twice} jobs whose body "
          f"started more than once ({extra_runs} extra starts), all on killed workers")
