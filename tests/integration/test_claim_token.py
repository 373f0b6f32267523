"""The fencing token survives a lost commit (seed 000: a late write with a stale token is
rejected).

With asynchronous replication a claim that committed on the old primary can be lost in a
failover: the new primary still has the job queued under the previous run_count, and the next
claim gives the same run_count to another run. Run A (the lost claim) and run B then hold the
same run_count; the random claim token written by each claim is what tells them apart. Each
test stands in for the failover with SQL: it puts the row back as it was before A's claim.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from akadze_core import App, NotOwner, current
from akadze_core.execution.context import JobContext
from akadze_core.execution.executor import decode_job
from akadze_core.model.outcomes import SUCCESS, Outcome
from akadze_core.store import database
from tests.helpers import job
from tests.integration.lease_support import claim, fake_worker, wait_until
from tests.integration.outcome_helpers import fast_worker


def register_noop(app: App) -> Any:
    @app.task("noop")
    async def noop() -> str:
        return "done"

    return noop


def lose_claim(db: psycopg.Connection, job_id: int, before: dict[str, Any]) -> None:
    """The failover: the row as the new primary has it, A's claim never replicated (the
    columns the claim writes, as they were before it)."""
    db.execute(
        "UPDATE akadze.jobs SET state = %s, run_count = %s, attempt = %s, worker_id = %s,"
        " started_at = %s, finished_at = %s, claim_token = %s WHERE id = %s",
        (before["state"], before["run_count"], before["attempt"], before["worker_id"],
         before["started_at"], before["finished_at"], before["claim_token"], job_id))


async def claim_twice(
    db: psycopg.Connection, url: str, job_id: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run A's claim, lost in a failover, then run B's claim of the same job."""
    before = job(db, job_id)
    [a] = await claim(url, fake_worker(db, ttl=60, name="A"), 1)
    lose_claim(db, job_id, before)
    [b] = await claim(url, fake_worker(db, ttl=60, name="B"), 1)
    assert a["id"] == b["id"] == job_id
    # What fenced outcomes before: equal for both runs.
    assert a["run_count"] == b["run_count"] == 1
    assert a["claim_token"] != b["claim_token"]
    return a, b


def fence(row: dict[str, Any]) -> tuple[int, int, int]:
    return row["id"], row["run_count"], row["claim_token"]


async def test_a_lost_claims_late_outcome_is_rejected_in_a_batch(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    noop = register_noop(app)
    job_id, other = noop.enqueue(), noop.configure(delay=3600).enqueue()
    a, b = await claim_twice(db, database_url, job_id)
    db.execute("UPDATE akadze.jobs SET scheduled_at = now() WHERE id = %s", (other,))
    [c] = await claim(database_url, fake_worker(db, ttl=60), 1)
    held = job(db, job_id)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        # A's outcome, batched with another run's: A's is dropped, the other lands.
        rows = await database.complete_many(conn, [
            Outcome(job_id, a["run_count"], SUCCESS, result='"from A"',
                    claim_token=a["claim_token"]),
            Outcome(other, c["run_count"], SUCCESS, result='"ok"', claim_token=c["claim_token"]),
        ])
        assert [row["id"] for row in rows] == [other]
        assert job(db, job_id) == held
        # A's graceful hand-back changes nothing either.
        assert await database.return_many(conn, [fence(a)]) == []
        assert job(db, job_id) == held
        rows = await database.complete_many(conn, [
            Outcome(job_id, b["run_count"], SUCCESS, result='"from B"',
                    claim_token=b["claim_token"])])
    assert [(row["id"], row["state"]) for row in rows] == [(job_id, "succeeded")]
    assert job(db, job_id)["result"] == "from B"


async def test_a_lost_claims_meta_writes_and_cancel_checks_are_rejected(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    """What a run does while it runs (progress in meta, its worker's checks for missed cancel
    and terminate requests) answers to B only."""
    noop = register_noop(app)
    job_id = noop.enqueue()
    a, b = await claim_twice(db, database_url, job_id)
    assert not database.update_job_meta(db, job_id, a["run_count"], '{"from": "A"}',
                                        a["claim_token"])
    assert job(db, job_id)["meta"] == {}
    assert database.update_job_meta(db, job_id, b["run_count"], '{"from": "B"}',
                                     b["claim_token"])
    assert job(db, job_id)["meta"] == {"from": "B"}
    assert database.cancel_job(db, job_id, signal=15)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        assert await database.list_revoked(conn, [fence(a), fence(b)]) == [job_id]
        assert await database.list_revoked(conn, [fence(a)]) == []
        assert await database.list_terminating(conn, [fence(a)]) == []
        assert await database.list_terminating(conn, [fence(b)]) == [(job_id, 15)]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_lost_claims_complete_tx_and_hand_over_raise_not_owner(
    app: App, db: psycopg.Connection, database_url: str, mode: str
) -> None:
    noop = register_noop(app)
    job_id = noop.enqueue()
    a, b = await claim_twice(db, database_url, job_id)
    late, owner = (JobContext(app, decode_job(app, row)[0]) for row in (a, b))
    marker = "CREATE TABLE IF NOT EXISTS written (run text)"
    db.execute(marker)

    async def commit(context: JobContext, run: str) -> None:
        if mode == "sync":
            with context.complete_tx() as connection:
                connection.execute("INSERT INTO written VALUES (%s)", (run,))
        else:
            async with context.complete_tx() as connection:
                await connection.execute("INSERT INTO written VALUES (%s)", (run,))

    with pytest.raises(NotOwner):
        await commit(late, "A")
    with pytest.raises(NotOwner), late.complete_tx() as connection:
        late.hand_over(connection, noop.enqueue())
    assert job(db, job_id)["state"] == "running"
    assert "replaced_by" not in job(db, job_id)["meta"]
    await commit(owner, "B")
    assert [row[0] for row in db.execute("SELECT run FROM written")] == ["B"]
    assert job(db, job_id)["state"] == "succeeded"


async def test_a_worker_whose_claim_was_lost_cannot_finish_the_new_run(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    """The whole worker path: run A starts in a real worker, its claim is lost, B claims the
    job; A's body then returns and the worker's batched write changes nothing."""
    started, release = asyncio.Event(), asyncio.Event()

    @app.task("held")
    async def held() -> str:
        started.set()
        await release.wait()
        return f"run with token {current().job.claim_token}"

    job_id = held.enqueue()
    before = job(db, job_id)
    worker = fast_worker(app)
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(started.wait(), 10)
        lose_claim(db, job_id, before)
        [b] = await claim(database_url, fake_worker(db, ttl=60, name="B"), 1)
        assert b["run_count"] == 1
        release.set()
        await wait_until(lambda: worker.accepted["held"] == 1 and not worker._runs.running
                         and not worker._runs.finished)
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(running, 10) == 0
    row = job(db, job_id)
    assert (row["state"], row["result"], row["claim_token"]) == ("running", None,
                                                                 b["claim_token"])
