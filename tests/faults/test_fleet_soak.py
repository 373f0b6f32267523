"""Fleet soak: 16 mixed workers on one private Postgres under chaos.

Not run by default (``soak`` marker). ``AKADZE_SOAK_JOBS`` jobs (default 150,000, a few
minutes on 2 cores), spread over 3 queues and two tasks (``fleet``: an async body;
``fleet_sync``: a sync body, in the worker's thread pool), drained by 16 ``fault_app``
worker processes of mixed shapes (``FLEET``): one to three queues each, 1, 4, 8 or 16 slots
per queue, in-process bodies or ``--processes`` children. Meanwhile:

- every ``AKADZE_SOAK_KILL_EVERY`` seconds (default 3) a random worker is SIGKILLed, and a
  supervisor starts it again (``Fleet``);
- once a third of the jobs succeeded, the server is restarted (``pg_ctl restart -m fast``);
- once two thirds did, every client backend but the test's own is terminated
  (``pg_terminate_backend``), twice, half a second apart;
- a sampler counts the cluster's client backends every half second.

Each body records its run in ``runs(job_id, run_count, pid)`` with an idempotent INSERT that
it retries while the database is away, so a body never fails because of the outage it rides
through, and ``pid`` is the worker process's (a ``--processes`` child records its worker's).

Asserted, from the database:

- every job ends ``succeeded``; no run is recorded twice and every job's last run is;
- the only entries in ``errors`` are ``WorkerLost`` (a run lost with its worker, rescued);
- every extra run (a recorded run under a ``run_count`` lower than the job's last) is matched
  by a ``WorkerLost`` entry on that job naming a worker id of the same process (a trigger
  copies each ``akadze.workers`` row's id and pid into ``fleet_workers``), and that process
  is one the test SIGKILLed, or one that stopped with exit code 1 after logging that it had
  no heartbeat for longer than its TTL (the database was gone, which the docs count as a
  lost run), or one that logged it had been declared dead (it missed its TTL, e.g. during
  the restart, and was rescued while alive);
- every worker process that ended is one the test killed or one of those exits 1; the rest
  stop with 0 at the end; and when the restart took less than ``QUICK_RESTART``, no
  worker stopped with 1 or was declared dead at all (the terminate storm leaves the server
  up: at a 3 s TTL, before the fix that ``test_stale_pool.py`` pins, workers stopped with 1
  or were declared dead after it, each step failing on the next dead pooled connection);
- the client backends never exceeded the bound that "How many connections"
  (docs/reference/choices.md) gives for this fleet
  (``connection_budget``, summed, plus one more worker's for a killed worker's backends that
  may outlive it beside its replacement's, plus the test's own).

Run: ``AKADZE_SOAK_JOBS=3000 python -m pytest -m soak tests/faults/test_fleet_soak.py -s``.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from tests.faults.conftest import SpawnWorker
from tests.faults.fault_app import build_fault_app
from tests.faults.support import Fleet, Spawn
from tests.workers.support import (
    RUNS_TABLE,
    PrivateCluster,
    started_cluster,
    with_application_name,
)

SOAK_JOBS = int(os.environ.get("AKADZE_SOAK_JOBS", "150000"))
KILL_EVERY = float(os.environ.get("AKADZE_SOAK_KILL_EVERY", "3"))
QUEUES = ("q1", "q2", "q3")
#: The workers' heartbeat TTL. A worker sees a restart as longer than the server's own
#: outage: its pool retries a failed connection attempt after about 1 s, then 2 s (psycopg's
#: reconnect backoff). At 3 s, workers were declared dead after a 0.8 s restart.
TTL = 6.0
#: A restart faster than this leaves every worker inside its TTL (see ``TTL``).
QUICK_RESTART = 2.0
TIMING = ("--heartbeat-interval", "0.5", "--heartbeat-ttl", str(TTL), "--poll-interval", "0.2",
          "--shutdown-timeout", "5")
#: The test's own connections are named so; the terminate storm spares them.
OWN = "fleet-soak"
#: What a worker logs when it stops for want of the database (then exits 1).
NO_HEARTBEAT = "no heartbeat for longer than heartbeat_ttl"
DECLARED_DEAD = "was declared dead by another worker"

pytestmark = [pytest.mark.soak, pytest.mark.slow]


@dataclass(frozen=True)
class Shape:
    """One member of the fleet: its queues, slots per queue, and pool children (0: none)."""

    queues: tuple[str, ...]
    slots: int
    processes: int = 0

    def args(self) -> tuple[str, ...]:
        """The fault_app command line of this shape."""
        queues = [part for queue in self.queues for part in ("--queue", queue)]
        extra = ("--processes", str(self.processes)) if self.processes else ()
        return (*queues, "--slots", str(self.slots), *extra, *TIMING)


FLEET = (
    Shape(("q1",), 1), Shape(("q2",), 4), Shape(("q3",), 8), Shape(QUEUES, 16),
    Shape(("q1", "q2"), 4), Shape(("q2", "q3"), 8), Shape(("q1",), 16), Shape(("q3",), 1),
    Shape(("q1", "q3"), 8), Shape(("q2",), 16), Shape(QUEUES, 1), Shape(("q3",), 4),
    Shape(("q1",), 4, processes=2), Shape(("q2", "q3"), 8, processes=2),
    Shape(QUEUES, 1, processes=3), Shape(("q3",), 16, processes=2),
)


def connection_budget(shape: Shape) -> int:
    """The most connections one worker process of ``shape`` holds (docs/reference/choices.md,
    "How many connections").

    The worker's pool (min(slots, 16) + 6), its listener, its first connection (closed once
    registered); the bodies' connections: in process, ``fleet_sync`` uses the App's sync
    pool (at most min(slots, pool_size 10), plus the direct connection that checks the URL
    before the pool opens), ``fleet`` the worker's pool; a ``--processes`` child runs one
    body at a time on its own App (one async pooled connection, one sync pooled, and the
    sync pool's URL check).
    """
    slots = shape.slots * len(shape.queues)
    worker = min(slots, 16) + 6 + 1 + 1
    if shape.processes:
        return worker + 3 * shape.processes
    return worker + min(slots, 10) + 1


#: The bound on the cluster's client backends: every member's budget, one member's more (a
#: killed worker's backends may outlive it for a moment beside its replacement's), and the
#: test's own three (sampler, probe, chaos).
CONNECTION_BOUND = (sum(connection_budget(shape) for shape in FLEET)
                    + max(connection_budget(shape) for shape in FLEET) + 3)


class FleetCluster(PrivateCluster):
    """A private cluster with room for the whole fleet and more, so that a fleet breaking
    the bound is seen exceeding it, not refused."""

    MAX_CONNECTIONS = CONNECTION_BOUND + 100


class MixedFleet(Fleet):
    """``Fleet`` whose member ``index`` runs ``FLEET[index]``."""

    def __init__(self, spawn: Spawn, url: str) -> None:
        super().__init__(spawn, url, len(FLEET))

    def args_for(self, index: int) -> tuple[str, ...]:
        return FLEET[index].args()


class Probe:
    """An autocommit connection of the test's own that reconnects after the restart."""

    def __init__(self, url: str, name: str) -> None:
        self._url = with_application_name(url, f"{OWN}-{name}")
        self._connection: psycopg.Connection | None = None

    def value(self, sql: str, params: Any = None) -> Any:
        """The first column of the query's row, or None while the server is away."""
        try:
            if self._connection is None or self._connection.closed:
                self._connection = psycopg.connect(self._url, autocommit=True,
                                                   connect_timeout=5)
            row = self._connection.execute(sql, params).fetchone()
            return None if row is None else row[0]
        except psycopg.Error:
            if self._connection is not None:
                self._connection.close()
            self._connection = None
            return None

    def close(self) -> None:
        """Close the connection (if open)."""
        if self._connection is not None:
            self._connection.close()


class Sampler(threading.Thread):
    """Counts the cluster's client backends every ``every`` seconds; keeps the maximum."""

    def __init__(self, url: str, every: float = 0.5) -> None:
        super().__init__(name="connection-sampler", daemon=True)
        self._probe = Probe(url, "sampler")
        self._every = every
        self._halt = threading.Event()
        self.max = 0
        self.samples = 0

    def run(self) -> None:
        while not self._halt.wait(self._every):
            seen = self._probe.value(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")
            if seen is not None:
                self.samples += 1
                self.max = max(self.max, int(seen))
        self._probe.close()

    def halt(self) -> None:
        """Stop sampling and wait for the thread."""
        self._halt.set()
        self.join(10)


@pytest.fixture
def fleet_cluster() -> Iterator[FleetCluster]:
    """A started FleetCluster with the schema, ``runs`` and the ``fleet_workers`` map."""
    # Rescued workers' rows are deleted: keep which process each worker id was.
    with started_cluster(FleetCluster, RUNS_TABLE, """
                CREATE TABLE fleet_workers (id bigint PRIMARY KEY, pid integer NOT NULL);
                CREATE FUNCTION fleet_worker_seen() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    INSERT INTO fleet_workers (id, pid) VALUES (NEW.id, NEW.pid);
                    RETURN NEW;
                END $$;
                CREATE TRIGGER fleet_worker_seen AFTER INSERT ON akadze.workers
                    FOR EACH ROW EXECUTE FUNCTION fleet_worker_seen();""") as server:
        yield server


def enqueue(url: str) -> None:
    """The jobs, spread over the queues and both tasks."""
    app = build_fault_app(url)
    try:
        for start in range(0, SOAK_JOBS, 5000):
            batch = range(start, min(start + 5000, SOAK_JOBS))
            for index, queue in enumerate(QUEUES):
                for task in ("fleet", "fleet_sync"):
                    picked = [{"n": n} for n in batch
                              if n % 3 == index and (task == "fleet") == (n // 3 % 2 == 0)]
                    if picked:
                        app.tasks[task].configure(queue=queue).enqueue_many(picked)
    finally:
        app.close()


def terminate_storm(chaos: Probe) -> int:
    """Terminate every client backend but the test's own; returns how many."""
    return int(chaos.value(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        " AND application_name NOT LIKE %s", (f"{OWN}-%",)) or 0)


def one(db: psycopg.Connection, sql: str) -> Any:
    """The first column of the query's only row."""
    row = db.execute(sql).fetchone()
    assert row is not None
    return row[0]


@pytest.mark.timeout(600 + SOAK_JOBS // 50)
def test_a_mixed_fleet_under_kills_a_restart_and_a_terminate_storm_loses_nothing(
    fleet_cluster: FleetCluster, spawn_worker: SpawnWorker
) -> None:
    url = fleet_cluster.url()
    enqueue(url)
    sampler = Sampler(url)
    sampler.start()
    probe = Probe(url, "probe")
    chaos = Probe(url, "chaos")
    started = time.monotonic()
    fleet = MixedFleet(spawn_worker, url)
    rng = random.Random(int(os.environ.get("AKADZE_SOAK_SEED", "20")))
    next_kill = started + KILL_EVERY
    next_report = started + 10
    deadline = started + 300 + SOAK_JOBS // 40
    restarted_at: float | None = None
    restart_took = 0.0
    storms: list[int] = []
    done = 0
    try:
        while done < SOAK_JOBS:
            now = time.monotonic()
            assert now < deadline, f"{done}/{SOAK_JOBS} succeeded by the deadline"
            fleet.supervise()
            if now >= next_kill:
                alive = [i for i, member in enumerate(fleet.members)
                         if member.proc.poll() is None]
                if alive:
                    fleet.kill(rng.choice(alive))
                next_kill = now + KILL_EVERY
            if restarted_at is None and done >= SOAK_JOBS // 3:
                fleet_cluster.restart()
                restarted_at = time.monotonic() - started
                restart_took = time.monotonic() - now
                print(f"fleet soak: server restarted at {restarted_at:.0f}s in "
                      f"{restart_took:.1f}s ({done} done)", flush=True)
            if restarted_at is not None and not storms and done >= 2 * SOAK_JOBS // 3:
                storms.append(terminate_storm(chaos))
                time.sleep(0.5)
                storms.append(terminate_storm(chaos))
                print(f"fleet soak: terminated {storms} backends at {now - started:.0f}s "
                      f"({done} done)", flush=True)
            value = probe.value("SELECT count(*) FROM akadze.jobs WHERE state = 'succeeded'")
            done = done if value is None else int(value)
            if now >= next_report:
                print(f"fleet soak: {done}/{SOAK_JOBS} succeeded after {now - started:.0f}s, "
                      f"{len(fleet.killed)} kills, max {sampler.max} connections", flush=True)
                next_report = now + 10
            time.sleep(0.2)
        took = time.monotonic() - started
        for member in fleet.alive():
            # A member restarted a moment ago: SIGTERM before its handlers exist kills it.
            member.wait_started(60)
        codes = fleet.stop()
    finally:
        sampler.halt()
        probe.close()
        chaos.close()
    assert codes == [0] * len(codes), (codes, fleet.logs()[-20000:])

    # Processes that ended early: killed by the test, or stopped (exit 1) for want of the
    # database longer than their TTL.
    stopped = {member.pid for member in fleet.ended
               if member.pid not in fleet.killed and member.proc.returncode == 1
               and NO_HEARTBEAT in member.log()}
    others = {member.pid: member.proc.returncode for member in fleet.ended
              if member.pid not in fleet.killed | stopped}
    assert not others, others
    declared_dead = {member.pid for member in [*fleet.ended, *fleet.members]
                     if DECLARED_DEAD in member.log()}
    lost = fleet.killed | stopped | declared_dead
    if restart_took < QUICK_RESTART:
        # The database was away for less than the TTL: no worker had reason to stop or to
        # be declared dead (the terminate storm left the server up throughout).
        assert not stopped and not declared_dead, (stopped, declared_dead)

    with psycopg.connect(url, autocommit=True) as db:
        states: dict[str, int] = dict(db.execute(
            "SELECT state, count(*) FROM akadze.jobs GROUP BY state"))
        assert states == {"succeeded": SOAK_JOBS}, states
        assert one(db, "SELECT count(*) FROM akadze.jobs, jsonb_array_elements(errors) AS e"
                       " WHERE e->>'type' <> 'WorkerLost'") == 0
        assert one(db, "SELECT count(*) FROM (SELECT 1 FROM runs GROUP BY job_id, run_count"
                       " HAVING count(*) > 1) AS twice") == 0
        assert one(db, "SELECT count(*) FROM akadze.jobs AS j WHERE NOT EXISTS (SELECT 1"
                       " FROM runs AS r WHERE r.job_id = j.id AND r.run_count = j.run_count)"
                   ) == 0
        # Every extra run: a WorkerLost entry of its job names a worker id of its process.
        extra = db.execute("""
            SELECT r.job_id, r.run_count, r.pid,
                   EXISTS (SELECT 1 FROM jsonb_array_elements(j.errors) AS e
                           JOIN fleet_workers AS w ON w.id = (e->>'worker_id')::bigint
                           WHERE e->>'type' = 'WorkerLost' AND w.pid = r.pid) AS rescued
            FROM runs AS r JOIN akadze.jobs AS j ON j.id = r.job_id
            WHERE r.run_count < j.run_count""").fetchall()
        unmatched = [row for row in extra if not row[3]]
        assert not unmatched, unmatched[:20]
        extra_pids = {pid for _, _, pid, _ in extra}
        assert extra_pids <= lost, extra_pids - lost
        rescued_jobs = one(db, "SELECT count(*) FROM akadze.jobs WHERE errors <> '[]'")
        lost_claims = one(db, "SELECT coalesce(sum(run_count - 1), 0) FROM akadze.jobs")
    by_kill = sum(1 for _, _, pid, _ in extra if pid in fleet.killed)
    by_outage = len(extra) - by_kill
    assert sampler.samples > 0
    assert sampler.max <= CONNECTION_BOUND, (sampler.max, CONNECTION_BOUND)
    children = sum(shape.processes for shape in FLEET)
    print(f"\nfleet soak: {SOAK_JOBS} jobs succeeded in {took:.1f}s "
          f"({SOAK_JOBS / took:.0f} jobs/s) with {len(FLEET)} workers ({children} pool "
          f"children); {len(fleet.killed)} SIGKILLs, 1 server restart at {restarted_at:.0f}s "
          f"({restart_took:.1f}s), "
          f"terminate storms {storms}; {len(stopped)} workers exited 1 (no heartbeat past "
          f"the TTL), {len(declared_dead)} declared dead and carried on; {len(extra)} extra "
          f"runs ({by_kill} on killed workers, {by_outage} on the others), {rescued_jobs} "
          f"jobs rescued, {lost_claims} claims beyond one; max {sampler.max} client "
          f"connections (bound {CONNECTION_BOUND}, max_connections "
          f"{FleetCluster.MAX_CONNECTIONS}; {sampler.samples} samples)")
