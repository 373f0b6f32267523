"""Outcome writes and claims that fail transiently.

Seed 000, "Ошибки базы": an outcome write that fails with a transient error is retried, same
outcome, while the run still owns the job; the job is not run again. Deadlocks and
serialization failures are transient too: logged, retried, nothing lost.
"""

from __future__ import annotations

import signal
import threading
import time

import psycopg
import pytest

from akadze_core import App
from akadze_core.store import database
from tests.faults.conftest import SpawnWorker
from tests.faults.fault_app import build_fault_app
from tests.faults.support import all_runs, count, rows_by_id, wait_until
from tests.workers.support import WORKER_APPLICATION_NAME, PrivateCluster, with_application_name

pytestmark = pytest.mark.slow

FAST = ("--heartbeat-interval", "0.2", "--heartbeat-ttl", "3", "--poll-interval", "0.1")



def statement_prefix(name: str) -> str:
    """A LIKE pattern matching named query ``name`` in pg_stat_activity: its first line
    (pg_stat_activity keeps only the first 1 kB of a statement; psycopg turns %(x)s
    placeholders into $n, so the line must have none)."""
    first = database.query(name).splitlines()[0]
    assert "%(" not in first, first
    return first.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


SLOW_OUTCOMES = """
CREATE FUNCTION public.slow_outcomes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows WHERE state = 'succeeded') THEN
        PERFORM pg_sleep(0.3);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER slow_outcomes AFTER UPDATE ON akadze.jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION public.slow_outcomes();
"""


def assert_each_ran_once_and_succeeded(db: psycopg.Connection, ids: list[int]) -> None:
    """Every job succeeded on its first run, with no error, and started exactly once."""
    for row in rows_by_id(db, ids).values():
        assert (row["state"], row["run_count"], row["attempt"], row["errors"]) == \
            ("succeeded", 1, 1, []), row
        assert row["result"] == "ok", row
    assert sorted(job_id for job_id, _, _ in all_runs(db)) == sorted(ids)


# --- scenario 11 -------------------------------------------------------------------------------


def test_connection_cut_during_the_completers_flush_is_retried_without_a_rerun(
    cluster: PrivateCluster, spawn_worker: SpawnWorker
) -> None:
    """A statement trigger holds every flush that marks jobs succeeded for 0.3 s; meanwhile
    the test terminates the backend running it (its transaction rolls back). The completer
    retries the same outcomes on a new connection: each job still ran exactly once."""
    complete_many = statement_prefix("job_complete_many")
    with psycopg.connect(cluster.url(password=False), autocommit=True) as db:
        db.execute(SLOW_OUTCOMES)
        app = build_fault_app(cluster.url())
        try:
            worker = spawn_worker(with_application_name(cluster.url()), *FAST, "--slots", "4")
            worker.wait_started()
            ids = app.tasks["quick"].enqueue_many([{}] * 30)
        finally:
            app.close()

        kills: set[int] = set()  # backend pids: a dying backend may still be listed
        stop = threading.Event()

        def cut_flushes() -> None:
            with psycopg.connect(cluster.url(password=False), autocommit=True) as killer:
                while not stop.is_set() and len(kills) < 5:
                    row = killer.execute(
                        "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND"
                        " state = 'active' AND query LIKE %s",
                        (WORKER_APPLICATION_NAME, complete_many)).fetchone()
                    if row and killer.execute("SELECT pg_terminate_backend(%s)",
                                              row).fetchone() == (True,):
                        kills.add(row[0])
                    time.sleep(0.01)

        killer = threading.Thread(target=cut_flushes, name="cut-flushes")
        killer.start()
        try:
            wait_until(lambda: len(kills) >= 5, timeout=20, what="five flushes cut mid-write")
            wait_until(lambda: count(db, "SELECT count(*) FROM akadze.jobs WHERE state <> "
                                         "'succeeded'") == 0, timeout=30,
                       what="every job to succeed")
        finally:
            stop.set()
            killer.join()
        assert_each_ran_once_and_succeeded(db, ids)
        wait_until(lambda: worker.log().count("outcomes failed") >= 5,
                   what="the worker to log each failed flush")
        assert worker.proc.poll() is None
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit()[0] == 0, worker.log()


# --- scenario 12 -------------------------------------------------------------------------------

INJECT_FAULTS = """
CREATE SEQUENCE public.fault_claims;
CREATE SEQUENCE public.fault_completes;
CREATE FUNCTION public.inject_faults() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- nextval is not rolled back with the failed statement: the budget really runs out.
    IF OLD.state = 'queued' AND NEW.state = 'running' THEN
        IF nextval('public.fault_claims') <= {claims} THEN
            RAISE EXCEPTION 'injected failure on claim' USING ERRCODE = '{claim_code}';
        END IF;
    ELSIF OLD.state = 'running' AND NEW.state <> 'running' THEN
        IF nextval('public.fault_completes') <= {completes} THEN
            RAISE EXCEPTION 'injected failure on complete' USING ERRCODE = '{complete_code}';
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER inject_faults BEFORE UPDATE ON akadze.jobs
    FOR EACH ROW EXECUTE FUNCTION public.inject_faults();
"""
REMOVE_FAULTS = """
DROP TRIGGER IF EXISTS inject_faults ON akadze.jobs;
DROP FUNCTION IF EXISTS public.inject_faults();
DROP SEQUENCE IF EXISTS public.fault_claims, public.fault_completes;
"""


@pytest.mark.parametrize(("claim_code", "complete_code"), [("40P01", "40001"),
                                                           ("40001", "40P01")],
                         ids=["deadlock on claim", "serialization failure on claim"])
def test_deadlocks_and_serialization_failures_are_retried_and_nothing_is_lost(
    app: App, database_url: str, runs_db: psycopg.Connection, spawn_worker: SpawnWorker,
    claim_code: str, complete_code: str,
) -> None:
    failures = 4
    runs_db.execute(INJECT_FAULTS.format(claims=failures, completes=failures,
                                         claim_code=claim_code, complete_code=complete_code))
    try:
        ids = app.tasks["quick"].enqueue_many([{}] * 20)
        worker = spawn_worker(database_url, *FAST, "--slots", "2")
        wait_until(lambda: count(runs_db, "SELECT count(*) FROM akadze.jobs WHERE state <> "
                                          "'succeeded'") == 0, timeout=30,
                   what="every job to succeed")
        # The budget was spent: the faults really happened, on both statements.
        injected = runs_db.execute("SELECT (SELECT last_value FROM public.fault_claims),"
                                   " (SELECT last_value FROM public.fault_completes)").fetchone()
        assert injected is not None and min(injected) > failures, injected
    finally:
        runs_db.execute(REMOVE_FAULTS)
    assert_each_ran_once_and_succeeded(runs_db, ids)
    log = worker.log()
    assert log.count("claim failed (injected failure on claim") >= 1, log
    assert log.count("outcomes failed") >= failures, log
    assert worker.proc.poll() is None
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit()[0] == 0, log
