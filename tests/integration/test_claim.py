"""Claiming on real Postgres: order, schedule, slots, SKIP LOCKED without over-locking,
no double claims under concurrency, fair rotation, and jobs cancelled before they start."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from akadze_core import App, Worker, current
from akadze_core.execution.process_child import ROW_FIELDS
from akadze_core.store import database
from tests.helpers import job
from tests.integration.lease_support import (
    FAST,
    claim,
    fake_worker,
    job_count,
    running,
    scalar,
    wait_until,
)

BASE = datetime(2020, 1, 1, tzinfo=timezone.utc)


def register_noop(app: App, name: str = "noop", queue: str | None = None) -> Any:
    @app.task(name, queue=queue)
    async def noop(**kwargs: Any) -> None:
        return None

    return noop


def all_succeeded(db: psycopg.Connection) -> bool:
    return not scalar(db, "SELECT count(*) FROM akadze.jobs WHERE state <> 'succeeded'")


# --- order and schedule --------------------------------------------------------------------


async def test_claim_order_is_priority_then_scheduled_at_then_id(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    noop = register_noop(app)
    expected = []
    # Enqueued in an order that differs from the claim order on every key.
    for priority, minutes, label in [(5, 0, "p5"), (0, 30, "p0-late"), (0, 10, "p0-early-a"),
                                     (-1, 50, "p-1"), (0, 10, "p0-early-b"), (1, 0, "p1")]:
        noop.configure(priority=priority, at=BASE + timedelta(minutes=minutes)).enqueue(
            label=label)
    expected = ["p-1", "p0-early-a", "p0-early-b", "p0-late", "p1", "p5"]
    worker_id = fake_worker(db, ttl=60)
    order = []
    for _ in range(len(expected)):  # one at a time: this checks which row each claim picks
        [row] = await claim(database_url, worker_id, 1)
        order.append(job(db, row["id"])["args"]["label"])
    assert order == expected
    assert await claim(database_url, worker_id, 10) == []


async def test_worker_runs_jobs_in_claim_order(app: App, db: psycopg.Connection) -> None:
    started: list[int] = []

    @app.task("ordered")
    async def ordered(n: int) -> None:
        started.append(n)

    for n, priority in [(3, 2), (1, 0), (4, 2), (2, 1), (0, -5)]:
        ordered.configure(priority=priority, at=BASE).enqueue(n=n)
    async with running(Worker(app, slots=1, **FAST)):
        await wait_until(lambda: all_succeeded(db))
    assert started == [0, 1, 2, 3, 4]


async def test_future_jobs_are_not_claimed_until_due(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    noop = register_noop(app)
    later = noop.configure(delay=timedelta(hours=1)).enqueue()
    also_later = noop.configure(at=datetime(2999, 1, 1, tzinfo=timezone.utc)).enqueue()
    worker_id = fake_worker(db, ttl=60)
    assert await claim(database_url, worker_id, 10) == []
    assert await claim(database_url, worker_id, 10, fair=True) == []
    # Due by the database clock one second from now: still not claimable now.
    db.execute("UPDATE akadze.jobs SET scheduled_at = now() + interval '1 second'")
    assert await claim(database_url, worker_id, 10) == []
    db.execute("UPDATE akadze.jobs SET scheduled_at = now() WHERE id = %s", (later,))
    assert [row["id"] for row in await claim(database_url, worker_id, 10)] == [later]
    assert job(db, also_later)["state"] == "queued"


async def test_queues_are_separate(app: App, db: psycopg.Connection, database_url: str) -> None:
    noop = register_noop(app)
    other = noop.configure(queue="other").enqueue()
    worker_id = fake_worker(db, ttl=60)
    assert await claim(database_url, worker_id, 10) == []
    assert [row["id"] for row in await claim(database_url, worker_id, 10, "other")] == [other]


# --- slots and locking ---------------------------------------------------------------------


def register_long(app: App, ended: set[int]) -> Any:
    @app.task("long")
    async def long() -> None:
        await asyncio.sleep(0.25)
        ended.add(current().id)

    return long


def running_bodies(db: psycopg.Connection, ended: set[int]) -> dict[str, int]:
    """Per queue, the jobs the database shows running whose body has not returned yet.

    A body that returned frees its slot at once while its outcome waits for the completer's
    next batch, so its row may still read ``running`` for a moment: those are left out. The
    snapshot of ``ended`` is taken before the query, and the query blocks the event loop the
    worker shares with this test, so no body can end and no claim can start in between.
    """
    finished = set(ended)
    counts: dict[str, int] = {}
    for job_id, queue in db.execute(
            "SELECT id, queue FROM akadze.jobs WHERE state = 'running'").fetchall():
        if job_id not in finished:
            counts[queue] = counts.get(queue, 0) + 1
    return counts


async def test_slots_bound_the_running_jobs(app: App, db: psycopg.Connection) -> None:
    ended: set[int] = set()
    register_long(app, ended).enqueue_many([{}] * 10)
    peak = 0
    async with running(Worker(app, slots=3, **FAST)):
        while not all_succeeded(db):
            peak = max(peak, running_bodies(db, ended).get("default", 0))
            assert peak <= 3
            await asyncio.sleep(0.01)
    assert peak == 3


async def test_slots_per_queue(app: App, db: psycopg.Connection) -> None:
    ended: set[int] = set()
    long = register_long(app, ended)
    long.configure(queue="a").enqueue_many([{}] * 6)
    long.configure(queue="b").enqueue_many([{}] * 6)
    peaks = {"a": 0, "b": 0}
    async with running(Worker(app, queues=["a", "b"], slots={"a": 1, "b": 3}, **FAST)):
        while not all_succeeded(db):
            for queue, count in running_bodies(db, ended).items():
                peaks[queue] = max(peaks[queue], count)
            assert peaks["a"] <= 1 and peaks["b"] <= 3
            await asyncio.sleep(0.01)
    assert peaks == {"a": 1, "b": 3}


async def test_concurrency_bounds_the_bodies_and_the_slots_beyond_it_wait(
        app: App, db: psycopg.Connection) -> None:
    started: list[int] = []
    ended: set[int] = set()

    @app.task("long")
    async def long() -> None:
        started.append(current().id)
        await asyncio.sleep(0.25)
        ended.add(current().id)

    long.enqueue_many([{}] * 6)
    peak_claimed = peak_bodies = 0
    async with running(Worker(app, slots=3, concurrency=1, **FAST)):
        while not all_succeeded(db):
            claimed = running_bodies(db, ended).get("default", 0)
            bodies = len(started) - len(ended)
            peak_claimed, peak_bodies = max(peak_claimed, claimed), max(peak_bodies, bodies)
            assert claimed <= 3 and bodies <= 1
            await asyncio.sleep(0.01)
    assert (peak_claimed, peak_bodies) == (3, 1)
    with pytest.raises(ValueError, match="concurrency"):
        Worker(app, concurrency=0)


@pytest.mark.parametrize("fair", [False, True])
async def test_a_claim_locks_no_more_rows_than_its_limit(
    app: App, db: psycopg.Connection, database_url: str, fair: bool
) -> None:
    noop = register_noop(app)
    other = register_noop(app, "other")
    noop.enqueue_many([{}] * 5)
    other.enqueue_many([{}] * 5)
    worker_id = fake_worker(db, ttl=60)
    async with await psycopg.AsyncConnection.connect(database_url) as claimer:
        rows = await database.claim_jobs(claimer, "default", 2, worker_id, fair)
        assert len(rows) == 2  # the transaction is still open: its locks are held
        with psycopg.connect(database_url) as observer:
            lockable = observer.execute(
                "SELECT id FROM akadze.jobs FOR UPDATE SKIP LOCKED").fetchall()
            observer.rollback()
        assert len(lockable) == 8
        assert {row["id"] for row in rows}.isdisjoint(row[0] for row in lockable)
        await claimer.commit()
    assert scalar(db, "SELECT count(*) FROM akadze.jobs WHERE state = 'running'") == 2


@pytest.mark.parametrize("fair", [False, True])
async def test_concurrent_claimers_never_share_a_job(
    app: App, db: psycopg.Connection, database_url: str, fair: bool
) -> None:
    noop = register_noop(app)
    other = register_noop(app, "other")
    ids = noop.enqueue_many([{}] * 60) + other.enqueue_many([{}] * 60)
    worker_ids = [fake_worker(db, ttl=60) for _ in range(4)]
    connections = [await psycopg.AsyncConnection.connect(database_url, autocommit=True)
                   for _ in range(4)]
    claimed: list[tuple[int, int]] = []

    async def claimer(connection: psycopg.AsyncConnection, worker_id: int) -> None:
        while True:
            rows = await database.claim_jobs(connection, "default", 3, worker_id, fair)
            if not rows:
                # SKIP LOCKED may pass over rows another claimer holds: stop only when
                # nothing is queued any more.
                cursor = await connection.execute(
                    "SELECT count(*) FROM akadze.jobs WHERE state = 'queued'")
                if (await cursor.fetchone())[0] == 0:  # type: ignore[index]
                    return
            claimed.extend((row["id"], row["run_count"]) for row in rows)

    try:
        for round_number in range(1, 6):
            before = len(claimed)
            await asyncio.gather(
                *(claimer(c, w) for c, w in zip(connections, worker_ids, strict=True)))
            this_round = claimed[before:]
            assert sorted(job_id for job_id, _ in this_round) == sorted(ids)
            assert {run_count for _, run_count in this_round} == {round_number}
            db.execute("UPDATE akadze.jobs SET state = 'queued', worker_id = NULL")
    finally:
        for connection in connections:
            await connection.close()
    assert len(claimed) == len(set(claimed)) == 5 * len(ids)


# --- fairness ------------------------------------------------------------------------------


async def fair_start_order(app: App, db: psycopg.Connection, fair: bool) -> list[str]:
    started: list[str] = []

    @app.task("flood")
    async def flood(n: int) -> None:
        started.append("A")

    @app.task("trickle")
    async def trickle(n: int) -> None:
        started.append("B")

    flood.enqueue_many([{"n": n} for n in range(20)])
    trickle.enqueue_many([{"n": n} for n in range(2)])
    async with running(Worker(app, slots=1, fair=fair, **FAST)):
        await wait_until(lambda: all_succeeded(db))
    return started


async def test_fair_worker_rotates_across_task_names(app: App, db: psycopg.Connection) -> None:
    started = await fair_start_order(app, db, fair=True)
    assert sorted(started) == ["A"] * 20 + ["B"] * 2
    # Both of B's jobs start long before A's flood is through.
    assert started.index("B") <= 2
    assert len(started) - started[::-1].index("B") - 1 <= 4


async def test_unfair_worker_runs_the_flood_first(app: App, db: psycopg.Connection) -> None:
    assert await fair_start_order(app, db, fair=False) == ["A"] * 20 + ["B"] * 2


async def test_fair_claim_interleaves_tasks_in_one_statement(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    tasks = {name: register_noop(app, name) for name in ("a", "b", "c")}
    tasks["a"].enqueue_many([{}] * 6)
    tasks["b"].enqueue_many([{}] * 2)
    tasks["c"].enqueue_many([{}] * 1)
    worker_id = fake_worker(db, ttl=60)
    rows = await claim(database_url, worker_id, 5, fair=True)
    assert sorted(row["task"] for row in rows) == ["a", "a", "b", "b", "c"]


async def test_fair_claim_goes_on_after_the_last_task_and_wraps_around(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    tasks = {name: register_noop(app, name) for name in ("a", "b", "c")}
    for task in tasks.values():
        task.enqueue_many([{}] * 3)
    worker_id = fake_worker(db, ttl=60)

    async def next_task(after: str | None) -> str:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
            [row] = await database.claim_jobs(c, "default", 1, worker_id, True, after_task=after)
        return str(row["task"])

    assert await next_task(None) == "a"
    assert await next_task("a") == "b"
    assert await next_task("b") == "c"
    assert await next_task("c") == "a"  # wraps around
    assert await next_task("zzz") == "a"
    assert await next_task("b") == "c"


# --- cancelled or expired before the start -------------------------------------------------


async def test_claim_cancels_jobs_cancelled_or_expired_before_they_start(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    noop = register_noop(app)
    requested = noop.enqueue()
    db.execute("UPDATE akadze.jobs SET cancel_requested = true WHERE id = %s", (requested,))
    expired = noop.configure(expires_at=datetime(2001, 1, 1, tzinfo=timezone.utc)).enqueue()
    fine = noop.enqueue()
    worker_id = fake_worker(db, ttl=60)
    rows = {row["id"]: row for row in await claim(database_url, worker_id, 3)}
    assert {job_id: row["state"] for job_id, row in rows.items()} == {
        requested: "cancelled", expired: "cancelled", fine: "running"}
    for job_id in (requested, expired):
        row = job(db, job_id)
        assert (row["state"], row["attempt"], row["run_count"], row["worker_id"]) == \
            ("cancelled", 0, 0, None)
        assert row["finished_at"] is not None
    assert (job(db, fine)["attempt"], job(db, fine)["run_count"]) == (1, 1)


async def test_cancelled_and_expired_jobs_never_run(app: App, db: psycopg.Connection) -> None:
    ran: list[str] = []

    @app.task("body")
    async def body(label: str) -> None:
        ran.append(label)

    requested = body.enqueue(label="requested")
    db.execute("UPDATE akadze.jobs SET cancel_requested = true WHERE id = %s", (requested,))
    expired = body.configure(expires_at=datetime(2001, 1, 1, tzinfo=timezone.utc)).enqueue(
        label="expired")
    # Expires while it waits for its turn.
    soon = body.configure(expires_at=datetime.now(timezone.utc) + timedelta(seconds=0.3),
                          delay=0.5).enqueue(label="soon")
    fine = body.enqueue(label="fine")
    started = time.monotonic()
    async with running(Worker(app, slots=1, **FAST)):
        await wait_until(lambda: job(db, soon)["state"] != "queued"
                         and job(db, fine)["state"] == "succeeded")
    assert time.monotonic() - started < 3
    assert ran == ["fine"]
    for job_id in (requested, expired, soon):
        assert (job(db, job_id)["state"], job(db, job_id)["run_count"]) == ("cancelled", 0)
    assert job_count(db) == 4


@pytest.mark.parametrize("fair", [False, True])
async def test_a_process_child_is_sent_every_column_of_a_claimed_row_but_the_parents_own(
    app: App, db: psycopg.Connection, database_url: str, fair: bool
) -> None:
    # A child reads a row as ROW_FIELDS' values: a column the claim gains must be sent too
    # (or named here as the parent's own), or a body in a child would read it as missing.
    register_noop(app).enqueue_many([{}] * 2)
    worker_id = fake_worker(db, ttl=60)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as claimer:
        rows = await database.claim_jobs(claimer, "default", 2, worker_id, fair)
    assert len(rows) == 2
    assert set(rows[0]) == set(ROW_FIELDS) | {"releases", "notified"}


async def test_claimed_rows_hold_what_a_claim_read_as_text_holds(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    # The claim reads its rows in binary: the same values, of the same types (timestamps in
    # the session's time zone, arrays as lists), as the statement's text rows.
    noop = register_noop(app)
    soon = datetime.now(timezone.utc) + timedelta(hours=1)
    for _ in range(2):
        noop.configure(priority=3, at=BASE, expires_at=soon).enqueue(label="same")
    db.execute("UPDATE akadze.jobs SET upstreams = '{1,2}', upstream_results = '[1, 2]',"
               " position = 4")
    worker_id = fake_worker(db, ttl=60)
    [binary] = await claim(database_url, worker_id, 1)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as text:
        cursor = text.cursor(row_factory=psycopg.rows.dict_row)
        await cursor.execute(database.query("job_claim"), {
            "lock_timeout": None, "queue": "default", "limit": 1, "worker_id": worker_id,
            "floor_priority": [], "floor_at": [], "floor_id": []})
        [as_text] = await cursor.fetchall()
    varying = {"id", "claim_token", "started_at", "created_at"}
    assert {key: (value, type(value)) for key, value in binary.items() if key not in varying} \
        == {key: (value, type(value)) for key, value in as_text.items() if key not in varying}
    assert {key: type(value) for key, value in binary.items()} \
        == {key: type(value) for key, value in as_text.items()}
    assert binary["expires_at"] == soon and binary["upstreams"] == [1, 2]
