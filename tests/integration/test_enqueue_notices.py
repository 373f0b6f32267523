"""Insert notices limited per process (akadze_core.store.notices): a single enqueue right
after another of the same queue and priority skips its NOTIFY, and the worker's follow-up
claim still picks its job up at once."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg

from akadze_core import App, Worker
from akadze_core.store.floors import parse_notice
from akadze_core.store.notices import FOLLOW_UP, WINDOW, NoticeLimiter
from tests.integration.lease_support import listening, running, scalar, wait_until


def _heard(listener: psycopg.Connection, marker: str) -> list[tuple[str, int | None]]:
    """(queue, priority) of each notification until ``marker``'s queue is heard."""
    found: list[tuple[str, int | None]] = []
    for notify in listener.notifies(timeout=5):
        queue, key = parse_notice(notify.payload)
        if queue == marker:
            return found
        found.append((queue, None if key is None else key[0]))
    raise AssertionError(f"the marker notification {marker!r} never arrived")


def _task(app: App) -> Any:
    @app.task("notices.send", queue="a")
    async def send(**kwargs: Any) -> None:
        return None

    return send


async def test_an_enqueue_right_after_another_skips_its_notice_and_the_others_keep_theirs(
        app: App, db: psycopg.Connection, database_url: str) -> None:
    send = _task(app)
    app.connections.notices.window = 60.0  # a slow machine must not close it mid-test
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN akadze_jobs")
        send.enqueue()
        send.enqueue()  # skipped
        await send.enqueue_async()  # skipped too: the same limiter
        send.configure(priority=1).enqueue()  # another priority
        send.configure(priority=1).enqueue()  # skipped
        send.configure(queue="b").enqueue()  # another queue
        # Their keys may lie below the heard one: an explicit eta, a negative countdown.
        send.configure(at=datetime.now(timezone.utc) - timedelta(minutes=1)).enqueue()
        send.configure(delay=-5).enqueue()
        send.configure(unique_key="k").enqueue()  # the conflict-handling insert
        with psycopg.connect(database_url) as session:  # the caller's transaction
            send.using(session=session).enqueue()
            session.commit()
        send.configure(delay=60).enqueue()  # not due: never a notice
        send.configure(queue="marker").enqueue()
        assert _heard(listener, "marker") == [("a", 0), ("a", 1), ("b", 0), ("a", 0),
                                              ("a", 0), ("a", 0), ("a", 0)]
    assert scalar(db, "SELECT count(*) FROM akadze.jobs") == 12


async def test_a_rolled_back_enqueue_does_not_quiet_the_next_one(
        app: App, database_url: str) -> None:
    send = _task(app)
    app.connections.notices.window = 60.0
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN akadze_jobs")
        with psycopg.connect(database_url) as session:
            send.using(session=session).enqueue()
            session.rollback()
        async with await psycopg.AsyncConnection.connect(database_url) as async_session:
            await send.using(session=async_session).enqueue_async()
            await async_session.rollback()
        send.enqueue()  # the first notice this process commits
        send.enqueue()
        send.configure(queue="marker").enqueue()
        assert _heard(listener, "marker") == [("a", 0)]


class _LateLimiter(NoticeLimiter):
    """A limiter that finds every quiet insert committed after its window."""

    def quiet(self, opened: float, started: float, ended: float) -> bool:
        super().quiet(opened, started, ended)
        return False


async def test_a_quiet_enqueue_that_commits_too_late_sends_its_row_notice_after_all(
        app: App, db: psycopg.Connection, database_url: str) -> None:
    send = _task(app)
    app.connections.notices = _LateLimiter(window=60.0)
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN akadze_jobs")
        send.enqueue()  # notifies with the insert
        send.enqueue()  # quiet, then late: notifies after its commit
        await send.enqueue_async()  # the same, async
        send.configure(queue="marker").enqueue()
        payloads = []
        for notify in listener.notifies(timeout=5):
            if parse_notice(notify.payload)[0] == "marker":
                break
            payloads.append(notify.payload)
    # Each the payload its own insert would have sent: the row's queue, priority and due time.
    rows = db.execute("SELECT akadze.job_notice(queue, priority, scheduled_at) FROM akadze.jobs"
                      " WHERE queue = 'a' ORDER BY id").fetchall()
    assert payloads == [row[0] for row in rows]
    assert len(payloads) == 3


async def test_a_job_enqueued_right_after_another_is_picked_up_at_once_by_an_idle_worker(
        app: App, db: psycopg.Connection, database_url: str) -> None:
    started: dict[int, float] = {}

    @app.task("notices.mark")
    async def mark(n: int) -> None:
        started[n] = time.monotonic()

    # Nothing but a notification or the follow-up claim can wake this worker in time.
    worker = Worker(app, poll_interval=30, heartbeat_interval=10, heartbeat_ttl=30,
                    prune_interval=3600, schedules=False)
    # The window and the follow-up ten times their defaults, kept as far apart: the second
    # insert waits for the first's claim, which a loaded machine can take longer than the
    # default window to make.
    app.connections.notices.window = 10 * WINDOW
    worker._producer.followups.delay = 10 * WINDOW + (FOLLOW_UP - WINDOW)
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN akadze_jobs")
        async with running(worker):
            await wait_until(lambda: listening(db)
                             and scalar(db, "SELECT count(*) FROM akadze.workers") == 1)
            await asyncio.sleep(0.3)  # the first round is over: the worker is idle
            for attempt in range(20):  # a loaded machine may still miss the window
                first, second = 2 * attempt, 2 * attempt + 1
                mark.enqueue(n=first)
                # Claimed before the second is inserted: only the follow-up claim can find
                # the second then.
                await wait_until(lambda n=first: n in started, timeout=3)
                mark.enqueue(n=second)
                enqueued = time.monotonic()
                mark.configure(queue="marker").enqueue(n=-1)
                heard = _heard(listener, "marker")
                await wait_until(lambda n=second: n in started, timeout=3)
                if len(heard) == 1:  # the second's notice was skipped
                    break
                await asyncio.sleep(app.connections.notices.window + 0.05)
            else:
                raise AssertionError("no second enqueue ever fell within the window")
            # Picked up by the follow-up claim, not at the next poll (30 s away).
            assert started[second] - enqueued < 0.5
