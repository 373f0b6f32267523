"""An App rides through a server restart.

One process, one App, a private cluster restarted (``pg_ctl restart -m fast``) or its
backends terminated between two calls: the second call reconnects and succeeds, and no job
is inserted twice. A connection found dead before the statement was sent is replaced; one
that breaks after sending raises ``ConnectionLost`` and is not retried; a caller's own
session is never retried or replaced.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg_pool
import pytest
from kombu.exceptions import OperationalError as KombuOperationalError

import akadze_compat
from akadze_compat import Celery
from akadze_core import App, ConnectionLost, DatabaseUnavailable, Task
from tests.workers.support import (
    PrivateCluster,
    started_cluster,
    wait_until,
    with_application_name,
)

pytestmark = pytest.mark.slow

#: The App's connections carry this name, so the tests can find and terminate them.
APP_NAME = "akadze-reconnect-test"


@pytest.fixture(scope="module")
def server() -> Iterator[PrivateCluster]:
    """One private cluster for the module (each test restarts it or kills its backends)."""
    with started_cluster() as cluster:
        yield cluster


def admin(cluster: PrivateCluster) -> psycopg.Connection:
    """A fresh autocommit connection of the test's own (not the App's)."""
    return psycopg.connect(cluster.url(password=False), autocommit=True)


@pytest.fixture
def cluster(server: PrivateCluster) -> Iterator[PrivateCluster]:
    """The module's cluster, running, with an empty jobs table."""
    if not server.running:
        server.start()
    with admin(server) as connection:
        connection.execute("TRUNCATE akadze.jobs")
    yield server


@pytest.fixture
def app_url(cluster: PrivateCluster) -> str:
    """The cluster's URL, with a password and the App's application_name."""
    return with_application_name(cluster.url(), APP_NAME)


@pytest.fixture
def app(app_url: str) -> Iterator[App]:
    application = App(app_url)
    yield application
    application.close()


def make_task(app: App) -> Task:
    @app.task("reconnect.send")
    def send(n: int) -> int:
        return n

    return send


def jobs(cluster: PrivateCluster) -> list[int]:
    """The ``n`` argument of every job (a core job's, or a Celery call's keyword), in
    insertion order."""
    with admin(cluster) as connection:
        rows = connection.execute(
            "SELECT coalesce(args->>'n', args->'kwargs'->>'n')::int FROM akadze.jobs"
            " ORDER BY id").fetchall()
    return [n for (n,) in rows]


def terminate_app_backends(cluster: PrivateCluster) -> int:
    """``pg_terminate_backend`` every connection of the App; returns how many."""
    with admin(cluster) as connection:
        pids = [pid for (pid,) in connection.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (APP_NAME,))]
        for pid in pids:
            connection.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
    return len(pids)


# --- sync: the single-call connection and the pool --------------------------------------------


def test_enqueue_rides_through_a_server_restart(cluster: PrivateCluster, app: App) -> None:
    send = make_task(app)
    first = send.enqueue(n=1)
    cluster.restart()
    second = send.enqueue(n=2)  # before the fix: AdminShutdown
    assert second > first
    assert jobs(cluster) == [1, 2]


def test_enqueue_rides_through_a_terminated_backend(cluster: PrivateCluster, app: App) -> None:
    send = make_task(app)
    send.enqueue(n=1)
    assert terminate_app_backends(cluster) >= 1
    send.enqueue(n=2)
    assert jobs(cluster) == [1, 2]


def test_a_pool_whose_connections_a_restart_all_killed_recovers_at_once(
    cluster: PrivateCluster, app: App
) -> None:
    """Every pooled connection dead: enqueue_many and lookups go on at the first call,
    without the pool's check backoff (1 s, 2 s, 4 s ... per dead connection)."""
    send = make_task(app)
    pool = app.pool()
    held = [pool.getconn() for _ in range(4)]  # grow the pool to four connections
    for connection in held:
        pool.putconn(connection)
    assert send.enqueue_many([{"n": 1}, {"n": 2}]) != []
    cluster.restart()
    started = time.monotonic()
    ids = send.enqueue_many([{"n": 3}, {"n": 4}])
    assert time.monotonic() - started < 2.0
    assert jobs(cluster) == [1, 2, 3, 4]
    job = app.get_job(ids[0])
    assert job is not None and job.args == {"n": 3}
    terminate_app_backends(cluster)
    assert app.list_jobs(limit=10)[0].args == {"n": 4}  # the newest first


def test_wait_for_job_rides_through_a_restart_while_it_waits(
    cluster: PrivateCluster, app: App
) -> None:
    """Waiting only reads: a lost connection is replaced and the wait goes on."""
    send = make_task(app)
    job_id = send.enqueue(n=1)
    outcome: dict[str, Any] = {}

    def wait() -> None:
        try:
            outcome["job"] = app.wait_for_job(job_id, timeout=30)
        except BaseException as exc:  # reported to the test thread
            outcome["error"] = exc

    waiter = threading.Thread(target=wait)
    waiter.start()
    with admin(cluster) as connection:
        wait_until(lambda: connection.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            " AND state = 'idle' AND query NOT ILIKE '%%insert%%'",  # not the enqueuer
            (APP_NAME,)).fetchone() == (1,),
            what="the waiter to listen")
    cluster.restart()
    with admin(cluster) as connection:
        connection.execute("UPDATE akadze.jobs SET state = 'cancelled' WHERE id = %s",
                           (job_id,))
    waiter.join(20)
    assert "error" not in outcome, outcome
    assert outcome["job"].state == "cancelled"


# --- async ------------------------------------------------------------------------------------


async def test_async_enqueues_ride_through_a_restart_and_terminated_backends(
    cluster: PrivateCluster, app: App
) -> None:
    send = make_task(app)
    try:
        await send.enqueue_async(n=1)
        await send.enqueue_many_async([{"n": 2}])
        await asyncio.to_thread(cluster.restart)
        await send.enqueue_async(n=3)
        await send.enqueue_many_async([{"n": 4}])
        await asyncio.to_thread(terminate_app_backends, cluster)
        await send.enqueue_many_async([{"n": 5}])
        await send.enqueue_async(n=6)
        job = await app.get_job_async(1)
        assert job is None or job.task == "reconnect.send"
    finally:
        await app.close_async()
    assert jobs(cluster) == [1, 2, 3, 4, 5, 6]


async def test_an_async_pool_whose_first_open_failed_is_replaced_once_the_server_is_up(
    cluster: PrivateCluster, app: App
) -> None:
    """psycopg closes a pool whose open timed out, for good ("cannot be reused"): the App
    kept it as the loop's pool, so every later async call on that loop raised PoolClosed,
    however long the server had been back (the fleet soak's children, max_connections
    full for a moment)."""
    send = make_task(app)
    await asyncio.to_thread(cluster.stop)
    try:
        with pytest.raises((DatabaseUnavailable, psycopg_pool.PoolTimeout)):
            await send.enqueue_async(n=1)
        await asyncio.to_thread(cluster.start)
        await send.enqueue_async(n=2)  # before the fix: PoolClosed
    finally:
        await app.close_async()
    assert jobs(cluster) == [2]


# --- after the statement was sent: ConnectionLost, never a retry ------------------------------


def _terminate_when_blocked(cluster: PrivateCluster, run: Any) -> BaseException:
    """Run ``run()`` in a thread while the jobs table is locked, terminate the App backend
    that waits on the lock (its INSERT was sent), release the lock; returns what ``run``
    raised. A retry would insert once the lock is gone."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = run()
        except BaseException as exc:  # reported to the test thread
            outcome["error"] = exc

    with admin(cluster) as locker:
        locker.execute("BEGIN")
        locker.execute("LOCK TABLE akadze.jobs IN SHARE MODE")  # blocks INSERT, not SELECT
        thread = threading.Thread(target=target)
        thread.start()
        with admin(cluster) as watcher:
            def blocked() -> list[tuple[int]]:
                return watcher.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
                    " AND wait_event_type = 'Lock'", (APP_NAME,)).fetchall()

            wait_until(lambda: len(blocked()) == 1, what="the insert to wait on the lock")
            (pid,), = blocked()
            watcher.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
        thread.join(10)
        locker.execute("ROLLBACK")
    assert not thread.is_alive()
    assert "value" not in outcome, f"returned {outcome.get('value')!r} instead of raising"
    return outcome["error"]


def test_a_connection_lost_after_the_insert_was_sent_raises_and_is_not_retried(
    cluster: PrivateCluster, app: App
) -> None:
    send = make_task(app)
    send.enqueue(n=1)  # the single-call connection is open
    error = _terminate_when_blocked(cluster, lambda: send.enqueue(n=2))
    assert isinstance(error, ConnectionLost), repr(error)
    assert isinstance(error, psycopg.OperationalError)  # what handlers caught before
    assert "may or may not have been enqueued" in str(error)
    assert PrivateCluster.PASSWORD not in str(error)
    assert isinstance(error.__cause__, psycopg.Error)
    time.sleep(0.2)
    assert jobs(cluster) == [1]  # not sent again once the lock was gone
    send.enqueue(n=3)  # and the next call reconnects
    assert jobs(cluster) == [1, 3]


def test_a_bulk_insert_lost_after_sending_raises_and_is_not_retried(
    cluster: PrivateCluster, app: App
) -> None:
    send = make_task(app)
    error = _terminate_when_blocked(cluster, lambda: send.enqueue_many([{"n": 1}, {"n": 2}]))
    assert isinstance(error, ConnectionLost), repr(error)
    assert "may or may not have been enqueued" in str(error)
    time.sleep(0.2)
    assert jobs(cluster) == []


# --- the caller's session: never retried, never replaced ------------------------------------


def test_a_callers_session_that_died_raises_and_is_not_retried(
    cluster: PrivateCluster, app: App, app_url: str
) -> None:
    send = make_task(app)
    send.enqueue(n=0)  # the App's own connection exists and stays alive
    with admin(cluster) as watcher:
        session = psycopg.connect(with_application_name(cluster.url(), "caller-session"))
        with session:
            send.using(session=session).enqueue(n=1)  # opens the caller's transaction
            pid = session.info.backend_pid
            watcher.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
            with pytest.raises(psycopg.OperationalError):
                send.using(session=session).enqueue(n=2)
            assert session.closed  # not replaced behind the caller's back
    assert jobs(cluster) == [0]  # the transaction's insert was lost with it, and no retry


# --- the Celery facade ------------------------------------------------------------------------


@pytest.fixture
def celery(app_url: str) -> Iterator[Celery]:
    application = Celery("proj", broker=app_url, set_as_current=False)
    yield application
    if application._core is not None:
        application._core.close()
    application.close()


def test_compat_delay_and_send_task_ride_through_a_restart(
    cluster: PrivateCluster, celery: Celery
) -> None:
    @celery.task(name="reconnect.add")
    def add(n: int) -> int:
        return n

    first = add.delay(n=1)
    celery.send_task("reconnect.add", kwargs={"n": 2})
    cluster.restart()
    add.delay(n=3)
    celery.send_task("reconnect.add", kwargs={"n": 4})
    terminate_app_backends(cluster)
    add.apply_async(kwargs={"n": 5})
    assert jobs(cluster) == [1, 2, 3, 4, 5]
    with admin(cluster) as connection:
        connection.execute("UPDATE akadze.jobs SET state = 'succeeded', result = '11'"
                           " WHERE args->'kwargs'->>'n' = '1'")
    cluster.restart()
    assert celery.AsyncResult(first.id).get(timeout=10) == 11


def test_compat_delay_lost_after_sending_raises_kombus_operational_error(
    cluster: PrivateCluster, celery: Celery
) -> None:
    @celery.task(name="reconnect.add")
    def add(n: int) -> int:
        return n

    add.delay(n=1)  # the plain call's fast path, kept for the next one
    error = _terminate_when_blocked(cluster, lambda: add.delay(n=2))
    assert isinstance(error, KombuOperationalError) and isinstance(error, ConnectionLost)
    assert "may or may not have been enqueued" in str(error)
    assert isinstance(error.__cause__, psycopg.Error)
    error = _terminate_when_blocked(
        cluster, lambda: celery.send_task("reconnect.add", kwargs={"n": 3}))
    assert isinstance(error, KombuOperationalError) and isinstance(error, ConnectionLost)
    time.sleep(0.2)
    assert jobs(cluster) == [1]


def test_compat_delay_in_a_transaction_whose_connection_died_raises(
    cluster: PrivateCluster, celery: Celery
) -> None:
    @celery.task(name="reconnect.in_tx")
    def in_tx() -> None: ...

    with admin(cluster) as watcher:
        connection = psycopg.connect(with_application_name(cluster.url(), "caller-session"))
        with connection:
            watcher.execute("SELECT pg_terminate_backend(%s, 5000)",
                            (connection.info.backend_pid,))
            with pytest.raises(psycopg.OperationalError), \
                    akadze_compat.transaction(connection):
                in_tx.delay()
            assert connection.closed
    assert jobs(cluster) == []
