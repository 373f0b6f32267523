"""Workflows: a group enqueued in one statement, a fan-in (chord) of no-op
members against a plain group's drain, a chain's step-to-step latency, and what a chord adds
to the completion path.

Core figures are read from the jobs table (database clock):

- **group enqueue**: ``Workflow`` of N no-op nodes, ``add_many`` to ``enqueue`` (one
  statement), against ``enqueue_many`` of the same N kwargs in one call, and (info) the same
  workflow built with one ``add`` per node; the sides take turns.
- **fan-in**: one ``akadze worker`` started beforehand and idle; a workflow of N no-ops and a
  body waiting on all of them is enqueued; the figure is the body's ``started_at`` minus the
  first job's ``created_at``. The comparison is the same worker draining a workflow of the
  same N no-ops without a body: last ``finished_at`` minus first ``created_at``. The two
  take turns (ABBA), the table is emptied between runs.
- **chain**: the same idle worker runs a chain of S no-op steps; each step's latency is its
  ``started_at`` minus its upstream's ``finished_at`` (the outcome's transaction, which
  releases it, starts at ``finished_at``). The comparison is a single job's ``started_at``
  minus its ``created_at`` (the enqueue's transaction starts there), jobs enqueued one at a
  time on the idle worker, in the same run: both spans are a releasing transaction's
  statement and commit, the NOTIFY and a claim.
- **statements**: a fresh worker drains a plain workflow, then another a chord of the same
  size; each is stopped afterwards (its backends exit and flush their statistics) and the
  database's committed transactions (``pg_stat_database.xact_commit``, less the harness's
  own), the rows updated in ``akadze.jobs`` and the calls of ``akadze.settle``
  (``track_functions = 'pl'``, set on the benchmark database) are compared. This part runs
  on a private cluster of its own (stock settings plus ``pg_stat_statements``), which counts
  the calls of every statement: the verdict is that no statement but the batched outcome
  write is called more often per member in the chord drain. How many outcome writes a
  drain takes depends on how the outcomes happened to batch, so transactions alone (the
  figure when no private cluster can be made) move with timing, not with statements.

The Celery side (``celery_real/celery_bench_canvas.py``, run in Celery's virtualenv):
``chord(group(member.s(i) ...), body.s())`` on Redis (broker and result backend, database
7), worker ``-P prefork -c <cores>`` started beforehand and idle; the figure is the body's
start (``time.time()`` in the body) minus the client's clock before ``apply_async``. The
facade's twin runs the same program under ``akadze-compat worker`` once its canvas exists.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from akadze_core.store.queries import query

from . import celery_side, db, procs
from .apps.core_app import NOOP, STAMP, make_app
from .core import percentile, worker_argv
from .drain import REPO_ROOT, worker_env
from .pgjqb.native import DEFAULT_PG_BIN, private_cluster

#: Celery's broker and result backend for the chord (a Redis database of its own).
CELERY_CANVAS_URL = "redis://127.0.0.1:6379/7"


@dataclass
class EnqueueFigures:
    """Jobs/s of a workflow of ``jobs`` independent nodes vs ``enqueue_many`` (medians)."""

    jobs: int
    workflow: float
    enqueue_many: float
    workflow_runs: list[float] = field(default_factory=list)
    enqueue_many_runs: list[float] = field(default_factory=list)
    #: The same workflow built with one ``add`` per node (jobs/s, median), 0 if not run.
    add_loop: float = 0.0
    # Where a workflow's time goes, seconds (medians): building it (add_many), its parameters,
    # the statement.
    add_seconds: float = 0.0
    params_seconds: float = 0.0
    statement_seconds: float = 0.0


@dataclass
class FanInFigures:
    """Seconds from the first enqueue to the body's start, vs a plain group's drain."""

    members: int
    slots: int
    chord: float
    plain: float
    chord_runs: list[float] = field(default_factory=list)
    plain_runs: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.chord / self.plain


@dataclass
class ChainFigures:
    """Step-to-step latency of a chain vs a single enqueue → start, ms (medians of runs)."""

    steps: int
    p50: float
    p99: float
    single_p50: float
    single_p99: float
    single_samples: int
    single_client_p50: float  # the latency workload's own measure: client clock, commit → body
    runs: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class StatementFigures:
    """What the worker did in a plain drain and in a chord drain of the same size."""

    members: int
    plain_xacts: int
    chord_xacts: int
    plain_updates: int
    chord_updates: int
    plain_settles: int
    chord_settles: int
    #: Calls per statement (pg_stat_statements, top level), when a private cluster ran it.
    plain_calls: dict[str, int] | None = None
    chord_calls: dict[str, int] | None = None

    @property
    def extra_per_member(self) -> float:
        return (self.chord_xacts - self.plain_xacts) / self.members

    def outcome_writes(self) -> tuple[int, int]:
        """(plain, chord) calls of the batched outcome write."""
        return (_calls_of(self.plain_calls, OUTCOME_WRITE),
                _calls_of(self.chord_calls, OUTCOME_WRITE))

    def most_grown(self) -> tuple[str, int]:
        """Of every statement but the outcome write and the lock bound sent before each
        write and claim, the one called most often more in the chord drain than in the
        plain one: (its first line, the difference)."""
        plain, chord = self.plain_calls or {}, self.chord_calls or {}
        grown = [(chord.get(text, 0) - plain.get(text, 0), text) for text in chord
                 if not text.startswith((OUTCOME_WRITE, LOCK_BOUND))]
        difference, text = max(grown, default=(0, ""))
        return text.splitlines()[0] if text else "-", difference


@dataclass
class CoreCanvasResult:
    """The core workflow figures; a part is None when it was not measured."""

    enqueue: EnqueueFigures | None = None
    fan_in: FanInFigures | None = None
    chain: ChainFigures | None = None
    statements: StatementFigures | None = None
    errors: dict[str, str] = field(default_factory=dict)
    log: str = ""


# --- group enqueue ---------------------------------------------------------------------------


def group_enqueue(url: str, jobs: int, *, rounds: int = 3) -> EnqueueFigures:
    """A workflow of ``jobs`` no-op nodes vs ``enqueue_many`` of the same kwargs, ``rounds``
    times each in alternating order, into an emptied table each time."""
    from akadze_core.store import database

    app = make_app(url)
    task = app.tasks[NOOP]
    kwargs = [{"n": i} for i in range(jobs)]
    flows: list[float] = []
    manys: list[float] = []
    loops: list[float] = []
    parts: list[tuple[float, float, float]] = []
    try:
        task.enqueue_many(kwargs[:10])  # warm up the pool
        warm = app.workflow()
        for item in kwargs[:10]:
            warm.add(task, **item)
        warm.enqueue()

        def workflow() -> None:
            started = time.perf_counter()
            flow = app.workflow()
            flow.add_many(task, kwargs)
            built = time.perf_counter()
            params = flow.params()
            shaped = time.perf_counter()
            app.run_pooled(lambda connection: database.insert_graph(connection, params),
                           "the benchmark's workflow")
            done = time.perf_counter()
            flows.append(jobs / (done - started))
            parts.append((built - started, shaped - built, done - shaped))

        def add_loop() -> None:
            started = time.perf_counter()
            flow = app.workflow()
            for item in kwargs:
                flow.add(task, **item)
            flow.enqueue()
            loops.append(jobs / (time.perf_counter() - started))

        def many() -> None:
            started = time.perf_counter()
            task.enqueue_many(kwargs)
            manys.append(jobs / (time.perf_counter() - started))

        for number in range(rounds):
            order = (workflow, many, add_loop) if number % 2 == 0 \
                else (add_loop, many, workflow)
            for side in order:
                _empty(url)
                side()
    finally:
        app.close()
    _empty(url)
    return EnqueueFigures(
        jobs=jobs, workflow=statistics.median(flows), enqueue_many=statistics.median(manys),
        workflow_runs=flows, enqueue_many_runs=manys, add_loop=statistics.median(loops),
        add_seconds=statistics.median(p[0] for p in parts),
        params_seconds=statistics.median(p[1] for p in parts),
        statement_seconds=statistics.median(p[2] for p in parts))


def _empty(url: str) -> None:
    """Empty the jobs table (the worker's row stays: it may be running, idle)."""
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("TRUNCATE akadze.jobs")


# --- the idle worker: fan-in and chain ---------------------------------------------------------


class IdleWorker:
    """One ``akadze worker`` subprocess, warmed up, to which workflows are enqueued."""

    def __init__(self, url: str, slots: int, log: Path) -> None:
        self.url, self.slots, self.log = url, slots, log
        self.app = make_app(url)
        self.process = procs.start(worker_argv(url, slots), log=log, env=worker_env(url),
                                   cwd=REPO_ROOT)
        self.connection = psycopg.connect(url, autocommit=True)
        self.polls = 0  # statements run on self.connection
        stamp = self.app.tasks[STAMP]
        for _ in range(3):  # its pools, LISTEN, the client's pool
            self.wait_job(stamp.enqueue(), timeout=60)

    def close(self) -> None:
        procs.stop(self.process)
        self.connection.close()
        self.app.close()

    def alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"the worker exited with code {self.process.returncode}: "
                               f"see {self.log}")

    def wait_job(self, job_id: int, timeout: float = 600, interval: float = 0.005) -> None:
        """Until job ``job_id`` has ended."""
        deadline = time.monotonic() + timeout
        while True:
            self.polls += 1
            row = self.connection.execute("SELECT state FROM akadze.jobs WHERE id = %s",
                                          (job_id,)).fetchone()
            if row and row[0] not in ("waiting", "queued", "running"):
                return
            self.alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job_id} did not finish in {timeout:.0f}s: "
                                   f"see {self.log}")
            time.sleep(interval)

    def wait_all(self, ids: list[int], timeout: float = 600) -> None:
        """Until every job of ``ids`` (ids drawn in order: a range) has ended."""
        deadline = time.monotonic() + timeout
        low, high = min(ids), max(ids)
        while True:
            self.polls += 1
            row = self.connection.execute(
                "SELECT count(*) FROM akadze.jobs WHERE id BETWEEN %s AND %s"
                " AND state IN ('waiting', 'queued', 'running')", (low, high)).fetchone()
            if row and row[0] == 0:
                return
            self.alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the workflow did not finish in {timeout:.0f}s: "
                                   f"see {self.log}")
            time.sleep(0.05)

    def enqueue_flow(self, members: int, *, body: bool) -> tuple[list[int], int | None]:
        """``members`` no-ops, and with ``body`` one more job waiting on all of them."""
        task = self.app.tasks[NOOP]
        flow = self.app.workflow()
        nodes = [flow.add(task, n=i) for i in range(members)]
        last = flow.add(task, after=nodes, n=-1) if body else None
        ids = flow.enqueue()
        return ids, last.id if last is not None else None

    def fan_in_run(self, members: int, *, body: bool) -> float:
        """One run: seconds from the first created_at to the body's start (``body``) or to
        the last outcome (a plain group)."""
        _empty(self.url)
        ids, body_id = self.enqueue_flow(members, body=body)
        if body_id is not None:
            self.wait_job(body_id, interval=0.05)
            query = ("SELECT extract(epoch FROM (SELECT started_at FROM akadze.jobs"
                     "  WHERE id = %(body)s) - min(created_at))::float8, count(*) FILTER"
                     " (WHERE state = 'succeeded') FROM akadze.jobs"
                     " WHERE id BETWEEN %(low)s AND %(high)s")
        else:
            self.wait_all(ids)
            query = ("SELECT extract(epoch FROM max(finished_at) - min(created_at))::float8,"
                     " count(*) FILTER (WHERE state = 'succeeded') FROM akadze.jobs"
                     " WHERE id BETWEEN %(low)s AND %(high)s")
        row = self.connection.execute(query, {"body": body_id, "low": min(ids),
                                              "high": max(ids)}).fetchone()
        assert row is not None
        seconds, succeeded = row
        if body_id is not None:
            self.wait_job(body_id)
        if succeeded < members:
            raise RuntimeError(f"{succeeded} of {members} members succeeded: see {self.log}")
        return float(seconds)

    def chain_run(self, steps: int) -> list[float]:
        """One chain of ``steps`` no-ops: each step's start minus its upstream's finish, ms."""
        _empty(self.url)
        task = self.app.tasks[NOOP]
        flow = self.app.workflow()
        node = flow.add(task, n=0)
        for i in range(1, steps):
            node = flow.add(task, after=node, n=i)
        ids = flow.enqueue()
        self.wait_job(ids[-1], interval=0.05)
        rows = self.connection.execute(
            "SELECT extract(epoch FROM n.started_at - p.finished_at)::float8 * 1000"
            " FROM akadze.jobs AS n JOIN akadze.jobs AS p ON p.id = n.upstreams[1]"
            " WHERE n.id BETWEEN %s AND %s AND n.state = 'succeeded'",
            (min(ids), max(ids))).fetchall()
        if len(rows) != steps - 1:
            raise RuntimeError(f"{len(rows) + 1} of {steps} chain steps ran: see {self.log}")
        return [row[0] for row in rows]

    def single_latency(self, samples: int) -> tuple[list[float], list[float]]:
        """Jobs enqueued one at a time to the idle worker: (started_at - created_at, ms;
        the body's clock - the client's after the commit, ms)."""
        _empty(self.url)
        stamp = self.app.tasks[STAMP]
        sent: list[tuple[int, float]] = []
        for _ in range(samples):
            time.sleep(random.uniform(0.02, 0.04))  # the worker is idle again
            job_id = stamp.enqueue()
            sent.append((job_id, time.time()))
            self.wait_job(job_id)
        rows = {row[0]: row[1:] for row in self.connection.execute(
            "SELECT id, extract(epoch FROM started_at - created_at)::float8 * 1000,"
            " (result #>> '{}')::float8 FROM akadze.jobs WHERE id = ANY(%s)",
            ([job_id for job_id, _ in sent],)).fetchall()}
        database = [rows[job_id][0] for job_id, _ in sent]
        client = [(rows[job_id][1] - after) * 1000 for job_id, after in sent]
        return database, client


def fan_in(worker: IdleWorker, members: int, *, rounds: int = 3) -> FanInFigures:
    """Chord and plain group runs, ABBA, on the same idle worker."""
    chords: list[float] = []
    plains: list[float] = []
    worker.fan_in_run(min(members, 1000), body=True)  # warm up the statements' plans
    for number in range(rounds):
        order = (True, False) if number % 2 == 0 else (False, True)
        for body in order:
            (chords if body else plains).append(worker.fan_in_run(members, body=body))
    return FanInFigures(members=members, slots=worker.slots, chord=statistics.median(chords),
                        plain=statistics.median(plains), chord_runs=chords, plain_runs=plains)


def chain(worker: IdleWorker, steps: int, samples: int, *, rounds: int = 3) -> ChainFigures:
    """``rounds`` chains of ``steps`` and, between them, single enqueues (``samples`` in
    all) on the same idle worker."""
    runs: list[tuple[float, float]] = []
    single: list[float] = []
    client: list[float] = []
    worker.chain_run(min(steps, 20))  # warm up
    for _ in range(rounds):
        delays = worker.chain_run(steps)
        runs.append((percentile(delays, 0.5), percentile(delays, 0.99)))
        database, stamped = worker.single_latency(max(1, samples // rounds))
        single += database
        client += stamped
    return ChainFigures(steps=steps, p50=statistics.median(r[0] for r in runs),
                        p99=statistics.median(r[1] for r in runs),
                        single_p50=percentile(single, 0.5), single_p99=percentile(single, 0.99),
                        single_samples=len(single), single_client_p50=percentile(client, 0.5),
                        runs=runs)


# --- statements on the completion path -------------------------------------------------------


_COUNTERS = (
    "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),"
    " coalesce((SELECT n_tup_upd FROM pg_stat_user_tables"
    "           WHERE schemaname = 'akadze' AND relname = 'jobs'), 0),"
    " coalesce((SELECT calls FROM pg_stat_user_functions"
    "           WHERE schemaname = 'akadze' AND funcname = 'settle'), 0)")


def _counters(url: str) -> tuple[int, int, int]:
    """(committed transactions, rows updated in akadze.jobs, akadze.settle calls) as the
    statistics collector has them, from a connection of its own (one transaction, counted
    once the connection ends)."""
    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute(_COUNTERS).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def _settled_counters(url: str, timeout: float = 15) -> tuple[tuple[int, int, int], int]:
    """The counters once the exited backends' statistics are in (they flush on exit), and
    the transactions its own readings added. A reading is a connection of its own, which
    adds the same number of transactions every time (two on Postgres 15 with psycopg 3):
    the counters are settled when the other two stand still and the transactions grow by
    just that between two readings in a row."""
    previous = _counters(url)
    readings, step = 1, None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.25)
        current = _counters(url)
        readings += 1
        grown = current[0] - previous[0]
        if current[1:] == previous[1:] and grown == step:
            return current, readings * step
        step = grown if current[1:] == previous[1:] else None
        previous = current
    return previous, readings * (step or 1)


#: How the worker's outcome write and the lock bound sent before each write and claim
#: begin, as pg_stat_statements shows them: their first line up to any parameter (shown
#: there as $1, $2...).
OUTCOME_WRITE = query("job_complete_many").splitlines()[0].split("%(")[0]
LOCK_BOUND = query("statement_lock_timeout").splitlines()[0].split("%(")[0]
_STATEMENTS_CONF = ("shared_preload_libraries = 'pg_stat_statements'\n"
                    "pg_stat_statements.track = top\n")


def _calls_of(calls: dict[str, int] | None, first_line: str) -> int:
    return sum(n for text, n in (calls or {}).items() if text.startswith(first_line))


@contextlib.contextmanager
def statements_database(pg_bin: Path = DEFAULT_PG_BIN) -> Iterator[str | None]:
    """A benchmark database on a private cluster with ``pg_stat_statements`` (stock
    settings otherwise), deleted on the way out; None when no cluster can be made here."""
    if not (pg_bin / "initdb").exists():
        yield None
        return
    with private_cluster(pg_bin, "akadze-canvas-pg-", _STATEMENTS_CONF) as server:
        url = db.recreate(server.url(), db.DEFAULT_NAME)
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute("CREATE EXTENSION pg_stat_statements")
        yield url


def _statement_calls(url: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as connection:
        rows = connection.execute(
            "SELECT query, sum(calls)::bigint FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " GROUP BY query").fetchall()
    return {text: int(calls) for text, calls in rows}


def _reset_statements(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("SELECT pg_stat_statements_reset()")


def statements(url: str, members: int, *, slots: int, run_dir: Path,
               pg_bin: Path = DEFAULT_PG_BIN) -> StatementFigures:
    """``statements_on`` a private cluster with ``pg_stat_statements`` when one can be
    made, else on ``url`` (transactions, rows and settle calls only)."""
    try:
        with statements_database(pg_bin) as private:
            if private is not None:
                return statements_on(private, members, slots=slots, run_dir=run_dir,
                                     per_statement=True)
    except RuntimeError as exc:  # initdb or pg_ctl refused: the shared server's figures
        (run_dir / "canvas-statements-cluster.txt").write_text(str(exc))
    return statements_on(url, members, slots=slots, run_dir=run_dir)


def statements_on(url: str, members: int, *, slots: int, run_dir: Path,
                  per_statement: bool = False) -> StatementFigures:
    """A plain drain, then a chord drain of the same size, each by a fresh worker stopped
    afterwards: the worker's transactions, rows updated and settle calls for each, and
    (``per_statement``) the calls of each statement.

    The harness's own transactions in the window are subtracted: its polls of the jobs
    table (counted), the four enqueues (three warm-up jobs, the workflow) and those of its
    readings of the counters; they are the same on both sides but for the number of
    polls and readings."""
    with psycopg.connect(url, autocommit=True) as connection:
        name = connection.execute("SELECT current_database()").fetchone()
        assert name is not None
        connection.execute(sql.SQL("ALTER DATABASE {} SET track_functions = 'pl'").format(
            sql.Identifier(name[0])))
    figures: dict[bool, tuple[int, int, int]] = {}
    calls: dict[bool, dict[str, int]] = {}
    for body in (False, True):
        _empty(url)
        before, _ = _settled_counters(url)
        if per_statement:
            _reset_statements(url)
        worker = IdleWorker(url, slots, run_dir / f"canvas-statements-{int(body)}.log")
        try:
            ids, _ = worker.enqueue_flow(members, body=body)
            worker.wait_all(ids)
        finally:
            worker.close()
        after, readings = _settled_counters(url)
        if per_statement:
            calls[body] = _statement_calls(url)
        harness = worker.polls + 4 + readings
        figures[body] = (after[0] - before[0] - harness, after[1] - before[1],
                         after[2] - before[2])
    _empty(url)
    plain, chord = figures[False], figures[True]
    return StatementFigures(members=members, plain_xacts=plain[0], chord_xacts=chord[0],
                            plain_updates=plain[1], chord_updates=chord[1],
                            plain_settles=plain[2], chord_settles=chord[2],
                            plain_calls=calls.get(False), chord_calls=calls.get(True))


# --- Celery and the facade -------------------------------------------------------------------


@dataclass
class ChordRun:
    """A chord program's figures: seconds to the body's start (median of runs), the
    publishing time, and a group's enqueue rate when measured."""

    members: int
    seconds: float
    runs: list[float]
    publish_seconds: float
    group_rate: float | None = None
    log: str = ""


def celery_chord(python: Path, members: int, *, concurrency: int, run_dir: Path,
                 rounds: int = 3, timeout: float = 1200) -> ChordRun:
    """Celery 5.7 on Redis: a prefork worker started, then ``rounds`` chords of
    ``members`` published by ``celery_bench_canvas`` (which waits for each body)."""
    stats_dir = run_dir / "celery-canvas"
    stats_dir.mkdir(parents=True, exist_ok=True)
    queue = f"akadze_bench_canvas_{os.getpid()}"
    env = celery_side.CeleryRun(python, CELERY_CANVAS_URL, "prefork", concurrency, members,
                                run_dir).env(stats_dir, queue)
    env["BENCH_RESULT_BACKEND"] = CELERY_CANVAS_URL
    log = run_dir / "celery-canvas.log"
    argv = [str(python), "-m", "celery", "-A", "celery_bench_app", "worker", "-P", "prefork",
            "-c", str(concurrency), "--without-gossip", "--without-mingle",
            "--without-heartbeat", "-Q", queue, "-n", f"canvas-{os.getpid()}@%h",
            "-l", "WARNING"]
    procs.run([str(python), "-m", "celery_bench_canvas", "--purge"], log=log, env=env,
              cwd=stats_dir, timeout=120)
    process = procs.start(argv, log=log, env=env, cwd=stats_dir)
    try:
        done = procs.run([str(python), "-m", "celery_bench_canvas", "--members", str(members),
                          "--rounds", str(rounds)], log=log, env=env, cwd=stats_dir,
                         timeout=timeout)
        if process.poll() is not None:
            raise RuntimeError(f"the Celery worker exited: see {log}")
    finally:
        procs.stop(process)
        procs.run([str(python), "-m", "celery_bench_canvas", "--purge", "--delete"], log=log,
                  env=env, cwd=stats_dir, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"the Celery chord program failed: see {log}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return ChordRun(members=members, seconds=statistics.median(figures["runs"]),
                    runs=figures["runs"], publish_seconds=statistics.median(figures["publish"]),
                    log=str(log))


def compat_canvas_available() -> str | None:
    """None when akadze_compat's chord and group work (no worker needed to tell), else why
    not."""
    try:
        from akadze_compat import canvas

        from .apps.celery_app import CHORD_BODY, CHORD_MEMBER
        from .apps.celery_app import make_app as make_celery_app

        celery = make_celery_app("postgresql://unused@127.0.0.1:1/none")
        member, body = celery.tasks[CHORD_MEMBER], celery.tasks[CHORD_BODY]
        canvas.chord(canvas.group(member.s(i) for i in range(2)), body.s())
    except NotImplementedError as exc:  # its first clause: the rows stay short
        return f"not available yet ({str(exc).split(' (')[0]})"
    except Exception as exc:  # the facade is being written: report, do not fail the run
        return f"not available yet ({type(exc).__name__}: {exc})"
    return None


def compat_chord(url: str, argv: list[str], members: int, *, concurrency: int, run_dir: Path,
                 rounds: int = 3) -> ChordRun:
    """The same chord program under ``akadze-compat worker -P prefork -c <concurrency>``,
    and ``group(...).apply_async()`` of ``members`` signatures timed on the side."""
    from akadze_compat import canvas

    from .apps.celery_app import CHORD_BODY, CHORD_MEMBER
    from .apps.celery_app import make_app as make_celery_app
    from .compat import APP_MODULE

    log = run_dir / "compat-canvas.log"
    _empty(url)
    celery = make_celery_app(url)
    member, body = celery.tasks[CHORD_MEMBER], celery.tasks[CHORD_BODY]
    process = procs.start([*argv, "-A", APP_MODULE, "worker", "-P", "prefork", "-c",
                           str(concurrency)], log=log, env=worker_env(url), cwd=REPO_ROOT)
    runs: list[float] = []
    publish: list[float] = []
    groups: list[float] = []
    try:
        _wait_result(body.delay(), process, log)  # warm up
        result: Any = None
        for _ in range(rounds):
            _empty(url)
            signatures = [member.s(i) for i in range(members)]
            # The last round's result goes first: freeing its 10,000 results (each with
            # the job it read) took ~25 ms, timed as part of the next send before.
            result = None
            started = time.time()
            result = canvas.group(signatures).apply_async()
            groups.append(members / (time.time() - started))
            _wait_result(result, process, log)
            _empty(url)
            result = None
            started = time.time()
            result = canvas.chord(canvas.group(member.s(i) for i in range(members)),
                                  body.s()).apply_async()
            publish.append(time.time() - started)
            runs.append(float(_wait_result(result, process, log)) - started)
    finally:
        procs.stop(process)
        celery.close()
    _empty(url)
    return ChordRun(members=members, seconds=statistics.median(runs), runs=runs,
                    publish_seconds=statistics.median(publish),
                    group_rate=statistics.median(groups), log=str(log))


def _wait_result(result: Any, process: subprocess.Popen[bytes], log: Path,
                 timeout: float = 600) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return result.get(timeout=1)
        except Exception as exc:
            if type(exc).__name__ not in ("TimeoutError",):
                raise
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the facade's chord did not finish: see {log}")


def run_core(url: str, *, members: int, steps: int, samples: int, slots: int,
             run_dir: Path, attempt: Callable[[Callable[[], Any]], Any]) -> CoreCanvasResult:
    """Every core part; a part that fails is reported in ``errors``, the others still run."""
    result = CoreCanvasResult()

    def part(name: str, call: Callable[[], Any]) -> Any:
        value = attempt(call)
        reason = getattr(value, "reason", None)
        if reason is not None:
            result.errors[name] = str(reason)
            return None
        return value

    result.enqueue = part("enqueue", lambda: group_enqueue(url, members))
    log = run_dir / f"canvas-worker-{slots}.log"
    result.log = str(log)
    worker: IdleWorker | None = part("worker", lambda: IdleWorker(url, slots, log))
    if worker is not None:
        try:
            result.fan_in = part("fan_in", lambda: fan_in(worker, members))
            result.chain = part("chain", lambda: chain(worker, steps, samples))
        finally:
            worker.close()
    result.statements = part("statements", lambda: statements(url, members, slots=slots,
                                                              run_dir=run_dir))
    return result
