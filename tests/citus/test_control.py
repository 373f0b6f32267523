"""Citus mode keeps the fleet's controls: remote control (a broadcast answered by a running
worker, the revoked and scheduled lists), runtime schedules (stored, changed, paused,
removed, each tick enqueued once however many schedulers race) and paused queues."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import psycopg

from akadze_core import App, Every, Scheduler, Worker
from akadze_core.ops.control import broadcast, request_cancel_sync, revoked_task_ids, scheduled_jobs
from tests.helpers import job

HOUR = timedelta(hours=1)


def rewind(db: psycopg.Connection, name: str) -> None:
    """The schedule's last tick an hour back, as if no worker had run meanwhile (the new value
    computed here: Citus runs no timestamp arithmetic on a column inside an UPDATE)."""
    row = db.execute("SELECT last_tick FROM akadze.schedules WHERE name = %s",
                     (name,)).fetchone()
    assert row is not None
    db.execute("UPDATE akadze.schedules SET last_tick = %s WHERE name = %s",
               (row[0] - HOUR, name))


def scheduled(db: psycopg.Connection, name: str) -> list[datetime]:
    """The ticks of the jobs the schedule enqueued, in order."""
    return [datetime.fromisoformat(row[0]) for row in db.execute(
        "SELECT meta->>'tick' FROM akadze.jobs WHERE meta->>'schedule' = %s ORDER BY 1",
        (name,)).fetchall()]


async def test_a_broadcast_is_answered_by_the_running_worker(
        citus_app: App, citus_db: psycopg.Connection) -> None:
    worker = Worker(citus_app, poll_interval=0.1)
    runner = asyncio.create_task(worker.run())
    try:
        for _ in range(200):
            if citus_app.list_workers(live=True):
                break
            await asyncio.sleep(0.05)
        replies = await asyncio.to_thread(broadcast, citus_app, "ping", reply=True, timeout=10)
        assert [reply.reply for reply in replies] == ["pong"]
        # Replies are written once per worker and request, in a reference table.
        assert citus_db.execute("SELECT count(*) FROM akadze.control_replies").fetchone() == (1,)
    finally:
        worker.request_stop()
        await asyncio.wait_for(runner, 30)


async def test_revoked_and_scheduled_lists_read_every_shard(
        citus_app: App, citus_db: psycopg.Connection) -> None:
    @citus_app.task("later")
    async def later(n: int) -> None:
        return None

    cancelled = [later.configure(meta={"tenant": f"t{n}"}).enqueue(n=n) for n in range(6)]
    with citus_app.connect(autocommit=True) as connection:
        for job_id in cancelled:
            assert request_cancel_sync(connection, job_id)
    waiting = [later.configure(delay=3600, meta={"tenant": f"t{n}"}).enqueue(n=n)
               for n in range(6)]
    assert len({job_id % 1024 for job_id in cancelled}) > 1  # several shards
    revoked = revoked_task_ids(citus_app, window=600, limit=100)
    assert len(revoked) == len(cancelled)
    listed = scheduled_jobs(citus_app, 0, ["default"], limit=100)
    assert sorted(row.id for row in listed) == sorted(waiting)


async def test_runtime_schedules_are_stored_changed_paused_and_removed(
        citus_app: App, citus_db: psycopg.Connection) -> None:
    schedules = citus_app.runtime_schedules
    try:
        stored = schedules.add("reports", "report.build", trigger=Every(HOUR),
                               args={"kind": "daily"}, priority=5)
        assert (stored.trigger, stored.paused, stored.priority) == ("every 3600s", False, 5)
        assert schedules.add("reports", "report.build", trigger=Every(HOUR),
                             replace=True).priority == 0
        assert schedules.pause("reports") is True
        assert schedules.get("reports").paused is True  # type: ignore[union-attr]
        assert schedules.resume("reports") is True
        assert [s.name for s in schedules.list()] == ["reports"]
        assert schedules.remove("reports") is True
        assert schedules.get("reports") is None
        assert schedules.remove("reports") is False
    finally:
        citus_db.execute("DELETE FROM akadze.schedules")


async def test_a_runtime_schedule_tick_is_enqueued_once_under_contention(
        citus_app: App, citus_db: psycopg.Connection, citus_url: str) -> None:
    citus_app.runtime_schedules.add("race", "t", trigger=Every(HOUR), meta={"owner": "ops"})
    connections = [await psycopg.AsyncConnection.connect(citus_url, autocommit=True)
                   for _ in range(6)]
    try:
        for round_number in range(1, 4):
            rewind(citus_db, "race")
            await asyncio.gather(*(Scheduler(citus_app).enqueue_due(connection)
                                   for connection in connections))
            # One job per pass, whichever of the six schedulers won the tick.
            assert len(scheduled(citus_db, "race")) == round_number
        [meta] = {row[0]["owner"] for row in citus_db.execute(
            "SELECT meta FROM akadze.jobs WHERE meta->>'schedule' = 'race'").fetchall()}
        assert meta == "ops"
        # A paused schedule enqueues nothing, however far behind it is.
        citus_app.runtime_schedules.pause("race")
        rewind(citus_db, "race")
        await Scheduler(citus_app).enqueue_due(connections[0])
        assert len(scheduled(citus_db, "race")) == 3
    finally:
        for connection in connections:
            await connection.close()
        citus_db.execute("DELETE FROM akadze.schedules")


async def test_a_paused_queue_is_claimed_by_no_worker_until_resumed(
        citus_app: App, citus_db: psycopg.Connection) -> None:
    @citus_app.task("noop")
    async def noop(n: int) -> None:
        return None

    assert citus_app.pause_queue("default", by="test") is True
    try:
        # Over several shards: no shard's claim may take one.
        ids = [noop.configure(meta={"tenant": f"t{n}"}).enqueue(n=n) for n in range(8)]
        worker = Worker(citus_app, poll_interval=0.1)
        runner = asyncio.create_task(worker.run())
        try:
            await asyncio.sleep(1.5)
            assert {job(citus_db, job_id)["state"] for job_id in ids} == {"queued"}
            [listed] = [q for q in citus_app.list_queues() if q.queue == "default"]
            assert (listed.paused, listed.paused_by, listed.due, listed.workers) == \
                (True, "test", 8, 1)
            assert citus_app.paused_queues() == ["default"]
            assert citus_app.resume_queue("default") is True
            for _ in range(200):
                if {job(citus_db, job_id)["state"] for job_id in ids} == {"succeeded"}:
                    break
                await asyncio.sleep(0.05)
            assert {job(citus_db, job_id)["state"] for job_id in ids} == {"succeeded"}
        finally:
            worker.request_stop()
            await asyncio.wait_for(runner, 30)
    finally:
        citus_db.execute("DELETE FROM akadze.queue_pauses")

