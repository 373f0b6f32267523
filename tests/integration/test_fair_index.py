"""The fair-claim index exists only where fair workers run (akadze_core.store.fair_index): the
schema has none, a fair worker builds it before it registers, once however many start
together, rebuilds one an interrupted build left invalid, waits for a session building it,
and starts anyway (with a warning) on a role that may not build it."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from akadze_core import App, Worker
from akadze_core.store import fair_index
from tests.integration.lease_support import FAST, running, scalar, wait_until

DEFINITION = ("CREATE INDEX jobs_fair_claim_idx ON akadze.jobs USING btree "
              "(queue, task, priority, scheduled_at, id) WHERE (state = 'queued'::text)")


def index_row(db: psycopg.Connection) -> tuple[str, bool] | None:
    """(definition, valid) of jobs_fair_claim_idx, or None when it does not exist."""
    row = db.execute(
        "SELECT pg_get_indexdef(i.indexrelid), i.indisvalid FROM pg_index AS i"
        " WHERE i.indexrelid = to_regclass('akadze.jobs_fair_claim_idx')").fetchone()
    return None if row is None else (row[0], row[1])


def building_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.getMessage().startswith("building jobs_fair_claim_idx")]


async def ensure(url: str, stop: asyncio.Event | None = None) -> None:
    await fair_index.ensure(url, {}, stop or asyncio.Event())


def test_the_schema_has_no_fair_index(db: psycopg.Connection) -> None:
    assert index_row(db) is None
    assert scalar(db, "SELECT count(*) FROM pg_indexes WHERE schemaname = 'akadze'"
                      " AND tablename = 'jobs' AND indexname = 'jobs_claim_idx'") == 1


async def test_a_fair_worker_builds_it_and_a_plain_one_does_not(
    app: App, db: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "akadze.worker")

    @app.task("noop")
    async def noop(n: int) -> None:
        return None

    noop.enqueue_many([{"n": n} for n in range(3)])
    async with running(Worker(app, slots=2, **FAST)):
        await wait_until(lambda: scalar(
            db, "SELECT count(*) FROM akadze.jobs WHERE state = 'succeeded'") == 3)
    assert index_row(db) is None
    noop.enqueue_many([{"n": n} for n in range(3)])
    async with running(Worker(app, slots=2, fair=True, **FAST)):
        await wait_until(lambda: scalar(
            db, "SELECT count(*) FROM akadze.jobs WHERE state = 'succeeded'") == 6)
    assert index_row(db) == (DEFINITION, True)
    assert len(building_lines(caplog)) == 1
    # It is there now: the next fair worker builds nothing.
    async with running(Worker(app, slots=2, fair=True, **FAST)):
        pass
    assert len(building_lines(caplog)) == 1


async def test_fair_workers_starting_together_build_it_once(
    database_url: str, db: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "akadze.worker")
    db.execute("INSERT INTO akadze.jobs (task, queue) SELECT 't' || (n % 7), 'q'"
               " FROM generate_series(1, 50000) AS n")
    await asyncio.gather(*[ensure(database_url) for _ in range(4)])
    assert index_row(db) == (DEFINITION, True)
    assert len(building_lines(caplog)) == 1


async def test_an_invalid_leftover_is_rebuilt(database_url: str,
                                              db: psycopg.Connection) -> None:
    # A CONCURRENTLY build that fails leaves its index behind, invalid: here a unique one
    # under the same name, failing on two jobs of one queue.
    db.execute("INSERT INTO akadze.jobs (task, queue) VALUES ('t', 'q'), ('t', 'q')")
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute("CREATE UNIQUE INDEX CONCURRENTLY jobs_fair_claim_idx"
                   " ON akadze.jobs (queue)")
    row = index_row(db)
    assert row is not None and row[1] is False
    await ensure(database_url)
    assert index_row(db) == (DEFINITION, True)


async def test_it_waits_for_the_session_holding_the_build_lock(
    database_url: str, db: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "akadze.worker")
    with psycopg.connect(database_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (fair_index.BUILD_LOCK,))
        waiting = asyncio.create_task(ensure(database_url))
        await wait_until(lambda: any("waiting for another session" in r.getMessage()
                                     for r in caplog.records))
        await asyncio.sleep(2 * fair_index.POLL_SECONDS)
        assert not waiting.done()
        assert index_row(db) is None
    # The holder's session ended without building it: the waiting one takes over.
    await asyncio.wait_for(waiting, 30)
    assert index_row(db) == (DEFINITION, True)


async def test_a_stop_ends_the_wait(database_url: str, db: psycopg.Connection) -> None:
    stop = asyncio.Event()
    with psycopg.connect(database_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (fair_index.BUILD_LOCK,))
        waiting = asyncio.create_task(ensure(database_url, stop))
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.wait_for(waiting, 5)
    assert index_row(db) is None


@pytest.fixture
def plain_role_url(database_url: str, db: psycopg.Connection) -> Iterator[str]:
    """The test database as a role that may use the schema but owns nothing."""
    role = f"akadze_plain_{uuid.uuid4().hex[:8]}"
    db.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    db.execute(sql.SQL("GRANT USAGE ON SCHEMA akadze TO {}").format(sql.Identifier(role)))
    db.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA akadze TO {}").format(
        sql.Identifier(role)))
    params = conninfo_to_dict(database_url)
    params["user"] = role
    try:
        yield make_conninfo(**params)
    finally:
        db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


async def test_a_role_that_may_not_build_it_gets_a_warning(
    plain_role_url: str, db: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "akadze.worker")
    await ensure(plain_role_url)
    assert index_row(db) is None
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "cannot build jobs_fair_claim_idx" in warning
    assert warning.endswith(fair_index.CREATE_SQL)
    # Built by hand as the warning says, it is what a fair worker builds.
    db.execute(fair_index.CREATE_SQL)
    assert index_row(db) == (DEFINITION, True)
