"""The lease model on real Postgres (seed 000): fenced outcome writes, rescue of dead
workers' jobs, racing rescuers, and heartbeats that touch one worker row and no job rows."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from akadze_core import App, Worker, current
from akadze_core.model.outcomes import CANCEL, FAIL, RETRY, SNOOZE, SUCCESS, Outcome
from akadze_core.store import database
from tests.helpers import job
from tests.integration.lease_support import (
    FAST,
    claim,
    fake_worker,
    rescue,
    running,
    scalar,
    wait_until,
)


def register_noop(app: App, name: str = "noop") -> Any:
    @app.task(name)
    async def noop(**kwargs: Any) -> str:
        return "done"

    return noop


async def complete(url: str, outcomes: list[Outcome]) -> list[dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as connection:
        return await database.complete_many(connection, outcomes)


async def claim_one(url: str, worker_id: int) -> dict[str, Any]:
    rows = await claim(url, worker_id, 1)
    assert len(rows) == 1
    return rows[0]


def worker_lost(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [entry for entry in row["errors"] if entry["type"] == "WorkerLost"]


# --- fencing ---------------------------------------------------------------------------------


async def test_a_late_outcome_of_a_rescued_run_changes_nothing(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    noop = register_noop(app)
    job_id = noop.enqueue()
    first = await claim_one(database_url, fake_worker(db, heartbeat_age=10, ttl=1))
    assert first["run_count"] == 1
    assert [row["id"] for row in await rescue(database_url)] == [job_id]
    db.execute("UPDATE akadze.jobs SET scheduled_at = now() WHERE id = %s", (job_id,))
    second = await claim_one(database_url, fake_worker(db, ttl=60))
    assert second["run_count"] == 2
    before = job(db, job_id)
    late, now = first["claim_token"], second["claim_token"]

    stale = [
        Outcome(job_id, 1, SUCCESS, result='"late"', claim_token=late),
        Outcome(job_id, 1, RETRY, delay=5, error='{"type": "X", "message": "late"}',
                claim_token=late),
        Outcome(job_id, 1, SNOOZE, delay=5, claim_token=late),
        Outcome(job_id, 1, FAIL, error='{"type": "Fail", "message": "late"}', claim_token=late),
        Outcome(job_id, 1, CANCEL, error='{"type": "Cancel", "message": "late"}',
                claim_token=late),
    ]
    for outcome in stale:
        assert await complete(database_url, [outcome]) == []
        assert job(db, job_id) == before

    # In a batch, the stale outcome is dropped and the current one lands.
    other = noop.enqueue()
    current_run = await claim_one(database_url, fake_worker(db, ttl=60))
    rows = await complete(database_url, [
        Outcome(job_id, 1, FAIL, error='{"type": "Fail", "message": "late"}', claim_token=late),
        Outcome(other, current_run["run_count"], SUCCESS, result='"ok"',
                claim_token=current_run["claim_token"]),
    ])
    assert [(row["id"], row["state"]) for row in rows] == [(other, "succeeded")]
    assert job(db, job_id) == before

    # The current run writes; afterwards even its own second write is rejected.
    rows = await complete(database_url, [
        Outcome(job_id, 2, SUCCESS, result='"current"', claim_token=now)])
    assert [(row["id"], row["run_count"], row["state"]) for row in rows] == \
        [(job_id, 2, "succeeded")]
    done = job(db, job_id)
    assert (done["state"], done["result"], done["run_count"], done["attempt"]) == \
        ("succeeded", "current", 2, 2)
    assert await complete(database_url, [
        Outcome(job_id, 2, FAIL, error='{"type": "X"}', claim_token=now)]) == []
    assert await complete(database_url, [
        Outcome(job_id, 1, SUCCESS, result='"late"', claim_token=late)]) == []
    assert job(db, job_id) == done


async def test_a_dead_worker_that_comes_back_cannot_overwrite_the_new_run(
    db: psycopg.Connection, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Worker A stalls, is declared dead, B rescues and finishes the job; A's late write loses."""
    release = asyncio.Event()
    runs: list[tuple[str, int]] = []

    def build(name: str) -> App:
        app = App(database_url)

        @app.task("slow")
        async def slow() -> str:
            runs.append((name, current().run_count))
            if name == "A":
                await release.wait()
            return f"from {name}"

        return app

    app_a, app_b = build("A"), build("B")
    caplog.set_level(logging.WARNING, logger="akadze.worker")
    try:
        job_id = app_a.tasks["slow"].enqueue()
        worker_a = Worker(app_a, slots=1, name="A", **FAST)
        async with running(worker_a):
            await wait_until(lambda: runs == [("A", 1)])
            a_id = job(db, job_id)["worker_id"]
            assert a_id == worker_a.worker_id
            # A "dies": its worker row disappears, as when another worker judged it dead.
            db.execute("DELETE FROM akadze.workers WHERE id = %s", (a_id,))
            worker_b = Worker(app_b, slots=1, name="B", **FAST)
            async with running(worker_b):
                await wait_until(lambda: job(db, job_id)["state"] == "succeeded", timeout=5)
            assert runs == [("A", 1), ("B", 2)]
            finished = job(db, job_id)
            assert (finished["result"], finished["run_count"], finished["attempt"]) == \
                ("from B", 2, 2)
            assert len(worker_lost(finished)) == 1
            release.set()
            await wait_until(lambda: any("rejected" in r.getMessage() for r in caplog.records))
        assert job(db, job_id) == finished
        assert scalar(db, "SELECT count(*) FROM akadze.workers") == 0
    finally:
        await app_a.close_async()
        await app_b.close_async()


# --- rescue ----------------------------------------------------------------------------------


async def test_rescue_returns_a_dead_workers_job_with_the_attempt_spent(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    noop = register_noop(app)
    job_id = noop.enqueue()
    live = fake_worker(db, heartbeat_age=0, ttl=1, name="live")
    dead = fake_worker(db, heartbeat_age=1.5, ttl=1, name="dead")
    claimed = await claim_one(database_url, dead)
    rows = await rescue(database_url)
    assert [(row["id"], row["state"]) for row in rows] == [(job_id, "queued")]

    row = job(db, job_id)
    assert (row["state"], row["attempt"], row["run_count"], row["worker_id"]) == \
        ("queued", 1, claimed["run_count"], None)
    assert row["finished_at"] is None
    [lost] = row["errors"]
    assert (lost["type"], lost["attempt"], lost["worker_id"]) == ("WorkerLost", 1, dead)
    assert lost["message"] and "traceback" in lost
    # Default curve after attempt 1: 2^0 s with jitter in [50 %, 100 %], by the DB clock.
    delay = scalar(db, "SELECT extract(epoch FROM scheduled_at - (errors->0->>'at')::timestamptz)"
                       " FROM akadze.jobs WHERE id = %s", (job_id,))
    assert 0.5 <= float(delay) <= 1.0
    assert scalar(db, "SELECT scheduled_at > now() FROM akadze.jobs WHERE id = %s", (job_id,))
    assert [r[0] for r in db.execute("SELECT id FROM akadze.workers").fetchall()] == [live]
    assert await rescue(database_url) == []


async def test_rescue_follows_the_default_curve_and_fails_the_last_attempt(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    noop = register_noop(app)
    third = noop.configure(max_attempts=5).enqueue()
    last = noop.enqueue()  # max_attempts 3
    db.execute("UPDATE akadze.jobs SET attempt = 2")
    dead = fake_worker(db, heartbeat_age=60, ttl=1)
    claimed = {row["id"]: row for row in await claim(database_url, dead, 2)}
    assert {row["attempt"] for row in claimed.values()} == {3}
    states = {row["id"]: row["state"] for row in await rescue(database_url)}
    assert states == {third: "queued", last: "failed"}

    delay = scalar(db, "SELECT extract(epoch FROM scheduled_at - (errors->0->>'at')::timestamptz)"
                       " FROM akadze.jobs WHERE id = %s", (third,))
    assert 2.0 <= float(delay) <= 4.0  # 2^(3-1) s, jittered
    failed = job(db, last)
    assert (failed["state"], failed["attempt"], failed["worker_id"]) == ("failed", 3, None)
    assert failed["finished_at"] is not None
    assert [entry["type"] for entry in failed["errors"]] == ["WorkerLost"]


async def test_rescue_returns_jobs_of_a_worker_row_that_no_longer_exists(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    noop = register_noop(app)
    ids = noop.enqueue_many([{}] * 3)
    gone = fake_worker(db, ttl=60)
    await claim(database_url, gone, 3)
    db.execute("DELETE FROM akadze.workers WHERE id = %s", (gone,))
    assert sorted(row["id"] for row in await rescue(database_url)) == sorted(ids)
    assert {job(db, i)["state"] for i in ids} == {"queued"}
    assert all(len(worker_lost(job(db, i))) == 1 for i in ids)


async def test_rescue_leaves_live_workers_alone(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    noop = register_noop(app)
    noop.enqueue_many([{}] * 2)
    # Ten seconds without a heartbeat is fine for a worker whose own TTL is 60 s.
    patient = fake_worker(db, heartbeat_age=10, ttl=60)
    fresh = fake_worker(db, heartbeat_age=0, ttl=1)
    await claim(database_url, patient, 1)
    await claim(database_url, fresh, 1)
    assert await rescue(database_url) == []
    assert scalar(db, "SELECT count(*) FROM akadze.jobs WHERE state = 'running'") == 2
    assert scalar(db, "SELECT count(*) FROM akadze.workers") == 2


async def test_racing_rescuers_rescue_each_job_once(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    noop = register_noop(app)
    ids = noop.configure(max_attempts=1000).enqueue_many([{}] * 8)
    rescuers = [await psycopg.AsyncConnection.connect(database_url, autocommit=True)
                for _ in range(4)]
    rounds = 25
    try:
        for round_number in range(1, rounds + 1):
            db.execute("UPDATE akadze.jobs SET scheduled_at = now()")
            dead = fake_worker(db, heartbeat_age=0, ttl=60)
            orphaned = fake_worker(db, heartbeat_age=0, ttl=60)
            await claim(database_url, dead, 5)
            await claim(database_url, orphaned, 3)
            assert scalar(db, "SELECT count(*) FROM akadze.jobs WHERE state = 'running'") == 8
            # One worker dies of old age, the other's row vanishes.
            db.execute("UPDATE akadze.workers SET heartbeat_at = now() - interval '1 hour'"
                       " WHERE id = %s", (dead,))
            db.execute("DELETE FROM akadze.workers WHERE id = %s", (orphaned,))
            results = await asyncio.gather(
                *(database.rescue_jobs(connection) for connection in rescuers))
            rescued = [row["id"] for rows in results for row in rows]
            assert sorted(rescued) == sorted(ids), f"round {round_number}"
            for job_id in ids:
                row = job(db, job_id)
                assert (row["state"], row["run_count"], row["attempt"]) == \
                    ("queued", round_number, round_number)
                assert len(worker_lost(row)) == round_number
    finally:
        for connection in rescuers:
            await connection.close()
    assert scalar(db, "SELECT count(*) FROM akadze.workers") == 0


async def test_a_live_worker_rescues_and_reruns_a_dead_workers_job(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    attempts: list[int] = []

    @app.task("resumable")
    async def resumable() -> str:
        attempts.append(current().attempt)
        return "finished"

    job_id = resumable.enqueue()
    await claim_one(database_url, fake_worker(db, heartbeat_age=30, ttl=1))
    async with running(Worker(app, **FAST)):
        await wait_until(lambda: job(db, job_id)["state"] == "succeeded", timeout=4)
    row = job(db, job_id)
    assert attempts == [2]
    assert (row["attempt"], row["run_count"], row["result"]) == (2, 2, "finished")
    assert [entry["type"] for entry in row["errors"]] == ["WorkerLost"]


# --- heartbeat -------------------------------------------------------------------------------


async def test_heartbeat_updates_one_worker_row_and_no_job_row(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    release = asyncio.Event()

    @app.task("long")
    async def long() -> None:
        await release.wait()

    job_id = long.enqueue()
    # Two workers of one app in one event loop: each keeps its own pool and its own row.
    other = Worker(app, queues=["elsewhere"], **FAST)
    worker = Worker(app, **FAST)
    async with running(other), running(worker):
        # The other worker claims nothing, so nothing but its id says it has registered.
        await wait_until(lambda: job(db, job_id)["state"] == "running"
                         and other.worker_id is not None)
        row_version = scalar(db, "SELECT xmin::text FROM akadze.jobs WHERE id = %s", (job_id,))
        before = job(db, job_id)
        beats: set[Any] = set()
        sampling = time.monotonic()
        for _ in range(50):  # about a second: several heartbeats at 0.2 s
            rows = db.execute("SELECT id, heartbeat_at FROM akadze.workers").fetchall()
            assert sorted(row[0] for row in rows) == sorted([worker.worker_id, other.worker_id])
            beats.add(dict(rows)[worker.worker_id])
            assert scalar(db, "SELECT xmin::text FROM akadze.jobs WHERE id = %s",
                          (job_id,)) == row_version
            # A heartbeat keeps the run alive: nobody may rescue it.
            assert await rescue(database_url) == []
            await asyncio.sleep(0.02)
        # One heartbeat per interval: not one per loop round (poll_interval is 0.05 s).
        intervals = (time.monotonic() - sampling) / 0.2
        assert intervals / 2 <= len(beats) <= intervals + 2
        assert job(db, job_id) == before
        assert before["worker_id"] == worker.worker_id
        release.set()
        await wait_until(lambda: job(db, job_id)["state"] == "succeeded")
    assert scalar(db, "SELECT count(*) FROM akadze.workers") == 0


async def test_heartbeat_interval_must_be_shorter_than_the_ttl(app: App) -> None:
    with pytest.raises(ValueError):
        Worker(app, heartbeat_interval=timedelta(seconds=5), heartbeat_ttl=timedelta(seconds=5))
