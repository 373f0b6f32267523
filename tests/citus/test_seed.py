"""Citus mode keeps every seed rule: retry with backoff, max attempts, fail, snooze, cancel,
expiry, requeue, unique keys, transactional enqueue across nodes, wake-up by LISTEN on the
coordinator, and exactly-once schedule ticks."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from akadze_core import App, Every, Fail, Retry, Scheduler, Snooze, Worker
from akadze_core.ops.control import request_cancel_sync, requeue_sync
from tests.citus.test_core_path import placement
from tests.helpers import job, run_worker_until

HOUR = timedelta(hours=1)


def db_now(db: psycopg.Connection, offset: str) -> Any:
    row = db.execute("SELECT now() + %s::interval", (offset,)).fetchone()
    assert row is not None
    return row[0]


async def run_until(app: App, done: Any, **options: Any) -> None:
    options.setdefault("poll_interval", 0.1)
    await run_worker_until(Worker(app, **options), done)


async def test_retry_with_backoff_then_success(citus_app: App,
                                              citus_db: psycopg.Connection) -> None:
    attempts: list[int] = []

    @citus_app.task("flaky", max_attempts=3)
    async def flaky() -> str:
        attempts.append(len(attempts) + 1)
        if len(attempts) < 3:
            raise Retry(timedelta(milliseconds=300))
        return "ok"

    job_id = flaky.enqueue()
    await run_until(citus_app, lambda: job(citus_db, job_id)["state"] == "succeeded")
    row = job(citus_db, job_id)
    assert (row["attempt"], row["run_count"], row["result"]) == (3, 3, "ok")
    assert [error["type"] for error in row["errors"]] == ["Retry", "Retry"]
    assert [error["attempt"] for error in row["errors"]] == [1, 2]
    # The backoff was kept: each retry became due 0.3 s after the attempt that asked for it.
    first, second = (error["at"] for error in row["errors"])
    assert attempts == [1, 2, 3]
    assert first < second


async def test_an_exception_spends_attempts_until_failed(citus_app: App,
                                                       citus_db: psycopg.Connection) -> None:
    @citus_app.task("broken", max_attempts=2,
                    backoff=lambda attempt: 0.05)
    async def broken() -> None:
        raise RuntimeError("still broken")

    job_id = broken.enqueue()
    await run_until(citus_app, lambda: job(citus_db, job_id)["state"] == "failed",
                    )
    row = job(citus_db, job_id)
    assert (row["attempt"], row["max_attempts"]) == (2, 2)
    assert [error["type"] for error in row["errors"]] == ["RuntimeError", "RuntimeError"]
    assert row["finished_at"] is not None
    # Requeue by id finds the job's shard from its id: one more attempt.
    with citus_app.connect(autocommit=True) as connection:
        assert requeue_sync(connection, job_id) is True
    row = job(citus_db, job_id)
    assert (row["state"], row["max_attempts"]) == ("queued", 3)


async def test_fail_and_snooze(citus_app: App, citus_db: psycopg.Connection) -> None:
    runs: list[str] = []

    @citus_app.task("fails")
    async def fails() -> None:
        raise Fail("rejected")

    @citus_app.task("snoozes")
    async def snoozes() -> str:
        runs.append("snooze")
        if len(runs) == 1:
            raise Snooze(timedelta(milliseconds=100))
        return "woke"

    failed, snoozed = fails.enqueue(), snoozes.enqueue()
    await run_until(citus_app, lambda: job(citus_db, failed)["state"] == "failed"
                    and job(citus_db, snoozed)["state"] == "succeeded")
    assert job(citus_db, failed)["attempt"] == 1
    row = job(citus_db, snoozed)
    assert (row["attempt"], row["run_count"]) == (1, 2)  # a snooze gives its attempt back


async def test_cancel_and_expiry(citus_app: App, citus_db: psycopg.Connection) -> None:
    ran: list[str] = []

    @citus_app.task("work")
    async def work(name: str) -> None:
        ran.append(name)

    target = work.enqueue(name="target")
    expired = work.configure(expires_at=db_now(citus_db, "-1 second")).enqueue(name="expired")
    sentinel = work.enqueue(name="sentinel")
    with citus_app.connect(autocommit=True) as connection:
        assert request_cancel_sync(connection, target) is True
        assert request_cancel_sync(connection, target) is False
    row = job(citus_db, target)
    assert (row["state"], row["cancel_requested"]) == ("cancelled", True)
    await run_until(citus_app, lambda: job(citus_db, sentinel)["state"] == "succeeded"
                    and job(citus_db, expired)["state"] != "queued")
    for job_id in (target, expired):
        row = job(citus_db, job_id)
        assert (row["state"], row["attempt"], row["run_count"]) == ("cancelled", 0, 0)
    assert ran == ["sentinel"]


async def test_unique_keys_hold_within_the_key_shard(citus_app: App,
                                                    citus_db: psycopg.Connection) -> None:
    @citus_app.task("once")
    async def once() -> None: ...

    first = once.configure(unique_key="report:42").enqueue()
    again = once.configure(unique_key="report:42").enqueue()
    other = once.configure(unique_key="report:43").enqueue()
    assert again == first and other != first
    await run_until(citus_app, lambda: job(citus_db, first)["state"] == "succeeded"
                    and job(citus_db, other)["state"] == "succeeded")
    # Finished: the key is free again.
    assert once.configure(unique_key="report:42").enqueue() not in (first, other)


def two_tenants_on_two_nodes(db: psycopg.Connection, app: App) -> tuple[str, str]:
    """Two tenant keys whose shards live on different worker nodes."""
    seen: dict[str, str] = {}
    for n in range(64):
        tenant = f"tenant-{n}"
        shard = db.execute("SELECT akadze.citus_shard_for(%s::jsonb, NULL, 'q', '{}', 1)",
                           (f'{{"tenant": "{tenant}"}}',)).fetchone()
        assert shard is not None
        node = placement(db, shard[0])
        if node not in seen:
            seen[node] = tenant
        if len(seen) == 2:
            first, second = seen.values()
            return first, second
    raise AssertionError("every tenant landed on one node")


async def test_transactional_enqueue_across_two_nodes(citus_app: App,
                                                      citus_db: psycopg.Connection,
                                                      citus_url: str) -> None:
    @citus_app.task("send")
    async def send(n: int) -> None: ...

    one, two = two_tenants_on_two_nodes(citus_db, citus_app)
    with psycopg.connect(citus_url) as session:  # not autocommit: one transaction
        gone = [send.configure(meta={"tenant": one}).using(session=session).enqueue(n=1),
                send.configure(meta={"tenant": two}).using(session=session).enqueue(n=2)]
        session.rollback()
        kept = [send.configure(meta={"tenant": one}).using(session=session).enqueue(n=3),
                send.configure(meta={"tenant": two}).using(session=session).enqueue(n=4)]
        assert citus_db.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (0,)
        session.commit()
    assert placement(citus_db, kept[0]) != placement(citus_db, kept[1])
    rows = citus_db.execute("SELECT id FROM akadze.jobs ORDER BY id").fetchall()
    assert [row[0] for row in rows] == sorted(kept)
    assert not set(gone) & set(kept)


async def test_a_worker_wakes_by_listen_on_the_coordinator(citus_app: App,
                                                            citus_db: psycopg.Connection
                                                            ) -> None:
    @citus_app.task("ping")
    async def ping() -> str:
        return "pong"

    # A poll every minute: only the NOTIFY can wake the worker within the test's bound.
    worker = Worker(citus_app, poll_interval=60)
    runner = asyncio.create_task(worker.run())
    try:
        # The worker is idle on an empty queue (its first claims found nothing).
        for _ in range(200):
            if citus_db.execute("SELECT count(*) FROM akadze.workers").fetchone() == (1,):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        started = time.monotonic()
        job_id = await ping.enqueue_async()
        while job(citus_db, job_id)["state"] != "succeeded":
            assert time.monotonic() - started < 10, "the NOTIFY did not wake the worker"
            await asyncio.sleep(0.02)
        woke_in = time.monotonic() - started
    finally:
        worker.request_stop()
        await asyncio.wait_for(runner, 30)
    assert woke_in < 5


async def test_a_schedule_tick_is_enqueued_once_under_contention(
        citus_app: App, citus_db: psycopg.Connection, citus_url: str) -> None:
    citus_app.add_schedule("race", "t", trigger=Every(HOUR))
    connections = [await psycopg.AsyncConnection.connect(citus_url, autocommit=True)
                   for _ in range(8)]
    try:
        await Scheduler(citus_app).enqueue_due(connections[0])
        for round_number in range(1, 4):
            # Rewound as if no worker had run for an hour (the new value computed here:
            # Citus runs no timestamp arithmetic on a column inside an UPDATE).
            row = citus_db.execute("SELECT last_tick FROM akadze.schedules"
                                   " WHERE name = 'race'").fetchone()
            assert row is not None
            citus_db.execute("UPDATE akadze.schedules SET last_tick = %s WHERE name = 'race'",
                             (row[0] - HOUR,))
            await asyncio.gather(*(Scheduler(citus_app).enqueue_due(connection)
                                   for connection in connections))
            count = citus_db.execute("SELECT count(*) FROM akadze.jobs"
                                     " WHERE meta->>'schedule' = 'race'").fetchone()
            assert count == (round_number,)
    finally:
        for connection in connections:
            await connection.close()
        citus_db.execute("DELETE FROM akadze.schedules")


def test_a_statement_without_a_citus_form_refuses(citus_app: App) -> None:
    from akadze_core.store.queries import citus_queries

    # Today every statement of sql/queries.sql has one but the limits' and the late notice of
    # a quiet insert, which Citus mode never owes (docs/how-to/citus.md says so): a new
    # statement must be given one, or be listed there as refused.
    assert sorted(name for name, text in citus_queries().items() if "citus_refuse" in text) \
        == ["job_notice_send", "limit_clear", "limit_list", "limit_set", "limit_wait"]
    with citus_app.connect(autocommit=True) as connection, \
            pytest.raises(psycopg.errors.FeatureNotSupported,
                          match="job_new_thing is not available in Citus mode"):
        connection.execute("SELECT akadze.citus_refuse('job_new_thing')")


async def test_a_paused_queue_gives_no_job_until_resumed(citus_app: App,
                                                         citus_db: psycopg.Connection
                                                         ) -> None:
    @citus_app.task("held", queue="pausable")
    async def held() -> str:
        return "done"

    assert await citus_app.pause_queue_async("pausable", by="test") is True
    try:
        job_ids = [await held.enqueue_async() for _ in range(4)]
        with citus_app.connect(autocommit=True) as connection:
            assert citus_app.paused_queues() == ["pausable"]
            claimed = connection.execute(
                "SELECT count(*) FROM akadze.citus_claim_jobs(NULL, 'pausable', 10, NULL,"
                " '{}', '{}', '{}')").fetchone()
        assert claimed == (0,)
        assert {job(citus_db, job_id)["state"] for job_id in job_ids} == {"queued"}
    finally:
        assert await citus_app.resume_queue_async("pausable") is True
    await run_until(citus_app, lambda: all(
        job(citus_db, job_id)["state"] == "succeeded" for job_id in job_ids),
        queues=["pausable"])


def test_rate_limits_and_concurrency_keys_refuse(citus_app: App) -> None:
    """Citus mode has no limited claim: a limit or a key that would not hold is refused."""
    @citus_app.task("keyed", concurrency_key="tenant-1", max_concurrency=1)
    async def keyed() -> None:
        return None

    with pytest.raises(psycopg.errors.FeatureNotSupported, match="concurrency_key"):
        keyed.enqueue()
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="limit_set"):
        citus_app.set_rate_limit("10/s", queue="default")
