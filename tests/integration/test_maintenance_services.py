"""Maintenance runs beside the claim loop: a prune stuck on a lock delays neither claims nor
heartbeats, and stopping does not wait for it."""

from __future__ import annotations

import time
from datetime import timedelta

import psycopg

from akadze_core import App, Worker
from tests.helpers import job
from tests.integration.lease_support import FAST, running, scalar, wait_until

#: The advisory lock the test holds and the DELETE trigger waits for.
PRUNE_GATE = 4242

BLOCK_DELETES = f"""
CREATE FUNCTION akadze.test_wait_for_gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock({PRUNE_GATE});
    RETURN OLD;
END $$;
CREATE TRIGGER test_wait_for_gate BEFORE DELETE ON akadze.jobs
    FOR EACH ROW EXECUTE FUNCTION akadze.test_wait_for_gate();
"""


def prune_waiting(db: psycopg.Connection) -> bool:
    return bool(scalar(db, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                           " AND objid = %s AND NOT granted", (PRUNE_GATE,)))


async def test_a_prune_blocked_on_a_lock_delays_no_claim_and_no_heartbeat(
    db: psycopg.Connection, database_url: str
) -> None:
    app = App(database_url, succeeded_retention=timedelta(hours=1))

    @app.task("quick")
    async def quick(n: int) -> int:
        return n

    old = quick.enqueue(n=0)
    db.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = now() - interval "
               "'2 hours' WHERE id = %s", (old,))
    db.execute(BLOCK_DELETES)
    gate = psycopg.connect(database_url, autocommit=True)
    gate.execute("SELECT pg_advisory_lock(%s)", (PRUNE_GATE,))
    try:
        worker = Worker(app, prune_interval=0.1, **FAST)
        async with running(worker):
            await wait_until(lambda: prune_waiting(db), timeout=5)
            beat = scalar(db, "SELECT heartbeat_at FROM akadze.workers")
            started = time.monotonic()
            due = quick.enqueue(n=1)
            await wait_until(lambda: job(db, due)["state"] == "succeeded", timeout=3)
            took = time.monotonic() - started
            # Heartbeats go on too (FAST beats every 0.2 s; a stalled one would let another
            # worker judge this one dead after its 1 s TTL).
            await wait_until(
                lambda: scalar(db, "SELECT heartbeat_at FROM akadze.workers") > beat,
                timeout=1)
            # Still blocked: it waits again after each lock_timeout, so look for a while.
            await wait_until(lambda: prune_waiting(db), timeout=2)
            stopping = time.monotonic()
        # Stopping abandons the waiting prune instead of waiting for the lock.
        assert time.monotonic() - stopping < 5
        assert took < 1.5, took
        assert job(db, old)["state"] == "succeeded"  # not pruned: the lock was never freed
    finally:
        gate.close()
        await app.close_async()
