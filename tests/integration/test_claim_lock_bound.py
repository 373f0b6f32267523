"""The claims bound their own lock waits: under ``database.lock_timeout`` a claim, plain or
fair, gives up on a locked jobs table after the bound, sent as one statement (no pipeline,
nothing left set on the session)."""

from __future__ import annotations

import time

import psycopg
import pytest

from akadze_core.store import database


@pytest.mark.parametrize("fair", [False, True])
async def test_a_claim_gives_up_on_a_locked_table_after_its_bound(
    database_url: str, db: psycopg.Connection, fair: bool
) -> None:
    db.execute("INSERT INTO akadze.jobs (task, queue, args) VALUES ('t', 'q', '{}')")
    connection = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    locker = psycopg.connect(database_url)  # not autocommit: the lock lasts until rollback
    try:
        locker.execute("LOCK TABLE akadze.jobs IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        with database.lock_timeout(0.2), pytest.raises(psycopg.errors.LockNotAvailable):
            await database.claim_jobs(connection, "q", 10, 1, fair)
        assert time.monotonic() - started < 2.0
        locker.rollback()
        # Nothing stayed set on the session, and the claim works once the lock is gone.
        row = await (await connection.execute("SHOW lock_timeout")).fetchone()
        assert row is not None and row[0] == "0"
        rows = await database.claim_jobs(connection, "q", 10, 1, fair)
        assert [row["task"] for row in rows] == ["t"]
    finally:
        locker.close()
        await connection.close()
