"""Rate limits and per-key concurrency in the claim, on real Postgres: the limit's room is
taken whole and no more, jobs over it stay queued with their attempt untouched, a full key
hides no other key's jobs, and a limit's lock holds up nothing but its own claims."""

from __future__ import annotations

from typing import Any

import psycopg

from akadze_core import App
from akadze_core.store import database
from tests.integration.lease_support import claim, fake_worker, scalar


def register(app: App, name: str, **options: Any) -> Any:
    @app.task(name, **options)
    async def noop(**kwargs: Any) -> None:
        return None

    return noop


def states(db: psycopg.Connection) -> dict[str, int]:
    rows = db.execute("SELECT state, count(*) FROM akadze.jobs GROUP BY state").fetchall()
    return {state: count for state, count in rows}


async def test_a_queue_limit_starts_its_room_and_leaves_the_rest_queued_unspent(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    noop = register(app, "noop")
    for number in range(10):
        noop.enqueue(n=number)
    assert app.set_rate_limit("3/h", queue="default")
    worker_id = fake_worker(db, ttl=60)
    assert len(await claim(database_url, worker_id, 10)) == 3
    assert await claim(database_url, worker_id, 10) == []
    assert states(db) == {"running": 3, "queued": 7}
    assert scalar(db, "SELECT max(attempt) FROM akadze.jobs WHERE state = 'queued'") == 0
    # Raised, the limit has room again at once.
    app.set_rate_limit("5/h", queue="default")
    assert len(await claim(database_url, worker_id, 10)) == 2
    app.set_rate_limit(None, queue="default")
    assert len(await claim(database_url, worker_id, 10)) == 5


async def test_a_task_limit_holds_back_only_that_tasks_jobs(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    slow, fast = register(app, "slow", rate_limit="2/m"), register(app, "fast")
    for number in range(5):
        slow.enqueue(n=number)
        fast.enqueue(n=number)
    app.set_rate_limit(slow.rate_limit, task="slow")
    worker_id = fake_worker(db, ttl=60)
    rows = await claim(database_url, worker_id, 10)
    assert sorted(row["task"] for row in rows) == ["fast"] * 5 + ["slow"] * 2
    ledger = scalar(db, "SELECT sum(n) FROM akadze.limit_starts WHERE name = 'slow'")
    assert ledger == 2


async def test_a_key_runs_at_most_its_max_and_a_full_key_hides_no_other(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    noop = register(app, "noop")
    for number in range(50):
        noop.configure(concurrency_key="tenant-a", max_concurrency=2).enqueue(n=number)
    noop.configure(concurrency_key="tenant-b").enqueue(n=99)
    noop.enqueue(n=100)
    worker_id = fake_worker(db, ttl=60)
    rows = await claim(database_url, worker_id, 10)
    keys = sorted(str(row["meta"]).count("tenant-a") for row in rows)
    assert len(rows) == 4 and keys == [0, 0, 1, 1]
    assert await claim(database_url, worker_id, 10) == []
    # A finished run gives its key's slot back, with nothing but its own state changing.
    db.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = now()"
               " WHERE id = %s", [rows[0]["id"] if "tenant-a" in rows[0]["meta"]
                                  else rows[1]["id"]])
    assert len(await claim(database_url, worker_id, 10)) == 1


async def test_a_held_limit_lock_holds_up_no_other_queue_nor_task(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    noop = register(app, "noop")
    other = register(app, "other", queue="other")
    limited = register(app, "limited", queue="other")
    noop.enqueue(n=1)
    other.enqueue(n=2)
    limited.enqueue(n=3)
    app.set_rate_limit("100/s", queue="default")
    app.set_rate_limit("100/s", task="limited")
    worker_id = fake_worker(db, ttl=60)
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT 1 FROM akadze.limits FOR UPDATE")
        # The other queue's claim passes the held task limit by (as full for now) ...
        rows = await claim(database_url, worker_id, 10, queue="other")
        assert [row["task"] for row in rows] == ["other"]
    # ... and takes its job once the lock is gone.
    assert [row["task"] for row in await claim(database_url, worker_id, 10, queue="other")] \
        == ["limited"]
    assert len(await claim(database_url, worker_id, 10)) == 1


async def test_the_fair_claim_goes_through_the_limits_too(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    noop = register(app, "noop")
    for number in range(4):
        noop.enqueue(n=number)
    app.set_rate_limit(2, queue="default")
    worker_id = fake_worker(db, ttl=60)
    assert len(await claim(database_url, worker_id, 10, fair=True)) == 2


async def test_a_graceful_stops_hand_back_gives_the_keys_slot_back(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    noop = register(app, "noop")
    for number in range(3):
        noop.configure(concurrency_key="one").enqueue(n=number)
    worker_id = fake_worker(db, ttl=60)
    [row] = await claim(database_url, worker_id, 10)
    assert await claim(database_url, worker_id, 10) == []
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as session:
        returned = await database.return_many(
            session, [(row["id"], row["run_count"], row["claim_token"])])
    assert [back["id"] for back in returned] == [row["id"]]
    again = await claim(database_url, worker_id, 10)
    assert len(again) == 1 and again[0]["attempt"] == 1
