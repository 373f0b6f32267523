"""``current()`` and ``current().complete_tx()`` (seed 003), on real Postgres with a real worker.

The caller's writes and the job's move to succeeded commit together or not at all; a run that
no longer owns the job gets ``NotOwner`` and its writes roll back; cancel or expiry during the
block does not stop it; an error inside rolls back and spends an attempt, unless cancel was
requested or the job expired meanwhile (then cancelled, no attempt spent).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg
import pytest

from akadze_core import App, NotOwner, current, request_cancel
from tests.helpers import job
from tests.integration.outcome_helpers import (
    fast_worker,
    ran,
    run_until,
    running,
    wait_event,
    wait_until,
)


@pytest.fixture
def reports(db: psycopg.Connection) -> psycopg.Connection:
    """A user table the tasks write to."""
    db.execute("CREATE TABLE reports (id int PRIMARY KEY, ready boolean NOT NULL)")
    return db


def report_ids(db: psycopg.Connection) -> list[int]:
    return [row[0] for row in db.execute("SELECT id FROM reports ORDER BY id").fetchall()]


def jobs_of(db: psycopg.Connection, task: str) -> list[tuple[int, str, Any]]:
    return [tuple(row) for row in db.execute(  # type: ignore[misc]
        "SELECT id, state, args FROM akadze.jobs WHERE task = %s ORDER BY id", (task,))]


class Chain:
    """A report.build task that marks its report ready and enqueues report.notify, both in
    complete_tx; ``hold`` makes it wait inside the block, ``fail`` raise inside it."""

    def __init__(self, app: App, *, hold: bool = False, fail: bool = False) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.next_ids: list[int] = []
        self.errors: list[BaseException] = []
        if not hold:
            self.release.set()

        @app.task("report.notify", queue="notifications")
        async def notify(report_id: int) -> None: ...

        @app.task("report.build")
        async def build(report_id: int) -> None:
            try:
                async with current().complete_tx() as connection:
                    await connection.execute(
                        "INSERT INTO reports (id, ready) VALUES (%s, true)", (report_id,))
                    self.next_ids.append(
                        await notify.using(session=connection).enqueue(report_id=report_id))
                    self.entered.set()
                    await self.release.wait()
                    if fail:
                        raise ValueError("the report is broken")
            except BaseException as exc:
                self.errors.append(exc)
                raise

        self.build = build


async def test_writes_next_job_and_success_commit_together(
    app: App, reports: psycopg.Connection
) -> None:
    db = reports
    chain = Chain(app)
    job_id = chain.build.enqueue(report_id=1)
    await run_until(app, lambda: job(db, job_id)["state"] == "succeeded")
    row = job(db, job_id)
    assert (row["attempt"], row["run_count"], row["errors"], row["result"]) == (1, 1, [], None)
    assert row["finished_at"] is not None and row["worker_id"] is None
    assert report_ids(db) == [1]
    assert jobs_of(db, "report.notify") == [(chain.next_ids[0], "queued", {"report_id": 1})]
    assert chain.errors == []


async def test_error_inside_the_block_rolls_back_and_spends_the_attempt(
    app: App, reports: psycopg.Connection
) -> None:
    db = reports
    chain = Chain(app, fail=True)
    job_id = chain.build.enqueue(report_id=1)
    await run_until(app, ran(db, job_id))
    row = job(db, job_id)
    assert (row["state"], row["attempt"]) == ("queued", 1)
    assert [e["type"] for e in row["errors"]] == ["ValueError"]
    assert report_ids(db) == [], "the block's writes rolled back"
    assert jobs_of(db, "report.notify") == [], "the next job rolled back with them"
    assert len(chain.next_ids) == 1, "the enqueue itself had happened inside the block"


@pytest.mark.parametrize("how", ["cancel", "expiry"])
async def test_cancel_or_expiry_during_the_block_does_not_stop_it(
    app: App, reports: psycopg.Connection, database_url: str, how: str
) -> None:
    db = reports
    chain = Chain(app, hold=True)
    options = {}
    if how == "expiry":
        # Long enough for a worker starting on a loaded machine to claim it first.
        expires = db.execute("SELECT now() + interval '2 seconds'").fetchone()[0]  # type: ignore[index]
        options["expires_at"] = expires
    job_id = chain.build.configure(**options).enqueue(report_id=1)
    async with running(fast_worker(app)):
        await wait_event(chain.entered, what="the block")
        await interrupt(db, database_url, job_id, how)
        chain.release.set()
        await wait_until(lambda: job(db, job_id)["state"] != "running", what="the outcome")
    row = job(db, job_id)
    assert (row["state"], row["attempt"]) == ("succeeded", 1)
    assert report_ids(db) == [1]
    assert [state for _, state, _ in jobs_of(db, "report.notify")] == ["queued"]


@pytest.mark.parametrize("how", ["cancel", "expiry"])
async def test_error_inside_the_block_after_cancel_or_expiry_cancels(
    app: App, reports: psycopg.Connection, database_url: str, how: str
) -> None:
    db = reports
    chain = Chain(app, hold=True, fail=True)
    options = {}
    if how == "expiry":
        # Long enough for a worker starting on a loaded machine to claim it first.
        expires = db.execute("SELECT now() + interval '2 seconds'").fetchone()[0]  # type: ignore[index]
        options["expires_at"] = expires
    # max_attempts=1: without the cancel the error would end the job failed.
    job_id = chain.build.configure(max_attempts=1, **options).enqueue(report_id=1)
    async with running(fast_worker(app)):
        await wait_event(chain.entered, what="the block")
        await interrupt(db, database_url, job_id, how)
        chain.release.set()
        await wait_until(lambda: job(db, job_id)["state"] != "running", what="the outcome")
    row = job(db, job_id)
    assert (row["state"], row["attempt"]) == ("cancelled", 0)
    assert report_ids(db) == []
    assert jobs_of(db, "report.notify") == []


async def interrupt(db: psycopg.Connection, database_url: str, job_id: int, how: str) -> None:
    """Request the cancel, or wait until the job's expires_at has passed on the DB clock."""
    if how == "cancel":
        async with await psycopg.AsyncConnection.connect(database_url) as connection:
            assert await request_cancel(connection, job_id) is True
        assert job(db, job_id)["cancel_requested"] is True
    else:
        await wait_until(lambda: db.execute(
            "SELECT expires_at <= now() FROM akadze.jobs WHERE id = %s",
            (job_id,)).fetchone() == (True,), what="the expiry")
    assert job(db, job_id)["state"] == "running"


@pytest.mark.parametrize(
    "takeover",
    [
        # Rescued and claimed again by another worker: same state, newer run_count.
        "UPDATE akadze.jobs SET run_count = run_count + 1 WHERE id = %s",
        # Rescued, waiting for its retry.
        "UPDATE akadze.jobs SET state = 'queued', worker_id = NULL, "
        "scheduled_at = now() + interval '1 hour' WHERE id = %s",
        # Finished by someone else.
        "UPDATE akadze.jobs SET state = 'succeeded', finished_at = now() WHERE id = %s",
    ],
    ids=["reclaimed", "rescued", "finished"],
)
async def test_a_run_that_no_longer_owns_the_job_gets_not_owner(
    app: App, reports: psycopg.Connection, takeover: str
) -> None:
    db = reports
    chain = Chain(app, hold=True)
    job_id = chain.build.enqueue(report_id=1)
    async with running(fast_worker(app)):
        await wait_event(chain.entered, what="the block")
        db.execute(takeover, (job_id,))
        taken = job(db, job_id)
        chain.release.set()
        await wait_until(lambda: len(chain.errors) == 1, what="the block to exit")
    # The worker has stopped, so the run's outcome was written (and rejected by fencing).
    [error] = chain.errors
    assert isinstance(error, NotOwner)
    assert str(job_id) in str(error)
    assert report_ids(db) == [], "the run's writes rolled back"
    assert jobs_of(db, "report.notify") == []
    assert job(db, job_id) == taken, "the late run changed nothing"


async def test_sync_complete_tx_in_a_plain_def_task(
    app: App, reports: psycopg.Connection
) -> None:
    db = reports
    next_ids: list[int] = []

    @app.task("report.notify", queue="notifications")
    def notify(report_id: int) -> None: ...

    @app.task("report.build_sync")
    def build_sync(report_id: int, fail: bool) -> None:
        with current().complete_tx() as connection:
            connection.execute("INSERT INTO reports (id, ready) VALUES (%s, true)", (report_id,))
            next_ids.append(notify.using(session=connection).enqueue(report_id=report_id))
            if fail:
                raise ValueError("broken inside the block")

    good = build_sync.enqueue(report_id=1, fail=False)
    bad = build_sync.enqueue(report_id=2, fail=True)
    await run_until(app, lambda: ran(db, good)() and ran(db, bad)(), slots=2)
    row = job(db, good)
    assert (row["state"], row["attempt"]) == ("succeeded", 1)
    row = job(db, bad)
    assert (row["state"], row["attempt"]) == ("queued", 1)
    assert [e["type"] for e in row["errors"]] == ["ValueError"]
    assert report_ids(db) == [1]
    assert len(next_ids) == 2 and all(isinstance(i, int) for i in next_ids), \
        "a sync session's enqueue returns the id"
    [(notify_id, state, args)] = jobs_of(db, "report.notify")
    assert notify_id in next_ids
    assert (state, args) == ("queued", {"report_id": 1}), "only the committed block's job"


async def test_an_error_after_complete_tx_committed_leaves_the_job_succeeded(
    app: App, reports: psycopg.Connection
) -> None:
    db = reports

    @app.task("after_commit")
    async def after_commit() -> None:
        async with current().complete_tx() as connection:
            await connection.execute("INSERT INTO reports (id, ready) VALUES (9, true)")
        raise RuntimeError("too late to matter")

    job_id = after_commit.enqueue()
    await run_until(app, ran(db, job_id))
    row = job(db, job_id)
    assert (row["state"], row["attempt"], row["errors"]) == ("succeeded", 1, [])
    assert report_ids(db) == [9]


async def test_current_exposes_the_running_job(app: App, db: psycopg.Connection) -> None:
    seen: dict[str, dict[str, Any]] = {}

    def snapshot() -> dict[str, Any]:
        context = current()
        return {"id": context.id, "attempt": context.attempt, "task": context.task,
                "args": context.args, "run_count": context.run_count, "queue": context.queue,
                "max_attempts": context.max_attempts}

    @app.task("ctx.async", max_attempts=5)
    async def ctx_async(value: int) -> None:
        seen["async"] = snapshot()
        if current().run_count == 1:
            raise RuntimeError("once more")

    @app.task("ctx.sync", queue="other")
    def ctx_sync(value: str) -> None:
        seen["sync"] = snapshot()
        seen["thread"] = {"name": threading.current_thread().name}

    first = ctx_async.enqueue(value=1)
    second = ctx_sync.enqueue(value="x")
    await run_until(app, lambda: ran(db, first)() and ran(db, second)(), queues=["default",
                                                                               "other"])
    assert seen["async"] == {"id": first, "attempt": 1, "task": "ctx.async", "args": {"value": 1},
                             "run_count": 1, "queue": "default", "max_attempts": 5}
    assert seen["sync"] == {"id": second, "attempt": 1, "task": "ctx.sync",
                            "args": {"value": "x"}, "run_count": 1, "queue": "other",
                            "max_attempts": 3}
    assert seen["thread"]["name"] != threading.main_thread().name, "sync bodies run in threads"

    db.execute("UPDATE akadze.jobs SET scheduled_at = now() WHERE id = %s", (first,))
    await run_until(app, lambda: job(db, first)["state"] == "succeeded")
    assert (seen["async"]["attempt"], seen["async"]["run_count"]) == (2, 2)


async def test_current_outside_a_job_raises_lookup_error() -> None:
    with pytest.raises(LookupError, match="only available inside a running akadze job"):
        current()

    errors: list[BaseException] = []

    def in_thread() -> None:
        try:
            current()
        except LookupError as exc:
            errors.append(exc)

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    assert len(errors) == 1


async def test_current_is_reset_after_the_job(app: App, db: psycopg.Connection) -> None:
    @app.task("noop")
    async def noop() -> None:
        assert current().task == "noop"

    job_id = noop.enqueue()
    await run_until(app, lambda: job(db, job_id)["state"] == "succeeded")
    with pytest.raises(LookupError):
        current()
