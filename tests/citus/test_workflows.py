"""Workflows in Citus mode, on the cluster: the single-server workflow tests run as written
(chains, groups, fan-in, failures walking downstream, errbacks, cancel of a waiting job,
waiting on jobs enqueued before, the caller's transaction, hand_over), with every member of
a workflow in one shard; and a workflow that would wait on jobs of two shards is refused."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from akadze_core import App, Worker, current
from akadze_core.store import database
from tests.helpers import job
from tests.integration.lease_support import fake_worker
from tests.integration.outcome_helpers import run_until
from tests.integration.test_hand_over import (  # noqa: F401
    test_a_run_that_lost_the_job_hands_nothing_over,
    test_what_waits_on_the_job_runs_after_its_replacement,
)
from tests.integration.test_workflows import (  # noqa: F401  (collected here, on the cluster)
    finished,
    tasks,
    test_a_failed_member_fails_a_fan_in_that_asks_for_it,
    test_a_failed_step_cancels_the_rest_and_runs_its_errback,
    test_a_failure_before_a_fan_ins_marked_inputs_cancels_it,
    test_a_failure_inside_marked_inputs_fails_the_fan_in_once,
    test_a_fan_out_added_at_once_is_a_plain_insert,
    test_a_workflow_commits_with_the_callers_transaction,
    test_cancelling_a_waiting_job_cancels_what_waits_on_it,
    test_chain_passes_each_result_to_the_next_step,
    test_fan_in_gets_the_results_in_order_once,
    test_prune_keeps_what_a_waiting_job_still_needs_and_purge_takes_waiting_jobs,
    test_waiting_on_a_failed_job_is_refused_and_inserts_nothing,
    test_waiting_on_jobs_enqueued_before,
)


def db_clock(db: psycopg.Connection) -> datetime:
    row = db.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]


@pytest.fixture
def db(citus_db: psycopg.Connection) -> psycopg.Connection:
    """The single-server tests' ``db``: the coordinator, one lane per queue (so that jobs
    enqueued one by one into a queue share a shard, as a workflow waiting on them needs)."""
    citus_db.execute("UPDATE akadze.citus_settings SET lanes = 1")
    return citus_db


@pytest.fixture
def app(citus_app: App, db: psycopg.Connection) -> App:
    """The single-server tests' ``app``, in Citus mode."""
    return citus_app


async def test_every_member_of_a_workflow_shares_the_first_jobs_shard(
        app: App, db: psycopg.Connection, tasks: dict[str, Any]) -> None:  # noqa: F811
    flow = app.workflow()
    # The first job's tenant places the workflow; the others' tenants do not split it.
    first = flow.add(tasks["add"].configure(meta={"tenant": "acme"}), x=1)
    parts = [flow.add(tasks["add"].configure(meta={"tenant": f"t{n}"}), after=first,
                      result_arg="x", y=n) for n in range(6)]
    body = flow.add(tasks["total"], after=parts, result_arg="values")
    ids = flow.enqueue()
    expected = db.execute(
        "SELECT akadze.citus_shard_for('{\"tenant\": \"acme\"}', NULL, 'default', '{}', 1)"
    ).fetchone()
    assert expected is not None
    assert {job_id % 1024 for job_id in ids} == {expected[0]}
    assert {row[0] for row in db.execute("SELECT shard FROM akadze.jobs")} == {expected[0]}
    await run_until(app, finished(db, body.id))
    assert job(db, body.id)["result"] == sum(1 + n for n in range(6))


async def test_a_group_lands_in_one_shard(app: App, db: psycopg.Connection,
                                          tasks: dict[str, Any]) -> None:  # noqa: F811
    flow = app.workflow()
    flow.add_many(tasks["add"], [{"x": i} for i in range(40)])
    assert "external" not in flow.params()  # job_insert_rows
    ids = flow.enqueue()
    assert len({job_id % 1024 for job_id in ids}) == 1
    await run_until(app, finished(db, *ids))
    assert [job(db, i)["result"] for i in ids] == list(range(40))


def test_waiting_on_jobs_of_two_shards_is_refused(app: App, db: psycopg.Connection,
                                                  tasks: dict[str, Any]) -> None:  # noqa: F811
    ids = [tasks["add"].configure(meta={"tenant": f"t{n}"}).enqueue(x=n) for n in range(8)]
    shards = {job_id % 1024: job_id for job_id in ids}
    assert len(shards) > 1
    one, other = list(shards.values())[:2]
    before = db.execute("SELECT count(*) FROM akadze.jobs").fetchone()
    flow = app.workflow()
    flow.add(tasks["total"], after=[one, other], result_arg="values")
    with pytest.raises(psycopg.errors.FeatureNotSupported,
                       match="in Citus mode a workflow's jobs share one shard"):
        flow.enqueue()
    assert db.execute("SELECT count(*) FROM akadze.jobs").fetchone() == before


async def test_hand_over_to_a_job_in_another_shard_is_refused(
        app: App, db: psycopg.Connection) -> None:
    tenants = {row[0]: row[1] for row in db.execute(
        "SELECT t, akadze.citus_shard_for(jsonb_build_object('tenant', t), NULL, 'default',"
        " '{}', 1) FROM (SELECT 't' || n AS t FROM generate_series(0, 63) AS n) AS x")}
    errors: list[str] = []

    @app.task("ho.next")
    async def next_step() -> None: ...

    @app.task("ho.first", max_attempts=1)
    async def first_step() -> None:
        context = current()
        elsewhere = next(t for t, shard in tenants.items() if shard != context.id % 1024)
        try:
            async with context.complete_tx() as connection:
                replacement = await next_step.configure(meta={"tenant": elsewhere}).using(
                    session=connection).enqueue()
                await context.hand_over_async(connection, replacement)
        except psycopg.errors.FeatureNotSupported as exc:
            errors.append(str(exc))
            raise

    flow = app.workflow()
    head = flow.add(first_step)
    tail = flow.add(next_step, after=head)
    flow.enqueue()
    assert head.id is not None and tail.id is not None
    await run_until(app, finished(db, head.id, tail.id))
    assert (job(db, head.id)["state"], job(db, tail.id)["state"]) == ("failed", "cancelled")
    assert errors and "which is in another shard" in errors[0]
    # The replacement rolled back with the rest of the block.
    assert db.execute("SELECT count(*) FROM akadze.jobs WHERE task = 'ho.next'").fetchone() \
        == (1,)


async def test_a_rescue_that_fails_a_step_cancels_what_waits_on_it(
        app: App, db: psycopg.Connection, citus_url: str,
        tasks: dict[str, Any]) -> None:  # noqa: F811
    flow = app.workflow()
    head = flow.add(tasks["boom"], x=1)  # max_attempts=1
    tail = flow.add(tasks["add"], after=head, result_arg="x")
    flow.enqueue()
    assert head.id is not None and tail.id is not None
    # Its worker died mid-run on its only attempt (the row set as a claim leaves it).
    dead = fake_worker(db, heartbeat_age=600, ttl=1)
    started = db_clock(db) - timedelta(minutes=5)
    db.execute("UPDATE akadze.jobs SET state = 'running', worker_id = %s, attempt = 1,"
               " run_count = 1, started_at = %s WHERE id = %s", (dead, started, head.id))
    async with await psycopg.AsyncConnection.connect(citus_url, autocommit=True) as connection:
        rescued = await database.rescue_jobs(connection)
    assert [(row["id"], row["state"]) for row in rescued] == [(head.id, "failed")]
    assert (job(db, tail.id)["state"], job(db, tail.id)["errors"][-1]["upstream"]) == \
        ("cancelled", head.id)


async def test_a_step_expired_before_its_start_cancels_what_waits_on_it(
        app: App, db: psycopg.Connection, tasks: dict[str, Any]) -> None:  # noqa: F811
    flow = app.workflow()
    head = flow.add(tasks["add"], x=1)
    tail = flow.add(tasks["add"], after=head, result_arg="x")
    flow.enqueue()
    assert head.id is not None and tail.id is not None
    db.execute("UPDATE akadze.jobs SET expires_at = %s WHERE id = %s",
               (db_clock(db) - timedelta(seconds=1), head.id))
    await run_until(app, finished(db, head.id, tail.id))
    assert (job(db, head.id)["state"], job(db, tail.id)["state"]) == ("cancelled", "cancelled")
    assert tasks["calls"] == []


async def test_fan_ins_drained_by_two_workers_release_each_body_once(
        app: App, db: psycopg.Connection, tasks: dict[str, Any]) -> None:  # noqa: F811
    bodies = []
    for chord in range(5):
        flow = app.workflow()
        # Each chord placed by its first member's tenant: several shards, settled at once.
        parts = [flow.add(tasks["add"].configure(meta={"tenant": f"chord{chord}"}), x=i)
                 for i in range(40)]
        bodies.append(flow.add(tasks["total"], after=parts, result_arg="values"))
        flow.enqueue()
    assert len({body.id % 1024 for body in bodies if body.id is not None}) > 1
    workers = [Worker(app, slots=8, poll_interval=0.05) for _ in range(2)]
    runners = [asyncio.create_task(worker.run()) for worker in workers]
    try:
        for _ in range(1200):
            if finished(db, *(body.id for body in bodies))():
                break
            await asyncio.sleep(0.05)
    finally:
        for worker in workers:
            worker.request_stop()
        await asyncio.wait_for(asyncio.gather(*runners), 60)
    assert [job(db, body.id)["result"] for body in bodies if body.id is not None] == \
        [sum(range(40))] * 5
    assert [args for name, args in tasks["calls"] if name == "total"] == [list(range(40))] * 5
