"""Claim floors (akadze_core/store/floors.py): a claim reads the claim index only above
the last key its worker claimed, so the entries of jobs claimed before -- which VACUUM cannot
remove while a transaction pins the horizon -- cost it nothing; and no job is ever left
below a floor unseen."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from akadze_core import App, Worker
from akadze_core.store import database
from akadze_core.store.floors import Floors
from akadze_core.store.listener import listen_for_jobs
from akadze_core.store.queries import query

QUEUE = "floors"


@pytest.fixture
def worker_id(db: psycopg.Connection) -> int:
    row = db.execute(
        "INSERT INTO akadze.workers (name, hostname, pid, queues, heartbeat_ttl)"
        " VALUES ('floors', 'test', 1, %s, '1 hour') RETURNING id", ([QUEUE],)).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def pinned_horizon(database_url: str) -> Iterator[None]:
    """What the independent harness does: a session idle in a transaction that has an xid,
    so VACUUM keeps every row version since and index scans can mark no entry dead."""
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT txid_current()")
        yield


def _fill(db: psycopg.Connection, jobs: int, priority: int = 0) -> None:
    db.execute("INSERT INTO akadze.jobs (task, queue, priority, scheduled_at)"
               " SELECT 't', %s, %s, now() - interval '1 hour' + g * interval '1 ms'"
               " FROM generate_series(1, %s) AS g", (QUEUE, priority, jobs))
    db.execute("ANALYZE akadze.jobs")


async def _claim(url: str, worker_id: int, floors: Floors | None,
                 limit: int = 10) -> list[dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as connection:
        return await database.claim_jobs(connection, QUEUE, limit, worker_id, False,
                                         floors=floors)


def _listening_floors(**settings: float) -> Floors:
    floors = Floors(**settings)
    floors.set_listening(True)
    return floors


def _claim_buffers(db: psycopg.Connection, worker_id: int, floors: Floors) -> int:
    """Shared buffers one claim of 10 touches (EXPLAIN ANALYZE runs it: it claims)."""
    priorities, ats, ids = floors.bounds(QUEUE)
    row = db.execute(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query("job_claim"),
        {"lock_timeout": None, "queue": QUEUE, "limit": 10, "worker_id": worker_id,
         "floor_priority": priorities,
         "floor_at": ats, "floor_id": ids}).fetchone()
    assert row is not None
    top = row[0][0]["Plan"]  # psycopg reads the json column as Python objects
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


async def test_a_claim_with_floors_reads_nothing_of_the_jobs_claimed_before(
        database_url: str, db: psycopg.Connection, worker_id: int,
        pinned_horizon: None) -> None:
    _fill(db, 30_000)
    floors = _listening_floors()
    # The cost of a claim with nothing claimed before (its UPDATE and index inserts too).
    fresh = _claim_buffers(db, worker_id, floors)
    floors.claimed(QUEUE, [])  # that claim's rows are not known here: start from the head
    async with await psycopg.AsyncConnection.connect(database_url,
                                                     autocommit=True) as connection:
        for _ in range(2_000):  # 20,000 claimed and finished under the pinned horizon
            rows = await database.claim_jobs(connection, QUEUE, 10, worker_id, False,
                                             floors=floors)
            assert len(rows) == 10
            await connection.execute(
                "UPDATE akadze.jobs SET state = 'succeeded', finished_at = now()"
                " WHERE id = ANY(%s)", ([row["id"] for row in rows],))
    with_floors = _claim_buffers(db, worker_id, floors)
    # The same claim read from the head of the queue: every entry of those 20,000 jobs
    # first. (The rescan every RESCAN_INTERVAL pays this, not each claim.)
    from_head = _claim_buffers(db, worker_id, Floors())
    # About 470 buffers of dead entries read from the head, none with floors (the UPDATE's
    # index inserts grow a little with the PK index: about 20).
    assert from_head > with_floors + 300, (fresh, with_floors, from_head)
    assert with_floors < fresh + 100, (fresh, with_floors, from_head)


async def test_claims_follow_priority_order_across_floors_and_the_gaps_between(
        database_url: str, db: psycopg.Connection, worker_id: int) -> None:
    _fill(db, 30, priority=5)
    floors = _listening_floors()
    first = await _claim(database_url, worker_id, floors)
    assert [row["priority"] for row in first] == [5] * 10
    # Priorities this worker has no floor for, inserted without telling it (no heard()):
    # read from their start, and before priority 5 in claim order.
    db.execute("INSERT INTO akadze.jobs (task, queue, priority, scheduled_at) VALUES"
               " ('t', %(q)s, 9, now() - interval '2 hours'),"
               " ('t', %(q)s, 0, now() - interval '2 hours'),"
               " ('t', %(q)s, 7, now() - interval '2 hours')", {"q": QUEUE})
    second = await _claim(database_url, worker_id, floors, limit=3)
    assert [row["priority"] for row in second] == [0, 5, 5]
    rest = await _claim(database_url, worker_id, floors, limit=100)
    assert [row["priority"] for row in rest] == [5] * 18 + [7, 9]
    ids = [row["id"] for row in first + second + rest]
    assert len(set(ids)) == len(ids) == 33


async def test_a_job_below_a_floor_is_claimed_once_heard_and_by_the_rescan_otherwise(
        database_url: str, db: psycopg.Connection, worker_id: int) -> None:
    _fill(db, 20)
    floors = _listening_floors(rescan_interval=1.0)
    assert len(await _claim(database_url, worker_id, floors)) == 10
    early = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=1)

    def below(days: int = 0) -> int:
        row = db.execute("INSERT INTO akadze.jobs (task, queue, scheduled_at)"
                         " VALUES ('t', %s, %s) RETURNING id",
                         (QUEUE, early - dt.timedelta(days=days))).fetchone()
        assert row is not None
        return int(row[0])

    # Unheard, a job below the floor is passed over (this is what the floors skip)...
    hidden = below()
    assert hidden not in {row["id"] for row in await _claim(database_url, worker_id,
                                                            floors, limit=1)}
    # ...until its notification's key lowers the floor,
    floors.heard(QUEUE, (0, early))
    assert [row["id"] for row in await _claim(database_url, worker_id, floors,
                                              limit=1)] == [hidden]
    # or the rescan reads the queue from its head.
    unheard = below(days=1)  # below the floor the last claim left
    assert unheard not in {row["id"] for row in await _claim(database_url, worker_id,
                                                             floors, limit=1)}
    await asyncio.sleep(1.1)
    assert [row["id"] for row in await _claim(database_url, worker_id, floors,
                                              limit=1)] == [unheard]


async def test_a_job_committed_late_with_an_early_key_runs_at_once(
        app: App, database_url: str) -> None:
    # An enqueue in a transaction has that transaction's now(): committed after later jobs
    # ran (and moved the worker's floor past it), its notification's key lowers the floor.
    # Held open longer than floors.MARGIN, it would wait for the rescan without the key.
    ran: dict[str, float] = {}

    @app.task("floors.mark", queue=QUEUE)
    async def mark(name: str) -> None:
        ran[name] = time.monotonic()

    worker = Worker(app, queues=[QUEUE], slots=4, schedules=False, poll_interval=30)
    runner = asyncio.create_task(worker.run())
    try:
        async with await psycopg.AsyncConnection.connect(database_url) as session:
            await mark.using(session=session).enqueue_async(name="late")
            for n in range(20):
                await mark.enqueue_async(name=f"on time {n}")
            deadline = time.monotonic() + 20
            while len(ran) < 20:
                assert time.monotonic() < deadline and not runner.done()
                await asyncio.sleep(0.02)
            await asyncio.sleep(2.5)  # longer than floors.MARGIN
            await session.commit()
            committed = time.monotonic()
        while "late" not in ran:
            assert time.monotonic() < committed + 5, "the late job waited for the rescan"
            assert not runner.done()
            await asyncio.sleep(0.02)
    finally:
        worker.request_stop()
        await asyncio.wait_for(runner, 30)
    assert ran["late"] - committed < 5


async def test_the_listener_hears_each_insert_s_lowest_key(app: App, database_url: str,
                                                           db: psycopg.Connection) -> None:
    heard: list[tuple[str, tuple[int, dt.datetime] | None]] = []
    states: list[bool] = []
    woken = asyncio.Event()
    listener = asyncio.create_task(listen_for_jobs(
        database_url, [QUEUE, "other"], woken.set, lambda failures: 0.1,
        jobs_heard=lambda queue, key: heard.append((queue, key)), connected=states.append))
    try:
        while not states:
            await asyncio.sleep(0.01)
        task = app.task("floors.t", queue=QUEUE)(lambda: None)
        early = dt.datetime(2026, 1, 1, 12, 30, 0, 123456, tzinfo=dt.timezone.utc)
        single = await task.configure(priority=3, at=early).enqueue_async()
        await task.configure(priority=-2).enqueue_many_async([{}, {}])
        await asyncio.wait_for(woken.wait(), 5)
        while len(heard) < 2:
            await asyncio.sleep(0.01)
        rows = db.execute("SELECT priority, scheduled_at FROM akadze.jobs WHERE id <> %s",
                          (single,)).fetchall()
        assert heard[0] == (QUEUE, (3, early))
        assert heard[1] == (QUEUE, (-2, min(at for _, at in rows)))
        assert states == [True]
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
    assert states == [True, False]
