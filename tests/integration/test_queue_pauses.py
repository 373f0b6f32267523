"""Paused queues on real Postgres: a paused queue is claimed by no worker (running, or
started later) until resumed; other queues go on; a pause waits for the claims under way, so
once it returns no job slips; a resume wakes idle workers at once, not at their next poll."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import psycopg
import pytest

from akadze_core import App, Worker
from akadze_core.model.errors import InvalidArgs
from akadze_core.store import database, pauses
from tests.integration.lease_support import FAST, claim, fake_worker, running, scalar, wait_until
from tests.integration.test_cli import DEAD_URL, PASSWORD, SCHEMA_LINE, one_error_line, run


def register_noop(app: App) -> Any:
    @app.task("noop")
    async def noop(**kwargs: Any) -> None:
        return None

    return noop


def states(db: psycopg.Connection, queue: str) -> list[str]:
    return [row[0] for row in db.execute(
        "SELECT state FROM akadze.jobs WHERE queue = %s ORDER BY id", (queue,)).fetchall()]


async def test_a_paused_queue_gives_no_job_to_either_claim_and_resume_gives_them_back(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    noop = register_noop(app)
    assert app.pause_queue("default", by="test") is True
    assert app.pause_queue("default") is False  # already paused
    # Enqueue still works while paused: the jobs wait.
    waiting = [noop.enqueue() for _ in range(3)]
    other = noop.configure(queue="other").enqueue()
    worker_id = fake_worker(db, ttl=60)
    assert await claim(database_url, worker_id, 10) == []
    assert await claim(database_url, worker_id, 10, fair=True) == []
    assert [row["id"] for row in await claim(database_url, worker_id, 10, "other")] == [other]
    assert app.paused_queues() == ["default"]
    [listed] = [state for state in app.list_queues() if state.queue == "default"]
    assert (listed.paused, listed.paused_by, listed.due) == (True, "test", 3)

    assert app.resume_queue("default") is True
    assert app.resume_queue("default") is False
    assert app.paused_queues() == []
    assert sorted(row["id"] for row in await claim(database_url, worker_id, 10, fair=True)) \
        == waiting


async def test_async_twins_pause_and_resume(app: App) -> None:
    assert await app.pause_queue_async("q") is True
    assert app.paused_queues() == ["q"]
    assert await app.resume_queue_async("q") is True
    assert app.paused_queues() == []


def test_a_bad_queue_name_is_refused_before_anything_is_written(app: App) -> None:
    with pytest.raises(InvalidArgs):
        app.pause_queue("")
    with pytest.raises(InvalidArgs):
        app.pause_queue("q", by="a\x00b")
    assert app.paused_queues() == []


def test_a_pause_waits_for_the_claims_under_way_so_none_commits_after_it(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    noop = register_noop(app)
    noop.enqueue()
    worker_id = fake_worker(db, ttl=60)
    # A claim whose transaction has not committed yet: it found the queue not paused.
    with psycopg.connect(database_url) as claimer:
        rows = database.fetch_all(claimer, "job_claim", lock_timeout=None, queue="default",
                                  limit=1, worker_id=worker_id, floor_priority=[],
                                  floor_at=[], floor_id=[])
        assert len(rows) == 1
        returned = threading.Event()

        def pause() -> None:
            with psycopg.connect(database_url, autocommit=True) as connection:
                pauses.pause(connection, "default")
            returned.set()

        pauser = threading.Thread(target=pause)
        pauser.start()
        time.sleep(0.3)
        assert not returned.is_set()  # waits for the claim's transaction
        claimer.commit()
        pauser.join(5)
    assert returned.is_set()
    # A claim that starts while a pause waits for its lock waits for the pause to commit,
    # and then sees it.
    noop.enqueue()
    with psycopg.connect(database_url) as pauser_tx:
        pauses.resume(pauser_tx, "default")
        pauser_tx.commit()
        pauses.pause(pauser_tx, "default")  # holds the queue's lock until commit
        result: list[list[dict[str, Any]]] = []
        claimer_thread = threading.Thread(target=lambda: result.append(asyncio.run(
            claim(database_url, worker_id, 10))))
        claimer_thread.start()
        time.sleep(0.3)
        assert not result
        pauser_tx.commit()
        claimer_thread.join(5)
    assert result == [[]]


async def test_a_running_worker_stops_taking_a_paused_queue_and_a_resume_wakes_it_at_once(
    app: App, db: psycopg.Connection
) -> None:
    noop = register_noop(app)
    # A long poll: only the resume's NOTIFY can make the worker claim promptly.
    worker = Worker(app, queues=["default", "other"], **{**FAST, "poll_interval": 30})
    async with running(worker):
        await wait_until(lambda: bool(scalar(
            db, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND query ILIKE 'LISTEN%%akadze_pauses%%'")))
        app.pause_queue("default")
        await wait_until(lambda: "default" in worker._producer.paused)
        for _ in range(3):
            noop.enqueue()
        noop.configure(queue="other").enqueue()
        await wait_until(lambda: states(db, "other") == ["succeeded"])
        await asyncio.sleep(0.3)
        assert states(db, "default") == ["queued"] * 3
        app.resume_queue("default")
        took = await wait_until(lambda: states(db, "default") == ["succeeded"] * 3)
        assert took < 2


async def test_a_worker_started_while_paused_claims_nothing_from_the_queue(
    app: App, db: psycopg.Connection
) -> None:
    noop = register_noop(app)
    app.pause_queue("default")
    noop.enqueue()
    worker = Worker(app, queues=["default"], **FAST)
    async with running(worker):
        await wait_until(lambda: worker._producer.paused == {"default"})
        await asyncio.sleep(0.5)
        assert states(db, "default") == ["queued"]
        app.resume_queue("default")
        await wait_until(lambda: states(db, "default") == ["succeeded"])


# --- akadze queues ---------------------------------------------------------------------------


def test_cli_pauses_lists_and_resumes_a_queue(app: App, database_url: str) -> None:
    register_noop(app).enqueue()
    paused = run("queues", "pause", "default", url=database_url)
    assert (paused.exit_code, paused.output) == (0, "paused queue default\n")
    again = run("queues", "pause", "default", url=database_url)
    assert (again.exit_code, again.output) == (0, "queue default was already paused\n")
    assert app.paused_queues() == ["default"]
    listed = run("queues", "list", url=database_url)
    assert listed.exit_code == 0
    header, line = listed.output.splitlines()
    assert header.split()[:4] == ["QUEUE", "STATE", "DUE", "WORKERS"]
    assert line.split()[:4] == ["default", "paused", "1", "0"] and line.endswith("cli")
    [entry] = json.loads(run("queues", "list", "--json", url=database_url).output)
    assert (entry["queue"], entry["paused"], entry["paused_by"]) == ("default", True, "cli")
    resumed = run("queues", "resume", "default", url=database_url)
    assert (resumed.exit_code, resumed.output) == (0, "resumed queue default\n")
    assert run("queues", "resume", "default", url=database_url).output \
        == "queue default was not paused\n"
    assert run("queues", "list", url=database_url).output.splitlines()[1].split()[:2] \
        == ["default", "active"]


@pytest.mark.parametrize("args", [("queues", "list"), ("queues", "pause", "q"),
                                  ("queues", "resume", "q")], ids=" ".join)
def test_cli_words_a_missing_schema_and_a_dead_database_on_one_line(
        empty_database_url: str, args: tuple[str, ...]) -> None:
    missing = run(*args, url=empty_database_url)
    assert missing.exit_code == 1
    assert one_error_line(missing) == SCHEMA_LINE
    dead = run(*args, url=DEAD_URL)
    assert dead.exit_code == 1
    assert one_error_line(dead).startswith("akadze: error: cannot connect to Postgres")
    assert PASSWORD not in dead.output


def test_cli_refuses_a_queue_name_postgres_cannot_store(database_url: str) -> None:
    result = run("queues", "pause", "a\x00b", url=database_url)
    assert result.exit_code == 1
    assert "NUL" in one_error_line(result)
