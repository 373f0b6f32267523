"""The basic path: enqueue, a worker runs it, the outcome lands."""

from __future__ import annotations

import psycopg

from akadze_core import App, Worker
from tests.helpers import job, run_worker_until


async def test_enqueue_run_succeed(app: App, db: psycopg.Connection) -> None:
    seen: list[str] = []

    @app.task("greet")
    async def greet(name: str) -> str:
        seen.append(name)
        return f"hello {name}"

    @app.task("greet_sync")
    def greet_sync(name: str) -> dict[str, str]:
        return {"hi": name}

    first = greet.enqueue(name="ada")
    second = await greet_sync.enqueue_async(name="bob")
    worker = Worker(app, slots=2, poll_interval=0.1)
    code = await run_worker_until(
        worker, lambda: job(db, second)["state"] == "succeeded"
        and job(db, first)["state"] == "succeeded")
    assert code == 0
    assert seen == ["ada"]
    assert job(db, first)["result"] == "hello ada"
    assert job(db, second)["result"] == {"hi": "bob"}
    assert job(db, first)["attempt"] == 1
    assert db.execute("SELECT count(*) FROM akadze.workers").fetchone()[0] == 0
