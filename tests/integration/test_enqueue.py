"""Enqueue on real Postgres: ids, options, the caller's transaction, bulk inserts, unique
keys, bad input rejected before anything is inserted, names as data, and NOTIFY wake-ups."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from akadze_core import App, InvalidArgs, Worker
from akadze_core.enqueue.encoding import BULK_CHUNK
from akadze_core.store.floors import parse_notice
from tests.helpers import job
from tests.integration.lease_support import (
    claim,
    fake_worker,
    job_count,
    listening,
    running,
    scalar,
    wait_until,
)

HOSTILE = "x'); DROP TABLE akadze.jobs;--"


def make_tasks(app: App) -> Any:
    @app.task("mail.send")
    async def send(**kwargs: Any) -> None:
        return None

    return send


# --- plain enqueue -------------------------------------------------------------------------


async def test_enqueue_sync_and_async_return_the_ids_of_queued_rows(
    app: App, db: psycopg.Connection
) -> None:
    send = make_tasks(app)
    first = send.enqueue(to="ada", n=1)
    second = await send.enqueue_async(to="bob", nested={"list": [1, 2.5, None, True]})
    assert isinstance(first, int) and isinstance(second, int) and first != second

    row = job(db, first)
    assert (row["task"], row["queue"], row["state"]) == ("mail.send", "default", "queued")
    assert row["args"] == {"to": "ada", "n": 1}
    assert (row["attempt"], row["max_attempts"], row["run_count"], row["priority"]) == (0, 3, 0, 0)
    assert row["errors"] == [] and row["result"] is None and row["worker_id"] is None
    assert job(db, second)["args"] == {"to": "bob", "nested": {"list": [1, 2.5, None, True]}}
    # No delay: due at once by the database's clock.
    assert scalar(db, "SELECT scheduled_at <= now() FROM akadze.jobs WHERE id = %s", (first,))


async def test_task_defaults_are_stored(app: App, db: psycopg.Connection) -> None:
    @app.task("report.build", queue="reports", max_attempts=7, priority=4)
    def build() -> None:
        return None

    row = job(db, build.enqueue())
    assert (row["queue"], row["max_attempts"], row["priority"]) == ("reports", 7, 4)


async def test_changed_task_defaults_are_stored_from_the_next_enqueue(
        app: App, db: psycopg.Connection) -> None:
    @app.task("report.build", queue="reports", max_attempts=7, priority=4)
    def build() -> None:
        return None

    call = build.configure(priority=9)  # its own priority, the task's other defaults
    assert job(db, build.enqueue())["queue"] == job(db, call.enqueue())["queue"] == "reports"
    build.queue, build.max_attempts, build.priority = "later", 2, 1
    rows = [job(db, build.enqueue()), job(db, call.enqueue())]
    assert [(row["queue"], row["max_attempts"], row["priority"]) for row in rows] == [
        ("later", 2, 1), ("later", 2, 9)]


async def test_configure_stores_every_option(app: App, db: psycopg.Connection) -> None:
    send = make_tasks(app)
    expires = datetime(2999, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    delayed = send.configure(delay=timedelta(minutes=5), queue="slow", priority=-3,
                             expires_at=expires, max_attempts=9, unique_key="k1").enqueue(x=1)
    row = job(db, delayed)
    assert (row["queue"], row["priority"], row["max_attempts"], row["unique_key"]) == \
        ("slow", -3, 9, "k1")
    assert row["expires_at"] == expires
    # The delay is added to the database clock, in the insert itself.
    assert row["scheduled_at"] - row["created_at"] == timedelta(minutes=5)
    assert scalar(db, "SELECT scheduled_at > now() + interval '4 minutes' FROM akadze.jobs"
                      " WHERE id = %s", (delayed,))

    seconds = send.configure(delay=90).enqueue()
    row = job(db, seconds)
    assert row["scheduled_at"] - row["created_at"] == timedelta(seconds=90)

    at = datetime(2030, 6, 1, 12, 0, tzinfo=timezone(timedelta(hours=3)))
    row = job(db, send.configure(at=at).enqueue())
    assert row["scheduled_at"] == at

    # A later configure(at=...) replaces an earlier delay, and the reverse.
    row = job(db, send.configure(delay=timedelta(hours=1)).configure(at=at).enqueue())
    assert row["scheduled_at"] == at
    row = job(db, send.configure(at=at).configure(delay=timedelta(seconds=30)).enqueue())
    assert row["scheduled_at"] - row["created_at"] == timedelta(seconds=30)

    # A past `at` is due at once.
    past = await send.configure(at=datetime(2001, 1, 1, tzinfo=timezone.utc)).enqueue_async()
    assert job(db, past)["scheduled_at"] == datetime(2001, 1, 1, tzinfo=timezone.utc)

    with pytest.raises(ValueError):
        send.configure(delay=1, at=at)
    with pytest.raises(ValueError):
        send.configure(max_attempts=0)


# --- the caller's transaction --------------------------------------------------------------


async def test_using_a_sync_connection_joins_its_transaction(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    send = make_tasks(app)
    with psycopg.connect(database_url) as session:  # not autocommit: a transaction is open
        committed = send.using(session=session).enqueue(n=1)
        many = send.using(session=session).enqueue_many([{"n": 2}, {"n": 3}])
        assert isinstance(committed, int)
        assert job_count(db) == 0  # not visible before the caller commits
        session.commit()
        assert job_count(db) == 3
        assert job(db, committed)["args"] == {"n": 1}
        assert [job(db, i)["args"]["n"] for i in many] == [2, 3]

        gone = send.using(session=session).enqueue(n=4)
        session.execute("SELECT 1")  # the caller's own work in the same transaction
        session.rollback()
    assert job_count(db) == 3
    assert scalar(db, "SELECT count(*) FROM akadze.jobs WHERE id = %s", (gone,)) == 0


async def test_using_an_async_connection_joins_its_transaction(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    send = make_tasks(app)
    async with await psycopg.AsyncConnection.connect(database_url) as session:
        awaitable = send.using(session=session).enqueue(n=1)
        committed = await awaitable
        second = await send.using(session=session).enqueue_async(n=2)
        many = await send.using(session=session).enqueue_many_async([{"n": 3}, {"n": 4}])
        also = await send.using(session=session).enqueue_many([{"n": 5}])
        assert job_count(db) == 0
        await session.commit()
        assert job_count(db) == 5
        assert [job(db, i)["args"]["n"] for i in [committed, second, *many, *also]] == \
            [1, 2, 3, 4, 5]

        await send.using(session=session).enqueue_async(n=6)
        await send.using(session=session).enqueue_many_async([{"n": 7}])
        await session.rollback()
    assert job_count(db) == 5


async def test_enqueue_async_refuses_a_sync_session(app: App, database_url: str) -> None:
    send = make_tasks(app)
    with psycopg.connect(database_url) as session:
        with pytest.raises(TypeError):
            await send.using(session=session).enqueue_async(n=1)
        with pytest.raises(TypeError):
            await send.using(session=session).enqueue_many_async([{"n": 1}])


# --- bulk ------------------------------------------------------------------------------------


async def test_enqueue_many_returns_ids_in_input_order(app: App, db: psycopg.Connection) -> None:
    send = make_tasks(app)
    ids = send.enqueue_many([{"i": i} for i in range(300)])
    assert len(ids) == len(set(ids)) == 300
    stored = dict(db.execute("SELECT id, (args->>'i')::int FROM akadze.jobs").fetchall())
    assert [stored[i] for i in ids] == list(range(300))

    more = await send.configure(queue="bulk", priority=2, delay=timedelta(minutes=1)) \
        .enqueue_many_async({"i": i} for i in range(50))
    assert len(more) == 50
    rows = db.execute(
        "SELECT id, (args->>'i')::int, queue, priority, scheduled_at - created_at"
        " FROM akadze.jobs WHERE queue = 'bulk'").fetchall()
    by_id = {row[0]: row[1:] for row in rows}
    assert [by_id[i][0] for i in more] == list(range(50))
    assert {row[1:] for row in by_id.values()} == {("bulk", 2, timedelta(minutes=1))}
    assert send.enqueue_many([]) == [] and await send.enqueue_many_async([]) == []


async def test_one_bad_item_in_a_batch_inserts_nothing(app: App, db: psycopg.Connection) -> None:
    send = make_tasks(app)
    batch: list[dict[str, Any]] = [{"i": i} for i in range(10)]
    batch[7] = {"i": {1, 2}}
    with pytest.raises(InvalidArgs):
        send.enqueue_many(batch)
    with pytest.raises(InvalidArgs):
        await send.enqueue_many_async(batch)
    batch[7] = {"i": "nul\x00"}
    with pytest.raises(InvalidArgs):
        send.enqueue_many(batch)
    assert job_count(db) == 0


# Bulk args travel as JSON arrays of BULK_CHUNK jobs: these batches span several of them.
TRICKY: list[dict[str, Any]] = [
    {}, {"unicode": "😀 ünï 日本", "é": "clé"}, {"escaped": "\\u0000", "quote": "'\"\\"},
    {"nested": {"list": [1, 2.5, None, True, {"deep": []}]}, "tab": "a\tb\nc"},
    {"big": 10**30, "neg": -0.5}, {"hostile": HOSTILE},
]


async def test_bulk_across_chunks_stores_every_job_exactly_in_input_order(
    app: App, db: psycopg.Connection
) -> None:
    send = make_tasks(app)
    batch = [dict(TRICKY[i % len(TRICKY)], i=i) for i in range(2 * BULK_CHUNK + 37)]
    ids = send.configure(priority=3).enqueue_many(batch)
    more = await send.configure(queue="async").enqueue_many_async(iter(batch))
    assert len(set(ids + more)) == 2 * len(batch)
    assert ids == sorted(ids) and more == sorted(more)  # ascending: FIFO for the claim
    stored = dict(db.execute("SELECT id, args FROM akadze.jobs").fetchall())
    assert [stored[i] for i in ids] == batch and [stored[i] for i in more] == batch
    rows = db.execute("SELECT DISTINCT queue, priority, meta, max_attempts FROM akadze.jobs"
                      " ORDER BY queue").fetchall()
    assert rows == [("async", 0, {}, 3), ("default", 3, {}, 3)]


@pytest.mark.parametrize("position", [0, BULK_CHUNK - 1, BULK_CHUNK, 2 * BULK_CHUNK + 1])
async def test_a_bad_job_in_any_chunk_inserts_nothing_with_the_same_message(
    app: App, db: psycopg.Connection, position: int
) -> None:
    send = make_tasks(app)
    for name, bad in BAD_ARGS.items():
        batch: list[dict[str, Any]] = [{"i": i} for i in range(2 * BULK_CHUNK + 2)]
        batch[position] = bad
        with pytest.raises(InvalidArgs) as single:
            send.enqueue(**bad)
        with pytest.raises(InvalidArgs) as bulk:
            send.enqueue_many(batch)
        assert str(bulk.value) == str(single.value), name
        with pytest.raises(InvalidArgs) as bulk_async:
            await send.enqueue_many_async(batch)
        assert str(bulk_async.value) == str(single.value), name
    assert job_count(db) == 0


async def test_refused_bulk_input_leaves_the_callers_transaction_usable(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    """Validation happens before any SQL: the caller's transaction is not aborted."""
    send = make_tasks(app)
    bad: list[dict[str, Any]] = [{"i": i} for i in range(BULK_CHUNK + 5)]
    bad[-1] = {"i": float("nan")}
    with psycopg.connect(database_url) as session:
        kept = send.using(session=session).enqueue(n=1)
        with pytest.raises(InvalidArgs):
            send.using(session=session).enqueue_many(bad)
        many = send.using(session=session).enqueue_many(bad[:-1])
        session.commit()
    async with await psycopg.AsyncConnection.connect(database_url) as async_session:
        with pytest.raises(InvalidArgs):
            await send.using(session=async_session).enqueue_many_async(bad)
        more = await send.using(session=async_session).enqueue_many_async(bad[:3])
        await async_session.commit()
    assert job_count(db) == 1 + len(bad) - 1 + 3
    assert job(db, kept)["args"] == {"n": 1}
    assert [job(db, i)["args"] for i in many + more] == bad[:-1] + bad[:3]


async def test_a_bulk_insert_that_fails_in_the_database_inserts_nothing(
    database_url: str, db: psycopg.Connection
) -> None:
    """A dumps that returns text jsonb refuses (after validation passed): the statement
    fails as a whole, whichever chunk the bad text is in."""
    def dumps(value: Any) -> str:
        return "{oops" if value.get("i") == BULK_CHUNK + 1 else json.dumps(value)

    app = App(database_url, json_dumps=dumps)
    try:
        send = make_tasks(app)
        with pytest.raises(psycopg.errors.InvalidTextRepresentation):
            send.enqueue_many([{"i": i} for i in range(2 * BULK_CHUNK)])
        assert job_count(db) == 0
    finally:
        await app.close_async()


async def test_bulk_with_a_custom_dumps_and_a_small_size_limit(
    database_url: str, db: psycopg.Connection
) -> None:
    """Every job is checked alone against the limit, whatever the batch's total size."""
    app = App(database_url, max_args_bytes=60,
              json_dumps=lambda value: json.dumps(value, indent=1, ensure_ascii=False))
    try:
        send = make_tasks(app)
        batch = [{"i": i, "s": "é" * 10} for i in range(2 * BULK_CHUNK + 1)]
        ids = send.enqueue_many(batch)
        assert [job(db, i)["args"] for i in ids[::50]] == batch[::50]
        with pytest.raises(InvalidArgs, match="over the limit of 60 bytes"):
            send.enqueue_many([*batch, {"i": 0, "s": "é" * 30}])
        assert job_count(db) == len(batch)
    finally:
        await app.close_async()


async def test_enqueue_with_task_id_splices_the_id_into_the_kept_meta(
    app: App, db: psycopg.Connection
) -> None:
    send = make_tasks(app)
    first = send.enqueue_with_task_id("id-1", to="a")
    assert (job(db, first)["meta"], job(db, first)["args"]) == ({"task_id": "id-1"}, {"to": "a"})
    assert app.find_job("id-1").id == first  # type: ignore[union-attr]
    call = send.configure(meta={"celery": {"x": [1, "é"]}, "task_id": "replaced"})
    ids = [call.enqueue_with_task_id(f"id-{n}", n=n) for n in range(2, 5)]
    encoded = call._meta_text
    assert [job(db, i)["meta"] for i in ids] == [
        {"celery": {"x": [1, "é"]}, "task_id": f"id-{n}"} for n in range(2, 5)]
    assert call._meta_text is encoded  # the meta is encoded once, each id spliced in
    assert job(db, call.enqueue(n=0))["meta"]["task_id"] == "replaced"  # plain enqueue: as is
    # Any text a task id may be, as JSON: quotes, backslashes, non-ASCII.
    odd = 'a"b\\c\u00e9\u2028' + HOSTILE
    assert job(db, send.enqueue_with_task_id(odd))["meta"] == {"task_id": odd}
    for bad, message in (("nul\x00", "NUL"), ("\ud800", "surrogate"), (7, "must be a str")):
        with pytest.raises(InvalidArgs, match=message):
            send.enqueue_with_task_id(bad)  # type: ignore[arg-type]
    assert job_count(db) == 6


async def test_enqueue_with_task_id_with_a_custom_dumps_and_a_small_size_limit(
    database_url: str, db: psycopg.Connection
) -> None:
    app = App(database_url, max_args_bytes=60,
              json_dumps=lambda value: json.dumps(value, indent=2, ensure_ascii=False) + "\n")
    try:
        call = make_tasks(app).configure(meta={"k": "é"})
        job_id = call.enqueue_with_task_id("t" * 20)
        assert job(db, job_id)["meta"] == {"k": "é", "task_id": "t" * 20}
        with pytest.raises(InvalidArgs, match="over the limit of 60 bytes"):
            call.enqueue_with_task_id("t" * 40)
        assert job_count(db) == 1
    finally:
        await app.close_async()


async def test_one_notify_per_queue_for_a_bulk_insert_of_many_chunks(
    app: App, database_url: str
) -> None:
    send = make_tasks(app)
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN akadze_jobs")
        send.configure(queue="c").enqueue_many([{"n": n} for n in range(3 * BULK_CHUNK)])
        await send.configure(queue="d").enqueue_many_async([{}] * (BULK_CHUNK + 1))
        send.configure(queue="marker").enqueue()
        assert drain_notifies(listener, "marker") == ["c", "d"]


# --- single enqueue from many threads on the shared pool ------------------------------------


async def test_enqueue_from_many_threads_on_a_small_pool(
    database_url: str, db: psycopg.Connection
) -> None:
    """Pooled connections keep a cursor each for reuse: threads taking turns on two
    connections must still get their own rows back."""
    app = App(database_url, pool_size=2)
    try:
        send = make_tasks(app)
        keyed = send.configure(unique_key="shared")
        got: dict[int, list[tuple[int, int]]] = {}

        def enqueue_some(thread: int) -> None:
            got[thread] = [(n, send.enqueue(thread=thread, n=n)) for n in range(40)]
            got[thread].append((-1, keyed.enqueue(thread=thread, n=-1)))

        threads = [threading.Thread(target=enqueue_some, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            await asyncio.to_thread(thread.join, 60)
        stored = {row[0]: row[1] for row in db.execute("SELECT id, args FROM akadze.jobs")}
        assert len(stored) == 8 * 40 + 1
        for thread, pairs in got.items():
            for n, job_id in pairs[:-1]:
                assert stored[job_id] == {"thread": thread, "n": n}
        assert len({pairs[-1][1] for pairs in got.values()}) == 1  # one holder of the key
    finally:
        await app.close_async()


async def test_enqueue_recovers_after_its_pooled_connections_are_killed(
    app: App, db: psycopg.Connection
) -> None:
    send = make_tasks(app)
    first = send.enqueue(n=0)
    killed = db.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                        ).fetchone()
    assert killed is not None and killed[0] >= 1
    done, failures = [first], 0
    while len(done) < 4:  # a dead pooled connection fails its call once and is replaced
        try:
            done.append(send.enqueue(n=len(done)))
        except psycopg.OperationalError:
            failures += 1
            assert failures <= app.pool_size
    assert [job(db, i)["args"] for i in done] == [{"n": n} for n in range(4)]
    assert job_count(db) == 4


def _backends(db: psycopg.Connection) -> int:
    """Client connections to the test database other than ``db`` itself."""
    return int(scalar(db, "SELECT count(*) FROM pg_stat_activity WHERE datname ="
                          " current_database() AND pid <> pg_backend_pid()"
                          " AND backend_type = 'client backend'"))


def _pid(connection: psycopg.Connection) -> int:
    return int(connection.info.backend_pid)


async def test_single_enqueues_share_one_connection_that_close_ends(
    app: App, db: psycopg.Connection
) -> None:
    """One-by-one enqueues run on the app's single-call connection, not through the pool's
    getconn/putconn: one backend serves them all, and close() ends it."""
    send = make_tasks(app)
    ids = [send.enqueue(n=n) for n in range(5)]
    assert [job(db, i)["args"] for i in ids] == [{"n": n} for n in range(5)]
    assert _backends(db) == 1
    first = app.run_single(_pid)
    assert app.run_single(_pid) == first
    app.close()
    await wait_until(lambda: _backends(db) == 0)
    assert send.enqueue(n=5) > ids[-1]  # a closed app connects again, like its pool


async def test_the_single_connections_kept_poller_sees_its_backend_terminated(
    app: App, db: psycopg.Connection
) -> None:
    """The single-call connection is checked before each call with a poller kept for its
    socket (``liveness.watch``): one killed while idle is found dead and replaced, and the
    call runs once, on the new one; a live one is not found dead."""
    from akadze_core.store.liveness import found_dead, watch

    send = make_tasks(app)
    first = app.run_single(_pid)
    with psycopg.connect(app.database_url, autocommit=True) as other:
        watcher = watch(other)
        assert not found_dead(other, watcher)
        db.execute("SELECT pg_terminate_backend(%s)", (_pid(other),))
        await wait_until(lambda: found_dead(other, watcher))
    db.execute("SELECT pg_terminate_backend(%s)", (first,))
    await wait_until(lambda: scalar(db, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                    (first,)) == 0)
    sent = send.enqueue(n=1)
    assert app.run_single(_pid) != first
    assert [job(db, sent)["args"]] == [{"n": 1}]
    assert scalar(db, "SELECT count(*) FROM akadze.jobs") == 1


async def test_a_call_made_while_the_single_connection_is_busy_takes_a_pooled_one(
    database_url: str, db: psycopg.Connection
) -> None:
    """Nobody waits for the single-call connection: a call that finds it in use (here, a
    call made from inside one) runs on the pool, even a pool of one connection."""
    app = App(database_url, pool_size=1)
    try:
        send = make_tasks(app)
        inner: list[int] = []

        def outer(connection: psycopg.Connection) -> int:
            inner.append(app.run_single(_pid))
            inner.append(send.enqueue(n=1))
            return _pid(connection)

        outer_pid = app.run_single(outer)
        assert inner[0] != outer_pid
        assert job(db, inner[1])["args"] == {"n": 1}
        assert app.run_single(_pid) == outer_pid  # and the single one is kept after
    finally:
        app.close()


async def test_the_single_connection_is_dropped_when_a_call_leaves_a_transaction_open(
    app: App, db: psycopg.Connection
) -> None:
    """A call that leaves its connection in a transaction (or interrupted, or broken) must
    not hand that state to the next enqueue: the connection is closed, its transaction
    rolled back, and the next call opens another."""
    make_tasks(app)
    left_open = app.run_single(lambda connection: (
        connection.execute("BEGIN"),
        connection.execute("INSERT INTO akadze.jobs (task, queue, args) VALUES ('t', 'q', '{}')"),
        _pid(connection))[-1])
    assert app.run_single(_pid) != left_open
    assert app.run_single(lambda connection: connection.info.transaction_status.name) == "IDLE"
    assert scalar(db, "SELECT count(*) FROM akadze.jobs") == 0
    await wait_until(lambda: scalar(db, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                    (left_open,)) == 0)


async def test_the_single_connection_is_replaced_after_its_lifetime(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("akadze_core.store.connections.SINGLE_LIFETIME", 0.0)
    make_tasks(app)
    pids = [app.run_single(_pid) for _ in range(3)]
    assert len(set(pids)) == 3


def test_a_forked_child_connects_on_its_own_and_leaves_the_parents_sessions_alone(
    app: App, db: psycopg.Connection
) -> None:
    """After a fork (gunicorn --preload, multiprocessing's fork), a statement on the
    parent's connection would interleave both processes' messages on one session: the
    child opens its own, and its exit does not end the parent's."""
    send = make_tasks(app)
    first = send.enqueue(n=0)
    single, pooled = app.run_single(_pid), app.run_pooled(_pid)
    child = os.fork()
    if child == 0:  # the child: no pytest here, only an exit code
        code = 1
        try:
            backends = {app.run_single(_pid), app.run_pooled(_pid)}
            job_id = send.enqueue(n=1)
            code = 0 if backends.isdisjoint({single, pooled}) and job_id > first else 3
            app.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert app.run_single(_pid) == single
    alive = db.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pooled,))
    assert alive.fetchone() == (1,)  # the pool may hand out another one of its connections
    app.run_pooled(_pid)
    assert send.enqueue(n=2) > first
    rows = db.execute("SELECT (args->>'n')::int FROM akadze.jobs ORDER BY id").fetchall()
    assert [n for (n,) in rows] == [0, 1, 2]


# --- unique keys -----------------------------------------------------------------------------


async def test_unique_key_returns_the_active_job_then_allows_a_new_one(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    send = make_tasks(app)
    keyed = send.configure(unique_key="export:42")
    first = keyed.enqueue(n=1)
    assert keyed.enqueue(n=2) == first  # queued
    assert await keyed.enqueue_async(n=3) == first
    assert job_count(db) == 1 and job(db, first)["args"] == {"n": 1}

    worker_id = fake_worker(db, ttl=60)
    [claimed] = await claim(database_url, worker_id, 5)
    assert claimed["id"] == first
    assert keyed.enqueue(n=4) == first  # running
    assert job_count(db) == 1

    for final in ("succeeded", "failed", "cancelled"):
        db.execute("UPDATE akadze.jobs SET state = %s, finished_at = now() WHERE unique_key"
                   " = 'export:42' AND state IN ('queued', 'running')", (final,))
        fresh = keyed.enqueue(n=5)
        assert fresh != first and job(db, fresh)["state"] == "queued"
        assert keyed.enqueue(n=6) == fresh
        first = fresh
    assert job_count(db) == 4
    # Other keys and no key are independent.
    assert send.configure(unique_key="export:43").enqueue() != first
    assert send.enqueue() != send.enqueue()


async def test_unique_key_inside_one_transaction(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    send = make_tasks(app)
    with psycopg.connect(database_url) as session:
        keyed = send.configure(unique_key="k").using(session=session)
        first = keyed.enqueue()
        assert keyed.enqueue() == first
        session.commit()
    assert job_count(db) == 1


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
async def test_unique_key_racing_an_uncommitted_holder(
    app: App, db: psycopg.Connection, database_url: str, outcome: str
) -> None:
    """The second enqueue waits for the first transaction and then does the right thing."""
    send = make_tasks(app)
    keyed = send.configure(unique_key="race")
    with psycopg.connect(database_url) as holder:
        held = keyed.using(session=holder).enqueue(who="holder")
        result: dict[str, Any] = {}

        def contender() -> None:
            result["id"] = keyed.enqueue(who="contender")

        thread = threading.Thread(target=contender)
        thread.start()
        # The contender is blocked on the holder's uncommitted row.
        await wait_until(lambda: scalar(
            db, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'") > 0)
        assert thread.is_alive()
        getattr(holder, outcome)()
        await asyncio.to_thread(thread.join, 10)
    assert not thread.is_alive()
    assert job_count(db) == 1
    if outcome == "commit":
        assert result["id"] == held
    else:
        assert result["id"] != held
        assert job(db, result["id"])["args"] == {"who": "contender"}


async def test_enqueue_many_refuses_unique_keys(app: App, db: psycopg.Connection) -> None:
    send = make_tasks(app)
    with pytest.raises(ValueError):
        send.configure(unique_key="k").enqueue_many([{"n": 1}])
    assert job_count(db) == 0


# --- bad input -----------------------------------------------------------------------------

def deep_list(depth: int) -> list[Any]:
    """``[[[...]]]``, ``depth`` lists deep (built without recursion)."""
    outer: list[Any] = []
    inner = outer
    for _ in range(depth - 1):
        inner.append([])
        inner = inner[0]
    return outer


BAD_ARGS = {
    "set": {"x": {1, 2}},
    "bytes": {"x": b"raw"},
    "datetime": {"when": datetime(2024, 1, 1, tzinfo=timezone.utc)},
    "object": {"x": [1, {"y": object()}]},
    "nan": {"x": float("nan")},
    "infinity": {"x": [float("-inf")]},
    "nul in value": {"x": "a\x00b"},
    "nested nul": {"x": {"y": ["ok", "\x00"]}},
    "nul in key": {"a\x00b": 1},
    "nested nul key": {"x": {"\x00": 1}},
    "lone surrogate": {"x": "\ud800"},
    "surrogate key": {"\udc00": 1},
    "nested 10,000 deep": {"x": deep_list(10_000)},
}


@pytest.mark.parametrize("args", BAD_ARGS.values(), ids=BAD_ARGS.keys())
async def test_bad_args_raise_invalid_args_and_insert_nothing(
    app: App, db: psycopg.Connection, database_url: str, args: dict[str, Any]
) -> None:
    send = make_tasks(app)
    with pytest.raises(InvalidArgs) as raised:
        send.enqueue(**args)
    assert isinstance(raised.value, ValueError)
    with pytest.raises(InvalidArgs):
        await send.enqueue_async(**args)
    with pytest.raises(InvalidArgs):
        send.enqueue_many([{"fine": 1}, args])
    with psycopg.connect(database_url) as session:
        with pytest.raises(InvalidArgs):
            send.using(session=session).enqueue(**args)
        session.commit()
    assert job_count(db) == 0


LONG = "q" * 256  # one character over MAX_NAME_LENGTH
BAD_NAMES = {
    "queue too long": ({"queue": LONG}, "a queue name is 256 characters long"),
    "queue of 8 KB": ({"queue": "q" * 8200}, "over the limit of 255"),
    "empty queue": ({"queue": ""}, None),  # "" is no queue: the task's own
    "queue with a NUL": ({"queue": "q\x00"}, "NUL"),
    "queue not a str": ({"queue": 7}, "must be a str"),
    "unique key too long": ({"unique_key": "k" * 300}, "a unique key is 300 characters"),
    "unique key with a surrogate": ({"unique_key": "k\ud800"}, "lone surrogate"),
}


@pytest.mark.parametrize(("options", "message"), BAD_NAMES.values(), ids=BAD_NAMES.keys())
async def test_bad_queue_names_and_keys_raise_invalid_args_and_insert_nothing(
    app: App, db: psycopg.Connection, database_url: str, options: dict[str, Any],
    message: str | None,
) -> None:
    send = make_tasks(app)
    call = send.configure(**options)
    if message is None:  # accepted, as every enqueue before this check: the task's queue
        assert job(db, call.enqueue())["queue"] == "default"
        return
    with pytest.raises(InvalidArgs, match=message):
        call.enqueue(x=1)
    with pytest.raises(InvalidArgs, match=message):
        await call.enqueue_async(x=1)
    if "unique_key" not in options:  # bulk enqueue refuses unique keys on its own
        with pytest.raises(InvalidArgs, match=message):
            call.enqueue_many([{"x": 1}])
    with psycopg.connect(database_url) as session:
        with pytest.raises(InvalidArgs, match=message):
            call.using(session=session).enqueue(x=1)
        session.commit()
    # A workflow whose last step is on such a queue inserts none of its steps, rather than
    # inserting them and losing the upstream's result when the step is released.
    flow = app.workflow()
    first = flow.add(send, x=1)
    with pytest.raises(InvalidArgs, match=message):
        flow.add(call, after=first, x=2)
        flow.enqueue()
    assert job_count(db) == 0


async def test_task_names_and_task_ids_have_the_same_limits(
    app: App, db: psycopg.Connection
) -> None:
    edge = "t" * 255
    long_named = app.task("t" * 256)(lambda: None)
    with pytest.raises(InvalidArgs, match="a task name is 256 characters long"):
        long_named.enqueue()
    with pytest.raises(InvalidArgs, match="a task name"):
        long_named.enqueue_many([{}])
    send = make_tasks(app)
    with pytest.raises(InvalidArgs, match="a task id is 256 characters long"):
        send.configure().enqueue_with_task_id("i" * 256, x=1)
    assert job_count(db) == 0
    # At the limit, with four bytes a character, every name fits the indexes and notices.
    wide = "\U0001f600" * 255
    at_limit = app.task(edge, queue=wide)(lambda: None)
    job_id = at_limit.configure(unique_key=wide).enqueue_with_task_id(wide)
    row = job(db, job_id)
    assert (row["task"], row["queue"], row["unique_key"]) == (edge, wide, wide)
    assert row["meta"]["task_id"] == wide


async def test_args_over_the_size_limit_are_refused(db: psycopg.Connection,
                                                     database_url: str) -> None:
    app = App(database_url, max_args_bytes=100)
    try:
        send = make_tasks(app)
        with pytest.raises(InvalidArgs, match="100 bytes"):
            send.enqueue(x="a" * 200)
        # The limit counts UTF-8 bytes, not characters: 60 characters, 120 bytes.
        with pytest.raises(InvalidArgs):
            await send.enqueue_async(x="é" * 60)
        with pytest.raises(InvalidArgs):
            send.enqueue_many([{"x": "ok"}, {"x": "a" * 200}])
        assert job_count(db) == 0
        fits = send.enqueue(x="a" * 50)
        assert job(db, fits)["args"] == {"x": "a" * 50}
    finally:
        await app.close_async()


async def test_text_that_only_looks_unstorable_is_stored_exactly(
    app: App, db: psycopg.Connection
) -> None:
    send = make_tasks(app)
    tricky = {"escaped": "\\u0000", "backslashes": "\\\\u0000", "emoji": "🙂", "quote": "'\""}
    assert job(db, send.enqueue(**tricky))["args"] == tricky


# --- names are data ------------------------------------------------------------------------


async def test_hostile_task_and_queue_names_are_stored_literally(
    app: App, db: psycopg.Connection
) -> None:
    ran: list[str] = []

    @app.task(HOSTILE, queue=HOSTILE)
    async def hostile(value: str) -> str:
        ran.append(value)
        return value

    first = hostile.enqueue(value=HOSTILE)
    [second] = hostile.enqueue_many([{"value": "bulk"}])
    third = hostile.configure(queue=HOSTILE + "2").enqueue(value="x")
    assert (job(db, first)["task"], job(db, first)["queue"]) == (HOSTILE, HOSTILE)
    assert job(db, first)["args"] == {"value": HOSTILE}
    assert job(db, second)["queue"] == HOSTILE
    assert job(db, third)["queue"] == HOSTILE + "2"
    assert job_count(db) == 3

    worker = Worker(app, queues=[HOSTILE], poll_interval=0.05, heartbeat_interval=0.2,
                    heartbeat_ttl=1)
    async with running(worker):
        await wait_until(lambda: job(db, second)["state"] == "succeeded")
    assert job(db, first)["result"] == HOSTILE
    assert sorted(ran) == sorted([HOSTILE, "bulk"])
    assert job(db, third)["state"] == "queued"
    tables = db.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'akadze' "
                        "ORDER BY tablename").fetchall()
    assert [row[0] for row in tables] == ["control_replies", "control_requests", "jobs",
                                         "limit_starts", "limits",
                                         "migrations", "queue_pauses", "repeatable_migrations",
                                         "saved_groups", "schedules",
                                         "task_id_key", "workers"]


# --- NOTIFY ----------------------------------------------------------------------------------


def drain_notifies(listener: psycopg.Connection, marker: str | None = None,
                   timeout: float = 2.0) -> list[str]:
    """The queues of the notifications received on ``listener`` until ``marker``'s arrives
    (or ``timeout`` passes); a payload's key part (akadze_core.store.floors) is left out."""
    payloads: list[str] = []
    for notify in listener.notifies(timeout=timeout):
        queue, _ = parse_notice(notify.payload)
        if queue == marker:
            break
        payloads.append(queue)
    else:
        if marker is not None:
            raise AssertionError(f"the marker notification {marker!r} never arrived")
    return payloads


async def test_one_notify_per_transaction_and_queue(
    app: App, database_url: str
) -> None:
    send = make_tasks(app)
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN akadze_jobs")
        with psycopg.connect(database_url) as session:
            for n in range(50):
                send.configure(queue="a").using(session=session).enqueue(n=n)
                send.configure(queue="b").using(session=session).enqueue(n=n)
            send.configure(queue="a").using(session=session).enqueue_many([{"n": -1}] * 20)
            session.commit()
        send.configure(queue="marker").enqueue()
        assert sorted(drain_notifies(listener, "marker")) == ["a", "b"]

        # A bulk insert outside any transaction: one notify per queue of the statement.
        send.configure(queue="c").enqueue_many([{"n": n} for n in range(30)])
        send.configure(queue="marker").enqueue()
        assert drain_notifies(listener, "marker") == ["c"]


async def test_no_notify_on_rollback_or_for_future_jobs(app: App, database_url: str) -> None:
    send = make_tasks(app)
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN akadze_jobs")
        with psycopg.connect(database_url) as session:
            send.configure(queue="a").using(session=session).enqueue()
            send.configure(queue="a").using(session=session).enqueue_many([{}, {}])
            session.rollback()
        async with await psycopg.AsyncConnection.connect(database_url) as async_session:
            await send.configure(queue="a").using(session=async_session).enqueue_async()
            await async_session.rollback()
        send.configure(queue="later", delay=timedelta(hours=1)).enqueue()
        send.configure(queue="later", delay=60).enqueue_many([{}, {}])
        await send.configure(queue="later",
                             at=datetime(2999, 1, 1, tzinfo=timezone.utc)).enqueue_async()
        send.configure(queue="marker").enqueue()
        assert drain_notifies(listener, "marker") == []


async def test_an_idle_worker_is_woken_by_notify_not_polling(
    app: App, db: psycopg.Connection
) -> None:
    done: list[float] = []

    @app.task("wake")
    async def wake() -> None:
        done.append(time.monotonic())

    # Nothing but a notification can wake this worker within the next few seconds.
    worker = Worker(app, poll_interval=30, heartbeat_interval=10, heartbeat_ttl=30,
                    prune_interval=3600)
    async with running(worker):
        await wait_until(lambda: listening(db)
                         and scalar(db, "SELECT count(*) FROM akadze.workers") == 1)
        await asyncio.sleep(0.3)  # let the first round end: the worker is now idle
        for _ in range(2):
            enqueued = time.monotonic()
            job_id = await wake.enqueue_async()
            await wait_until(lambda job_id=job_id: job(db, job_id)["state"] == "succeeded",
                             timeout=3)
            assert done[-1] - enqueued < 1.0
            await asyncio.sleep(0.3)


async def test_requeue_refuses_while_a_newer_job_holds_the_unique_key(
    app: App, db: psycopg.Connection
) -> None:
    from akadze_core import requeue

    @app.task("enqueue.keyed")
    def keyed() -> None: ...

    old = keyed.configure(unique_key="k").enqueue()
    db.execute("UPDATE akadze.jobs SET state = 'failed', finished_at = now() WHERE id = %s",
               (old,))
    newer = keyed.configure(unique_key="k").enqueue()
    assert newer != old
    async with await app.connect_async(autocommit=True) as connection:
        assert await requeue(connection, old) is False
        assert job(db, old)["state"] == "failed"
        db.execute("UPDATE akadze.jobs SET state = 'succeeded' WHERE id = %s", (newer,))
        assert await requeue(connection, old) is True
    assert job(db, old)["state"] == "queued"


def test_a_configured_call_encodes_its_meta_once_and_bad_meta_fails_at_enqueue(
        app: App, db: psycopg.Connection) -> None:
    noop = make_tasks(app)
    call = noop.configure(meta={"origin": "api", "tags": ["a"]})
    first, second = call.enqueue(n=1), call.enqueue(n=2)
    assert job(db, first)["meta"] == job(db, second)["meta"] == {"origin": "api",
                                                                  "tags": ["a"]}
    bad = noop.configure(meta={"when": object()})  # configure itself does not encode
    for _ in range(2):  # a failed encoding is not kept: it fails again, nothing inserted
        with pytest.raises(InvalidArgs):
            bad.enqueue(n=3)
    assert db.execute("SELECT count(*) FROM akadze.jobs").fetchone()[0] == 2
