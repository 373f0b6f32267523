"""The batching completer on real Postgres: outcomes finishing together share one flush."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from akadze_core import App
from akadze_core.model.outcomes import SUCCESS, Outcome, succeeded
from akadze_core.worker import completer as completer_module
from akadze_core.worker.completer import Completer
from tests.helpers import job
from tests.integration.lease_support import claim, fake_worker


async def _flushes(app: App, database_url: str, db: psycopg.Connection, *,
                   gather: float) -> list[int]:
    """Claim three jobs, hand their outcomes to a completer 30 ms apart; returns the size
    of each flush, once every outcome is written."""

    @app.task("batch.noop")
    async def noop() -> None: ...

    ids = [noop.enqueue() for _ in range(3)]
    rows = await claim(database_url, fake_worker(db), 3)
    assert sorted(row["id"] for row in rows) == sorted(ids)

    @contextlib.asynccontextmanager
    async def connection() -> AsyncIterator[psycopg.AsyncConnection]:
        async with await psycopg.AsyncConnection.connect(database_url,
                                                         autocommit=True) as opened:
            yield opened

    flushes: list[int] = []
    completer = Completer(connection, lambda batch, rows: flushes.append(len(batch)),
                          gather=gather)
    runner = asyncio.create_task(completer.run())
    await asyncio.sleep(0.05)  # idle before the first outcome, as in a worker
    for row in rows:
        completer.submit(succeeded(row["id"], row["run_count"], row["attempt"], None, None,
                                   claim_token=row["claim_token"]))
        await asyncio.sleep(0.03)
    assert await completer.close(timeout=10)
    await runner
    assert [job(db, job_id)["state"] for job_id in ids] == ["succeeded"] * 3
    return flushes


async def test_outcomes_arriving_within_the_gather_window_share_one_flush(
        app: App, database_url: str, db: psycopg.Connection) -> None:
    assert await _flushes(app, database_url, db, gather=0.5) == [3]


async def test_without_a_gather_window_the_first_outcome_is_written_alone(
        app: App, database_url: str, db: psycopg.Connection) -> None:
    """The window is what batches them: with none, the first outcome's flush starts at once
    and holds it alone (the others arrive while it runs)."""
    flushes = await _flushes(app, database_url, db, gather=0.0)
    assert flushes[0] == 1 and sum(flushes) == 3


async def test_outcomes_submitted_while_a_write_is_in_flight_are_written_next_and_waited_for(
        app: App, database_url: str, db: psycopg.Connection) -> None:
    """Only the first outcome of a batch wakes the completer and marks it busy: those
    arriving while a write is in flight go out in the next write, urgent or not, and
    ``wait_idle`` returns only once they are written."""

    @app.task("batch.inflight")
    async def noop() -> None: ...

    ids = [noop.enqueue() for _ in range(3)]
    rows = await claim(database_url, fake_worker(db), 3)
    entered, go = asyncio.Event(), asyncio.Event()

    @contextlib.asynccontextmanager
    async def connection() -> AsyncIterator[psycopg.AsyncConnection]:
        entered.set()
        await go.wait()
        async with await psycopg.AsyncConnection.connect(database_url,
                                                         autocommit=True) as opened:
            yield opened

    flushes: list[list[int]] = []
    completer = Completer(connection, lambda batch, written: flushes.append(
        sorted(outcome.job_id for outcome in batch)), gather=0.0)
    runner = asyncio.create_task(completer.run())
    outcomes = [succeeded(row["id"], row["run_count"], row["attempt"], None, None,
                          claim_token=row["claim_token"]) for row in rows]
    completer.submit(outcomes[0])
    await asyncio.wait_for(entered.wait(), 10)  # the first write is in flight
    completer.submit(outcomes[1])
    completer.submit(outcomes[2], urgent=True)
    idle = asyncio.create_task(completer.wait_idle())
    await asyncio.sleep(0.05)
    assert not idle.done() and completer.pending == 3
    go.set()
    await asyncio.wait_for(idle, 10)
    assert completer.pending == 0
    assert flushes == [[rows[0]["id"]], sorted(row["id"] for row in rows[1:])]
    assert [job(db, job_id)["state"] for job_id in ids] == ["succeeded"] * 3
    assert await completer.close(timeout=10)
    await runner


async def test_outcomes_pending_when_a_write_answers_go_out_at_once_on_its_connection(
        app: App, database_url: str, db: psycopg.Connection,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Outcomes that arrived while a write was in flight go out in the next statement on
    the same connection, sent in the loop turn the last answer is read in (no callback made
    ready meanwhile runs first), each batch reported written before the next is sent."""
    from akadze_core.store import database

    @app.task("batch.steps")
    async def noop() -> None: ...

    ids = [noop.enqueue() for _ in range(3)]
    rows = await claim(database_url, fake_worker(db), 3)
    opened: list[int] = []

    @contextlib.asynccontextmanager
    async def connection() -> AsyncIterator[psycopg.AsyncConnection]:
        async with await psycopg.AsyncConnection.connect(database_url,
                                                         autocommit=True) as made:
            opened.append(1)
            yield made

    events: list[Any] = []
    turns: list[int] = []  # the answers a loop turn has passed since
    answers: list[int] = []
    sent = asyncio.Event()
    complete_many = database.complete_many

    async def recorded(connection: Any, outcomes: Any) -> list[dict[str, Any]]:
        if answers:
            events.append(("turned", turns[-1:] == [len(answers)]))
        events.append(("sent", sorted(outcome.job_id for outcome in outcomes)))
        sent.set()
        written = await complete_many(connection, outcomes)
        answers.append(len(written))
        asyncio.get_running_loop().call_soon(turns.append, len(answers))
        return written

    monkeypatch.setattr(database, "complete_many", recorded)
    # A step of writes that outlasts its length gives way to a new one, on a new turn and a
    # connection taken again: a loaded machine's first write took that long.
    monkeypatch.setattr(completer_module, "WRITES_PER_STEP", 60.0)
    completer = Completer(connection, lambda batch, written: events.append(
        ("written", sorted(outcome.job_id for outcome in batch))), gather=0.0,
        lease_end=lambda: asyncio.get_running_loop().time() + 60)
    runner = asyncio.create_task(completer.run())
    outcomes = [succeeded(row["id"], row["run_count"], row["attempt"], None, None,
                          claim_token=row["claim_token"]) for row in rows]
    completer.submit(outcomes[0])
    await asyncio.wait_for(sent.wait(), 10)  # the first write is in flight
    completer.submit(outcomes[1])
    completer.submit(outcomes[2])
    await asyncio.wait_for(completer.wait_idle(), 10)
    rest = sorted(row["id"] for row in rows[1:])
    assert events == [("sent", [rows[0]["id"]]), ("written", [rows[0]["id"]]),
                      ("turned", False), ("sent", rest), ("written", rest)]
    assert opened == [1]
    assert [job(db, job_id)["state"] for job_id in ids] == ["succeeded"] * 3
    assert await completer.close(timeout=10)
    await runner


async def test_a_batch_postgres_refuses_is_split_until_the_bad_outcomes_fail_alone(
        app: App, database_url: str, db: psycopg.Connection,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Among 40 outcomes written together, two that Postgres refuses (text that is not JSON:
    a data error; nesting past its stack: a program limit, class 54) fail their jobs at once
    with UnstorableOutcome; the other 38 are stored. Results add up to at most
    MAX_BATCH_CHARS per write (shrunk here), whatever max_batch allows."""
    monkeypatch.setattr(completer_module, "MAX_BATCH_CHARS", 250_000)

    @app.task("batch.noop")
    async def noop() -> None: ...

    ids = noop.enqueue_many([{}] * 40)
    rows = {row["id"]: row for row in await claim(database_url, fake_worker(db), 40)}
    bad = {ids[7]: "{not json", ids[31]: "[" * 100_000 + "]" * 100_000}

    @contextlib.asynccontextmanager
    async def connection() -> AsyncIterator[psycopg.AsyncConnection]:
        async with await psycopg.AsyncConnection.connect(database_url,
                                                         autocommit=True) as opened:
            yield opened

    flushes: list[int] = []
    completer = Completer(connection, lambda batch, rows: flushes.append(len(batch)),
                          gather=0.2)
    filler = '"' + "r" * 24_998 + '"'
    runner = asyncio.create_task(completer.run())
    for job_id in ids:
        row = rows[job_id]
        result = bad.get(job_id, filler)  # 10 fillers a write, or the deep one and 2
        completer.submit(Outcome(job_id, row["run_count"], SUCCESS, result=result,
                                 claim_token=row["claim_token"]))
    assert await completer.close(timeout=30)
    await runner
    assert max(flushes[:-1]) <= 10 and sum(flushes) == 40, flushes
    for job_id in ids:
        row = job(db, job_id)
        if job_id in bad:
            assert (row["state"], row["result"]) == ("failed", None), row
            assert [entry["type"] for entry in row["errors"]] == ["UnstorableOutcome"]
        else:
            assert (row["state"], row["result"]) == ("succeeded", "r" * 24_998), row


async def test_store_outcome_writes_one_outcome_at_once_fenced_and_fails_an_unstorable_one(
        app: App, database_url: str, db: psycopg.Connection) -> None:
    """The completer's write for one outcome, outside a batch (what the Celery facade calls
    before ``task_postrun``): stored at once; a second write of the same run, or one with
    another claim token, changes nothing (False); an outcome Postgres refuses fails its job
    with UnstorableOutcome, as a batch's would."""

    @app.task("store.noop")
    async def noop() -> None: ...

    ids = noop.enqueue_many([{}] * 3)
    rows = {row["id"]: row for row in await claim(database_url, fake_worker(db), 3)}
    first, second, third = (rows[job_id] for job_id in ids)

    def outcome(row: dict[str, Any], result: str, token: int | None = None) -> Outcome:
        return Outcome(row["id"], row["run_count"], SUCCESS, result=result,
                       claim_token=row["claim_token"] if token is None else token)

    assert completer_module.store_outcome_sync(app, outcome(first, '"one"')) is True
    assert completer_module.store_outcome_sync(app, outcome(first, '"again"')) is False
    assert job(db, ids[0])["result"] == "one"
    wrong_token = second["claim_token"] + 1
    assert completer_module.store_outcome_sync(app, outcome(second, '"x"', wrong_token)) \
        is False
    assert job(db, ids[1])["state"] == "running"
    assert await completer_module.store_outcome(app, outcome(second, '"two"')) is True
    assert job(db, ids[1])["result"] == "two"
    assert completer_module.store_outcome_sync(app, outcome(third, "{not json")) is True
    row = job(db, ids[2])
    assert (row["state"], row["result"]) == ("failed", None)
    assert [entry["type"] for entry in row["errors"]] == ["UnstorableOutcome"]
