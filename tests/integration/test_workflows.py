"""Workflows (akadze_core.enqueue.workflow) on real Postgres with a real worker: chains, fan-in,
failure and cancel cascades, errbacks, waiting on jobs enqueued before, the caller's
transaction. Only the database decides what happened: the assertions read job rows."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from akadze_core import (
    App,
    Fail,
    InvalidArgs,
    OnFailure,
    UpstreamFailed,
    current,
    request_cancel_sync,
)
from akadze_core.model.serialization import strict_dumps
from akadze_core.store.floors import parse_notice
from tests.helpers import job
from tests.integration.outcome_helpers import run_until


def state(db: psycopg.Connection, job_id: int | None) -> str:
    assert job_id is not None
    return str(job(db, job_id)["state"])


def finished(db: psycopg.Connection, *ids: int | None) -> Any:
    def check() -> bool:
        return all(state(db, i) in ("succeeded", "failed", "cancelled") for i in ids)
    return check


@pytest.fixture
def tasks(app: App) -> dict[str, Any]:
    calls: list[tuple[str, Any]] = []

    @app.task("wf.add")
    async def add(x: int, y: int = 0) -> int:
        calls.append(("add", (x, y)))
        return x + y

    @app.task("wf.total")
    async def total(values: list[int], bonus: int = 0) -> int:
        calls.append(("total", values))
        return sum(values) + bonus

    @app.task("wf.boom", max_attempts=1)
    async def boom(x: int = 0) -> None:
        calls.append(("boom", x))
        raise Fail(f"boom {x}")

    @app.task("wf.alert")
    async def alert(tag: str, error: dict[str, Any] | None = None) -> str:
        calls.append(("alert", (tag, error and error["message"])))
        return tag

    return {"add": add, "total": total, "boom": boom, "alert": alert, "calls": calls}


async def test_chain_passes_each_result_to_the_next_step(app: App, db: psycopg.Connection,
                                                         tasks: dict[str, Any]) -> None:
    flow = app.workflow()
    first = flow.add(tasks["add"], x=1, y=2)
    second = flow.add(tasks["add"], after=first, result_arg="x", y=10)
    third = flow.add(tasks["add"], after=second, result_arg="x", y=100)
    ids = flow.enqueue()
    assert ids == [first.id, second.id, third.id]
    assert [state(db, i) for i in ids] == ["queued", "waiting", "waiting"]
    assert job(db, ids[0])["dependents"] == [ids[1]]
    assert job(db, ids[2])["upstreams"] == [ids[1]] and job(db, ids[2])["waiting_for"] == 1
    await run_until(app, finished(db, *ids))
    assert [job(db, i)["result"] for i in ids] == [3, 13, 113]


async def test_fan_in_gets_the_results_in_order_once(app: App, db: psycopg.Connection,
                                                     tasks: dict[str, Any]) -> None:
    flow = app.workflow()
    parts = [flow.add(tasks["add"], x=i) for i in range(20)]
    body = flow.add(tasks["total"], after=parts, result_arg="values", bonus=1000)
    flow.enqueue()
    await run_until(app, finished(db, body.id), slots=8)
    assert job(db, body.id)["result"] == sum(range(20)) + 1000
    totals = [args for name, args in tasks["calls"] if name == "total"]
    assert totals == [list(range(20))]


async def test_a_failed_step_cancels_the_rest_and_runs_its_errback(
        app: App, db: psycopg.Connection, tasks: dict[str, Any]) -> None:
    flow = app.workflow()
    head = flow.add(tasks["add"], x=1)
    bad = flow.add(tasks["boom"], after=head,
                   on_failure=[OnFailure(tasks["alert"], result_arg="error", tag="ops")])
    rest = flow.add(tasks["add"], after=bad, result_arg="x")
    last = flow.add(tasks["add"], after=rest, result_arg="x")
    flow.enqueue()
    await run_until(app, lambda: finished(db, head.id, bad.id, rest.id, last.id)()
                    and any(name == "alert" for name, _ in tasks["calls"]))
    assert [state(db, n.id) for n in (head, bad, rest, last)] == \
        ["succeeded", "failed", "cancelled", "cancelled"]
    entry = job(db, last.id)["errors"][-1]
    assert entry["type"] == "UpstreamFailed" and entry["upstream"] == bad.id
    assert entry["upstream_error"]["message"] == "boom 0"
    assert ("alert", ("ops", "boom 0")) in tasks["calls"]
    errback = db.execute("SELECT upstreams, state FROM akadze.jobs WHERE task = 'wf.alert'"
                         ).fetchall()
    assert errback == [([bad.id], "succeeded")]


async def test_a_failed_member_fails_a_fan_in_that_asks_for_it(
        app: App, db: psycopg.Connection, tasks: dict[str, Any]) -> None:
    flow = app.workflow()
    parts = [flow.add(tasks["add"], x=1), flow.add(tasks["boom"], x=7)]
    body = flow.add(tasks["total"], after=parts, result_arg="values",
                    on_upstream_failure="fail",
                    on_failure=[OnFailure(tasks["alert"], tag="body")])
    flow.enqueue()
    await run_until(app, lambda: finished(db, body.id)()
                    and any(name == "alert" for name, _ in tasks["calls"]))
    assert state(db, body.id) == "failed"
    assert job(db, body.id)["attempt"] == 0
    assert not [name for name, _ in tasks["calls"] if name == "total"]


def errback_counts(db: psycopg.Connection) -> dict[int, int]:
    """How many errbacks were inserted for each failed job (by its id)."""
    return dict(db.execute("SELECT upstreams[1], count(*) FROM akadze.jobs"
                           " WHERE task = 'wf.alert' GROUP BY 1").fetchall())


async def test_a_failure_before_a_fan_ins_marked_inputs_cancels_it(
        app: App, db: psycopg.Connection, tasks: dict[str, Any]) -> None:
    """Celery's chain(a, chord(header, body), chord(header2, body2)) with `a` failing: the
    bodies are cancelled (no errback runs for them), not failed as their header's own
    failure would fail them."""
    alert = [OnFailure(tasks["alert"], tag="x")]
    flow = app.workflow()
    head = flow.add(tasks["boom"], x=1, on_failure=alert)
    first = flow.add(tasks["add"], after=head, result_arg="x")
    inner = flow.add(tasks["add"], after=first, result_arg="x")  # a chain in the header
    other = flow.add(tasks["add"], after=head, result_arg="x")
    assert flow.mark_inputs(first) == 2  # first and other wait on head; inner does not
    body = flow.add(tasks["total"], after=[inner, other], result_arg="values",
                    on_upstream_failure="fail", on_failure=alert)
    second = flow.add(tasks["add"], after=body, result_arg="x")
    assert flow.mark_inputs(second) == 1
    body2 = flow.add(tasks["total"], after=[second], result_arg="values",
                     on_upstream_failure="fail", on_failure=alert)
    flow.enqueue()
    await run_until(app, lambda: finished(db, body2.id)()
                    and any(name == "alert" for name, _ in tasks["calls"]))
    assert [state(db, n.id) for n in (head, first, inner, other, body, second, body2)] == \
        ["failed"] + ["cancelled"] * 6
    entry = job(db, body.id)["errors"][-1]
    assert entry["type"] == "UpstreamFailed" and entry["upstream"] == head.id
    assert errback_counts(db) == {head.id: 1}


async def test_a_failure_inside_marked_inputs_fails_the_fan_in_once(
        app: App, db: psycopg.Connection, tasks: dict[str, Any]) -> None:
    """A failure among the inputs (a chain in Celery's chord header failing at its first
    step) fails the fan-in and runs its errbacks; a fan-in after it whose inputs follow the
    failed one is cancelled, and one fed by it directly fails (a chord of chords)."""
    alert = [OnFailure(tasks["alert"], tag="x")]
    flow = app.workflow()
    head = flow.add(tasks["add"], x=1)
    bad = flow.add(tasks["boom"], after=head, on_failure=alert)
    after_bad = flow.add(tasks["add"], after=bad, result_arg="x")
    good = flow.add(tasks["add"], after=head, result_arg="x")
    flow.mark_inputs(bad)
    body = flow.add(tasks["total"], after=[after_bad, good], result_arg="values",
                    on_upstream_failure="fail", on_failure=alert)
    # chain(..., chord([body's chord], ...)): fed by body itself, inside its header.
    fed = flow.add(tasks["total"], after=[body], result_arg="values",
                   on_upstream_failure="fail", on_failure=alert)
    # chain(..., chord(header, ...)) after it: its header's entry waits on `fed`.
    entry_node = flow.add(tasks["add"], after=fed, result_arg="x")
    flow.mark_inputs(entry_node)
    later = flow.add(tasks["total"], after=[entry_node], result_arg="values",
                     on_upstream_failure="fail", on_failure=alert)
    flow.enqueue()
    await run_until(app, lambda: finished(db, later.id)()
                    and sum(name == "alert" for name, _ in tasks["calls"]) >= 3)
    assert [state(db, n.id) for n in (head, bad, after_bad, good, body, fed, entry_node,
                                      later)] == \
        ["succeeded", "failed", "cancelled", "succeeded", "failed", "failed", "cancelled",
         "cancelled"]
    assert errback_counts(db) == {bad.id: 1, body.id: 1, fed.id: 1}


def test_mark_inputs_refuses_a_node_of_another_workflow(app: App,
                                                       tasks: dict[str, Any]) -> None:
    flow, other = app.workflow(), app.workflow()
    node = other.add(tasks["add"], x=1)
    with pytest.raises(ValueError, match="mark_inputs"):
        flow.mark_inputs(node)


async def test_cancelling_a_waiting_job_cancels_what_waits_on_it(
        app: App, db: psycopg.Connection, tasks: dict[str, Any]) -> None:
    flow = app.workflow()
    head = flow.add(tasks["add"], x=1)
    middle = flow.add(tasks["add"], after=head, result_arg="x")
    tail = flow.add(tasks["add"], after=middle, result_arg="x")
    flow.enqueue()
    assert middle.id is not None
    with psycopg.connect(app.database_url, autocommit=True) as connection:
        assert request_cancel_sync(connection, middle.id)
    assert (state(db, middle.id), state(db, tail.id)) == ("cancelled", "cancelled")
    await run_until(app, finished(db, head.id))
    assert state(db, head.id) == "succeeded" and state(db, tail.id) == "cancelled"


async def test_waiting_on_jobs_enqueued_before(app: App, db: psycopg.Connection,
                                               tasks: dict[str, Any]) -> None:
    done_id = tasks["add"].enqueue(x=5)
    await run_until(app, finished(db, done_id))
    queued_id = tasks["add"].enqueue(x=6)
    flow = app.workflow()
    body = flow.add(tasks["total"], after=[done_id, queued_id], result_arg="values")
    flow.enqueue()
    assert state(db, body.id) == "waiting" and job(db, body.id)["waiting_for"] == 1
    assert job(db, queued_id)["dependents"] == [body.id]
    await run_until(app, finished(db, body.id))
    assert job(db, body.id)["result"] == 11
    # Everything waited on already succeeded: queued at once, with the results.
    flow = app.workflow()
    now = flow.add(tasks["total"], after=[done_id, queued_id], result_arg="values")
    flow.enqueue()
    assert state(db, now.id) == "queued"
    assert job(db, now.id)["upstream_results"] == [5, 6]


async def test_waiting_on_a_failed_job_is_refused_and_inserts_nothing(
        app: App, db: psycopg.Connection, tasks: dict[str, Any]) -> None:
    bad_id = tasks["boom"].enqueue()
    await run_until(app, finished(db, bad_id))
    before = db.execute("SELECT count(*) FROM akadze.jobs").fetchone()
    flow = app.workflow()
    flow.add(tasks["add"], x=1)
    flow.add(tasks["add"], after=bad_id, result_arg="x")
    with pytest.raises(UpstreamFailed, match=f"job {bad_id}.*failed"):
        flow.enqueue()
    flow = app.workflow()
    flow.add(tasks["add"], after=10**12, result_arg="x")
    with pytest.raises(UpstreamFailed, match="does not exist"):
        flow.enqueue()
    assert db.execute("SELECT count(*) FROM akadze.jobs").fetchone() == before


def test_a_workflow_commits_with_the_callers_transaction(app: App, db: psycopg.Connection,
                                                         tasks: dict[str, Any]) -> None:
    with psycopg.connect(app.database_url) as connection:
        flow = app.workflow().using(session=connection)
        flow.add(tasks["add"], x=1)
        ids = flow.enqueue()
        connection.rollback()
    assert db.execute("SELECT count(*) FROM akadze.jobs WHERE id = ANY(%s)", (ids,)
                      ).fetchone() == (0,)


def test_bad_calls_fail_before_anything_is_sent(app: App, tasks: dict[str, Any]) -> None:
    flow = app.workflow()
    head = flow.add(tasks["add"], x=1)
    with pytest.raises(TypeError, match="cannot take"):
        flow.add(tasks["add"], after=head, result_arg="nope")
    with pytest.raises(TypeError, match="also the argument"):
        flow.add(tasks["add"], after=head, result_arg="x", x=2)
    with pytest.raises(ValueError, match="needs after"):
        flow.add(tasks["add"], result_arg="x")
    other = app.workflow().add(tasks["add"], x=1)
    with pytest.raises(ValueError, match="another workflow"):
        flow.add(tasks["add"], after=other, x=1)


async def test_waiting_for_many_jobs_at_once(app: App, db: psycopg.Connection,
                                             tasks: dict[str, Any]) -> None:
    import asyncio

    ids = tasks["add"].enqueue_many([{"x": i} for i in range(5)])
    assert set(app.get_jobs([*ids, 10**12])) == set(ids)
    with pytest.raises(TimeoutError):
        await asyncio.to_thread(app.wait_for_jobs, ids, 0.2)
    waiter = asyncio.create_task(asyncio.to_thread(app.wait_for_jobs, ids, 20))
    await run_until(app, finished(db, *ids))
    jobs = await waiter
    assert list(jobs) == ids and [jobs[i].result for i in ids] == list(range(5))


async def test_prune_keeps_what_a_waiting_job_still_needs_and_purge_takes_waiting_jobs(
        app: App, db: psycopg.Connection, tasks: dict[str, Any]) -> None:
    from akadze_core.store import database

    flow = app.workflow()
    first = flow.add(tasks["add"], x=1)
    second = flow.add(tasks["add"], x=2)
    body = flow.add(tasks["total"], after=[first, second], result_arg="values")
    flow.enqueue()
    # first succeeded long ago, second has not run: body still waits on first's result.
    db.execute("UPDATE akadze.jobs SET state = 'succeeded', result = '1', "
               "finished_at = now() - interval '30 days' WHERE id = %s", (first.id,))
    db.execute("UPDATE akadze.jobs SET waiting_for = 1 WHERE id = %s", (body.id,))
    lonely = tasks["add"].enqueue(x=9)
    db.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = now() - "
               "interval '30 days' WHERE id = %s", (lonely,))
    async with await psycopg.AsyncConnection.connect(app.database_url,
                                                     autocommit=True) as connection:
        pruned = await database.prune_jobs(connection, finished_retention=60,
                                           failed_retention=60, limit=100)
    assert pruned == 1
    assert state(db, first.id) == "succeeded"
    assert app.purge() == 2  # second (queued) and body (waiting)
    assert db.execute("SELECT count(*) FROM akadze.jobs WHERE id IN (%s, %s)",
                      (second.id, body.id)).fetchone() == (0,)


async def test_a_fan_out_added_at_once_is_a_plain_insert(app: App, db: psycopg.Connection,
                                                         tasks: dict[str, Any]) -> None:
    flow = app.workflow()
    parts = flow.add_many(tasks["add"], [{"x": i} for i in range(50)])
    assert "external" not in flow.params()  # no graph: job_insert_rows
    ids = flow.enqueue()
    assert ids == [node.id for node in parts] and ids == sorted(ids)
    with pytest.raises(TypeError, match="cannot take"):
        app.workflow().add_many(tasks["add"], [{"x": 1}, {"nope": 2}])
    flow = app.workflow()
    more = flow.add_many(tasks["add"], [{"x": i} for i in range(3)])
    body = flow.add(tasks["total"], after=more, result_arg="values")
    flow.enqueue()
    await run_until(app, finished(db, body.id, *ids))
    assert job(db, body.id)["result"] == 3
    assert [job(db, i)["result"] for i in ids] == list(range(50))


async def test_a_plain_insert_across_chunks_and_templates_keeps_every_job_in_order(
        app: App, db: psycopg.Connection, tasks: dict[str, Any]) -> None:
    """job_insert_rows draws ids in input order with no sort: runs of several templates,
    each over chunk boundaries, one with metas of its own, come back in the order added and
    each row holds what was added for it."""
    flow = app.workflow()
    add = tasks["add"]
    urgent = add.configure(priority=7, queue="urgent")
    expected: list[tuple[str, int, dict[str, Any], dict[str, Any]]] = []
    nodes = flow.add_many(add, [{"x": i} for i in range(230)])
    expected += [("default", 0, {"x": i}, {}) for i in range(230)]
    for i in range(3):
        nodes.append(flow.add(urgent, x=1000 + i))
        expected.append(("urgent", 7, {"x": 1000 + i}, {}))
    nodes += flow.add_many(urgent, [{"x": 2000 + i} for i in range(170)],
                           metas=[{"n": i} for i in range(170)])
    expected += [("urgent", 7, {"x": 2000 + i}, {"n": i}) for i in range(170)]
    nodes += flow.add_many(add, [{"x": 3000 + i} for i in range(101)])
    expected += [("default", 0, {"x": 3000 + i}, {}) for i in range(101)]
    assert "external" not in flow.params()  # job_insert_rows
    ids = flow.enqueue()
    assert ids == [node.id for node in nodes] and ids == sorted(ids)
    stored = {row[0]: row[1:] for row in db.execute(
        "SELECT id, queue, priority, args, meta FROM akadze.jobs").fetchall()}
    assert [stored[i] for i in ids] == expected


def test_a_plain_insert_wakes_each_queue_of_its_due_jobs_once_with_their_first_key(
        app: App, db: psycopg.Connection, database_url: str, tasks: dict[str, Any]) -> None:
    """job_insert_rows works its wake-ups out from the templates of the jobs it inserts: one
    per queue with due jobs, keyed by their lowest priority and earliest scheduled_at; none
    for a queue whose jobs all wait for later; the key of a due job of one template is not
    lowered by a later job of another in the same queue."""
    add = tasks["add"]
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN akadze_jobs")
        flow = app.workflow()
        flow.add_many(add.configure(queue="wa", priority=3), [{"x": i} for i in range(150)])
        flow.add(add.configure(queue="wa", priority=1), x=1)
        flow.add(add.configure(queue="wa", priority=0, delay=3600), x=2)
        flow.add_many(add.configure(queue="wb", priority=2), [{"x": 1}],
                      metas=[{"own": True}])
        flow.add(add.configure(queue="later", delay=3600), x=3)
        assert "external" not in flow.params()  # job_insert_rows
        flow.enqueue()
        add.configure(queue="marker").enqueue(x=0)
        heard: dict[str, tuple[int, datetime] | None] = {}
        for notify in listener.notifies(timeout=5):
            queue, key = parse_notice(notify.payload)
            if queue == "marker":
                break
            assert queue not in heard, queue
            heard[queue] = key
    assert sorted(heard) == ["wa", "wb"]
    first = {queue: db.execute(
        "SELECT min(priority), min(scheduled_at) FROM akadze.jobs WHERE queue = %s "
        "AND scheduled_at <= now()", (queue,)).fetchone() for queue in heard}
    assert heard == {queue: (priority, at) for queue, (priority, at) in first.items()}
    assert first["wa"][0] == 1


async def test_an_upstream_named_twice_is_waited_on_once_and_passed_twice(
        app: App, db: psycopg.Connection, tasks: dict[str, Any]) -> None:
    """``after=[a, a]``: the job waits for ``a`` once (it is released when ``a`` succeeds)
    and receives its result twice, for a node of the workflow and for a job enqueued
    before alike."""
    before = tasks["add"].enqueue(x=4)
    flow = app.workflow()
    head = flow.add(tasks["add"], x=3)
    twice = flow.add(tasks["total"], after=[head, head], result_arg="values")
    outside = flow.add(tasks["total"], after=[before, before, head], result_arg="values")
    flow.enqueue()
    assert job(db, twice.id)["waiting_for"] == 1
    assert job(db, outside.id)["waiting_for"] == 2
    await run_until(app, finished(db, twice.id, outside.id))
    assert job(db, twice.id)["result"] == 6
    assert job(db, outside.id)["result"] == 11


@pytest.mark.parametrize("body", [False, True], ids=["rows", "graph"])
def test_every_node_gets_the_row_its_call_would_insert_alone(
        app: App, db: psycopg.Connection, tasks: dict[str, Any], body: bool) -> None:
    # The inserts send each run of nodes' shared options once (templates) and the nodes in
    # JSON arrays of 100: runs that change every few nodes, across array boundaries, with
    # their own meta or the template's, must still give each node its own call's row.
    at = datetime.now(timezone.utc) + timedelta(hours=1)
    calls = [tasks["add"],
             tasks["add"].configure(queue="other", priority=7, max_attempts=9,
                                    meta={"m": "x"}),
             tasks["add"].configure(at=at, expires_at=at + timedelta(days=1)),
             tasks["add"].configure(delay=30, meta={"m": "y"})]
    flow = app.workflow()
    nodes = [flow.add(calls[(i // 3) % 4], x=i) for i in range(250)]
    if body:
        flow.add(tasks["total"], after=nodes[::50], result_arg="values")
    assert ("external" in flow.params()) is body
    flow.enqueue()
    columns = "task, queue, args, priority, max_attempts, meta, expires_at, state"
    for i, node in enumerate(nodes):
        call = calls[(i // 3) % 4]
        alone = call.enqueue(x=i)
        mine, theirs = (db.execute(
            f"SELECT {columns}, scheduled_at - created_at, scheduled_at FROM akadze.jobs "
            "WHERE id = %s", (job_id,)).fetchone() for job_id in (node.id, alone))
        assert mine is not None and theirs is not None
        assert mine[:-2] == theirs[:-2], i
        if call is calls[2]:
            # The same time (at): the late inserts of this loop are seconds after the
            # workflow's on a loaded machine, so compare the time, not the delay to it.
            assert mine[-1] == theirs[-1] == at, i
        else:
            # The same delay (30 s, or none) from each insert's own now().
            assert abs((mine[-2] - theirs[-2]).total_seconds()) < 1, i


@pytest.mark.parametrize("body", [False, True], ids=["rows", "graph"])
def test_add_many_gives_each_node_the_row_add_would(
        app: App, db: psycopg.Connection, tasks: dict[str, Any], body: bool) -> None:
    # add_many encodes its jobs in arrays of 100 and sends them as they are; blocks of it
    # between single adds, of calls whose template an earlier node made with another meta,
    # one with each job's own meta, and (graph) some of their nodes waited on, which sends
    # those node by node: every node's row must be the one add() gives it.
    plain, other = tasks["add"], tasks["add"].configure(meta={"m": "x"})
    same_options = tasks["add"].configure(meta={"m": "y"})  # other's template, not its meta
    flow, twin = app.workflow(), app.workflow()
    nodes: list[Any] = []
    twins: list[Any] = []
    metas = [{"task_id": f"t{i}", "n": [i, "é"]} for i in range(130)]

    def block(call: Any, start: int, count: int) -> None:
        kwargs = [{"x": i} for i in range(start, start + count)]
        nodes.extend(flow.add_many(call, kwargs))
        twins.extend(twin.add(call, **item) for item in kwargs)

    block(plain, 0, 250)
    nodes.append(flow.add(other, x=1000))
    twins.append(twin.add(other, x=1000))
    block(same_options, 250, 120)
    block(other, 370, 5)
    own = flow.add_many(plain, [{"x": i} for i in range(130)], metas=metas)
    nodes.extend(own)
    twins.extend(twin.add(plain.configure(meta=meta), x=i) for i, meta in enumerate(metas))
    # Metas encoded by the caller (meta_texts): chunks of {"args": [...], "meta": [...]}.
    spliced = [{"task_id": f"s{i}", "n": [i, "é"]} for i in range(150)]
    texts = flow.add_many(plain, [{"x": i} for i in range(150)],
                          meta_texts=[strict_dumps(meta) for meta in spliced])
    nodes.extend(texts)
    twins.extend(twin.add(plain.configure(meta=meta), x=i) for i, meta in enumerate(spliced))
    # One more that nothing waits on: sent as it is, to job_insert_graph too (graph).
    nodes.extend(flow.add_many(plain, [{"x": i} for i in range(50)],
                               meta_texts=[strict_dumps(meta) for meta in spliced[:50]]))
    twins.extend(twin.add(plain.configure(meta=meta), x=i) for i, meta in enumerate(spliced[:50]))
    earlier = list(nodes)
    # Numbered (first_position): the call's meta, and each job's position in the fan-out,
    # written by the insert; one block of them waited on in part (graph: node by node,
    # each with its position), one not (sent as it is). Their call shares another's
    # options but not its meta: a template of their own, sent as it is all the same.
    fan = {"fan": {"group": "g1"}, "k": [1, "é"]}
    numbered = tasks["add"].configure(meta=fan)
    positions: list[int | None] = [None] * len(nodes)

    def numbered_block(start: int, count: int) -> list[Any]:
        added = flow.add_many(numbered, [{"x": i} for i in range(count)],
                              first_position=start)
        nodes.extend(added)
        twins.extend(twin.add(numbered, x=i) for i in range(count))
        positions.extend(range(start, start + count))
        return added

    counted = numbered_block(7, 230)
    numbered_block(0, 40)
    if body:
        flow.add(tasks["total"], after=earlier[::50] + own[7:9] + texts[140:142]
                 + counted[100:102], result_arg="values")
    params = flow.params()
    assert ("external" in params) is body
    # The uncounted numbered block goes as it is (one chunk), the counted one too (rows).
    assert sum(chunk.startswith('{"args":') and '"index":' in chunk[-40:]
               for chunk in params["nodes"]) == (1 if body else 4)
    assert [node.request for node in nodes] == [node.request for node in twins]
    assert [node.position for node in nodes] == positions
    flow.enqueue()
    twin.enqueue()
    columns = "task, queue, args, priority, max_attempts, meta, expires_at, state"
    for node, alone in zip(nodes, twins, strict=True):
        mine, theirs = (db.execute(f"SELECT {columns} FROM akadze.jobs WHERE id = %s",
                                   (job_id,)).fetchone() for job_id in (node.id, alone.id))
        assert mine == theirs and mine is not None, node.index
    stored = dict(db.execute("SELECT id, position FROM akadze.jobs WHERE id = ANY(%s)",
                             ([node.id for node in nodes],)).fetchall())
    assert [stored[node.id] for node in nodes] == positions
    assert json_meta(db, own[3].id) == metas[3]
    assert json_meta(db, texts[141].id) == spliced[141]
    assert json_meta(db, counted[150].id) == fan
    assert app.get_job(counted[150].id).position == 157  # type: ignore[union-attr]


async def test_blocks_waited_on_whole_are_sent_as_arrays_with_their_dependents(
        app: App, db: psycopg.Connection, tasks: dict[str, Any]) -> None:
    # A chord's members: every node of an add_many block waited on by the same jobs. Each
    # array goes as it is with the dependents once (not an element per node), in every
    # array form (args, [args, meta], {"args", "meta"}, numbered); a block only part of
    # which is waited on goes node by node. Rows, dependents and results must be the
    # ones adding each node alone gives.
    add = tasks["add"]
    flow = app.workflow()
    plain = flow.add_many(add, [{"x": i} for i in range(150)])
    pairs = flow.add_many(add, [{"x": i} for i in range(3)],
                          metas=[{"task_id": f"p{i}"} for i in range(3)])
    texts = flow.add_many(add, [{"x": i} for i in range(120)],
                          meta_texts=[strict_dumps({"task_id": f"t{i}"}) for i in range(120)])
    numbered = flow.add_many(add.configure(meta={"fan": {"g": 1}}),
                             [{"x": i} for i in range(101)], first_position=5)
    partly = flow.add_many(add, [{"x": i} for i in range(4)])
    members = plain + pairs + texts + numbered
    body = flow.add(tasks["total"], after=members + partly[:2], result_arg="values")
    # A second fan-in over the plain block alone: its nodes have two dependents.
    second = flow.add(tasks["total"], after=plain, result_arg="values", bonus=1)
    requests = [node.request for node in flow.nodes]
    params = flow.params()
    shared = [chunk for chunk in params["nodes"] if '"downs":' in chunk[-40:]]
    assert len(shared) == 2 + 1 + 2 + 2  # plain (150), pairs, texts (120), numbered (101)
    assert sum(f'"downs":"{{{body.index + 1},{second.index + 1}}}"' in chunk
               for chunk in shared) == 2
    flow.enqueue()
    twin = app.workflow()
    alone = [twin.add_request(request) for request in requests[:len(members) + 4]]
    twin.enqueue()
    columns = "task, queue, args, priority, max_attempts, meta, state"
    for node, other in zip(members + partly, alone, strict=True):
        mine, theirs = (db.execute(f"SELECT {columns} FROM akadze.jobs WHERE id = %s",
                                   (job_id,)).fetchone() for job_id in (node.id, other.id))
        assert mine == theirs and mine is not None, node.index
    assert json_meta(db, numbered[100].id) == {"fan": {"g": 1}}
    assert [job(db, node.id)["position"] for node in numbered[::100]] == [5, 105]
    assert [job(db, node.id)["dependents"] for node in (plain[0], plain[149])] \
        == [[body.id, second.id]] * 2
    assert {tuple(job(db, node.id)["dependents"]) for node in pairs + texts + numbered} \
        == {(body.id,)}
    assert [job(db, node.id)["dependents"] for node in partly] \
        == [[body.id], [body.id], None, None]
    assert job(db, body.id)["waiting_for"] == len(members) + 2
    await run_until(app, finished(db, body.id, second.id), slots=20)
    values = [*range(150), *range(3), *range(120), *range(101), 0, 1]
    assert job(db, body.id)["result"] == sum(values)
    assert [args for name, args in tasks["calls"] if name == "total" and len(args) > 150] \
        == [values]
    assert job(db, second.id)["result"] == sum(range(150)) + 1


async def test_a_fan_outs_jobs_run_knowing_their_position(app: App,
                                                         db: psycopg.Connection) -> None:
    # first_position: each job's index in its fan-out, in its row (not its meta), which
    # the claim hands to the body as current().job.position; other jobs have none.
    seen: dict[int, int | None] = {}

    @app.task("wf.where")
    async def where(x: int) -> None:
        seen[x] = current().job.position

    flow = app.workflow()
    flow.add_many(where, [{"x": i} for i in range(150)], first_position=10)
    flow.add(where, x=-1)
    waiting = flow.add_many(where, [{"x": 1000 + i} for i in range(3)], first_position=0)
    flow.add(where, after=waiting, x=-2)
    flow.enqueue()
    await run_until(app, lambda: len(seen) == 155, slots=10)
    assert seen == {**{i: 10 + i for i in range(150)}, -1: None,
                    **{1000 + i: i for i in range(3)}, -2: None}


def json_meta(db: psycopg.Connection, job_id: int | None) -> Any:
    row = db.execute("SELECT meta FROM akadze.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row[0]


@pytest.mark.parametrize("bad", ["args", "meta"])
def test_add_many_refuses_a_bad_job_and_adds_nothing(app: App, tasks: dict[str, Any],
                                                     bad: str) -> None:
    flow = app.workflow()
    flow.add(tasks["add"], x=0)
    kwargs: list[dict[str, Any]] = [{"x": i} for i in range(150)]
    metas: list[dict[str, Any]] = [{"i": i} for i in range(150)]
    (kwargs if bad == "args" else metas)[120] = {"x": object()}
    with pytest.raises(InvalidArgs, match="not JSON"):
        flow.add_many(tasks["add"], kwargs, metas=metas)
    with pytest.raises(InvalidArgs, match="NUL"):
        flow.add_many(tasks["add"], [{"x": 1}, {"x": "a\x00"}])
    with pytest.raises(ValueError, match="2 metas for 1 jobs"):
        flow.add_many(tasks["add"], [{"x": 1}], metas=[{}, {}])
    with pytest.raises(ValueError, match="2 meta texts for 1 jobs"):
        flow.add_many(tasks["add"], [{"x": 1}], meta_texts=["{}", "{}"])
    with pytest.raises(TypeError, match="JSON text of an object"):
        flow.add_many(tasks["add"], [{"x": 1}, {"x": 2}], meta_texts=["{}", "[1]"])
    with pytest.raises(ValueError, match="give one of"):
        flow.add_many(tasks["add"], [{"x": 1}], metas=[{}], meta_texts=["{}"])
    with pytest.raises(ValueError, match="give one of"):
        flow.add_many(tasks["add"], [{"x": 1}], metas=[{}], first_position=0)
    with pytest.raises(TypeError, match="first_position is an int"):
        flow.add_many(tasks["add"], [{"x": 1}], first_position=True)
    with pytest.raises(ValueError, match="do not fit the position column"):
        flow.add_many(tasks["add"], [{"x": 1}, {"x": 2}], first_position=2**31 - 1)
    with pytest.raises(ValueError, match="do not fit the position column"):
        flow.add_many(tasks["add"], [{"x": 1}], first_position=-2**31 - 1)
    with pytest.raises(ValueError, match="unique_key"):
        flow.add_many(tasks["add"].configure(unique_key="k"), [{"x": 1}])
    assert len(flow) == 1 and flow.params()["nodes"] == ['[{"x":0}]']
    assert flow.add_many(tasks["add"], []) == []


def test_a_deferred_fan_out_is_sent_in_parts_and_keeps_every_job_in_order(
        app: App, db: psycopg.Connection, database_url: str, tasks: dict[str, Any]) -> None:
    """``add_many(deferred=True)``: its arrays are encoded by ``enqueue``, the insert sent in
    parts (pipelined, one transaction) while the next are encoded. Runs of several
    templates, plain nodes between them and numbered jobs across part boundaries come back
    in the order added, each row holding what was added for it, and each queue with due
    jobs is woken once."""
    add = tasks["add"]
    urgent = add.configure(priority=7, queue="urgent")
    flow = app.workflow()
    expected: list[tuple[str, int, dict[str, Any], dict[str, Any], int | None]] = []
    nodes = flow.add_many(add, [{"x": i} for i in range(1234)], first_position=10,
                          deferred=True)
    expected += [("default", 0, {"x": i}, {}, 10 + i) for i in range(1234)]
    nodes.append(flow.add(urgent, x=-1))
    expected.append(("urgent", 7, {"x": -1}, {}, None))
    nodes += flow.add_many(urgent, [{"x": 5000 + i} for i in range(777)],
                           metas=[{"n": i} for i in range(777)], deferred=True)
    expected += [("urgent", 7, {"x": 5000 + i}, {"n": i}, None) for i in range(777)]
    nodes += flow.add_many(add, [{"x": 9000 + i} for i in range(3)], deferred=True)
    expected += [("default", 0, {"x": 9000 + i}, {}, None) for i in range(3)]
    assert [len(part["nodes"]) for part in flow._parts()] == [5, 18]  # 13 + 1 + 8 + 1
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN akadze_jobs")
        ids = flow.enqueue()
        add.configure(queue="marker").enqueue(x=0)
        heard = []
        for notify in listener.notifies(timeout=5):
            queue, _ = parse_notice(notify.payload)
            if queue == "marker":
                break
            heard.append(queue)
    assert sorted(heard) == ["default", "urgent"]
    assert ids == [node.id for node in nodes] and ids == sorted(ids)
    stored = {row[0]: row[1:] for row in db.execute(
        "SELECT id, queue, priority, args, meta, position FROM akadze.jobs "
        "WHERE queue <> 'marker'").fetchall()}
    assert [stored[i] for i in ids] == expected


def test_a_bad_job_of_a_deferred_fan_out_fails_its_enqueue_and_inserts_nothing(
        app: App, db: psycopg.Connection, tasks: dict[str, Any]) -> None:
    """A deferred fan-out is checked as it is encoded: its first bad job raises its own
    ``InvalidArgs`` from ``enqueue``, though the parts before it were sent, and nothing is
    inserted (one transaction); as when the database refuses a later part."""
    add = tasks["add"]
    kwargs: list[dict[str, Any]] = [{"x": i} for i in range(2000)]
    kwargs[1700] = {"x": "a\x00"}
    kwargs[1900] = {"x": object()}
    flow = app.workflow()
    flow.add(add, x=0)
    flow.add_many(add, kwargs, deferred=True)
    with pytest.raises(InvalidArgs, match="NUL"):
        flow.enqueue()
    assert db.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (0,)
    flow = app.workflow()
    texts = ['{"a": 1}'] * 1500
    texts[1400] = "{oops}"
    flow.add_many(add, [{"x": i} for i in range(1500)], meta_texts=texts, deferred=True)
    with pytest.raises(psycopg.errors.InvalidTextRepresentation):
        flow.enqueue()
    assert db.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (0,)


def test_meanwhile_runs_once_while_the_insert_is_sent(app: App, db: psycopg.Connection,
                                                      tasks: dict[str, Any]) -> None:
    """``enqueue(meanwhile=...)`` calls it once: after the last part of an insert sent in
    parts (its rows not yet visible to others), else just before the one statement."""
    seen: list[int] = []

    def meanwhile() -> None:
        seen.append(db.execute("SELECT count(*) FROM akadze.jobs").fetchone()[0])

    for count, deferred in ((3000, True), (30, True), (3000, False)):
        flow = app.workflow()
        flow.add_many(tasks["add"], [{"x": i} for i in range(count)], deferred=deferred)
        assert len(flow.enqueue(meanwhile=meanwhile)) == count
    assert seen == [0, 3000, 3030]


def test_a_meta_text_that_is_not_json_fails_the_insert_and_inserts_nothing(
        app: App, db: psycopg.Connection, tasks: dict[str, Any]) -> None:
    # meta_texts are spliced unparsed (the integration's own encoding): a bad one is the
    # database's to refuse, and the whole statement goes with it.
    flow = app.workflow()
    flow.add_many(tasks["add"], [{"x": i} for i in range(3)],
                  meta_texts=['{"a": 1}', "{oops}", '{"a": 3}'])
    with pytest.raises(psycopg.errors.InvalidTextRepresentation):
        flow.enqueue()
    assert db.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (0,)


@pytest.mark.parametrize("fair", [False, True], ids=["claim", "fair claim"])
async def test_a_claim_says_which_outcomes_may_release_a_waiting_job(
        app: App, db: psycopg.Connection, tasks: dict[str, Any], database_url: str,
        fair: bool) -> None:
    """``releases``: the outcome is flushed at once (a chain's next step, a fan-in's body
    with no more upstreams left than the claim takes); a fan-in member whose body still
    waits on many gathers with the others, as a plain job does."""
    from tests.integration.lease_support import claim, fake_worker

    flow = app.workflow()
    head = flow.add(tasks["add"], x=1)
    flow.add(tasks["add"], after=head, x=2)
    members = flow.add_many(tasks["add"], [{"x": i} for i in range(25)])
    flow.add(tasks["total"], after=members, result_arg="values")
    lonely = flow.add(tasks["add"], x=3)
    flow.enqueue()
    worker = fake_worker(db, ttl=60)
    rows = await claim(database_url, worker, 10, fair=fair)
    releases = {row["id"]: row["releases"] for row in rows}
    assert releases.pop(head.id) is True and releases.pop(lonely.id, False) is False
    assert releases and not any(releases.values())  # the body waits on 25 > 10
    db.execute("UPDATE akadze.jobs SET waiting_for = 10 WHERE upstreams @> %s::bigint[]",
               ([members[0].id],))  # as if 15 members had succeeded
    rows = await claim(database_url, worker, 10, fair=fair)
    assert rows and all(row["releases"] for row in rows if row["id"] in
                        {node.id for node in members})
