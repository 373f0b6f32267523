"""Failover to a promoted replica.

A primary and a streaming replica (pg_basebackup, both private clusters); a worker process
and a producer in the test process run on one multi-host URL with
``target_session_attrs=read-write``. The primary is stopped and the replica promoted while
they run: the worker (same process, same worker id) and the App reconnect to the new primary
on their own, every job whose enqueue returned an id is on the new primary and succeeds,
jobs that were running at the stop finish under the same worker, and nothing runs twice.

The stop is ``pg_ctl stop -m fast``: a clean shutdown sends the connected standby all the WAL
up to the shutdown checkpoint, and waits for it to be flushed there, before the server
exits, so an asynchronous replica loses nothing acknowledged. A crash (``-m immediate``, a
host lost) can lose the last commits the replica had not received yet; see
docs/reference/guarantees.md.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from akadze_core import App, ConnectionLost
from akadze_core.store.migrations import migrate
from tests.workers.support import (
    RUNS_TABLE,
    PrivateCluster,
    WorkerProcess,
    wait_until,
    with_application_name,
)
from tests.workers.worker_app import build_app

pytestmark = pytest.mark.slow

#: Long enough to ride out the failover (stop, a second with no primary, promotion, the
#: pool's reconnect backoff): a worker whose heartbeat fails for longer exits 1 by design.
HEARTBEAT_TTL = 10.0
#: Seconds with no writable server between the primary's stop and the promotion.
NO_PRIMARY = 1.0


def connect(cluster: PrivateCluster) -> psycopg.Connection:
    """A fresh autocommit connection of the test's own, to that server only."""
    return psycopg.connect(cluster.url(password=False), autocommit=True)


def caught_up(primary: PrivateCluster) -> bool:
    """The standby streams and has replayed everything the primary wrote so far."""
    with connect(primary) as connection:
        row = connection.execute(
            "SELECT state, replay_lsn >= pg_current_wal_lsn() FROM pg_stat_replication"
        ).fetchone()
    return row == ("streaming", True)


@pytest.fixture
def pair() -> Iterator[tuple[PrivateCluster, PrivateCluster]]:
    """A migrated primary with a runs table, and a streaming replica of it (caught up)."""
    clusters: list[PrivateCluster] = []
    try:
        try:
            primary = PrivateCluster()
            clusters.append(primary)
            primary.start()
            with connect(primary) as connection:
                migrate(connection)
                connection.execute(RUNS_TABLE)
            replica = PrivateCluster(replica_of=primary)
            clusters.append(replica)
            replica.start()
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            pytest.skip(f"cannot create a primary and a replica: {exc}")
        with connect(replica) as connection:
            assert connection.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        wait_until(lambda: caught_up(primary), what="the replica to catch up")
        yield primary, replica
    finally:
        for cluster in clusters:
            cluster.destroy()


def multi_host_url(primary: PrivateCluster, replica: PrivateCluster) -> str:
    """Both servers, the writable one chosen at each connect (libpq's multi-host URL)."""
    return (f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{replica.port}"
            "/postgres?target_session_attrs=read-write")


class Producer(threading.Thread):
    """Enqueues ``quick`` jobs back to back until stopped; keeps every id returned and
    every error raised (with the time it was raised)."""

    def __init__(self, app: App) -> None:
        super().__init__(name="producer", daemon=True)
        self.app = app
        self.ids: list[int] = []
        #: (monotonic start, monotonic end) of each enqueue that returned an id.
        self.calls: list[tuple[float, float]] = []
        self.errors: list[BaseException] = []
        self.done = threading.Event()

    def run(self) -> None:
        quick = self.app.tasks["quick"]
        while not self.done.is_set():
            started = time.monotonic()
            try:
                self.ids.append(quick.enqueue())
                self.calls.append((started, time.monotonic()))
            except Exception as exc:  # noted; the producer goes on, as a service would
                self.errors.append(exc)
                time.sleep(0.05)
            time.sleep(0.005)

    def stop(self) -> None:
        self.done.set()
        self.join(30)
        assert not self.is_alive()


def running_started(primary: PrivateCluster, ids: list[int]) -> bool:
    with connect(primary) as connection:
        (started,), = connection.execute(
            "SELECT count(DISTINCT job_id) FROM runs WHERE job_id = ANY(%s)", (ids,))
    return started == len(ids)


def job_states(cluster: PrivateCluster) -> dict[int, str]:
    with connect(cluster) as connection:
        return dict(connection.execute("SELECT id, state FROM akadze.jobs").fetchall())


def test_workers_and_the_app_fail_over_to_the_promoted_replica_and_lose_nothing(
    pair: tuple[PrivateCluster, PrivateCluster], tmp_path: Path
) -> None:
    primary, replica = pair
    url = multi_host_url(primary, replica)
    worker = WorkerProcess(with_application_name(url), tmp_path / "worker.log",
                           ["--slots", "8", "--heartbeat-ttl", str(HEARTBEAT_TTL)])
    app = build_app(url)
    producer = Producer(app)
    try:
        worker.wait_started()
        with connect(primary) as connection:
            (worker_id,), = connection.execute("SELECT id FROM akadze.workers")
        producer.start()
        wait_until(lambda: len(producer.ids) >= 50, what="jobs before the failover")
        # Jobs running on the old primary when it stops: their outcome is written on the
        # new one, by the same worker.
        sleep = app.tasks["sleep"]
        long_ids = [sleep.enqueue(seconds=1.5) for _ in range(3)]
        wait_until(lambda: running_started(primary, long_ids), what="the long jobs to start")
        wait_until(lambda: caught_up(primary), what="the replica to catch up")
        before = len(producer.ids)

        primary.stop("fast")
        stopped = time.monotonic()
        time.sleep(NO_PRIMARY)  # nobody can write: the replica is read-only until promoted
        replica.promote()
        promoted = time.monotonic()

        wait_until(lambda: len(producer.ids) >= before + 50, timeout=30,
                   what="jobs enqueued after the promotion")
        producer.stop()
        ids = producer.ids
        wait_until(lambda: all(job_states(replica).get(job_id) == "succeeded"
                               for job_id in [*ids, *long_ids]),
                   timeout=30, what="every acknowledged job to succeed on the new primary")

        assert worker.proc.poll() is None, worker.log()  # no restart, no exit 1
        with connect(replica) as connection:
            states = dict(connection.execute("SELECT id, state FROM akadze.jobs").fetchall())
            runs: dict[int, list[tuple[int, int]]] = {}
            for job_id, run_count, pid in connection.execute(
                    "SELECT job_id, run_count, pid FROM runs ORDER BY started"):
                runs.setdefault(job_id, []).append((run_count, pid))
            workers = connection.execute("SELECT id FROM akadze.workers").fetchall()
    finally:
        producer.done.set()
        app.close()
        worker.stop()
    log = worker.log()
    # Every acknowledged enqueue reached the replica (a clean stop loses nothing) ...
    missing = [job_id for job_id in [*ids, *long_ids] if job_id not in states]
    assert missing == []
    # ... and each of its jobs ran exactly once, by this worker process. A task whose own
    # connection (the runs insert) failed in the gap spent an attempt before it recorded
    # anything, so its one recorded run may be a later run_count; the jobs that were
    # running at the stop finished in their first run, not rescued and run again.
    not_once = {job_id: runs.get(job_id) for job_id in [*ids, *long_ids]
                if [pid for _, pid in runs.get(job_id, [])] != [worker.pid]}
    assert not_once == {}
    assert [runs[job_id] for job_id in long_ids] == [[(1, worker.pid)]] * len(long_ids)
    assert "rescued" not in log and "declared dead" not in log, log
    assert workers == [(worker_id,)]  # the same worker row, still heartbeating
    # Enqueues during the gap waited for the new primary; one in flight at the stop may
    # raise ConnectionLost (its outcome unknown), nothing else.
    unexpected = [error for error in producer.errors if not isinstance(error, ConnectionLost)]
    assert unexpected == [], unexpected
    assert promoted - stopped < HEARTBEAT_TTL
    # An enqueue in progress while no server took writes waited for the promotion and
    # returned its id (the App's found_dead + RECONNECT_WINDOW, on the multi-host URL).
    assert any(start < promoted - NO_PRIMARY / 2 and promoted < end
               for start, end in producer.calls)


def test_a_worker_on_a_read_only_server_stops_with_one_line_naming_target_session_attrs(
    pair: tuple[PrivateCluster, PrivateCluster], tmp_path: Path
) -> None:
    """Both hosts but no ``target_session_attrs``: with the primary down, libpq settles on
    the standby, whose first write (the worker's registration) is refused with 25006. That
    no wait fixes (the server may be a standby for good): one line saying what to set."""
    primary, replica = pair
    primary.stop("fast")
    url = (f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{replica.port}"
           "/postgres")
    worker = WorkerProcess(url, tmp_path / "worker.log", [])
    try:
        code, _ = worker.wait_exit(timeout=30)
    finally:
        worker.stop()
    assert code == 1, worker.log()
    last = worker.log().strip().splitlines()[-2]  # before worker_app's own exit line
    assert last.startswith("akadze: error: the server is read-only"), worker.log()
    assert "target_session_attrs=read-write" in last
    app = build_app(url)
    try:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):  # an enqueue: 25006 too
            app.tasks["quick"].enqueue()
    finally:
        app.close()


def disconnect(replica: PrivateCluster) -> None:
    """Stop the standby's WAL receiver (it stays a standby): from here on the primary's
    commits do not reach it, as when a replica lags behind or its network is cut."""
    with connect(replica) as connection:
        connection.execute("ALTER SYSTEM SET primary_conninfo = ''")
        connection.execute("SELECT pg_reload_conf()")
        wait_until(lambda: connection.execute(
            "SELECT count(*) FROM pg_stat_wal_receiver").fetchone() == (0,),
            what="the WAL receiver to stop")


def test_a_crash_loses_the_commits_the_asynchronous_replica_had_not_received(
    pair: tuple[PrivateCluster, PrivateCluster]
) -> None:
    """What asynchronous replication can lose, shown: enqueues the primary acknowledged
    while the replica lagged are gone after a crash (``-m immediate``) and the promotion;
    the ids they returned are handed out again by the new primary (their sequence values
    were lost with them); what the replica had received is all there. The App rides
    through the crash on its multi-host URL."""
    primary, replica = pair
    app = build_app(multi_host_url(primary, replica))
    quick = app.tasks["quick"]
    try:
        kept = [quick.enqueue() for _ in range(10)]
        wait_until(lambda: caught_up(primary), what="the replica to catch up")
        disconnect(replica)
        lost = [quick.enqueue() for _ in range(40)]  # acknowledged: synchronous_commit=on
        primary.stop("immediate")  # a crash: nothing more is sent to anyone
        replica.promote()
        after = quick.enqueue()  # the App reconnects to the new primary
    finally:
        app.close()
    states = job_states(replica)
    assert [job_id in states for job_id in kept] == [True] * len(kept)
    assert [job_id for job_id in lost if job_id in states] == [after]
    assert after > max(kept)  # a lost job's id, now naming another job



def test_with_a_synchronous_standby_an_enqueue_the_crash_cut_off_returned_no_id(
    pair: tuple[PrivateCluster, PrivateCluster]
) -> None:
    """The remedy: ``synchronous_standby_names`` on the primary. A commit waits until the
    standby has it, so the enqueue the crash cut off never returned an id (it raises
    ``ConnectionLost``: it may be on the old primary, not on the new one), and no id
    returned is lost."""
    primary, replica = pair
    with connect(primary) as connection:
        connection.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        connection.execute("SELECT pg_reload_conf()")
        wait_until(lambda: connection.execute(
            "SELECT sync_state FROM pg_stat_replication").fetchone() == ("sync",),
            what="the standby to be synchronous")
    app = build_app(multi_host_url(primary, replica))
    quick = app.tasks["quick"]
    outcome: dict[str, Any] = {}

    def enqueue() -> None:
        try:
            outcome["id"] = quick.enqueue()
        except BaseException as exc:  # reported to the test thread
            outcome["error"] = exc

    try:
        kept = [quick.enqueue() for _ in range(10)]
        disconnect(replica)
        waiting = threading.Thread(target=enqueue)
        waiting.start()
        with connect(primary) as connection:
            wait_until(lambda: connection.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            ).fetchone() == (1,), what="the commit to wait for the standby")
        assert outcome == {}  # no id while the standby lacks the commit
        primary.stop("immediate")
        waiting.join(20)
        replica.promote()
        after = quick.enqueue()
    finally:
        app.close()
    assert isinstance(outcome.get("error"), ConnectionLost), outcome
    assert "may or may not have been enqueued" in str(outcome["error"])
    assert sorted(job_states(replica)) == [*kept, after]


def test_an_enqueue_after_one_the_failover_cut_off_waits_for_the_promoted_replica(
    pair: tuple[PrivateCluster, PrivateCluster]
) -> None:
    """An enqueue in flight when the primary stops raises ``ConnectionLost`` and its
    connection is dropped; the next one, called while no server takes writes yet, waits
    for the promotion (``RECONNECT_WINDOW``) as it does for a connection found dead,
    instead of failing at once because it opens a connection afresh."""
    primary, replica = pair
    app = build_app(multi_host_url(primary, replica))
    quick = app.tasks["quick"]
    outcome: dict[str, Any] = {}

    def enqueue(key: str) -> None:
        try:
            outcome[key] = quick.enqueue()
        except BaseException as exc:  # reported to the test thread
            outcome[key] = exc

    try:
        first = quick.enqueue()
        locker = connect(primary)  # closed by the stop, as the App's connection is
        locker.execute("BEGIN")
        locker.execute("LOCK TABLE akadze.jobs IN SHARE MODE")  # the INSERT waits
        cut = threading.Thread(target=enqueue, args=("cut",))
        cut.start()
        wait_until(lambda: locker.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        ).fetchone() == (1,), what="the insert to wait on the lock")
        primary.stop("fast")
        locker.close()
        cut.join(20)
        # Almost always ConnectionLost. Rarely the shutdown's message is read before the
        # socket's end (psycopg raises the 57P01 itself), or the locker's backend ends first
        # and the insert commits before its own signal: the next call is judged either way.
        assert isinstance(outcome["cut"], ConnectionLost | psycopg.OperationalError | int), \
            outcome
        waiting = threading.Thread(target=enqueue, args=("next",))
        waiting.start()
        time.sleep(NO_PRIMARY)  # no writable server: the replica is not promoted yet
        replica.promote()
        waiting.join(20)
    finally:
        app.close()
    assert isinstance(outcome["next"], int), outcome  # before: ConfigurationError at once
    acknowledged = {first, outcome["next"]} | (
        {outcome["cut"]} if isinstance(outcome["cut"], int) else set())
    states = job_states(replica)
    assert acknowledged <= set(states)
    assert len(states) <= 3  # at most the cut insert besides, never a second copy of one
