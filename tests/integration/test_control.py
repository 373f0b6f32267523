"""The remote-control tables: expired requests and their replies are pruned, live ones kept;
a reply to a request already pruned is no error."""

from __future__ import annotations

import psycopg

from akadze_core.store import database


async def test_prune_deletes_expired_requests_and_their_replies(database_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as db:
        await db.execute(
            "INSERT INTO akadze.control_requests (id, command, targets, reply, expires_at)"
            " OVERRIDING SYSTEM VALUE VALUES"
            " (1, 'ping', '{1}', true, now() - interval '1 second'),"
            " (2, 'ping', '{1}', true, now() + interval '1 minute')")
        for request_id in (1, 2, 3):  # 3: its request is gone already
            await database.fetch_one_async(db, "control_reply", request_id=request_id,
                                           worker_id=1, worker_name="w", reply='"pong"')
        assert await database.execute_query(db, "control_prune") == 2
        cursor = await db.execute("SELECT id FROM akadze.control_requests")
        assert await cursor.fetchall() == [(2,)]
        cursor = await db.execute("SELECT request_id FROM akadze.control_replies")
        assert await cursor.fetchall() == [(2,)]
        # A second answer from the same worker is ignored, not an error.
        assert await database.fetch_one_async(db, "control_reply", request_id=2, worker_id=1,
                                              worker_name="w", reply=None) is None
