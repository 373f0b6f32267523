"""A Worker started in the producer's event loop hands the app its own pool
(``Connections.use_async_pool``) while the producer's first enqueue may still be opening the app's
pool: that enqueue must be served, not left waiting on a pool closed under it (
6 of 40 enqueues 4-8 ms after ``Worker.run()`` failed with "PoolTimeout: pool
initialization incomplete after 10 sec")."""

from __future__ import annotations

import asyncio
import random

import psycopg
import psycopg_pool
import pytest

from akadze_core import App, Worker
from tests.integration.lease_support import scalar


def _noop_app(url: str) -> App:
    app = App(url)

    @app.task("race.noop")
    async def noop(n: int) -> None:
        return None

    return app


async def test_an_enqueue_while_the_apps_pool_opens_survives_a_worker_taking_over(
        database_url: str, db: psycopg.Connection) -> None:
    # The race made certain: the worker's pool arrives while the enqueue waits for the
    # app's first pool to open.
    app = _noop_app(database_url)
    enqueue = asyncio.create_task(
        app.tasks["race.noop"].enqueue_many_async([{"n": 1}, {"n": 2}]))
    loop = asyncio.get_running_loop()
    while loop not in app.connections._async_pools:  # the enqueue has made the app's pool
        await asyncio.sleep(0)
    own = app.connections._async_pools[loop]
    assert not enqueue.done()
    theirs = psycopg_pool.AsyncConnectionPool(database_url, min_size=1, open=False,
                                              kwargs={"autocommit": True})
    await theirs.open(wait=False)
    try:
        await app.connections.use_async_pool(theirs)
        ids = await asyncio.wait_for(enqueue, 5)
        assert len(ids) == 2
        assert scalar(db, "SELECT count(*) FROM akadze.jobs") == 2
        # The app's pool was left for the enqueue that held it, and closed after it.
        assert own.closed
        # Later calls use the pool handed in.
        assert await app.tasks["race.noop"].enqueue_many_async([{"n": 3}])
        assert app.connections._async_pools[loop] is theirs
    finally:
        enqueue.cancel()  # a failed assertion must not leave it waiting on the pool
        await asyncio.gather(enqueue, return_exceptions=True)
        app.connections.forget_async_pool(theirs)
        await theirs.close()
        await app.close_async()


@pytest.mark.slow  # 40 workers started and stopped
async def test_an_enqueue_a_few_ms_after_a_worker_starts_in_the_same_loop(
        database_url: str, db: psycopg.Connection) -> None:
    # The shape, 40 times: a fresh app each time (the race needs its first pool),
    # the enqueue 0-20 ms after Worker.run() starts, spread so that some land while the
    # worker registers and some while it opens its pool.
    for attempt in range(40):
        app = _noop_app(database_url)
        worker = Worker(app, slots=2, schedules=False)
        runner = asyncio.create_task(worker.run())
        try:
            await asyncio.sleep(random.uniform(0.0, 0.02))
            ids = await asyncio.wait_for(
                app.tasks["race.noop"].enqueue_many_async([{"n": attempt}]), 8)
            assert len(ids) == 1
        finally:
            worker.request_stop()
            assert await asyncio.wait_for(runner, 30) == 0
            await app.close_async()
    assert scalar(db, "SELECT count(*) FROM akadze.jobs") == 40
