"""Cancellation, expiry and requeue (seed 003), on real Postgres with a real worker.

- ``request_cancel`` marks a queued or running job in the caller's transaction; for anything
  else (finished, unknown id) it does nothing and returns False.
- Cancelled or past ``expires_at`` before it starts → cancelled without running.
- A running body is not interrupted (0.6.0 rules): returned a value → succeeded with it;
  raised anything (Retry and Snooze included) or returned non-JSON → cancelled, no attempt
  spent. Expiry during the run behaves the same.
- ``requeue``: failed → queued in the caller's transaction; attempt, errors and args kept,
  max_attempts raised when none is left.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from akadze_core import (
    App,
    Cancel,
    Fail,
    Retry,
    Snooze,
    current,
    request_cancel,
    request_cancel_sync,
    requeue,
    requeue_sync,
)
from tests.helpers import job
from tests.integration.outcome_helpers import (
    fast_worker,
    ran,
    run_until,
    running,
    wait_event,
    wait_until,
)

MISSING_ID = 987_654_321


@asynccontextmanager
async def connect(url: str) -> AsyncIterator[psycopg.AsyncConnection]:
    """An async autocommit connection: each ``transaction()`` block is the caller's
    transaction."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as connection:
        yield connection


def db_now(db: psycopg.Connection, offset: str = "0 seconds") -> datetime:
    """The database clock plus ``offset`` (an interval literal)."""
    row = db.execute("SELECT now() + %s::interval", (offset,)).fetchone()
    assert row is not None
    return row[0]


def not_running(db: psycopg.Connection, job_id: int) -> bool:
    row = job(db, job_id)
    return row["run_count"] > 0 and row["state"] != "running"


# --- request_cancel before the job starts ----------------------------------------------------

async def test_cancel_of_a_queued_job_cancels_it_without_running(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    ran_with: list[str] = []

    @app.task("work")
    async def work(name: str) -> str:
        ran_with.append(name)
        return name

    target = work.enqueue(name="target")
    sentinel = work.enqueue(name="sentinel")
    async with connect(database_url) as connection:
        assert await request_cancel(connection, target) is True
    row = job(db, target)
    assert (row["state"], row["cancel_requested"]) == ("cancelled", True)
    assert row["finished_at"] is not None
    # The worker passes it by: the sentinel enqueued after it runs, the target never does.
    await run_until(app, lambda: job(db, sentinel)["state"] == "succeeded")
    row = job(db, target)
    assert (row["state"], row["attempt"], row["run_count"]) == ("cancelled", 0, 0)
    assert ran_with == ["sentinel"]


async def test_cancel_joins_the_callers_transaction(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    @app.task("work")
    async def work() -> None: ...

    job_id = work.enqueue()
    async with connect(database_url) as connection:
        async with connection.transaction():
            assert await request_cancel(connection, job_id) is True
            # Not visible outside the transaction until it commits.
            assert job(db, job_id)["state"] == "queued"
            raise psycopg.Rollback()
        row = job(db, job_id)
        assert (row["state"], row["cancel_requested"]) == ("queued", False)

        async with connection.transaction():
            assert await request_cancel(connection, job_id) is True
        assert job(db, job_id)["state"] == "cancelled"


async def test_cancel_of_a_finished_or_unknown_job_returns_false(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    @app.task("ok")
    async def ok() -> str:
        return "done"

    @app.task("bad")
    async def bad() -> None:
        raise Fail("no")

    succeeded, failed, cancelled = ok.enqueue(), bad.enqueue(), ok.enqueue()
    async with connect(database_url) as connection:
        assert await request_cancel(connection, cancelled) is True
        await run_until(app, lambda: not_running(db, succeeded) and not_running(db, failed),
                        slots=2)
        before = {i: job(db, i) for i in (succeeded, failed, cancelled)}
        assert [before[i]["state"] for i in (succeeded, failed, cancelled)] == [
            "succeeded", "failed", "cancelled"]
        for job_id in (succeeded, failed, cancelled, MISSING_ID):
            assert await request_cancel(connection, job_id) is False
    with psycopg.connect(database_url, autocommit=True) as sync_connection:
        for job_id in (succeeded, failed, cancelled, MISSING_ID):
            assert request_cancel_sync(sync_connection, job_id) is False
    for job_id, row in before.items():
        assert job(db, job_id) == row, "a cancel of an inactive job changes nothing"


async def test_expired_before_start_is_cancelled_without_running(
    app: App, db: psycopg.Connection
) -> None:
    ran_with: list[str] = []

    @app.task("work")
    async def work(name: str) -> None:
        ran_with.append(name)

    expired = work.configure(expires_at=db_now(db, "-1 second")).enqueue(name="expired")
    # Due in 0.3 s but expires after 0.1 s: it expires while it waits.
    later = work.configure(delay=0.3, expires_at=db_now(db, "0.1 seconds")).enqueue(
        name="later")
    sentinel = work.enqueue(name="sentinel")
    await run_until(app, lambda: job(db, later)["state"] != "queued"
                    and job(db, sentinel)["state"] == "succeeded")
    for job_id in (expired, later):
        row = job(db, job_id)
        assert (row["state"], row["attempt"], row["run_count"]) == ("cancelled", 0, 0)
        assert row["finished_at"] is not None
    assert ran_with == ["sentinel"]


# --- cancel or expiry while the body runs ----------------------------------------------------

MODES: dict[str, Any] = {
    "exception": RuntimeError("failed after the cancel"),
    "retry": Retry(timedelta(seconds=5)),
    "snooze": Snooze(timedelta(seconds=5)),
    "fail": Fail("failed after the cancel"),
    "cancel": Cancel(),
}


def finish(mode: str) -> Any:
    """What the body does once released: return a value, return non-JSON, or raise."""
    if mode == "value":
        return {"done": True}
    if mode == "non_json":
        return datetime(2024, 1, 1)
    raise MODES[mode]


@pytest.mark.parametrize(
    ("mode", "state"),
    [("value", "succeeded"), ("non_json", "cancelled"), ("exception", "cancelled"),
     ("retry", "cancelled"), ("snooze", "cancelled"), ("fail", "cancelled"),
     ("cancel", "cancelled")],
)
async def test_cancel_while_running_follows_the_0_6_rules(
    app: App, db: psycopg.Connection, database_url: str, mode: str, state: str
) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    # max_attempts=1: without the cancel, every raising mode would end failed (or queued).
    @app.task("long", max_attempts=1)
    async def long_task() -> Any:
        started.set()
        await release.wait()
        return finish(mode)

    job_id = long_task.enqueue()
    async with running(fast_worker(app)):
        await wait_event(started, what="the body to start")
        async with connect(database_url) as connection:
            assert await request_cancel(connection, job_id) is True
        row = job(db, job_id)
        assert (row["state"], row["cancel_requested"]) == ("running", True), \
            "a running body is not interrupted"
        release.set()
        await wait_until(lambda: job(db, job_id)["state"] != "running", what="the outcome")
    row = job(db, job_id)
    assert row["state"] == state
    assert row["run_count"] == 1
    if state == "succeeded":
        assert row["result"] == {"done": True}
        assert row["attempt"] == 1
    else:
        assert row["attempt"] == 0, "a cancelled run does not spend its attempt"
        assert row["result"] is None
    assert row["finished_at"] is not None


async def test_cancel_while_a_sync_body_runs(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    started, release = threading.Event(), threading.Event()

    @app.task("long_sync")
    def long_sync(fail: bool) -> str:
        started.set()
        release.wait(10)
        if fail:
            raise RuntimeError("after the cancel")
        return "side effects happened"

    raising, returning = long_sync.enqueue(fail=True), long_sync.enqueue(fail=False)
    try:
        async with running(fast_worker(app, slots=2)):
            await wait_until(lambda: job(db, raising)["state"] == "running"
                             and job(db, returning)["state"] == "running", what="both runs")
            async with connect(database_url) as connection, connection.transaction():
                assert await request_cancel(connection, raising) is True
                assert await request_cancel(connection, returning) is True
            release.set()
            await wait_until(lambda: not_running(db, raising) and not_running(db, returning),
                             what="the outcomes")
    finally:
        release.set()
    row = job(db, raising)
    assert (row["state"], row["attempt"]) == ("cancelled", 0)
    row = job(db, returning)
    assert (row["state"], row["attempt"], row["result"]) == (
        "succeeded", 1, "side effects happened")


async def test_cancel_on_a_later_attempt_gives_back_only_that_attempt(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    @app.task("twice")
    async def twice() -> None:
        if current().run_count == 1:
            raise RuntimeError("first run")
        started.set()
        await release.wait()
        raise RuntimeError("second run, after the cancel")

    job_id = twice.enqueue()
    async with running(fast_worker(app)):
        await wait_until(lambda: job(db, job_id)["attempt"] == 1
                         and job(db, job_id)["state"] == "queued", what="the first failure")
        db.execute("UPDATE akadze.jobs SET scheduled_at = now() WHERE id = %s", (job_id,))
        await wait_event(started, what="the second run")
        async with connect(database_url) as connection:
            assert await request_cancel(connection, job_id) is True
        release.set()
        await wait_until(lambda: job(db, job_id)["state"] == "cancelled", what="the cancel")
    row = job(db, job_id)
    assert (row["attempt"], row["run_count"]) == (1, 2)


@pytest.mark.parametrize(("fail", "state", "attempt"), [(True, "cancelled", 0),
                                                         (False, "succeeded", 1)])
async def test_expiry_while_running_behaves_like_cancel(
    app: App, db: psycopg.Connection, fail: bool, state: str, attempt: int
) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    @app.task("expiring")
    async def expiring() -> str:
        started.set()
        await release.wait()
        if fail:
            raise Retry(1)
        return "made it"

    # An expiry far enough off to be claimed first however slow the worker's start (0.3 s
    # was not, on a loaded machine: the job expired unstarted); once the body runs, the
    # expiry is brought to now, as if its time had come meanwhile.
    job_id = expiring.configure(expires_at=db_now(db, "1 hour")).enqueue()
    async with running(fast_worker(app)):
        await wait_event(started, what="the body to start")
        db.execute("UPDATE akadze.jobs SET expires_at = now() WHERE id = %s", (job_id,))
        await wait_until(lambda: db.execute(
            "SELECT expires_at <= now() FROM akadze.jobs WHERE id = %s",
            (job_id,)).fetchone() == (True,), what="the expiry")
        assert job(db, job_id)["state"] == "running", "expiry does not interrupt a body"
        release.set()
        await wait_until(lambda: job(db, job_id)["state"] != "running", what="the outcome")
    row = job(db, job_id)
    assert (row["state"], row["attempt"]) == (state, attempt)
    assert row["result"] == (None if fail else "made it")


# --- requeue ---------------------------------------------------------------------------------

async def test_requeue_moves_a_failed_job_back_in_the_callers_transaction(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    seen: list[tuple[int, dict[str, Any]]] = []

    @app.task("fragile", max_attempts=1)
    async def fragile(order: int, tags: list[str]) -> str:
        seen.append((current().attempt, dict(current().args)))
        if current().run_count == 1:
            raise RuntimeError("vendor down")
        return "done"

    job_id = fragile.enqueue(order=7, tags=["a", "b"])
    await run_until(app, ran(db, job_id))
    failed = job(db, job_id)
    assert (failed["state"], failed["attempt"], failed["max_attempts"]) == ("failed", 1, 1)

    async with connect(database_url) as connection:
        async with connection.transaction():
            assert await requeue(connection, job_id) is True
            raise psycopg.Rollback()
        assert job(db, job_id) == failed, "a rolled-back requeue changes nothing"

        async with connection.transaction():
            assert await requeue(connection, job_id) is True
            assert job(db, job_id)["state"] == "failed", "not visible before the commit"
    row = job(db, job_id)
    assert row["state"] == "queued"
    assert row["attempt"] == 1, "attempt kept"
    assert row["errors"] == failed["errors"] and len(row["errors"]) == 1, "errors kept"
    assert row["args"] == {"order": 7, "tags": ["a", "b"]}, "args kept"
    assert row["max_attempts"] == 2, "raised so one more attempt is possible"
    assert row["finished_at"] is None
    assert db.execute("SELECT scheduled_at <= now() FROM akadze.jobs WHERE id = %s",
                      (job_id,)).fetchone() == (True,)

    await run_until(app, lambda: job(db, job_id)["state"] == "succeeded")
    row = job(db, job_id)
    assert (row["attempt"], row["run_count"], row["result"]) == (2, 2, "done")
    assert len(row["errors"]) == 1
    assert seen == [(1, {"order": 7, "tags": ["a", "b"]}), (2, {"order": 7, "tags": ["a", "b"]})]


async def test_requeue_keeps_max_attempts_when_attempts_are_left(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    @app.task("rejected")
    async def rejected() -> None:
        raise Fail("rejected")

    job_id = rejected.enqueue()
    await run_until(app, ran(db, job_id))
    assert (job(db, job_id)["state"], job(db, job_id)["attempt"]) == ("failed", 1)
    with psycopg.connect(database_url) as connection:  # sync twin, committed on exit
        assert requeue_sync(connection, job_id) is True
    row = job(db, job_id)
    assert (row["state"], row["attempt"], row["max_attempts"]) == ("queued", 1, 3)


async def test_requeue_of_a_job_that_is_not_failed_returns_false(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    @app.task("ok")
    async def ok() -> str:
        return "fine"

    succeeded, queued, cancelled = ok.enqueue(), ok.enqueue(), ok.enqueue()
    async with connect(database_url) as connection:
        assert await request_cancel(connection, cancelled) is True
        await run_until(app, lambda: job(db, succeeded)["state"] == "succeeded")
        queued = ok.configure(delay=3600).enqueue()
        before = {i: job(db, i) for i in (succeeded, queued, cancelled)}
        for job_id in (succeeded, queued, cancelled, MISSING_ID):
            assert await requeue(connection, job_id) is False
    with psycopg.connect(database_url, autocommit=True) as sync_connection:
        for job_id in (succeeded, queued, cancelled, MISSING_ID):
            assert requeue_sync(sync_connection, job_id) is False
    for job_id, row in before.items():
        assert job(db, job_id) == row


# --- cancel or expiry while a claimed-ahead job waits for a body slot ------------------------

@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
@pytest.mark.parametrize("how", ["cancel", "expiry"])
async def test_a_job_claimed_ahead_is_cancelled_without_running_when_cancelled_or_expired(
    app: App, db: psycopg.Connection, database_url: str, how: str, sync: bool
) -> None:
    # concurrency=1 with 2 slots: the second job is claimed while the first holds the only
    # body slot, and waits in the window (Celery's prefetch). Seed 003: cancelled or expired
    # before it starts -> cancelled, never run, no attempt spent.
    release = threading.Event()
    started: list[str] = []

    if sync:
        @app.task("step")
        def step(name: str) -> None:
            started.append(name)
            if name == "first":
                release.wait(10)
    else:
        @app.task("step")
        async def step(name: str) -> None:
            started.append(name)
            while name == "first" and not release.is_set():
                await asyncio.sleep(0.01)

    first = step.enqueue(name="first")
    # No heartbeat during the test: the NOTIFY (cancel) or the timer (expiry) must do it.
    worker = fast_worker(app, slots=2, concurrency=1, heartbeat_interval=10, heartbeat_ttl=30)
    async with running(worker):
        await wait_until(lambda: started == ["first"])
        waiting = (step.configure(expires_at=db_now(db, "0.4 seconds")) if how == "expiry"
                   else step).enqueue(name="second")
        await wait_until(lambda: job(db, waiting)["state"] != "queued")
        assert job(db, waiting)["state"] == "running"  # claimed ahead, waiting for the slot
        if how == "cancel":
            async with connect(database_url) as connection:
                assert await request_cancel(connection, waiting) is True
        else:
            await wait_until(lambda: bool(db.execute(
                "SELECT expires_at <= now() FROM akadze.jobs WHERE id = %s",
                (waiting,)).fetchone()[0]))
        await asyncio.sleep(0.1)  # the worker hears of it while the first still runs
        release.set()
        await wait_until(lambda: job(db, first)["state"] == "succeeded"
                         and job(db, waiting)["state"] != "running")
    row = job(db, waiting)
    assert started == ["first"], "the job claimed ahead must not run"
    assert (row["state"], row["attempt"], row["errors"], row["result"]) == (
        "cancelled", 0, [], None), row
    assert row["worker_id"] is None and row["finished_at"] is not None


async def test_a_cancel_heard_of_without_its_notification_still_stops_a_waiting_job(
    app: App, db: psycopg.Connection
) -> None:
    # The flag set behind the worker's back (as if the NOTIFY was lost with the LISTEN
    # connection): the check every heartbeat finds it before the slot frees.
    release = threading.Event()
    started: list[str] = []

    @app.task("step")
    async def step(name: str) -> None:
        started.append(name)
        while name == "first" and not release.is_set():
            await asyncio.sleep(0.01)

    first = step.enqueue(name="first")
    async with running(fast_worker(app, slots=2, concurrency=1)):
        await wait_until(lambda: started == ["first"])
        waiting = step.enqueue(name="second")
        await wait_until(lambda: job(db, waiting)["state"] == "running")
        db.execute("UPDATE akadze.jobs SET cancel_requested = true WHERE id = %s", (waiting,))
        await wait_until(lambda: job(db, waiting)["state"] != "running", timeout=3)
        release.set()
        await wait_until(lambda: job(db, first)["state"] == "succeeded")
    row = job(db, waiting)
    assert started == ["first"]
    assert (row["state"], row["attempt"], row["errors"]) == ("cancelled", 0, []), row


async def test_an_unstarted_run_neither_cancelled_nor_expired_goes_back_unspent(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    # The worker's expiry timer runs on its own clock; only the database's decides. Dropped
    # before expiry on the database clock, the job is queued again, due now, attempt unspent.
    from akadze_core.model.outcomes import UNSTARTED, Outcome
    from akadze_core.store import database
    from tests.integration.lease_support import claim, fake_worker

    @app.task("later")
    async def later() -> None: ...

    job_id = later.configure(expires_at=db_now(db, "1 hour")).enqueue()
    [claimed] = await claim(database_url, fake_worker(db, ttl=60), 1)
    async with connect(database_url) as connection:
        rows = await database.complete_many(
            connection, [Outcome(job_id, claimed["run_count"], UNSTARTED,
                                 claim_token=claimed["claim_token"])])
    assert [row["state"] for row in rows] == ["queued"]
    row = job(db, job_id)
    assert (row["state"], row["attempt"], row["errors"], row["worker_id"]) == (
        "queued", 0, [], None), row
    assert row["scheduled_at"] <= db_now(db)


@pytest.mark.parametrize("kind", ["async", "sync"])
@pytest.mark.parametrize("terminate", [False, True])
async def test_a_cancel_heard_while_its_claim_is_on_its_way_keeps_the_job_from_running(
    app: App, db: psycopg.Connection, kind: str, terminate: bool
) -> None:
    """A cancel (or terminate) asked just after the claim committed waits for the claim's
    row lock, so it finds the job running, and its notice may come in before the worker
    has read the claim's answer: the worker does not hold the job yet. The job must still
    end cancelled without running (it ran, and the heartbeat's check came too late)."""
    import signal

    ran: list[int] = []
    if kind == "async":
        @app.task("victim")
        async def victim() -> None:
            ran.append(1)
    else:
        @app.task("victim")
        def victim() -> None:
            ran.append(1)

    worker = fast_worker(app)
    target = victim.enqueue()
    real_start_many = worker._runs.start_many

    def start_many(rows: list[dict[str, Any]]) -> None:
        if any(row["id"] == target for row in rows):
            # Claimed; the cancel's notice is heard before its answer.
            assert request_cancel_sync(db, target, terminate=terminate)
            if terminate:
                worker._runs.terminate(target, signal.SIGTERM)
            else:
                worker._runs.cancelled(target)
        real_start_many(rows)

    worker._runs.start_many = start_many  # type: ignore[method-assign]
    async with running(worker):
        await wait_until(lambda: job(db, target)["state"] == "cancelled")
    assert ran == []
    row = job(db, target)
    assert (row["attempt"], row["errors"], row["worker_id"]) == (0, [], None), row


@pytest.mark.parametrize("how", ["cancel", "stop"])
async def test_a_run_in_a_task_waits_from_its_claim_before_its_task_takes_a_step(
    app: App, db: psycopg.Connection, how: str
) -> None:
    """A run claimed ahead whose body runs in a task waits from its claim on, not from its
    task's first step: the worker says so at once, a cancel heard before that step drops
    it unstarted, and a warm stop returns it unspent."""
    started: list[str] = []
    release = asyncio.Event()
    step = _step(app, started, release)
    worker = fast_worker(app, slots=1, shutdown_timeout=10)
    second: list[int] = []
    seen: list[dict[int, bool]] = []
    real_start_many = worker._runs.start_many

    def start_many(rows: list[dict[str, Any]]) -> None:
        real_start_many(rows)
        for row in rows:
            if row["id"] in second:  # its task created, its first step not taken
                seen.append(worker.running())
                if how == "cancel":
                    assert request_cancel_sync(db, row["id"])
                    worker._runs.cancelled(row["id"])
                else:
                    worker.request_stop()

    worker._runs.start_many = start_many  # type: ignore[method-assign]
    runner = asyncio.create_task(worker.run())
    try:
        await _warm(worker, step, db)
        first, later = step.enqueue_many([{"name": "first"}, {"name": "second"}])
        second.append(later)
        await wait_until(lambda: bool(seen))
        assert seen[0].get(later) is False  # claimed ahead: not started
        await wait_until(lambda: started[-1:] == ["first"])
        await asyncio.sleep(0.2)
        release.set()
        if how == "cancel":
            await wait_until(lambda: job(db, first)["state"] == "succeeded")
            worker.request_stop()
        assert await asyncio.wait_for(runner, 10) == 0
    finally:
        release.set()
        await _stop(worker, runner)
    assert "second" not in started
    assert job(db, first)["state"] == "succeeded"
    row = job(db, later)
    expected = "cancelled" if how == "cancel" else "queued"
    assert (row["state"], row["attempt"], row["errors"], row["worker_id"]) == (
        expected, 0, [], None), row


@pytest.mark.parametrize("how", ["run", "cancel"])
async def test_an_async_run_handed_a_slot_waits_until_its_task_takes_a_step(
    app: App, db: psycopg.Connection, how: str
) -> None:
    """An async run waiting at the body gate gets its task when it is handed a slot: until
    that task's first step it still waits (a cancel drops it unstarted and the slot passes
    on); run, its body has a task of its own and its context."""
    release = threading.Event()
    started: list[str] = []
    seen: list[tuple[bool, int]] = []

    @app.task("step")
    async def step(name: str) -> None:
        started.append(name)
        seen.append((asyncio.current_task() is not None, current().job.id))
        while name == "first" and not release.is_set():
            await asyncio.sleep(0.01)

    first = step.enqueue(name="first")
    worker = fast_worker(app, slots=2, concurrency=1, shutdown_timeout=10)
    waiting: list[int] = []
    handed: list[dict[int, bool]] = []
    real_handed = worker._runs._task_handed

    def task_handed(run: Any, slot: bool) -> None:
        real_handed(run, slot)
        if slot and run.job_id in waiting:  # its task made, its first step not taken
            handed.append(worker.running())
            if how == "cancel":
                assert request_cancel_sync(db, run.job_id)
                worker._runs.cancelled(run.job_id)

    worker._runs._task_handed = task_handed  # type: ignore[method-assign]
    runner = asyncio.create_task(worker.run())
    try:
        await wait_until(lambda: started == ["first"])
        second = step.enqueue(name="second")
        waiting.append(second)
        await wait_until(lambda: second in worker.running())
        assert worker.running() == {first: True, second: False}
        release.set()
        await wait_until(lambda: bool(handed))
        assert handed[0].get(second) is False  # handed a slot: not started yet
        await wait_until(lambda: job(db, first)["state"] == "succeeded"
                         and job(db, second)["state"] != "running")
        worker.request_stop()
        assert await asyncio.wait_for(runner, 10) == 0
    finally:
        release.set()
        if not runner.done():
            worker.request_stop()
            await asyncio.wait_for(runner, 15)
    row = job(db, second)
    if how == "run":
        assert started == ["first", "second"]
        assert seen[-1] == (True, second)
        assert row["state"] == "succeeded", row
    else:
        assert started == ["first"], "the run handed a slot must not start"
        assert (row["state"], row["attempt"], row["errors"], row["worker_id"]) == (
            "cancelled", 0, [], None), row
    assert worker._runs.bodies is not None and worker._runs.bodies.try_enter()  # slot back


_CLAIMER = contextvars.ContextVar("claimer", default="unset")
_OWN = contextvars.ContextVar("own", default=0)


@pytest.mark.parametrize("concurrency", [None, 1])
async def test_each_async_run_has_a_task_named_for_its_job_in_its_own_copy_of_the_claimers_context(
    app: App, db: psycopg.Connection, concurrency: int | None
) -> None:
    """An async body runs in a task of its own named ``job-<id>``, in a copy of the claimer's
    context variables made at its claim: it sees what the claimer set, and what it sets
    stays its own. Whether it starts at its claim or waits for a slot at the gate first
    (claimed ahead of ``concurrency`` 1)."""
    seen: list[tuple[int, str, str, int]] = []
    release = asyncio.Event()

    @app.task("context_probe")
    async def probe(number: int) -> None:
        task = asyncio.current_task()
        assert task is not None
        seen.append((current().job.id, task.get_name(), _CLAIMER.get(), _OWN.get()))
        _OWN.set(number + 1)
        if number == 0:
            await release.wait()

    ids = probe.enqueue_many([{"number": number} for number in range(4)])
    worker = fast_worker(app, slots=4, concurrency=concurrency, shutdown_timeout=10)
    token = _CLAIMER.set("the worker's")
    try:
        runner = asyncio.create_task(worker.run())
    finally:
        _CLAIMER.reset(token)
    try:
        # The first body has started (its task took its first step: a task made but not
        # yet stepped still reads as waiting), and the others are held.
        await wait_until(lambda: (len(seen) >= 1
                                  and all(job_id in worker.running() for job_id in ids))
                         or len(seen) == 4)
        if concurrency == 1:
            assert worker.running() == {ids[0]: True, ids[1]: False, ids[2]: False,
                                        ids[3]: False}  # waiting at the gate, no task yet
        release.set()
        await wait_until(lambda: all(job(db, job_id)["state"] == "succeeded" for job_id in ids))
        worker.request_stop()
        assert await asyncio.wait_for(runner, 10) == 0
    finally:
        release.set()
        await _stop(worker, runner)
    assert sorted(seen) == [(job_id, f"job-{job_id}", "the worker's", 0) for job_id in ids]


async def test_a_warm_stop_returns_a_sync_run_waiting_at_the_gate_and_waits_for_the_running_one(
    app: App, db: psycopg.Connection
) -> None:
    """Sync bodies at ``concurrency=1`` run without a task per job: stopping returns the run
    claimed ahead (waiting for the body slot) unspent at once, and the running body's
    outcome is still written when it ends within the shutdown timeout."""
    release = threading.Event()
    started: list[str] = []

    @app.task("step")
    def step(name: str) -> str:
        started.append(name)
        if name == "first":
            release.wait(10)
        return name

    first = step.enqueue(name="first")
    worker = fast_worker(app, slots=2, concurrency=1, shutdown_timeout=10)
    runner = asyncio.create_task(worker.run())
    try:
        await wait_until(lambda: started == ["first"])
        waiting = step.enqueue(name="second")
        await wait_until(lambda: job(db, waiting)["state"] == "running")
        # The claim commits before the worker reads its answer: wait for the worker too.
        await wait_until(lambda: waiting in worker.running())
        assert worker.running() == {first: True, waiting: False}
        worker.request_stop()
        await asyncio.sleep(0.2)
        assert not runner.done()  # waits for the running body
        release.set()
        assert await asyncio.wait_for(runner, 10) == 0
    finally:
        release.set()
        await _stop(worker, runner)
    assert started == ["first"], "the run claimed ahead must not start while stopping"
    assert (job(db, first)["state"], job(db, first)["result"]) == ("succeeded", "first")
    row = job(db, waiting)
    assert (row["state"], row["attempt"], row["errors"], row["worker_id"]) == (
        "queued", 0, [], None), row


async def _stop(worker: Any, runner: asyncio.Task[int]) -> None:
    """Stop ``worker`` if its ``runner`` still runs, and wait for it to end."""
    if not runner.done():
        worker.request_stop()
        await asyncio.wait_for(runner, 15)


# --- the core worker's own claim ahead (no process pool, no concurrency limit) ----------------

def _step(app: App, started: list[str], release: asyncio.Event) -> Any:
    """A task whose run named "first" blocks until ``release``; the others end at once."""

    @app.task("step")
    async def step(name: str) -> None:
        started.append(name)
        while name == "first" and not release.is_set():
            await asyncio.sleep(0.01)

    return step


async def _warm(worker: Any, step: Any, db: psycopg.Connection) -> None:
    """Short runs one after another until the worker claims ahead (its last run ended
    within a short run's time of its claim, which a loaded machine may take a few to do)."""
    for i in range(100):
        warm = step.enqueue(name=f"warm{i}")
        await wait_until(lambda warm=warm: job(db, warm)["state"] == "succeeded")
        if worker._runs.ahead(1):
            return
    raise AssertionError("no run of a no-op ended within a short run's time")


@pytest.mark.parametrize("how", ["run", "cancel", "stop", "cap"])
async def test_a_worker_of_short_runs_claims_ahead_and_holds_its_bodies_to_its_slots(
    app: App, db: psycopg.Connection, database_url: str, how: str
) -> None:
    """After a streak of short runs, a worker without processes or a concurrency limit
    claims the next claim's jobs while its slots are taken: they wait, not started, and its
    slots still bound the bodies running. A job claimed ahead is cancelled without running
    when cancelled, a warm stop returns it unspent, and a cap on runs set meanwhile that it
    would exceed hands it back to the queue unstarted (it runs later, within the cap)."""
    started: list[str] = []
    release = asyncio.Event()
    step = _step(app, started, release)
    worker = fast_worker(app, slots=1, shutdown_timeout=10)
    runner = asyncio.create_task(worker.run())
    try:
        await _warm(worker, step, db)
        first, second = step.enqueue_many([{"name": "first"}, {"name": "second"}])
        # The claim commits before the worker has read its answer: wait for the worker, and
        # for the first body to start (a task not yet stepped reads as waiting).
        await wait_until(lambda: second in worker.running() and started[-1:] == ["first"])
        assert job(db, second)["state"] == "running"
        assert worker.running() == {first: True, second: False}  # one slot, one body
        assert started[-1] == "first"
        if how == "cancel":
            async with connect(database_url) as connection:
                assert await request_cancel(connection, second) is True
            await wait_until(lambda: job(db, second)["state"] != "running")
        elif how == "stop":
            worker.request_stop()
            await asyncio.sleep(0.2)
            assert not runner.done()  # waits for the running body
        elif how == "cap":
            worker.resize(max_running=1)
            await wait_until(lambda: job(db, second)["state"] == "queued")
            assert (job(db, second)["attempt"], worker.running()) == (0, {first: True})
        release.set()
        await wait_until(lambda: job(db, first)["state"] == "succeeded")
        if how == "cap":
            await wait_until(lambda: job(db, second)["state"] == "succeeded")
        if how != "stop":
            await wait_until(lambda: job(db, second)["state"] != "running")
            worker.request_stop()
        assert await asyncio.wait_for(runner, 10) == 0
    finally:
        release.set()
        await _stop(worker, runner)
    row = job(db, second)
    if how in ("run", "cap"):
        assert started[-2:] == ["first", "second"]
        assert row["state"] == "succeeded", row
    else:
        assert "second" not in started, "the job claimed ahead must not run"
        expected = "cancelled" if how == "cancel" else "queued"
        assert (row["state"], row["attempt"], row["errors"], row["worker_id"]) == (
            expected, 0, [], None), row


async def test_a_long_run_stops_the_claims_ahead(app: App, db: psycopg.Connection) -> None:
    """Once a body has run longer than a short one, the worker claims nothing beyond its
    slots: a job another worker could run does not wait behind it here."""
    started: list[str] = []
    release = asyncio.Event()
    step = _step(app, started, release)
    worker = fast_worker(app, slots=1)
    async with running(worker):
        await _warm(worker, step, db)
        first = step.enqueue(name="first")
        await wait_until(lambda: started[-1:] == ["first"])
        await asyncio.sleep(0.05)
        second = step.enqueue(name="second")
        await asyncio.sleep(0.3)
        assert job(db, second)["state"] == "queued"
        assert worker.running() == {first: True}
        release.set()
        await wait_until(lambda: job(db, second)["state"] == "succeeded")


def _recording(monkeypatch: pytest.MonkeyPatch, worker: Any,
               events: list[tuple[str, Any]]) -> None:
    """Record in ``events`` each claim sent ("sent") and answered ("answered", its ids),
    and each run ``worker`` starts ("start", its id)."""
    from akadze_core.store import database

    claim_jobs = database.claim_jobs

    async def recorded(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        events.append(("sent", None))
        rows = await claim_jobs(*args, **kwargs)
        events.append(("answered", [row["id"] for row in rows]))
        return rows

    monkeypatch.setattr(database, "claim_jobs", recorded)
    start_many = worker._runs.start_many

    def start_recorded(rows: list[dict[str, Any]]) -> None:
        # A claim's rows start together (``Runs.start_many``), in its order.
        events.extend(("start", row["id"]) for row in rows)
        start_many(rows)

    monkeypatch.setattr(worker._runs, "start_many", start_recorded)


def _started_after_the_next_claim(events: list[tuple[str, Any]]) -> int:
    """How many full claims of two (``_recording``'s events) started their runs only after
    the next claim was sent; each claim's runs start together, in its order."""
    later = 0
    for index, (what, value) in enumerate(events):
        if what != "answered" or len(value) != 2:
            continue
        first = events.index(("start", value[0]))
        assert events[first:first + 2] == [("start", value[0]), ("start", value[1])]
        later += ("sent", None) in events[index:first]
    return later


async def test_the_runs_of_a_claim_made_ahead_start_once_the_next_claim_is_sent(
    app: App, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full claim made ahead of the slots does not start its runs before the next claim
    is on its way: that claim is sent first (its reply comes while they run), then they
    start, in their claim's order, and every job runs once."""
    started: list[str] = []
    release = asyncio.Event()
    step = _step(app, started, release)
    events: list[tuple[str, Any]] = []
    worker = fast_worker(app, slots=2)
    async with running(worker):
        _recording(monkeypatch, worker, events)
        for _ in range(20):  # a loaded machine may need a few tries to claim ahead
            await _warm(worker, step, db)
            events.clear()
            ids = [int(i) for i in step.enqueue_many([{"name": f"n{i}"} for i in range(40)])]
            await wait_until(lambda ids=ids: all(job(db, i)["state"] == "succeeded"
                                                  for i in ids))
            starts = [value for what, value in events if what == "start"]
            assert sorted(starts) == sorted(ids)  # each once
            if _started_after_the_next_claim(events):
                return
        raise AssertionError("no full claim made ahead started its runs after the next one")


async def test_a_full_claim_sends_the_next_one_in_the_turn_its_answer_is_read(
    app: App, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While claims come back full, the next claim goes out in the loop turn the last
    answer was read in: no callback made ready meanwhile (a batch's bodies, a write's
    lines) runs between them. Every job runs once."""
    from akadze_core.store import database

    started: list[str] = []
    release = asyncio.Event()
    step = _step(app, started, release)
    answers: list[int] = []  # rows of each claim answered
    turns: list[int] = []  # the answers a loop turn has passed since
    gaps: list[bool] = []  # for each claim after a full one: a turn passed in between
    claim_jobs = database.claim_jobs

    async def recorded(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        if answers and answers[-1] == args[2]:  # the last claim came back full
            gaps.append(turns[-1:] == [len(answers)])
        rows = await claim_jobs(*args, **kwargs)
        answers.append(len(rows))
        asyncio.get_running_loop().call_soon(turns.append, len(answers))
        return rows

    monkeypatch.setattr(database, "claim_jobs", recorded)
    worker = fast_worker(app, slots=2)
    async with running(worker):
        for _ in range(20):  # a loaded machine may need a few tries to claim ahead
            await _warm(worker, step, db)
            gaps.clear()
            ids = [int(i) for i in step.enqueue_many([{"name": f"n{i}"} for i in range(40)])]
            await wait_until(lambda ids=ids: all(job(db, i)["state"] == "succeeded"
                                                  for i in ids))
            assert all(job(db, i)["run_count"] == 1 for i in ids)
            if False in gaps:
                return
        raise AssertionError(f"no claim went out in the turn of a full answer: {gaps}")


async def test_the_runs_of_a_claim_made_ahead_see_the_claim_loops_context_variables(
    app: App, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run claimed ahead starts in the claim loop's context variables, as one started at
    its claim does, not in those of the step that sent the next claim: its body never sees
    the worker's lock bound on its own statements."""
    from akadze_core.store import database

    bounds: dict[str, str | None] = {}

    @app.task("step")
    async def step(name: str) -> None:
        bounds[name] = database._bound()

    events: list[tuple[str, Any]] = []
    worker = fast_worker(app, slots=2)
    async with running(worker):
        _recording(monkeypatch, worker, events)
        for _ in range(20):  # a loaded machine may need a few tries to claim ahead
            await _warm(worker, step, db)
            events.clear()
            names = [f"n{i}" for i in range(40)]
            ids = [int(i) for i in step.enqueue_many([{"name": name} for name in names])]
            await wait_until(lambda ids=ids: all(job(db, i)["state"] == "succeeded"
                                                  for i in ids))
            assert {name: bounds[name] for name in names} == dict.fromkeys(names)
            if _started_after_the_next_claim(events):
                return
        raise AssertionError("no full claim made ahead started its runs after the next one")
