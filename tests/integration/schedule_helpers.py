"""What the schedule tests read and move in the database: its clock, the jobs a schedule
enqueued, a schedule's row, and its last tick moved back as if the workers had been down."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from akadze_core import App, Scheduler


async def check(app: App, url: str, scheduler: Scheduler | None = None) -> float:
    """One scheduler pass, as a worker's round runs it, on its own connection."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as connection:
        return await (scheduler or Scheduler(app)).enqueue_due(connection)


def db_now(db: psycopg.Connection) -> datetime:
    row = db.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]


def jobs(db: psycopg.Connection, schedule: str | None = None) -> list[dict[str, Any]]:
    """Every job in id order, or only those the named schedule enqueued."""
    with db.cursor(row_factory=dict_row) as cursor:
        return cursor.execute(
            "SELECT * FROM akadze.jobs WHERE %(name)s::text IS NULL OR meta->>'schedule' = "
            "%(name)s ORDER BY id", {"name": schedule}).fetchall()


def schedule_row(db: psycopg.Connection, name: str) -> dict[str, Any] | None:
    with db.cursor(row_factory=dict_row) as cursor:
        return cursor.execute("SELECT * FROM akadze.schedules WHERE name = %s",
                              (name,)).fetchone()


def rewind(db: psycopg.Connection, name: str, by: timedelta) -> None:
    """Move the schedule's last tick back, as if no worker had run for ``by``."""
    cursor = db.execute("UPDATE akadze.schedules SET last_tick = last_tick - %s WHERE name = %s",
                        (by, name))
    assert cursor.rowcount == 1
