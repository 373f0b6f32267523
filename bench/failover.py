"""How long a Patroni failover stops the queue: SIGKILL of the leader → first job finished on
the new primary, with jobs lost counted.

The cluster is the fault tests' own (``tests/faults/patroni_support.py``: etcd, three
Postgres 15 nodes under Patroni, ``synchronous_mode``, leader TTL 10 s, on free loopback
ports, stopped by pid), and so are the two ``akadze worker`` processes
(``tests.faults.ha_app:app``, ``--heartbeat-ttl 60`` so they ride a failover out) on one
multi-host DSN with ``target_session_attrs=read-write``. A producer thread enqueues back to
back and notes when each enqueue returned. Then the leader's Patroni and postmaster are
SIGKILLed, and the script reads, on the host clock the three nodes share:

- ``leader``: kill → Patroni reports a new running leader;
- the longest pause between two acknowledged enqueues around the kill, and kill → the
  first enqueue after it;
- the longest pause between two ``finished_at`` around the kill, and kill → the first job
  finished after it (on the new primary; ``finished_at`` is the server's clock, the same host
  clock on loopback). A pause, not "the first after the kill": a commit the old leader
  made in the milliseconds its postmaster took to die reaches the standby too. The jobs
  finished in each second from 2 s before the kill are printed beside.

At the end every acknowledged job must exist and have succeeded (``lost`` counts those that
do not), and ``ha_runs`` shows any body run twice. ``python -m bench.failover``: about a
minute; one crash a run (the old leader would need pg_rewind to rejoin), so run it again
for more samples. ``python -m bench.failover --commit-cost 20000``: instead, that many
no-ops drained by one ``akadze worker --slots 10`` on a cluster with ``synchronous_mode`` and
on one without (a fresh cluster each): what waiting for the standby costs, on loopback.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from akadze_core import App
from akadze_core.store.migrations import migrate
from bench import db
from bench.apps.core_app import NOOP
from bench.core import worker_argv
from bench.drain import drain
from tests.faults.patroni_support import PatroniCluster, missing
from tests.faults.test_patroni_failover import Worker, connect, ha_app
from tests.workers.support import wait_until


class TimedProducer(threading.Thread):
    """Enqueues ``ha_record`` jobs back to back; keeps (host time, id) of each enqueue that
    returned an id (one in flight at the crash may fail: it is not acknowledged)."""

    def __init__(self, app: App) -> None:
        super().__init__(name="producer", daemon=True)
        self.task = app.tasks["ha_record"]
        self.acknowledged: list[tuple[float, int]] = []
        self.failed = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                job_id = self.task.enqueue()
                self.acknowledged.append((time.time(), job_id))
            except Exception:
                self.failed += 1
                time.sleep(0.05)
            time.sleep(0.01)

    def more(self, count: int, what: str) -> None:
        """Wait until ``count`` more enqueues returned an id."""
        target = len(self.acknowledged) + count
        wait_until(lambda: len(self.acknowledged) >= target, timeout=90, what=what)


def _largest_gap(moments: list[float], since: float) -> tuple[float, float]:
    """(length, end) of the longest pause between consecutive ``moments`` that ends after
    ``since``: how long the queue stood still around the crash, and when it moved again."""
    moments = sorted(moments)
    gaps = [(later - earlier, later) for earlier, later in itertools.pairwise(moments)
            if later > since]
    return max(gaps) if gaps else (0.0, since)


def _finished_between(dsn: str, start: float, stop: float) -> list[float]:
    with connect(dsn) as connection:
        return [float(at) for at, in connection.execute(
            "SELECT extract(epoch FROM finished_at)::float8 FROM akadze.jobs"
            " WHERE finished_at BETWEEN to_timestamp(%s) AND to_timestamp(%s)",
            (start, stop))]


def _crash(cluster: PatroniCluster, producer: TimedProducer, dsn: str) -> dict[str, float]:
    producer.more(100, "jobs before the crash")

    def steady() -> bool:  # the workers are up and finishing jobs before the crash
        with connect(dsn) as connection:
            (recent,), = connection.execute(
                "SELECT count(*) FROM akadze.jobs"
                " WHERE finished_at > now() - interval '1 second'").fetchall()
        return int(recent) >= 10
    wait_until(steady, timeout=90, what="the workers to finish jobs steadily")
    leader = cluster.leader()
    assert leader is not None
    killed = time.time()
    cluster.crash(leader)
    cluster.wait_leader_other_than(leader)
    elected = time.time()
    producer.more(100, "jobs after the crash")
    time.sleep(2)  # the jobs enqueued last are finished too
    window = (killed - 5, time.time())
    pause, resumed = _largest_gap([at for at, _ in producer.acknowledged
                                   if window[0] <= at <= window[1]], killed)
    finished_at = _finished_between(dsn, *window)
    stood, finished = _largest_gap(finished_at, killed)
    per_second = [sum(1 for at in finished_at if second <= at - killed < second + 1)
                  for second in range(-2, 25)]
    print("jobs finished per second from 2 s before the kill:", per_second, flush=True)
    return {"leader": elected - killed, "enqueue_pause": pause, "enqueue": resumed - killed,
            "finished_pause": stood, "finished": finished - killed}


def commit_cost(jobs: int) -> None:
    """Drain ``jobs`` no-ops with one ``akadze worker --slots 10`` on a fresh cluster with
    ``synchronous_mode`` and on one without: what waiting for the standby costs a drain."""
    for synchronous in (True, False):
        cluster = PatroniCluster(synchronous=synchronous)
        run_dir = Path(tempfile.mkdtemp(prefix="akadze-failover-"))
        try:
            cluster.start()
            dsn = cluster.dsn()
            with connect(dsn) as connection:
                migrate(connection)
            db.fill(dsn, jobs, task=NOOP)
            result = drain(dsn, worker_argv(dsn, 10), jobs=jobs,
                           log=run_dir / "drain.log", timeout=900)
            print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.1f}: "
                  f"synchronous_mode {'on ' if synchronous else 'off'}: {jobs:,} no-ops "
                  f"drained at {result.rate:,.0f} jobs/s", flush=True)
        finally:
            cluster.destroy()


def main() -> None:
    """Start the cluster, crash its leader once, print the figures and the jobs lost (or,
    with ``--commit-cost N``, the drains with and without a synchronous standby)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commit-cost", type=int, metavar="JOBS", default=0)
    args = parser.parse_args()
    reason = missing()
    if reason is not None:
        raise SystemExit(f"no Patroni cluster here: {reason}")
    if args.commit_cost:
        commit_cost(args.commit_cost)
        return
    cluster = PatroniCluster(synchronous=True)
    run_dir = Path(tempfile.mkdtemp(prefix="akadze-failover-"))
    workers: list[Worker] = []
    app: App | None = None
    producer: TimedProducer | None = None
    try:
        cluster.start()
        dsn = cluster.dsn()
        app = ha_app(dsn)
        workers = [Worker(dsn, run_dir / f"worker{i}.log") for i in range(2)]
        producer = TimedProducer(app)
        producer.start()
        print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
              f"{os.cpu_count()} cores, Patroni failover, synchronous_mode, "
              f"TTL {cluster.ttl} s, loopback")
        figures = _crash(cluster, producer, dsn)
        print(f"kill → new leader {figures['leader']:.1f} s; "
              f"no enqueue acknowledged for {figures['enqueue_pause']:.1f} s, the first "
              f"again {figures['enqueue']:.1f} s after the kill; no job finished for "
              f"{figures['finished_pause']:.1f} s, the first on the new primary "
              f"{figures['finished']:.1f} s after the kill", flush=True)
        producer.done.set()
        producer.join(30)
        acknowledged = [job_id for _, job_id in producer.acknowledged]

        def settled() -> bool:
            with connect(dsn) as connection:
                (left,), = connection.execute(
                    "SELECT count(*) FROM akadze.jobs WHERE state <> 'succeeded'").fetchall()
            return int(left) == 0
        wait_until(settled, timeout=90, what="every job to succeed")
        with connect(dsn) as connection:
            succeeded = {row[0] for row in connection.execute(
                "SELECT id FROM akadze.jobs WHERE state = 'succeeded'")}
            (twice,), = connection.execute(
                "SELECT count(*) FROM (SELECT job_id FROM ha_runs GROUP BY job_id"
                " HAVING count(*) > 1) AS repeated").fetchall()
        lost = [job_id for job_id in acknowledged if job_id not in succeeded]
        print(f"acknowledged {len(acknowledged)}, enqueues that raised {producer.failed}, "
              f"jobs lost {len(lost)}, bodies run twice {twice}")
    finally:
        if producer is not None:
            producer.done.set()
        for worker in workers:
            worker.stop()
        if app is not None:
            app.close()
        cluster.destroy()


if __name__ == "__main__":
    main()
