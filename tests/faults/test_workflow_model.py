"""Random workflows on a real worker, checked against a reference model.

Hypothesis draws small graphs: nodes waiting on earlier nodes (chains, fan-outs, fan-ins,
diamonds, the same upstream twice) and on jobs enqueued just before (which the worker may
have finished, be running or not have claimed yet when the workflow is inserted), nodes
that succeed, fail their first attempt, fail every attempt, fail at once (``Fail``) or
cancel themselves (``Cancel``), nodes cancelled in the enqueueing transaction, chord-style
nodes that fail when an upstream fails, errbacks with and without the error. One worker
process runs every example; the final rows must match what this model says:

- a waiting job runs iff every upstream succeeded, once per attempt it needs, and receives
  their results (the single one, or the list in ``after`` order);
- a failed or cancelled upstream ends the jobs downstream of it, transitively, without
  running them: ``cancelled``, with an ``UpstreamFailed`` entry naming a failed or cancelled
  ancestor; a node with ``on_upstream_failure='fail'`` (a fan-in) ``failed`` instead when the
  failure did not come from before inputs marked for it (``Workflow.mark_inputs``): counted
  along the path from the culprit the entry names, each marked input entered from outside
  adds one, each fan-in reached with one or more open closes one, and the fan-in fails only
  when none is open, passing none on (the entry's ``entered``: the count the node passes
  on);
- a cancel in the enqueueing transaction ends the job ``cancelled`` unless an earlier cancel
  already ended it (then ``request_cancel`` says False);
- each job that ends ``failed`` (itself or as a failed fan-in) gets each of its errbacks
  exactly once, with the error it failed with; no other job gets any.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akadze_core import App, Node, OnFailure, request_cancel_sync
from tests.faults.conftest import SpawnWorker
from tests.faults.support import count, rows_by_id

pytestmark = pytest.mark.slow

FINAL = ("succeeded", "failed", "cancelled")
#: How each mode ends when the node runs, how many starts it takes, and the type of the
#: error its errbacks receive.
MODES: dict[str, tuple[str, int, str | None]] = {
    "ok": ("succeeded", 1, None),
    "flaky": ("succeeded", 2, None),
    "exhaust": ("failed", 2, "ValueError"),
    "fail": ("failed", 1, "Fail"),
    "cancel": ("cancelled", 1, None),
    "tx": ("succeeded", 1, None),
    # Enqueued already expired: cancelled when claimed (the claim settles it), never run.
    "expired": ("cancelled", 0, None),
}


@dataclass
class Spec:
    """One node: ``after`` names earlier nodes (``("n", index)``) or external jobs
    (``("e", index)``); ``pass_`` how it takes their results; ``errbacks`` one bool per
    errback (True: it receives the error)."""

    mode: str
    after: list[tuple[str, int]]
    pass_: str | None
    on_upstream_failure: str
    errbacks: list[bool]
    seconds: float


@dataclass
class Graph:
    externals: list[str]  # the mode of each job enqueued before (ok or flaky)
    nodes: list[Spec]
    precancel: list[int]  # nodes cancelled, in this order, in the enqueueing transaction
    #: (k, at): mark_inputs(node k) called once node `at` is added (k <= at).
    marks: list[tuple[int, int]] = field(default_factory=list)


@st.composite
def graphs(draw: st.DrawFn) -> Graph:
    externals = draw(st.lists(st.sampled_from(["ok", "flaky"]), max_size=2))
    size = draw(st.integers(1, 8))
    nodes: list[Spec] = []
    for index in range(size):
        choices = [("n", j) for j in range(index)] + [("e", k) for k in range(len(externals))]
        after = draw(st.lists(st.sampled_from(choices), max_size=3)) if choices else []
        passes: list[str | None] = [None, "list"] + (["one"] if len(after) == 1 else [])
        nodes.append(Spec(
            mode=draw(st.sampled_from(["ok", "ok", "ok", "flaky", "exhaust", "fail",
                                       "cancel", "tx", "expired"])),
            after=after,
            pass_=draw(st.sampled_from(passes)) if after else None,
            on_upstream_failure=draw(st.sampled_from(["cancel", "fail"])),
            errbacks=draw(st.lists(st.booleans(), max_size=2)),
            seconds=draw(st.sampled_from([0.0, 0.0, 0.01, 0.05])),
        ))
    precancel = draw(st.one_of(st.just([]), st.lists(st.integers(0, size - 1), unique=True,
                                                     min_size=1, max_size=2)))
    marks = draw(st.lists(st.tuples(st.integers(0, size - 1), st.integers(0, size - 1))
                          .map(sorted).map(tuple), max_size=3))
    return Graph(externals, nodes, precancel, marks)


def enters(graph: Graph, index: int) -> int:
    """How many fan-ins' inputs node ``index`` opens: the marks whose range holds it and
    that it enters from outside (it waits on a node before the range, or on an external)."""
    after = graph.nodes[index].after
    return sum(1 for k, at in graph.marks if k <= index <= at
               and any(kind == "e" or ref < k for kind, ref in after))


def doom_depths(graph: Graph, root: int, doomed: set[int]) -> tuple[dict[int, int],
                                                                     dict[int, int]]:
    """From the culprit ``root``, through the ``doomed`` nodes: each node's arrival depth
    (the least over its paths) and the depth it passes on."""
    arrival: dict[int, int] = {}
    passed: dict[int, int] = {}
    for index in range(root + 1, len(graph.nodes)):
        if index not in doomed:
            continue
        ins = [0 if (kind, ref) == ("n", root) else passed[ref]
               for kind, ref in graph.nodes[index].after
               if kind == "n" and (ref == root or ref in passed)]
        if not ins:
            continue
        depth = arrival[index] = min(ins)
        fan_in = graph.nodes[index].on_upstream_failure == "fail"
        if fan_in and depth == 0:
            passed[index] = 0  # it fails: what follows sees a failure from inside
        else:
            passed[index] = depth - (1 if fan_in else 0) + enters(graph, index)
    return arrival, passed


@dataclass
class Prediction:
    state: list[str] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    result: list[Any] = field(default_factory=list)
    upstream_results: list[Any] = field(default_factory=list)
    error_type: list[str | None] = field(default_factory=list)  # what errbacks receive
    #: How each node ended: ran (or was claimed, for "expired"), "precancelled", "upstream".
    how: list[str] = field(default_factory=list)
    cancel_marks: list[bool] = field(default_factory=list)  # request_cancel's answers


def name(index: int) -> str:
    return f"n{index}"


def ext_name(index: int) -> str:
    return f"e{index}"


def ended_state(spec: Spec) -> str:
    # A fan-in's: decided in Runner.check from the culprit its entry names.
    return "failed" if spec.on_upstream_failure == "fail" else "cancelled"


def predict(graph: Graph) -> Prediction:
    """The reference model: what every node of ``graph`` ends as."""
    nodes = graph.nodes
    dependents: dict[int, list[int]] = {i: [] for i in range(len(nodes))}
    for index, spec in enumerate(nodes):
        for kind, ref in spec.after:
            if kind == "n":
                dependents[ref].append(index)
    out = Prediction()
    # At enqueue, in order: a cancel ends the node and, transitively, what waits on it.
    ended: dict[int, str] = {}
    for target in graph.precancel:
        out.cancel_marks.append(target not in ended)
        if target in ended:
            continue
        ended[target] = "cancelled"
        stack = [target]
        while stack:
            for downstream in dependents[stack.pop()]:
                if downstream not in ended:
                    ended[downstream] = ended_state(nodes[downstream])
                    stack.append(downstream)
    results: dict[tuple[str, int], Any] = {
        ("e", k): {"name": ext_name(k), "got": None} for k in range(len(graph.externals))}
    for index, spec in enumerate(nodes):
        states = [out.state[ref] if kind == "n" else "succeeded" for kind, ref in spec.after]
        if index in ended or any(state != "succeeded" for state in states):
            state = ended.get(index, ended_state(spec))
            out.state.append(state)
            out.starts.append(0)
            out.result.append(None)
            out.upstream_results.append(None)
            out.error_type.append("UpstreamFailed" if state == "failed" else None)
            out.how.append("precancelled" if ended.get(index) == "cancelled"
                           and index in graph.precancel else "upstream")
            continue
        state, starts, error_type = MODES[spec.mode]
        inputs = [results[ref] for ref in spec.after]
        passed = inputs[0] if spec.pass_ == "one" else inputs if spec.pass_ == "list" else None
        def name_of(value: Any) -> Any:
            return value["name"] if isinstance(value, dict) else None

        got = (name_of(passed) if spec.pass_ == "one"
               else [name_of(value) for value in inputs] if spec.pass_ == "list" else None)
        result = ({"name": name(index), "got": got} if state == "succeeded"
                  and spec.mode != "tx" else None)
        results[("n", index)] = result
        out.state.append(state)
        out.starts.append(starts)
        out.result.append(result)
        out.upstream_results.append(passed)
        out.error_type.append(error_type)
        out.how.append("ran")
    return out


def ancestors(graph: Graph, index: int) -> set[int]:
    """The workflow nodes ``index`` waits on, directly or not."""
    found: set[int] = set()
    stack = [index]
    while stack:
        for kind, ref in graph.nodes[stack.pop()].after:
            if kind == "n" and ref not in found:
                found.add(ref)
                stack.append(ref)
    return found


class Runner:
    """Enqueues one graph at a time for the worker and reads back what happened."""

    def __init__(self, app: App, db: psycopg.Connection, url: str) -> None:
        self.app = app
        self.db = db
        self.url = url
        self.node = app.tasks["wf_node"]
        self.errback = app.tasks["wf_errback"]
        self.expired = self.node.configure(
            expires_at=datetime.now(timezone.utc) - timedelta(hours=1))
        self.examples = 0

    def enqueue(self, graph: Graph) -> tuple[list[int], list[int], list[bool]]:
        """Enqueue the externals, then the graph and its cancels in one transaction;
        returns the external ids, the node ids and request_cancel's answers."""
        external_ids = []
        for k, mode in enumerate(graph.externals):
            flow = self.app.workflow()
            flow.add(self.node, name=ext_name(k), mode=mode)
            external_ids.extend(flow.enqueue())
        flow = self.app.workflow()
        nodes: list[Node] = []
        for index, spec in enumerate(graph.nodes):
            refs: list[Node | int] = [nodes[ref] if kind == "n" else external_ids[ref]
                                      for kind, ref in spec.after]
            after: Any = None
            if spec.pass_ == "one":
                after = refs[0]
            elif refs:
                after = refs
            errbacks = [OnFailure(self.errback, result_arg="error" if with_error else None,
                                  tag=f"{name(index)}/{k}")
                        for k, with_error in enumerate(spec.errbacks)]
            call = self.expired if spec.mode == "expired" else self.node
            nodes.append(flow.add(call, after=after,
                                  result_arg="inputs" if spec.pass_ else None,
                                  on_upstream_failure=spec.on_upstream_failure,
                                  on_failure=errbacks, name=name(index), mode=spec.mode,
                                  seconds=spec.seconds))
            for k, at in graph.marks:
                if at == index:
                    flow.mark_inputs(nodes[k])
        with psycopg.connect(self.url) as connection:
            node_ids = flow.using(session=connection).enqueue()
            marks = [request_cancel_sync(connection, node_ids[target])
                     for target in graph.precancel]
        return external_ids, node_ids, marks

    def wait_settled(self, baseline: int, timeout: float = 10.0) -> None:
        """Until every job inserted after ``baseline`` (errbacks included) is final."""
        deadline = time.monotonic() + timeout
        while count(self.db, "SELECT count(*) FROM akadze.jobs WHERE id > %s AND state NOT IN"
                             " ('succeeded', 'failed', 'cancelled')", (baseline,)):
            if time.monotonic() > deadline:
                stuck = self.db.execute(
                    "SELECT id, state, upstreams, waiting_for, dependents FROM akadze.jobs"
                    " WHERE id > %s AND state NOT IN ('succeeded', 'failed', 'cancelled')",
                    (baseline,)).fetchall()
                raise AssertionError(f"the workflow did not settle: {stuck}")
            time.sleep(0.02)

    def check(self, graph: Graph) -> None:
        self.examples += 1
        baseline = count(self.db, "SELECT coalesce(max(id), 0) FROM akadze.jobs")
        expected = predict(graph)
        external_ids, node_ids, marks = self.enqueue(graph)
        assert marks == expected.cancel_marks
        self.wait_settled(baseline)

        rows = rows_by_id(self.db, [*external_ids, *node_ids])
        starts = dict(self.db.execute(
            "SELECT job_id, count(*) FROM runs WHERE job_id = ANY(%s) GROUP BY job_id",
            (node_ids,)).fetchall())
        first_start = dict(self.db.execute(
            "SELECT job_id, min(started) FROM runs WHERE job_id = ANY(%s) GROUP BY job_id",
            (node_ids,)).fetchall())
        errbacks: dict[int, list[dict[str, Any]]] = {}
        for row in rows_by_id(self.db).values():
            if row["id"] > baseline and row["task"] == "wf_errback":
                errbacks.setdefault(row["upstreams"][0], []).append(row)
        for k, job_id in enumerate(external_ids):
            assert rows[job_id]["state"] == "succeeded"
            assert rows[job_id]["result"] == {"name": ext_name(k), "got": None}
        doomed = {index for index, job_id in enumerate(node_ids)
                  if rows[job_id]["errors"] and rows[job_id]["run_count"] == 0
                  and rows[job_id]["errors"][-1].get("type") == "UpstreamFailed"}
        index_of = {job_id: index for index, job_id in enumerate(node_ids)}
        for index, job_id in enumerate(node_ids):
            row, spec = rows[job_id], graph.nodes[index]
            where = (index, row, graph.marks)
            if expected.how[index] == "upstream" and index in doomed:
                # The culprit the entry names (through a failed fan-in it names instead),
                # and the depth counted from it.
                entry = row["errors"][-1]
                root = index_of[entry["upstream"]]
                if root in doomed:
                    root = index_of[entry["upstream_error"]["upstream"]]
                arrival, passed = doom_depths(graph, root, doomed)
                assert entry["entered"] == passed[index], where
                if spec.on_upstream_failure == "fail":
                    fails = arrival[index] == 0
                    expected.state[index] = "failed" if fails else "cancelled"
                    expected.error_type[index] = "UpstreamFailed" if fails else None
            assert row["state"] == expected.state[index], where
            assert starts.get(job_id, 0) == expected.starts[index], where
            if expected.state[index] == "succeeded":
                assert row["result"] == expected.result[index], where
            if spec.mode == "expired" and expected.how[index] == "ran":
                assert row["errors"] == [], where  # cancelled at claim
            if expected.starts[index]:
                assert row["upstream_results"] == expected.upstream_results[index], where
                # Released at zero, and not before: it started after its upstreams finished.
                assert row["waiting_for"] in (None, 0), where
                ups = [rows[i] for i in row["upstreams"] or []]
                assert all(first_start[job_id] > up["finished_at"] for up in ups), where
            else:
                assert row["run_count"] == 0 and row["attempt"] == 0, where
                if expected.how[index] == "upstream":
                    entry = row["errors"][-1]
                    assert entry["type"] == "UpstreamFailed", where
                    culprits = {node_ids[a] for a in ancestors(graph, index)
                                if expected.state[a] in ("failed", "cancelled")}
                    assert entry["upstream"] in culprits, (where, culprits)
            got = sorted((e["result"]["tag"], e["result"]["type"], e["state"])
                         for e in errbacks.pop(job_id, []))
            want = sorted((f"{name(index)}/{k}",
                           expected.error_type[index] if with_error else None, "succeeded")
                          for k, with_error in enumerate(spec.errbacks))
            assert got == (want if expected.state[index] == "failed" else []), where
        assert not errbacks, errbacks


def test_random_workflows_end_as_the_reference_model_says(
    app: App, database_url: str, runs_db: psycopg.Connection, spawn_worker: SpawnWorker
) -> None:
    worker = spawn_worker(database_url, "--heartbeat-interval", "0.2", "--heartbeat-ttl", "5",
                          "--poll-interval", "0.1", "--slots", "4")
    worker.wait_started()
    runner = Runner(app, runs_db, database_url)

    @settings(max_examples=80, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(graphs())
    def run(graph: Graph) -> None:
        runner.check(graph)

    run()
    assert runner.examples >= 80
    assert worker.proc.poll() is None, worker.log()
