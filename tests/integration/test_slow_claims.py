"""A slow claim on a busy but live server is waited for: it does not stop the worker claiming.

The worker bounds each call by its lease (the last good heartbeat plus ``heartbeat_ttl``) so a
network partition cannot hang it. But a claim that waits seconds for a busy server while the
heartbeats get through on other connections is no partition: the lease is renewed meanwhile,
and the claim is waited for. Abandoning it made the worker log "no claims until a heartbeat
succeeds", drop the connection, and claim nothing more until the orphan check had run.

The delay is a trigger that sleeps in the claim's UPDATE of one job (the heartbeats touch
akadze.workers and are not delayed), longer than the test worker's two-second TTL.
"""

from __future__ import annotations

import logging
import time

import psycopg
import pytest
from psycopg import sql

from akadze_core import App
from tests.helpers import job
from tests.integration.outcome_helpers import run_until

SLEEP = 3.0  # longer than FAST's heartbeat_ttl (2 s): the old code gave up at ~1.9 s


def delay_claims_of(db: psycopg.Connection, task: str, seconds: float) -> None:
    """Make the claim of every job of ``task`` take ``seconds`` longer (a trigger in this
    test's own database)."""
    # DDL takes no bound parameters: the values go in as quoted literals.
    db.execute(sql.SQL("""
        CREATE FUNCTION public.slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN PERFORM pg_sleep({}); RETURN NEW; END $$""").format(sql.Literal(seconds)))
    db.execute(sql.SQL("""
        CREATE TRIGGER slow_claim BEFORE UPDATE ON akadze.jobs FOR EACH ROW
        WHEN (OLD.state = 'queued' AND NEW.state = 'running' AND NEW.task = {})
        EXECUTE FUNCTION public.slow_claim()""").format(sql.Literal(task)))


async def test_a_slow_claim_on_a_live_server_is_waited_for_and_claims_go_on(
    app: App, db: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "akadze")
    ran: list[str] = []

    @app.task("slow.claimed")
    def slow_claimed() -> str:
        ran.append("slow")
        return "done"

    @app.task("slow.after")
    def after() -> str:
        ran.append("after")
        return "after"

    delay_claims_of(db, "slow.claimed", SLEEP)
    slow_id = slow_claimed.enqueue()
    started = time.monotonic()
    after_ids: list[int] = []

    def done() -> bool:
        # Once the slow claim is under way, more work arrives: the worker must take it.
        if not after_ids and time.monotonic() - started > 0.5:
            after_ids.append(after.enqueue())
        return bool(after_ids) and all(
            job(db, job_id)["state"] == "succeeded" for job_id in (slow_id, *after_ids))

    await run_until(app, done, timeout=60)
    slow = job(db, slow_id)
    # Claimed once, by the slow claim itself: not abandoned, handed back and claimed again.
    assert (slow["state"], slow["run_count"], slow["attempt"]) == ("succeeded", 1, 1)
    assert ran.count("slow") == 1
    lines = [record.getMessage() for record in caplog.records]
    assert not [line for line in lines if "no claims until" in line or "no answer" in line
                or "claimed by a query whose answer was lost" in line], lines
