"""The job state machine against the real database, driven by hypothesis.

Random sequences of enqueue, claim (plain and fair), heartbeat, outcome (of current and stale
runs), rescue, graceful return, cancel, requeue, "time passes", ageing and prune steps run
through ``akadze_core.store.database`` / ``control`` and the named queries. A model predicts every
row; after each step the database must match it and these invariants must hold:

- every job is in exactly one of the five states, and its other columns agree with it
  (``running`` <=> a worker holds it; ``finished_at`` set <=> succeeded/failed/cancelled);
- a fenced write (an outcome or a return of a run that no longer owns the job, a heartbeat of a
  worker judged dead) changes no row at all;
- ``0 <= attempt <= max_attempts`` always, and a queued job has an attempt left
  (``attempt < max_attempts``). Snooze, a graceful return and a run cancelled meanwhile give
  their attempt back, so ``attempt`` counts attempts *spent*, not runs: ``attempt <= run_count``;
- nothing disappears before its retention: only jobs finished longer ago than the retention
  of their state are pruned, and every other job is still there.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from psycopg.rows import dict_row

from akadze_core.model.outcomes import CANCEL, FAIL, RETRY, SNOOZE, SUCCESS, Outcome, error_entry
from akadze_core.ops import control
from akadze_core.store import database
from akadze_core.store.database import JobRequest

FINISHED = ("succeeded", "failed", "cancelled")
SUCCEEDED_RETENTION = 3600.0
FAILED_RETENTION = 7200.0
AGE = 5000.0  # once: past the succeeded/cancelled retention, within the failed one
QUEUE = "machine"

pytestmark = pytest.mark.slow


@dataclass
class Expected:
    """What the model says one job row holds."""

    state: str
    max_attempts: int
    attempt: int = 0
    run_count: int = 0
    worker_id: int | None = None
    cancel_requested: bool = False
    errors: int = 0
    #: "now": claimable; "later": scheduled an hour ahead; "maybe": a rescue's backoff
    #: (0.5 s to a few seconds): it may come due while the machine runs.
    due: str = "now"
    #: Seconds finished_at was moved back by (``age`` steps).
    aged: float = 0.0


class JobMachine(RuleBasedStateMachine):
    """One database, one model; rules are the operations akadze performs on jobs."""

    url: ClassVar[str]

    def __init__(self) -> None:
        super().__init__()
        self.db = psycopg.connect(self.url, autocommit=True)
        self.db.execute("TRUNCATE akadze.jobs, akadze.workers RESTART IDENTITY")
        self.loop = asyncio.new_event_loop()
        self.aconn = self.loop.run_until_complete(
            psycopg.AsyncConnection.connect(self.url, autocommit=True))
        self.jobs: dict[int, Expected] = {}
        self.alive: list[int] = []
        self.dead: list[int] = []
        #: Every (job id, run_count) a claim handed out, current or stale.
        self.tokens: list[tuple[int, int, int]] = []

    def teardown(self) -> None:
        self.loop.run_until_complete(self.aconn.close())
        self.loop.close()
        self.db.close()

    # --- helpers -------------------------------------------------------------------------------

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    def rows(self) -> dict[int, dict[str, Any]]:
        with self.db.cursor(row_factory=dict_row) as cursor:
            cursor.execute("SELECT * FROM akadze.jobs ORDER BY id")
            return {row["id"]: row for row in cursor.fetchall()}

    def owns(self, job_id: int, run_count: int) -> bool:
        expected = self.jobs.get(job_id)
        return expected is not None and expected.state == "running" \
            and expected.run_count == run_count

    def finish(self, expected: Expected, state: str) -> None:
        expected.state = state
        expected.worker_id = None
        expected.aged = 0.0

    # --- rules -----------------------------------------------------------------------------------

    @rule(max_attempts=st.integers(1, 3), later=st.booleans())
    def enqueue(self, max_attempts: int, later: bool) -> None:
        job_id = database.insert_job(self.db, JobRequest(
            task="t", queue=QUEUE, args="{}", max_attempts=max_attempts,
            delay=3600.0 if later else 0.0))
        self.jobs[job_id] = Expected("queued", max_attempts, due="later" if later else "now")

    @precondition(lambda self: len(self.alive) < 3)
    @rule()
    def start_worker(self) -> None:
        row = database.fetch_one(self.db, "worker_register", name="machine", hostname="h",
                                 pid=0, queues=[QUEUE], heartbeat_ttl=3600.0, slots=None)
        assert row is not None
        self.alive.append(int(row["id"]))

    @precondition(lambda self: self.alive)
    @rule(data=st.data(), limit=st.integers(1, 3), fair=st.booleans())
    def claim(self, data: st.DataObject, limit: int, fair: bool) -> None:
        worker_id = data.draw(st.sampled_from(self.alive))
        claimed = self.run(database.claim_jobs(self.aconn, QUEUE, limit, worker_id, fair))
        queued = {i: e for i, e in self.jobs.items() if e.state == "queued"}
        due_now = sum(e.due == "now" for e in queued.values())
        maybe = sum(e.due == "maybe" for e in queued.values())
        assert min(limit, due_now) <= len(claimed) <= min(limit, due_now + maybe), claimed
        for row in claimed:
            expected = queued.pop(row["id"])  # only queued jobs are claimed, each once
            assert expected.due != "later", row
            if expected.cancel_requested:
                assert row["state"] == "cancelled"
                self.finish(expected, "cancelled")
                continue
            expected.state = "running"
            expected.run_count += 1
            expected.attempt += 1
            expected.worker_id = worker_id
            assert (row["state"], row["run_count"]) == ("running", expected.run_count)
            self.tokens.append((row["id"], row["run_count"], row["claim_token"]))

    @precondition(lambda self: self.alive or self.dead)
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        worker_id = data.draw(st.sampled_from(self.alive + self.dead))
        before = self.rows()
        row = database.fetch_one(self.db, "worker_heartbeat", id=worker_id)
        # A worker judged dead is not resurrected by its heartbeat, and no job changes.
        assert (row is not None) == (worker_id in self.alive)
        assert self.rows() == before

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), kind=st.sampled_from([SUCCESS, RETRY, SNOOZE, FAIL, CANCEL]))
    def outcome(self, data: st.DataObject, kind: str) -> None:
        job_id, run_count, token = data.draw(st.sampled_from(self.tokens))
        error = None if kind in (SUCCESS, SNOOZE) else error_entry(ValueError("boom"))
        outcome = Outcome(job_id, run_count, kind, result="1" if kind == SUCCESS else None,
                          delay=0.0, error=error, claim_token=token)
        before = self.rows()
        current = self.owns(job_id, run_count)
        written = self.run(database.complete_many(self.aconn, [outcome]))
        if not current:
            # Fenced: a stale run's outcome changes nothing, not even a timestamp.
            assert written == [] and self.rows() == before
            return
        expected = self.jobs[job_id]
        gives_back = kind == SNOOZE or (kind in (RETRY, FAIL, CANCEL)
                                        and expected.cancel_requested)
        if kind == SUCCESS:
            state = "succeeded"
        elif kind == CANCEL or expected.cancel_requested:
            state = "cancelled"
        elif kind == FAIL:
            state = "failed"
        elif kind == SNOOZE:
            state = "queued"
        else:
            state = "failed" if expected.attempt >= expected.max_attempts else "queued"
        expected.attempt -= int(gives_back)
        expected.errors += int(error is not None)
        if state == "queued":
            expected.state, expected.worker_id, expected.due = "queued", None, "now"
        else:
            self.finish(expected, state)
        assert [(row["id"], row["state"]) for row in written] == [(job_id, state)]

    @precondition(lambda self: self.alive)
    @rule(data=st.data())
    def worker_dies_and_is_rescued(self, data: st.DataObject) -> None:
        worker_id = data.draw(st.sampled_from(self.alive))
        self.db.execute("UPDATE akadze.workers SET heartbeat_at = now() - interval '2 hours'"
                        " WHERE id = %s", (worker_id,))
        rescued = self.run(database.rescue_jobs(self.aconn))
        self.alive.remove(worker_id)
        self.dead.append(worker_id)
        expected_ids = set()
        for job_id, expected in self.jobs.items():
            if expected.state != "running" or expected.worker_id != worker_id:
                continue
            expected_ids.add(job_id)
            expected.errors += 1  # WorkerLost, the attempt stays spent
            if expected.cancel_requested:
                self.finish(expected, "cancelled")
            elif expected.attempt >= expected.max_attempts:
                self.finish(expected, "failed")
            else:
                expected.state, expected.worker_id, expected.due = "queued", None, "maybe"
        assert {row["id"] for row in rescued} == expected_ids  # each rescued once
        assert {row["id"]: row["state"] for row in rescued} == \
            {i: self.jobs[i].state for i in expected_ids}

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def graceful_return(self, data: st.DataObject) -> None:
        runs = data.draw(st.lists(st.sampled_from(self.tokens), min_size=1, max_size=3,
                                  unique=True))
        returned = self.run(database.return_many(self.aconn, runs))
        expected_ids = set()
        for job_id, run_count, _ in runs:
            if self.owns(job_id, run_count):
                expected = self.jobs[job_id]
                expected.state, expected.worker_id, expected.due = "queued", None, "now"
                expected.attempt -= 1  # not spent
                expected_ids.add(job_id)
        assert {row["id"] for row in returned} == expected_ids

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.jobs)))
        marked = self.run(control.request_cancel(self.aconn, job_id))
        expected = self.jobs[job_id]
        assert marked == (expected.state in ("queued", "running"))
        if expected.state == "queued":
            expected.cancel_requested = True
            self.finish(expected, "cancelled")
        elif expected.state == "running":
            expected.cancel_requested = True

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def requeue(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.jobs)))
        requeued = self.run(control.requeue(self.aconn, job_id))
        expected = self.jobs[job_id]
        assert requeued == (expected.state == "failed")
        if requeued:
            expected.state, expected.due, expected.aged = "queued", "now", 0.0
            expected.cancel_requested = False
            expected.max_attempts = max(expected.max_attempts, expected.attempt + 1)

    @rule()
    def time_passes(self) -> None:
        self.db.execute("UPDATE akadze.jobs SET scheduled_at = now() WHERE state = 'queued'")
        for expected in self.jobs.values():
            if expected.state == "queued":
                expected.due = "now"

    @precondition(lambda self: any(e.state in FINISHED for e in self.jobs.values()))
    @rule(data=st.data())
    def age(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(
            sorted(i for i, e in self.jobs.items() if e.state in FINISHED)))
        self.db.execute("UPDATE akadze.jobs SET finished_at = finished_at - %s * interval"
                        " '1 second' WHERE id = %s", (AGE, job_id))
        self.jobs[job_id].aged += AGE

    @rule()
    def prune(self) -> None:
        self.db.execute(database.query("job_prune"), {
            "finished_retention": SUCCEEDED_RETENTION, "failed_retention": FAILED_RETENTION,
            "limit": 1000})
        retention = {"succeeded": SUCCEEDED_RETENTION, "cancelled": SUCCEEDED_RETENTION,
                     "failed": FAILED_RETENTION}
        for job_id in [i for i, e in self.jobs.items()
                       if e.state in retention and e.aged > retention[e.state]]:
            del self.jobs[job_id]  # only these were past their retention
        self.tokens = [token for token in self.tokens if token[0] in self.jobs]

    # --- invariants ----------------------------------------------------------------------------

    @invariant()
    def database_matches_the_model(self) -> None:
        rows = self.rows()
        assert set(rows) == set(self.jobs), "a job appeared or disappeared"
        for job_id, row in rows.items():
            expected = self.jobs[job_id]
            # Exactly one state, and the columns agree with it.
            assert row["state"] in ("queued", "running", *FINISHED)
            assert (row["worker_id"] is not None) == (row["state"] == "running"), row
            assert (row["finished_at"] is not None) == (row["state"] in FINISHED), row
            # Attempts: spent ones only, never beyond the budget, one left while queued.
            assert 0 <= row["attempt"] <= row["max_attempts"], row
            assert row["attempt"] <= row["run_count"], row
            if row["state"] == "queued":
                assert row["attempt"] < row["max_attempts"], row
            actual = (row["state"], row["attempt"], row["max_attempts"], row["run_count"],
                      row["worker_id"], row["cancel_requested"], len(row["errors"]))
            predicted = (expected.state, expected.attempt, expected.max_attempts,
                         expected.run_count, expected.worker_id, expected.cancel_requested,
                         expected.errors)
            assert actual == predicted, (job_id, actual, predicted)
        workers = {row[0] for row in self.db.execute("SELECT id FROM akadze.workers")}
        assert workers == set(self.alive)


def test_the_job_state_machine_holds_its_invariants(database_url: str) -> None:
    JobMachine.url = database_url
    run_state_machine_as_test(JobMachine, settings=settings(
        max_examples=50, stateful_step_count=30, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))

