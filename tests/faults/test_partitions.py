"""Network partitions without a reset: a proxy between one worker and Postgres
stops forwarding, with no RST and no FIN, and later forwards again.

Seed 000, "Аренда" and "Ошибки базы": a partition shorter than the TTL is a slow network
and changes nothing; past the TTL the partitioned worker stops (exit 1) and another worker
rescues its jobs; what the old worker sent into the partition reaches the server when it
heals, and fencing by run_count makes it change nothing.

The partitioned worker's tasks record their start through the proxy too (their own
connection of the same URL), so every run here starts before the partition.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from akadze_core import App
from tests.faults.conftest import SpawnWorker
from tests.faults.fault_app import build_fault_app
from tests.faults.proxy import PartitionProxy
from tests.faults.support import error_types, job, rows_by_id, wait_until
from tests.workers.support import (
    WORKER_APPLICATION_NAME,
    PrivateCluster,
    runs,
    with_application_name,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def proxy(cluster: PrivateCluster) -> Iterator[PartitionProxy]:
    """A partition proxy in front of the private cluster."""
    server = PartitionProxy(cluster.port)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def direct(cluster: PrivateCluster) -> Iterator[psycopg.Connection]:
    """A connection to the cluster that no partition touches, for assertions."""
    with psycopg.connect(cluster.url(password=False), autocommit=True) as connection:
        yield connection


@pytest.fixture
def app(cluster: PrivateCluster) -> Iterator[App]:
    """The fault harness's App on the cluster (not through the proxy), used to enqueue."""
    application = build_fault_app(cluster.url(password=False))
    yield application
    application.close()


def worker_id_of(db: psycopg.Connection, pid: int) -> int | None:
    """The id of the worker row registered by process ``pid``, if any."""
    row = db.execute("SELECT id FROM akadze.workers WHERE pid = %s", (pid,)).fetchone()
    return None if row is None else int(row[0])


def statements_logged(logfile: Path, since: int, application: str) -> list[str]:
    """The statements the server logged for ``application`` after byte ``since`` of its log
    (each a whole entry: a statement's later lines carry no prefix)."""
    with logfile.open("rb") as log:
        log.seek(since)
        text = log.read().decode("utf-8", errors="replace")
    entries = re.split(r"\n(?=\d{4}-\d\d-\d\d )", text)
    return [entry for entry in entries
            if re.match(rf"\S+ \S+ \S+ \[\d+\] {re.escape(application)} LOG:  "
                        r"(statement|execute [^:]*):", entry)]


def test_a_partition_shorter_than_the_ttl_changes_nothing(
    cluster: PrivateCluster, proxy: PartitionProxy, app: App, direct: psycopg.Connection,
    spawn_worker: SpawnWorker,
) -> None:
    """A 2 s partition with a 6 s TTL: the jobs finish, nothing is rescued, each body ran
    once; the outcome of the job that ended during the partition lands once it heals."""
    ttl = 6.0
    options = ("--heartbeat-interval", "0.5", "--heartbeat-ttl", str(ttl))
    partitioned = spawn_worker(with_application_name(proxy.url()), *options, "--slots", "3")
    partitioned.wait_started()
    # Idle (its queue stays empty), and heartbeating every 0.5 s: it would rescue the jobs
    # if the TTL ran out. Started before the jobs: a start that takes longer than the
    # 1 s job under load must not end that job before the partition begins.
    watcher = spawn_worker(cluster.url(password=False), *options, "--queue", "watch")
    watcher.wait_started()
    # One ends during the partition (its outcome write waits in it), two after it.
    ids = [app.tasks["sleep"].enqueue(seconds=seconds) for seconds in (1.0, 4.0, 4.0)]
    wait_until(lambda: all(len(runs(direct, job_id)) == 1 for job_id in ids),
               what="the three runs to start")
    proxy.pause()
    paused = time.monotonic()
    time.sleep(2.0)
    assert all(row["state"] == "running" for row in rows_by_id(direct, ids).values())
    proxy.resume()
    print(f"partition of {time.monotonic() - paused:.2f}s")

    wait_until(lambda: all(r["state"] == "succeeded" for r in rows_by_id(direct, ids).values()),
               timeout=20, what="every job to succeed after the partition")
    for job_id, row in rows_by_id(direct, ids).items():
        assert (row["run_count"], row["attempt"], row["errors"]) == (1, 1, []), row
        assert runs(direct, job_id) == [(1, partitioned.pid)]
    assert "rescued job" not in watcher.log() + partitioned.log()
    assert "no heartbeat for longer than heartbeat_ttl" not in partitioned.log()
    # It goes on as the same worker.
    later = app.tasks["quick"].configure(queue="default").enqueue()
    wait_until(lambda: job(direct, later)["state"] == "succeeded", what="a job after it")
    assert "declared dead" not in partitioned.log()
    for worker in (partitioned, watcher):
        worker.signal(signal.SIGTERM)
        assert worker.wait_exit()[0] == 0, worker.log()


def test_a_partition_longer_than_the_ttl_stops_the_worker_and_its_late_writes_change_nothing(
    cluster: PrivateCluster, proxy: PartitionProxy, app: App, direct: psycopg.Connection,
    spawn_worker: SpawnWorker,
) -> None:
    """Past the TTL the partitioned worker exits 1 (no call of it hangs), another worker
    rescues and finishes its jobs, and when the partition heals the old worker's outcome
    write, heartbeat and claims reach the server and change nothing."""
    ttl, interval = 3.0, 0.3
    options = ("--heartbeat-interval", str(interval), "--heartbeat-ttl", str(ttl))
    # The server logs every statement with the client's application_name, so the
    # test sees the late writes arrive.
    direct.execute("ALTER SYSTEM SET log_statement = 'all'")
    direct.execute("ALTER SYSTEM SET log_line_prefix = '%m [%p] %a '")
    direct.execute("SELECT pg_reload_conf()")

    partitioned = spawn_worker(with_application_name(proxy.url()), *options, "--slots", "2")
    partitioned.wait_started()
    old_id = worker_id_of(direct, partitioned.pid)
    # "long" outlives the worker; "short" ends during the partition, so its outcome write
    # goes into it. Their runs after the rescue return at once.
    long_job = app.tasks["slow_first_run"].enqueue(seconds=60.0)
    short_job = app.tasks["slow_first_run"].enqueue(seconds=1.5)
    ids = [long_job, short_job]
    wait_until(lambda: all(len(runs(direct, job_id)) == 1 for job_id in ids),
               what="both first runs to start")
    proxy.pause()
    paused = time.monotonic()
    assert all(row["state"] == "running" for row in rows_by_id(direct, ids).values())
    during = app.tasks["quick"].enqueue()  # only the rescuer can claim it

    code, ended = partitioned.wait_exit(timeout=ttl + 15)
    took = ended - paused
    print(f"the partitioned worker exited {took:.2f}s after the partition began")
    assert code == 1, partitioned.log()
    assert "no heartbeat for longer than heartbeat_ttl" in partitioned.log()
    # Its last good heartbeat was at most one interval before the partition; then the TTL,
    # then the shutdown's tries: 1 s each for the outcome flush, the hand-back and the pool
    # (min(5, max(1, heartbeat_interval)) for the first two), and 1.5 s of slack.
    assert ttl - interval - 0.2 <= took < ttl + 4.5, (took, partitioned.log())
    # Started only now (it connects directly, the partition goes on): a start that takes
    # longer than the 1.5 s run under load must neither let that run end before the
    # partition nor delay the moment the exit above is seen.
    rescuer = spawn_worker(cluster.url(password=False), *options)
    rescuer.wait_started()

    wait_until(lambda: all(r["state"] == "succeeded"
                           for r in rows_by_id(direct, [*ids, during]).values()),
               timeout=20, what="the rescuer to rescue and finish every job")
    finished = rows_by_id(direct, [*ids, during])
    for job_id in ids:
        row = finished[job_id]
        assert (row["run_count"], row["attempt"], row["result"]) == (2, 2, "done"), row
        assert error_types(row) == ["WorkerLost"], row
        assert [pid for _, pid in runs(direct, job_id)] == [partitioned.pid, rescuer.pid]
    assert runs(direct, during) == [(1, rescuer.pid)]
    assert finished[during]["run_count"] == 1 and finished[during]["errors"] == []
    assert worker_id_of(direct, partitioned.pid) is None  # its row went with the rescue

    # Heal: what the dead worker sent into the partition reaches the server now.
    log_size = cluster.logfile.stat().st_size
    proxy.resume()
    wait_until(lambda: proxy.connections() == 0, what="the proxy to deliver and close")
    wait_until(lambda: direct.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
        (WORKER_APPLICATION_NAME,)).fetchone() == (0,),
        what="the old worker's backends to run what they got and end")
    late = statements_logged(cluster.logfile, log_size, WORKER_APPLICATION_NAME)
    print("late statements:", *(entry.split("\n", 1)[0] for entry in late), sep="\n  ")
    assert proxy.sent_after_resume > 0
    # What was in flight when the partition began reaches the server now: the outcome write
    # of "short" when it was sent before the lease ran out, else at least a claim or a
    # heartbeat (which of them depends on timing: under load the outcome write may start
    # after the lease and is then never sent). Either way, it must change nothing.
    assert any(marker in entry for entry in late
               for marker in ("WITH outcome AS", "FROM claimed", "heartbeat_at = now()")), late
    assert rows_by_id(direct, [*ids, during]) == finished  # fenced: nothing changed
    assert direct.execute("SELECT count(*) FROM akadze.workers WHERE id = %s",
                          (old_id,)).fetchone() == (0,)  # its heartbeat did not resurrect it
    assert direct.execute("SELECT count(*) FROM akadze.jobs WHERE state <> 'succeeded'"
                          ).fetchone() == (0,)
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait_exit()[0] == 0, rescuer.log()


def test_a_thread_a_task_left_waiting_in_the_partition_does_not_hold_the_exit(
    cluster: PrivateCluster, proxy: PartitionProxy, app: App, direct: psycopg.Connection,
    spawn_worker: SpawnWorker,
) -> None:
    """A task's ``asyncio.to_thread`` thread that waits for an answer through the partition
    (it never comes while the partition lasts) ends with nothing: the worker past its TTL
    exits 1 as promptly as without that thread, and says it did not wait for it."""
    ttl, interval = 3.0, 0.3
    options = ("--heartbeat-interval", str(interval), "--heartbeat-ttl", str(ttl))
    partitioned = spawn_worker(with_application_name(proxy.url()), *options)
    partitioned.wait_started()
    # The thread records the run, then sleeps in the server on the same connection: once
    # the run is seen, the thread waits for an answer held up in the partition.
    job_id = app.tasks["sleep_in_thread"].enqueue(seconds=60.0)
    wait_until(lambda: len(runs(direct, job_id)) == 1, what="the run to start")
    proxy.pause()
    paused = time.monotonic()

    code, ended = partitioned.wait_exit(timeout=ttl + 15)
    took = ended - paused
    print(f"the partitioned worker exited {took:.2f}s after the partition began")
    assert code == 1, partitioned.log()
    # The bound of the test above: the TTL, then the shutdown's tries, 1 s each.
    assert took < ttl + 4.5, (took, partitioned.log())
    assert "not waiting for 1 thread(s) of asyncio.to_thread" in partitioned.log()
    proxy.resume()
