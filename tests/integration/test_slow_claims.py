"""A slow claim on a busy but live server is waited for: it does not stop the worker claiming.

The worker bounds each call by its lease (the last good heartbeat plus ``heartbeat_ttl``) so a
network partition cannot hang it. But a claim that waits seconds for a busy server while the
heartbeats get through on other connections is no partition: the lease is renewed meanwhile,
and the claim is waited for. Abandoning it made the worker log "no claims until a heartbeat
succeeds", drop the connection, and claim nothing more until the orphan check had run.

The delay is a trigger that sleeps in the claim's UPDATE of one job (the heartbeats touch
akadze.workers and are not delayed), longer than the test worker's two-second TTL. Below,
``within_lease`` itself: renewed, a call is waited for; unrenewed (a partition: the
heartbeats get no answer either), or past the cap, it is abandoned.
"""

from __future__ import annotations

import asyncio
import logging
import time

import psycopg
import pytest
from psycopg import sql

from akadze_core import App
from akadze_core.store.deadlines import NoAnswer, within_lease
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


class Lease:
    """A lease as the worker keeps one: ``end`` moves on with each renewal."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def renew(self) -> None:
        self.end = time.monotonic() + self.seconds

    async def renew_every(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.renew()


async def sleep_on(database_url: str, lease: Lease, cap: float, seconds: float,
                   renew: bool) -> float:
    """``pg_sleep(seconds)`` under ``within_lease``; returns how long it waited."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        renewer = asyncio.create_task(lease.renew_every(0.1)) if renew else None
        started = time.monotonic()
        try:
            await within_lease(lambda: lease.end, cap, conn,
                               conn.execute("SELECT pg_sleep(%s)", (seconds,)), "the sleep")
        finally:
            if renewer is not None:
                renewer.cancel()
        return time.monotonic() - started


async def test_a_call_outliving_its_first_lease_is_waited_for_while_the_lease_is_renewed(
    database_url: str
) -> None:
    waited = await sleep_on(database_url, Lease(0.3), cap=30, seconds=1.5, renew=True)
    assert waited >= 1.5


async def test_a_call_is_abandoned_when_the_lease_runs_out_unrenewed(database_url: str) -> None:
    started = time.monotonic()
    with pytest.raises(NoAnswer, match="nor to the heartbeats"):
        await sleep_on(database_url, Lease(0.3), cap=30, seconds=20, renew=False)
    assert time.monotonic() - started < 10  # the lease (0.3 s) and a grace, not the 20 s


async def test_a_call_is_abandoned_at_the_cap_however_often_the_lease_is_renewed(
    database_url: str
) -> None:
    started = time.monotonic()
    with pytest.raises(NoAnswer, match="answers other calls"):
        await sleep_on(database_url, Lease(0.3), cap=1.0, seconds=20, renew=True)
    assert 1.0 <= time.monotonic() - started < 10
