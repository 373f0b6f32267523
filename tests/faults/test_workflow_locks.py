"""Two batched outcome writes settling the same waiting jobs do not deadlock.

A worker's flush writes many outcomes in one statement; ``akadze.settle`` then counts down
the dependents of the successes and ends what waits downstream of the failures. Here X waits
on A and D, Y on B and C; one flush has A succeeding and B failing, another (a second
worker) C succeeding and D failing. Had settle locked the successes' dependents and the
failures' downstream one after the other, the first flush would hold X and want Y while the
second held Y and wanted X. A trigger that sleeps on each count-down makes the two flushes
overlap for certain.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from akadze_core import App, Fail
from akadze_core.model.outcomes import Outcome, error_entry
from akadze_core.store import database
from tests.faults.support import rows_by_id

pytestmark = pytest.mark.slow

SLOW_COUNTDOWN = """
CREATE FUNCTION slow_countdown() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.waiting_for IS DISTINCT FROM OLD.waiting_for THEN
        PERFORM pg_sleep(0.3);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER slow_countdown BEFORE UPDATE ON akadze.jobs
FOR EACH ROW EXECUTE FUNCTION slow_countdown();
"""


async def test_two_flushes_settling_the_same_waiting_jobs_do_not_deadlock(
    app: App, database_url: str, db: psycopg.Connection
) -> None:
    db.execute(SLOW_COUNTDOWN)  # type: ignore[arg-type]
    quick = app.tasks["quick"]
    flow = app.workflow()
    a, b, c, d = (flow.add(quick) for _ in range(4))
    x = flow.add(quick, after=[a, d])
    y = flow.add(quick, after=[b, c])
    flow.enqueue()
    worker_id = db.execute(
        "INSERT INTO akadze.workers (name, hostname, pid, queues, heartbeat_ttl)"
        " VALUES ('test', 'here', 1, '{default}', interval '1 hour') RETURNING id"
    ).fetchone()[0]  # type: ignore[index]
    connections = [await psycopg.AsyncConnection.connect(database_url, autocommit=True)
                   for _ in range(3)]
    try:
        claimed = await database.claim_jobs(connections[0], "default", 10, worker_id, False)
        run = {row["id"]: row["run_count"] for row in claimed}
        token = {row["id"]: row["claim_token"] for row in claimed}
        assert set(run) == {a.id, b.id, c.id, d.id}
        failure = error_entry(Fail("no"))

        def flush(success: int | None, failed: int | None) -> list[Outcome]:
            assert success is not None and failed is not None
            return [Outcome(success, run[success], "success", result="1",
                            claim_token=token[success]),
                    Outcome(failed, run[failed], "fail", error=failure,
                            claim_token=token[failed])]

        written = await asyncio.gather(
            database.complete_many(connections[1], flush(a.id, b.id)),
            database.complete_many(connections[2], flush(c.id, d.id)),
            return_exceptions=True)
    finally:
        for connection in connections:
            await connection.close()
    assert not [w for w in written if isinstance(w, BaseException)], written
    rows = rows_by_id(db)
    assert [rows[n.id or 0]["state"] for n in (a, b, c, d, x, y)] == \
        ["succeeded", "failed", "succeeded", "failed", "cancelled", "cancelled"]
    assert rows[x.id or 0]["errors"][-1]["upstream"] == d.id
    assert rows[y.id or 0]["errors"][-1]["upstream"] == b.id

