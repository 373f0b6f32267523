"""Connections a storm killed while they sat idle in the worker's pool.

``pg_terminate_backend`` (or a server restart) kills every connection of a worker's pool at
once; the idle ones are only found dead when next used. The worker's own steps (heartbeat,
claims, outcome writes, hand-backs) check each connection before sending on it
(``found_dead``, one zero-timeout poll) and replace a dead one, as ``App.run_pooled_async`` does:
nothing was sent on it, so nothing is lost. Before, each step took the next dead connection
and failed on it: with a pool of 20 killed connections the heartbeat failed again and again
and the fleet soak saw workers stop (exit 1, no heartbeat past the TTL) with the database up.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from akadze_core import App
from tests.faults.conftest import SpawnWorker
from tests.faults.fault_app import build_fault_app
from tests.faults.support import count, wait_until
from tests.helpers import job
from tests.workers.support import WORKER_APPLICATION_NAME, PrivateCluster, with_application_name

pytestmark = pytest.mark.slow

#: What the worker logs when one of its steps failed on a connection.
FAILED = ("heartbeat failed", "claim failed", "outcomes failed", "orphan check failed")


@pytest.fixture
def cluster_app(cluster: PrivateCluster) -> Iterator[App]:
    """The fault harness's App on the private cluster, used to enqueue."""
    application = build_fault_app(cluster.url())
    yield application
    application.close()


def test_idle_pool_connections_killed_at_once_are_replaced_before_use(
    cluster: PrivateCluster, cluster_app: App, spawn_worker: SpawnWorker
) -> None:
    app = cluster_app
    worker = spawn_worker(with_application_name(cluster.url()), "--slots", "12",
                          "--heartbeat-interval", "0.2", "--heartbeat-ttl", "5")
    worker.wait_started()
    with psycopg.connect(cluster.url(password=False), autocommit=True) as db:
        # Twelve bodies each holding a pooled connection at once: the pool grows to 12+.
        ids = app.tasks["pooled_sleep"].enqueue_many([{"seconds": 1.0}] * 12)
        wait_until(lambda: all(job(db, i)["state"] == "succeeded" for i in ids), timeout=30,
                   what="the pool-growing jobs")
        time.sleep(0.5)  # idle now: every pooled connection sits in the pool
        killed = count(db, "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))"
                           " FROM pg_stat_activity WHERE application_name = %s",
                       (WORKER_APPLICATION_NAME,))
        assert killed >= 12, killed
        mark = len(worker.log())
        time.sleep(2.0)  # ten heartbeats, and claims polled every 0.1 s
        after = app.tasks["soak"].enqueue(n=1)
        wait_until(lambda: job(db, after)["state"] == "succeeded", timeout=15,
                   what="a job enqueued after the storm")
        assert job(db, after)["attempt"] == 1
        failures = [line for line in worker.log()[mark:].splitlines()
                    if any(text in line for text in FAILED)]
        assert failures == [], "\n".join(failures)
        assert worker.proc.poll() is None, worker.log()
