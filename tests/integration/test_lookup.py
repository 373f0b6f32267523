"""Reading jobs back: get/find, waiting for completion via NOTIFY, meta updates, purge."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import psycopg
import pytest

from akadze_core import App, Fail, Worker, current
from akadze_core.store import database
from tests.helpers import job, run_worker_until


def fast_worker(app: App, **options: object) -> Worker:
    return Worker(app, poll_interval=0.05, heartbeat_interval=0.2, heartbeat_ttl=2,
                  shutdown_timeout=1, **options)  # type: ignore[arg-type]


async def test_get_and_find_job(app: App, db: psycopg.Connection) -> None:
    @app.task("lookup.noop")
    def noop() -> None: ...

    plain = noop.enqueue()
    tagged = noop.configure(meta={"task_id": "celery-id-1"}).enqueue()
    assert (await app.get_job_async(plain)).id == plain  # type: ignore[union-attr]
    assert app.get_job(plain).task == "lookup.noop"  # type: ignore[union-attr]
    assert app.get_job(10**12) is None
    assert app.find_job("celery-id-1").id == tagged  # type: ignore[union-attr]
    assert (await app.find_job_async("celery-id-1")).id == tagged  # type: ignore[union-attr]
    assert app.find_job("nope") is None
    # A job without one is found by the id derived from its job id, and only that job.
    derived = app.task_id_of(app.get_job(plain))  # type: ignore[arg-type]
    assert derived == app.task_ids().derive(plain) != app.task_ids().derive(tagged)
    assert app.find_job(derived).id == plain  # type: ignore[union-attr]
    assert (await app.find_job_async(derived)).id == plain  # type: ignore[union-attr]
    assert app.find_job(app.task_ids().derive(tagged)) is None  # it has an id of its own
    assert app.find_job(app.task_ids().derive(10**12)) is None
    plan = db.execute("EXPLAIN SELECT id FROM akadze.jobs WHERE meta->>'task_id' = 'x'"
                      " AND meta ? 'task_id'").fetchall()
    assert "jobs_meta_task_id_idx" in " ".join(row[0] for row in plan)


def test_find_job_goes_through_the_task_id_index_on_a_large_table(
        app: App, db: psycopg.Connection) -> None:
    """Without statistics for the partial index, ``ORDER BY id DESC LIMIT 1`` tempts the
    planner into walking the primary key through every row for an id that matches none."""
    db.execute("INSERT INTO akadze.jobs (task, queue, args, meta) SELECT 't', 'q', '{}',"
               " jsonb_build_object('task_id', gen_random_uuid()::text)"
               " FROM generate_series(1, 20000)")
    db.execute("INSERT INTO akadze.jobs (task, queue, args) SELECT 't', 'q', '{}'"
               " FROM generate_series(1, 20000)")
    db.execute("ANALYZE akadze.jobs")
    db.commit()
    text = database.query("job_find_by_task_id")
    custom = " ".join(row[0] for row in db.execute("EXPLAIN " + text,
                                                   {"task_id": "nope", "derived": None}))
    # psycopg prepares a statement run five times; its generic plan must use the index too.
    db.execute("SET plan_cache_mode = force_generic_plan")
    db.execute("PREPARE find_by_task_id(text, bigint) AS "
               + text.replace("%(task_id)s", "$1").replace("%(derived)s", "$2"))
    generic = " ".join(row[0] for row in db.execute(
        "EXPLAIN EXECUTE find_by_task_id('nope', NULL)"))
    db.execute("DEALLOCATE find_by_task_id")
    db.execute("RESET plan_cache_mode")
    assert "jobs_meta_task_id_idx" in custom and "jobs_meta_task_id_idx" in generic, \
        (custom, generic)
    newest = db.execute("SELECT meta->>'task_id', id FROM akadze.jobs WHERE meta ? 'task_id'"
                        " ORDER BY id DESC LIMIT 1").fetchone()
    assert newest is not None
    assert app.find_job(newest[0]).id == newest[1]  # type: ignore[union-attr]
    assert app.find_job("nope") is None


async def test_wait_for_job_wakes_on_notify_not_polling(app: App) -> None:
    release = asyncio.Event()

    @app.task("lookup.gated")
    async def gated() -> str:
        await release.wait()
        return "done"

    job_id = gated.enqueue()
    worker = fast_worker(app)
    runner = asyncio.create_task(worker.run())
    # The waiter's fallback poll is 5 s: finishing well under that proves the NOTIFY woke it.
    waiter = asyncio.create_task(app.wait_for_job_async(job_id, timeout=20))
    await asyncio.sleep(0.3)
    assert not waiter.done()
    released_at = time.monotonic()
    release.set()
    finished = await asyncio.wait_for(waiter, 10)
    assert time.monotonic() - released_at < 2.0
    assert (finished.state, finished.result) == ("succeeded", "done")
    worker.request_stop()
    assert await runner == 0


async def test_sync_wait_for_job_and_timeout(app: App) -> None:
    @app.task("lookup.fails")
    async def fails() -> None:
        raise Fail("no")

    job_id = fails.enqueue()
    with pytest.raises(TimeoutError):
        await asyncio.to_thread(app.wait_for_job, job_id, 0.2)
    result: list[object] = []
    waiter = threading.Thread(target=lambda: result.append(app.wait_for_job(job_id, 20)))
    waiter.start()
    worker = fast_worker(app)
    await run_worker_until(worker, lambda: bool(result))
    waiter.join()
    assert result[0].state == "failed"  # type: ignore[attr-defined]


async def test_cancelled_queued_job_wakes_waiters(app: App) -> None:
    from akadze_core import request_cancel

    @app.task("lookup.never")
    def never() -> None: ...

    job_id = never.enqueue()
    waiter = asyncio.create_task(app.wait_for_job_async(job_id, timeout=20))
    await asyncio.sleep(0.2)
    async with await app.connect_async(autocommit=True) as connection:
        assert await request_cancel(connection, job_id)
    assert (await asyncio.wait_for(waiter, 3)).state == "cancelled"


async def test_update_meta_is_fenced_and_visible_while_running(
    app: App, db: psycopg.Connection
) -> None:
    seen: list[bool] = []
    release = asyncio.Event()

    @app.task("lookup.progress")
    async def progress() -> None:
        seen.append(await current().update_meta({"state": "PROGRESS", "done": 1}))
        await release.wait()

    @app.task("lookup.progress_sync")
    def progress_sync() -> None:
        seen.append(current().update_meta_sync({"step": "two"}))

    job_id = progress.enqueue()
    sync_id = progress_sync.enqueue()
    worker = fast_worker(app, slots=2)
    runner = asyncio.create_task(worker.run())
    for _ in range(200):
        if job(db, job_id)["meta"].get("state") == "PROGRESS":
            break
        await asyncio.sleep(0.02)
    row = job(db, job_id)
    assert row["state"] == "running" and row["meta"] == {"state": "PROGRESS", "done": 1}
    # Another run owns the job now: the stale run's update must change nothing.
    db.execute("UPDATE akadze.jobs SET run_count = run_count + 1 WHERE id = %s", (job_id,))
    stale = current_context_for(app, job_id, row["run_count"])
    assert await stale.update_meta({"state": "STALE"}) is False
    assert job(db, job_id)["meta"]["state"] == "PROGRESS"
    release.set()
    await asyncio.sleep(0.3)
    worker.request_stop()
    await runner
    assert job(db, sync_id)["meta"] == {"step": "two"}
    assert seen[:1] == [True]


def current_context_for(app: App, job_id: int, run_count: int):  # type: ignore[no-untyped-def]
    """A JobContext for an old run of ``job_id`` (what a late worker would hold)."""
    from akadze_core import Job, JobContext

    stale = Job(id=job_id, task="lookup.progress", queue="default", args={}, state="running",
                priority=0, scheduled_at=None, attempt=1, max_attempts=3,  # type: ignore[arg-type]
                run_count=run_count)
    return JobContext(app, stale)


async def test_fail_from_cause_records_the_cause(app: App, db: psycopg.Connection) -> None:
    @app.task("lookup.wrapped")
    async def wrapped() -> None:
        try:
            {}["missing"]
        except KeyError as exc:
            raise Fail("lookup failed") from exc

    job_id = wrapped.enqueue()
    await run_worker_until(fast_worker(app), lambda: job(db, job_id)["state"] == "failed")
    entry = job(db, job_id)["errors"][-1]
    assert (entry["type"], entry["module"], entry["reason"]) == ("KeyError", "builtins",
                                                                 "lookup failed")
    assert "missing" in entry["message"] and "KeyError" in entry["traceback"]


async def test_purge_and_list(app: App, db: psycopg.Connection) -> None:
    @app.task("lookup.item", queue="a")
    def item() -> None: ...

    item.enqueue_many([{}] * 3)
    item.configure(queue="b").enqueue()
    assert len(app.list_jobs(queue="a")) == 3
    assert app.purge(["a"]) == 3
    assert [j.queue for j in app.list_jobs()] == ["b"]
    assert app.purge() == 1
    assert app.list_workers() == []


async def test_retry_can_raise_the_attempt_budget(app: App, db: psycopg.Connection) -> None:
    from akadze_core import Retry

    seen: list[tuple[int, object]] = []

    @app.task("lookup.grows", max_attempts=1)
    async def grows() -> str:
        context = current()
        seen.append((context.attempt, context.last_error and context.last_error["type"]))
        if context.attempt < 3:
            raise Retry(0, max_attempts=3)
        return "third time"

    job_id = grows.enqueue()
    await run_worker_until(fast_worker(app), lambda: job(db, job_id)["state"] == "succeeded")
    row = job(db, job_id)
    assert (row["attempt"], row["max_attempts"], row["result"]) == (3, 3, "third time")
    assert seen == [(1, None), (2, "Retry"), (3, "Retry")]


async def test_retry_never_lowers_the_budget(app: App, db: psycopg.Connection) -> None:
    from akadze_core import Retry

    @app.task("lookup.lower", max_attempts=4)
    async def lower() -> None:
        raise Retry(0, max_attempts=1)

    job_id = lower.enqueue()
    await run_worker_until(fast_worker(app), lambda: job(db, job_id)["state"] == "failed")
    row = job(db, job_id)
    assert (row["attempt"], row["max_attempts"]) == (4, 4)


async def test_max_running_caps_runs_across_queues(app: App, db: psycopg.Connection) -> None:
    running = 0
    peak = 0

    async def body() -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1

    first = app.task("cap.a", queue="a")(body)
    second = app.task("cap.b", queue="b")(body)
    first.enqueue_many([{}] * 6)
    second.enqueue_many([{}] * 6)
    worker = fast_worker(app, queues=["a", "b"], slots=3, max_running=2)
    await run_worker_until(worker, lambda: db.execute(
        "SELECT count(*) FROM akadze.jobs WHERE state = 'succeeded'").fetchone()[0] == 12)
    assert peak == 2
    with pytest.raises(ValueError, match="max_running"):
        Worker(app, max_running=0)


async def test_live_workers_scheduled_jobs_and_counts(app: App, db: psycopg.Connection) -> None:
    from datetime import timedelta

    @app.task("cap.later")
    def later() -> None: ...

    soon = later.configure(delay=timedelta(minutes=5)).enqueue()
    later.enqueue()
    assert [job.id for job in app.list_scheduled()] == [soon]
    assert app.job_counts() == {"default": {"queued": 2}}
    db.execute("INSERT INTO akadze.workers (name, hostname, pid, queues, heartbeat_ttl,"
               " heartbeat_at) VALUES ('dead', 'h', 1, '{default}', '1 second',"
               " now() - interval '1 minute'), ('alive', 'h', 2, '{default}', '30 seconds',"
               " now())")
    assert [row["name"] for row in app.list_workers(live=True)] == ["alive"]
    assert len(app.list_workers()) == 2


async def test_a_failing_startup_hook_stops_the_worker_cleanly(
    app: App, db: psycopg.Connection, tmp_path: object
) -> None:
    from akadze_core import WorkerError

    def broken(context: dict[str, object]) -> None:
        raise RuntimeError("no redis today")

    health = f"{tmp_path}/healthy"
    worker = fast_worker(app, on_startup=[broken], health_file=health)
    # The bound is the stop's own: the completer's flush, the unregister and the pool's
    # close may each take up to 5 s on a loaded machine (CI timed out at 10 s beside its
    # other pass); a worker that hangs still fails here.
    with pytest.raises(WorkerError, match=r"on_startup hook .*broken failed.*no redis today"):
        await asyncio.wait_for(worker.run(), 30)
    assert db.execute("SELECT count(*) FROM akadze.workers").fetchone()[0] == 0
    assert not Path(health).exists()
