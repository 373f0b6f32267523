"""N worker processes x M jobs with batch claims.

Every claim takes up to the worker's free slots in one statement (FOR UPDATE SKIP LOCKED in a
CTE). Run by real processes racing each other, no job is ever claimed twice under one
run_count: each start is recorded as (job_id, run_count, pid) in ``runs`` by the task itself.

That a claim locks no more rows than its LIMIT is asserted where it can be observed exactly,
inside the claiming transaction: tests/integration/test_claim.py::
test_a_claim_locks_no_more_rows_than_its_limit (row locks are not listed in pg_locks, so
sampling it from here would prove nothing).
"""

from __future__ import annotations

import signal
from collections import Counter

import psycopg
import pytest

from akadze_core import App
from tests.faults.conftest import SpawnWorker
from tests.faults.support import all_runs, rows_by_id, wait_until

pytestmark = pytest.mark.slow

FAST = ("--heartbeat-interval", "0.2", "--heartbeat-ttl", "1.5", "--poll-interval", "0.1")


def test_racing_batch_claims_never_claim_a_job_twice_within_a_run_count(
    app: App, database_url: str, runs_db: psycopg.Connection, spawn_worker: SpawnWorker
) -> None:
    # Two fair workers and two plain ones, four slots each: claims of up to four rows race.
    workers = [spawn_worker(database_url, *FAST, "--slots", "4", *(["--fair"] * fair))
               for fair in (0, 0, 1, 1)]
    for worker in workers:
        worker.wait_started()
    # Two task names so the fair claims really rotate; enqueued in a few bulk inserts while
    # the workers are already claiming.
    ids: list[int] = []
    for _ in range(4):
        ids += app.tasks["quick"].enqueue_many([{}] * 60)
        ids += app.tasks["sleep"].enqueue_many([{"seconds": 0.0}] * 15)

    def done() -> bool:
        return all(row["state"] == "succeeded" for row in rows_by_id(runs_db, ids).values())

    wait_until(done, timeout=60, what="every job to succeed")
    starts = all_runs(runs_db)
    per_run = Counter((job_id, run_count) for job_id, run_count, _ in starts)
    assert max(per_run.values()) == 1, [key for key, n in per_run.items() if n > 1]
    assert sorted(job_id for job_id, _, _ in starts) == sorted(ids)  # each job ran once
    for row in rows_by_id(runs_db, ids).values():
        assert (row["run_count"], row["attempt"], row["errors"]) == (1, 1, []), row
    by_pid = Counter(pid for _, _, pid in starts)
    assert len(by_pid) >= 3, by_pid  # the work really was shared
    print(f"{len(ids)} jobs over {len(workers)} workers: starts per worker {dict(by_pid)}")
    for worker in workers:
        worker.signal(signal.SIGTERM)
    assert [worker.wait_exit()[0] for worker in workers] == [0] * 4
