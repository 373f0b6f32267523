"""Workflows under SIGKILL: worker processes killed mid-chain, mid-chord and
mid-body, rescued and retried; revokes racing kills; two live workers finishing one chord.

The next step of a chain and a chord's body are released by ``akadze.settle`` in the
transaction that writes the outcome releasing them, so a worker lost between the two cannot
lose the rest of the workflow, and a retried, rescued or fenced-off run cannot release it
twice. Everything is asserted from the database: the job rows, ``runs`` (every start of every
run, with the process that ran it) and ``wf_bodies`` (a chord body's effect, written with its
success by ``complete_tx``).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import psycopg
import pytest

from akadze_core import App, Node, OnFailure, Workflow, request_cancel_sync
from tests.faults.conftest import SpawnWorker
from tests.faults.support import count, error_types, rows_by_id, wait_until
from tests.faults.workflow_tasks import BODIES_TABLE
from tests.workers.support import WorkerProcess

pytestmark = pytest.mark.slow

TTL = 1.5
FAST = ("--heartbeat-interval", "0.2", "--heartbeat-ttl", str(TTL), "--poll-interval", "0.1")
BOTH_QUEUES = ("--queue", "default", "--queue", "chains")
FINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture
def wf_db(runs_db: psycopg.Connection) -> psycopg.Connection:
    """``runs_db`` with the chord bodies' effect table."""
    runs_db.execute(BODIES_TABLE)
    return runs_db


def worker_id_of(db: psycopg.Connection, pid: int) -> int | None:
    row = db.execute("SELECT id FROM akadze.workers WHERE pid = %s", (pid,)).fetchone()
    return None if row is None else int(row[0])


def started_here(db: psycopg.Connection, worker_id: int, pid: int) -> set[int]:
    """Jobs running on this worker whose current run's body started (recorded in ``runs``)."""
    rows = db.execute(
        "SELECT j.id FROM akadze.jobs AS j JOIN runs AS r ON r.job_id = j.id"
        " AND r.run_count = j.run_count AND r.pid = %s"
        " WHERE j.state = 'running' AND j.worker_id = %s", (pid, worker_id)).fetchall()
    return {row[0] for row in rows}


def starts_by_job(db: psycopg.Connection) -> dict[int, list[int]]:
    """job id -> the pid of each recorded start, in order."""
    out: dict[int, list[int]] = {}
    for job_id, pid in db.execute("SELECT job_id, pid FROM runs ORDER BY started"):
        out.setdefault(job_id, []).append(pid)
    return out


def all_final(db: psycopg.Connection) -> bool:
    return count(db, "SELECT count(*) FROM akadze.jobs WHERE state NOT IN "
                     "('succeeded', 'failed', 'cancelled')") == 0


def ids(nodes: Iterable[Node]) -> list[int]:
    out = []
    for node in nodes:
        assert node.id is not None
        out.append(node.id)
    return out


def add_chain(flow: Workflow, app: App, start: int, steps: int, *, queue: str = "chains",
              seconds: float = 0.1, flaky_every: int = 7, fail_at: int | None = None,
              on_failure: list[OnFailure] | None = None) -> list[Node]:
    """``steps`` wf_step jobs, each adding 1 to its upstream's result."""
    step = app.tasks["wf_step"].configure(queue=queue)
    nodes = [flow.add(step, x=start, seconds=seconds)]
    for index in range(1, steps):
        failing = index == fail_at
        nodes.append(flow.add(
            step, after=nodes[-1], result_arg="x", seconds=seconds,
            flaky=index % flaky_every == flaky_every // 2, fail=failing,
            on_failure=on_failure if failing and on_failure else ()))
    return nodes


def add_chord(flow: Workflow, app: App, tag: str, size: int, *, seconds: float = 0.03,
              body_seconds: float = 0.0, fail_member: int | None = None,
              body_on_failure: list[OnFailure] | None = None,
              member_on_failure: list[OnFailure] | None = None) -> tuple[list[Node], Node]:
    """``size`` members returning 0..size-1 (every tenth fails its first attempt), then a
    wf_body receiving their results in order."""
    member = app.tasks["wf_step"]
    members = [flow.add(member, x=i, add=0, seconds=seconds, flaky=i % 10 == 5,
                        fail=i == fail_member,
                        on_failure=member_on_failure if i == fail_member and member_on_failure
                        else ())
               for i in range(size)]
    body = flow.add(app.tasks["wf_body"], after=members, result_arg="values", tag=tag,
                    seconds=body_seconds,
                    on_upstream_failure="fail" if body_on_failure else "cancel",
                    on_failure=body_on_failure or ())
    return members, body


def errbacks_by_upstream(db: psycopg.Connection) -> dict[int, list[dict[str, Any]]]:
    """The errback jobs (task wf_errback), by the job whose failure inserted them."""
    out: dict[int, list[dict[str, Any]]] = {}
    for row in rows_by_id(db).values():
        if row["task"] == "wf_errback":
            assert row["upstreams"] is not None and len(row["upstreams"]) == 1, row
            out.setdefault(row["upstreams"][0], []).append(row)
    return out


def check_errbacks(db: psycopg.Connection) -> dict[int, list[dict[str, Any]]]:
    """Every failed job with errbacks got each of them exactly once, and no other job got
    any; every errback ran and succeeded. Returns the errbacks by failed job."""
    rows = rows_by_id(db)
    got = errbacks_by_upstream(db)
    for job_id, row in rows.items():
        specs = row["on_failure"] or []
        expected = len(specs) if row["state"] == "failed" else 0
        assert len(got.get(job_id, [])) == expected, (row, got.get(job_id))
        if expected:
            assert sorted(e["args"]["tag"] for e in got[job_id]) == \
                sorted(spec["args"]["tag"] for spec in specs)
    for errbacks in got.values():
        for errback in errbacks:
            assert errback["state"] == "succeeded", errback
    return got


def check_no_premature_start(db: psycopg.Connection, job_ids: Iterable[int]) -> None:
    """No job of ``job_ids`` with upstreams started before every upstream finished."""
    rows = db.execute(
        "SELECT w.id, min(r.started) AS first_start, max(u.finished_at) AS last_upstream"
        " FROM akadze.jobs AS w JOIN runs AS r ON r.job_id = w.id"
        " CROSS JOIN LATERAL unnest(w.upstreams) AS up(id) JOIN akadze.jobs AS u ON u.id = up.id"
        " WHERE w.id = ANY(%s) GROUP BY w.id", (list(job_ids),)).fetchall()
    for job_id, first_start, last_upstream in rows:
        assert first_start > last_upstream, (job_id, first_start, last_upstream)


class Chaos:
    """Workers started one after another, each SIGKILLed once it is running jobs of the
    kinds still wanted, until every goal is met; the last one is left to finish."""

    def __init__(self, db: psycopg.Connection, spawn: SpawnWorker, url: str,
                 *args: str) -> None:
        self.db = db
        self.spawn = spawn
        self.url = url
        self.args = args
        self.killed: set[int] = set()
        self.hits: Counter[str] = Counter()
        self.workers: list[WorkerProcess] = []

    def start(self) -> tuple[WorkerProcess, int]:
        worker = self.spawn(self.url, *self.args)
        self.workers.append(worker)
        worker.wait_started()
        worker_id = worker_id_of(self.db, worker.pid)
        assert worker_id is not None
        return worker, worker_id

    def run(self, kinds: dict[str, set[int]], goals: dict[str, int], *, min_starts: int = 10,
            max_kills: int = 12, timeout: float = 60.0) -> WorkerProcess:
        """Kill workers mid-run of ``kinds`` (name -> job ids) until each goal (name -> kills
        that caught a started run of that kind) is met; returns the last, unkilled worker."""
        deadline = time.monotonic() + timeout
        for _ in range(max_kills):
            worker, worker_id = self.start()
            if all(self.hits[kind] >= goal for kind, goal in goals.items()):
                return worker
            while True:
                assert time.monotonic() < deadline, (self.hits, goals, worker.log())
                assert not all_final(self.db), ("everything finished before the goals were met",
                                                self.hits, goals)
                started = started_here(self.db, worker_id, worker.pid)
                caught = {kind for kind, job_ids in kinds.items() if started & job_ids}
                wanted = {kind for kind in caught if self.hits[kind] < goals.get(kind, 0)}
                starts = count(self.db, "SELECT count(*) FROM runs WHERE pid = %s",
                               (worker.pid,))
                if wanted and (starts >= min_starts or "body" in wanted):
                    worker.signal(signal.SIGKILL)
                    assert worker.wait_exit()[0] == -signal.SIGKILL
                    self.killed.add(worker.pid)
                    self.hits.update(caught)
                    break
                time.sleep(0.02)
        raise AssertionError(f"goals {goals} not met after {max_kills} kills: {self.hits}")


def test_chains_and_chords_survive_repeated_sigkills(
    app: App, database_url: str, wf_db: psycopg.Connection, spawn_worker: SpawnWorker
) -> None:
    db = wf_db
    alert = app.tasks["wf_errback"]
    flow = app.workflow()
    chains = [add_chain(flow, app, 1000 * c, 30) for c in range(4)]
    chords = [add_chord(flow, app, f"chord{c}", 200, body_seconds=1.0) for c in range(2)]
    broken_chain = add_chain(flow, app, 0, 5, fail_at=2, on_failure=[
        OnFailure(alert, result_arg="error", tag="chain step")])
    broken_members, broken_body = add_chord(
        flow, app, "broken", 20, fail_member=7,
        member_on_failure=[OnFailure(alert, result_arg="error", tag="member")],
        body_on_failure=[OnFailure(alert, result_arg="error", tag="body"),
                         OnFailure(alert, tag="body, no error")])
    flow.enqueue()

    chain_ids = {i for chain in chains for i in ids(chain)}
    member_ids = {i for members, _ in chords for i in ids(members)}
    body_ids = set(ids(body for _, body in chords))
    chaos = Chaos(db, spawn_worker, database_url, *FAST, *BOTH_QUEUES, "--slots", "4")
    last = chaos.run({"chain": chain_ids, "chord": member_ids, "body": body_ids},
                     {"chain": 3, "chord": 3, "body": 1})
    wait_until(lambda: all_final(db), timeout=60, what="every workflow to finish")
    assert last.proc.poll() is None, last.log()

    rows = rows_by_id(db)
    starts = starts_by_job(db)
    # Every chain finished, each step once it had its upstream's result.
    for c, chain in enumerate(chains):
        assert [rows[i]["state"] for i in ids(chain)] == ["succeeded"] * 30
        assert [rows[i]["result"] for i in ids(chain)] == [1000 * c + n for n in range(1, 31)]
    check_no_premature_start(db, chain_ids | body_ids)
    # Every chord body ran with all 200 results in order, and its effect exists once.
    for members, body in chords:
        assert all(rows[i]["state"] == "succeeded" for i in ids(members))
        assert rows[body.id or 0]["upstream_results"] == list(range(200))
        assert rows[body.id or 0]["state"] == "succeeded"
    effects = db.execute("SELECT tag, job_id, vals FROM wf_bodies ORDER BY tag").fetchall()
    assert effects == [(f"chord{c}", body.id, list(range(200)))
                       for c, (_, body) in enumerate(chords)]
    # Runs beyond the first happened only in killed processes (or a flaky first attempt).
    for job_id, pids in starts.items():
        survivors = [pid for pid in pids if pid not in chaos.killed]
        flaky = rows[job_id]["args"].get("flaky", False)
        assert len(survivors) <= (2 if flaky else 1), (rows[job_id], pids, chaos.killed)
    lost = [i for i in chain_ids | member_ids | body_ids if "WorkerLost" in error_types(rows[i])]
    assert {i for i in lost if i in chain_ids} and {i for i in lost if i in member_ids}
    assert {i for i in lost if i in body_ids}, "no chord body was killed mid-run"

    # The failing chain stopped at its failing step; nothing after it ever ran.
    assert [rows[i]["state"] for i in ids(broken_chain)] == \
        ["succeeded", "succeeded", "failed", "cancelled", "cancelled"]
    assert not [i for i in ids(broken_chain)[3:] if i in starts]
    # The chord with a failed member: its body failed, never ran, left no effect.
    assert rows[broken_body.id or 0]["state"] == "failed" and broken_body.id not in starts
    assert error_types(rows[broken_body.id or 0])[-1] == "UpstreamFailed"
    # Errbacks: once per failed job, each with the error it was given.
    errbacks = check_errbacks(db)
    assert set(errbacks) == {ids(broken_chain)[2], ids(broken_members)[7], broken_body.id}
    assert errbacks[ids(broken_chain)[2]][0]["result"] == {"tag": "chain step", "type": "Fail"}
    assert sorted((e["result"]["tag"], e["result"]["type"]) for e in errbacks[broken_body.id]
                  ) == [("body", "UpstreamFailed"), ("body, no error", None)]


def test_a_step_that_kills_its_worker_until_it_fails_stops_the_chain_and_runs_its_errback(
    app: App, database_url: str, wf_db: psycopg.Connection, spawn_worker: SpawnWorker
) -> None:
    """The rescue is the statement that ends the step failed (out of attempts after
    WorkerLost): it is the one that must cancel the rest and insert the errback."""
    db = wf_db
    flow = app.workflow()
    head = flow.add(app.tasks["wf_step"], x=1)
    pill = flow.add(app.tasks["suicide"].configure(max_attempts=2), after=head,
                    on_failure=[OnFailure(app.tasks["wf_errback"], result_arg="error",
                                          tag="pill")])
    rest = [flow.add(app.tasks["wf_step"], after=pill, x=0)]
    rest.append(flow.add(app.tasks["wf_step"], after=rest[-1], result_arg="x"))
    flow.enqueue()
    workers = [spawn_worker(database_url, *FAST)]
    deadline = time.monotonic() + 40
    while db.execute("SELECT state FROM akadze.jobs WHERE id = %s", (pill.id,)
                     ).fetchone() != ("failed",):
        assert time.monotonic() < deadline, [w.log() for w in workers]
        if workers[-1].proc.poll() is not None:
            workers.append(spawn_worker(database_url, *FAST))
        time.sleep(0.05)
    if workers[-1].proc.poll() is not None:
        workers.append(spawn_worker(database_url, *FAST))
    errbacks: dict[int, list[dict[str, Any]]] = {}

    def errback_done() -> bool:
        errbacks.update(errbacks_by_upstream(db))
        return bool(errbacks) and all(e["state"] in FINAL for e in errbacks.get(pill.id or 0, []))

    wait_until(errback_done, timeout=20, what="the errback to run")
    rows = rows_by_id(db)
    assert error_types(rows[pill.id or 0]) == ["WorkerLost", "WorkerLost"]
    assert [rows[i]["state"] for i in ids(rest)] == ["cancelled", "cancelled"]
    assert not [i for i in ids(rest) if i in starts_by_job(db)]
    assert [e["result"] for e in errbacks[pill.id or 0]] == [{"tag": "pill",
                                                              "type": "WorkerLost"}]
    check_errbacks(db)


def cancel_if_waiting(url: str, job_id: int) -> bool:
    """Cancel ``job_id`` if (and only if) it is still waiting, in one transaction."""
    with psycopg.connect(url) as connection:
        row = connection.execute("SELECT state FROM akadze.jobs WHERE id = %s FOR UPDATE",
                                 (job_id,)).fetchone()
        if row != ("waiting",):
            return False
        assert request_cancel_sync(connection, job_id)
    return True


def stop_running(db: psycopg.Connection, worker: WorkerProcess, worker_id: int,
                 among: set[int]) -> None:
    """SIGSTOP ``worker`` while a job of ``among`` is running on it. Seen running, a 0.15 s
    step could finish (its outcome flushed) before a kill reached the worker: stopped, the
    worker writes nothing more, and a write it sent before it stopped lands within the
    pause below; if no job of ``among`` is still running then, it goes on and we retry."""
    for _ in range(50):
        wait_until(lambda: bool(started_here(db, worker_id, worker.pid) & among),
                   what="a job of the set running on the worker")
        worker.signal(signal.SIGSTOP)
        time.sleep(0.2)
        if started_here(db, worker_id, worker.pid) & among:
            return
        worker.signal(signal.SIGCONT)
    raise AssertionError("no job of the set stayed running on the worker")


def test_nothing_runs_after_a_revoke_across_kills(
    app: App, database_url: str, wf_db: psycopg.Connection, spawn_worker: SpawnWorker
) -> None:
    """Chains whose middle step is revoked while earlier steps run (on a worker that is then
    SIGKILLed, or on its rescuer), and a chord whose queued member is revoked: the revoked
    step and everything after it never runs; what came before finishes."""
    db = wf_db
    flow = app.workflow()
    chains = [add_chain(flow, app, 100 * c, 12, seconds=0.15) for c in range(6)]
    members, body = add_chord(flow, app, "revoked", 120, seconds=0.1)
    flow.enqueue()
    # The step revoked in chain c: the first three while their step 3 runs, the others
    # further on, right after the kill (nothing moves until the rescue).
    revoked = {c: (6 if c < 3 else 8) + c % 3 for c in range(6)}
    args = (*FAST, *BOTH_QUEUES, "--slots", "6")
    first = spawn_worker(database_url, *args)
    first.wait_started()
    first_id = worker_id_of(db, first.pid)
    assert first_id is not None

    def released(c: int, step: int) -> bool:
        return db.execute("SELECT state FROM akadze.jobs WHERE id = %s",
                          (chains[c][step].id,)).fetchone() != ("waiting",)

    for c in range(3):
        wait_until(lambda c=c: released(c, 3), what=f"chain {c} at step 3")  # type: ignore[misc]
        assert cancel_if_waiting(database_url, ids(chains[c])[revoked[c]])
    # The chord: one member revoked while still queued (the last ones wait their turn).
    victim = next(i for i in ids(members)[::-1]
                  if db.execute("SELECT state FROM akadze.jobs WHERE id = %s", (i,)
                                ).fetchone() == ("queued",))
    with psycopg.connect(database_url, autocommit=True) as connection:
        assert request_cancel_sync(connection, victim)
    chain_ids = {i for chain in chains for i in ids(chain)}
    stop_running(db, first, first_id, chain_ids)
    first.signal(signal.SIGKILL)
    assert first.wait_exit()[0] == -signal.SIGKILL
    for c in range(3, 6):
        assert cancel_if_waiting(database_url, ids(chains[c])[revoked[c]])
    rescuer = spawn_worker(database_url, *args)
    wait_until(lambda: all_final(db), timeout=60, what="every workflow to finish")
    assert rescuer.proc.poll() is None

    rows = rows_by_id(db)
    starts = starts_by_job(db)
    for c, chain in enumerate(chains):
        cut = revoked[c]
        states = [rows[i]["state"] for i in ids(chain)]
        assert states == ["succeeded"] * cut + ["cancelled"] * (12 - cut), (c, states)
        assert not [i for i in ids(chain)[cut:] if i in starts], c
        assert error_types(rows[ids(chain)[cut + 1]]) == ["UpstreamFailed"]
        assert rows[ids(chain)[cut + 1]]["errors"][-1]["upstream"] == ids(chain)[cut]
    assert rows[victim]["state"] == "cancelled" and victim not in starts
    assert rows[body.id or 0]["state"] == "cancelled" and body.id not in starts
    assert count(db, "SELECT count(*) FROM wf_bodies") == 0
    assert all(rows[i]["state"] == "succeeded" for i in ids(members) if i != victim)
    assert any("WorkerLost" in error_types(rows[i]) for i in chain_ids)


def test_two_live_workers_finishing_the_same_chords_run_each_body_once(
    app: App, database_url: str, wf_db: psycopg.Connection, spawn_worker: SpawnWorker
) -> None:
    """Members of each chord complete on two workers at once (their batched outcome writes
    race to release the body): every body is released once, with every result in order."""
    db = wf_db
    workers = [spawn_worker(database_url, *FAST, "--slots", "8") for _ in range(2)]
    for worker in workers:
        worker.wait_started()
    flow = app.workflow()
    chords = [add_chord(flow, app, f"chord{c}", 100, seconds=0.01) for c in range(8)]
    flow.enqueue()
    wait_until(lambda: all_final(db), timeout=60, what="every chord to finish")
    assert all(worker.proc.poll() is None for worker in workers)

    rows = rows_by_id(db)
    starts = starts_by_job(db)
    effects = db.execute("SELECT tag, job_id, run_count, vals FROM wf_bodies ORDER BY tag"
                         ).fetchall()
    assert effects == [(f"chord{c}", body.id, 1, list(range(100)))
                       for c, (_, body) in enumerate(chords)]
    shared = 0
    for members, body in chords:
        assert rows[body.id or 0]["state"] == "succeeded" and len(starts[body.id or 0]) == 1
        assert rows[body.id or 0]["upstream_results"] == list(range(100))
        pids = {pid for i in ids(members) for pid in starts[i]}
        shared += pids == {worker.pid for worker in workers}
    assert shared, "no chord had members completed by both workers"
    check_no_premature_start(db, ids(body for _, body in chords))
    for worker in workers:
        assert "deadlock" not in worker.log().lower(), worker.log()
