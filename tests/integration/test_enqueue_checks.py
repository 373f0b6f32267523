"""Enqueue refuses, up front and with one clear error, what could never run: a call the
task's function cannot take (``TypeError``), and a database without the akadze schema
(``SchemaMissing`` naming the command to run, no SQL text). Nothing is inserted either way."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from akadze_compat import Celery
from akadze_core import App, SchemaMissing, Worker
from tests.helpers import job
from tests.integration.lease_support import FAST, job_count, running, wait_until


def _tasks(app: App) -> dict[str, Any]:
    @app.task("exports.poll")
    async def poll(export_id: str, retries: int = 0) -> str:
        return export_id

    @app.task("exports.flexible")
    def flexible(export_id: str, **extra: Any) -> None:
        return None

    @app.task("exports.keyword_only")
    def keyword_only(*, export_id: str) -> None:
        return None

    def logged(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return func(*args, **kwargs)
        return wrapper

    @app.task("exports.decorated")
    @logged
    def decorated(export_id: str) -> None:
        return None

    return {"poll": poll, "flexible": flexible, "keyword_only": keyword_only,
            "decorated": decorated}


# --- calls checked against the signature ------------------------------------------------------

CALLS_THAT_CAN_NEVER_RUN = [
    ("poll", {"wrong": 1}, "missing a required argument: 'export_id'"),
    ("poll", {"export_id": "x", "wrong": 1}, "unexpected keyword argument 'wrong'"),
    ("poll", {}, "missing a required argument: 'export_id'"),
    ("flexible", {"anything": 1}, "missing a required argument: 'export_id'"),
    ("keyword_only", {"export": "x"}, "export_id"),
    ("decorated", {"export_id": "x", "n": 2}, "unexpected keyword argument 'n'"),
]


@pytest.mark.parametrize(("task", "kwargs", "message"), CALLS_THAT_CAN_NEVER_RUN)
async def test_a_call_that_can_never_run_raises_type_error_and_inserts_nothing(
    app: App, db: psycopg.Connection, task: str, kwargs: dict[str, Any], message: str
) -> None:
    target = _tasks(app)[task]
    with pytest.raises(TypeError, match=message) as raised:
        target.enqueue(**kwargs)
    assert f"task {target.name!r}" in str(raised.value)
    with pytest.raises(TypeError, match=message):
        await target.enqueue_async(**kwargs)
    with pytest.raises(TypeError, match=message):
        target.configure(priority=3).enqueue(**kwargs)
    with psycopg.connect(db.info.dsn) as session:  # inside the caller's transaction too
        with pytest.raises(TypeError, match=message):
            target.using(session=session).enqueue(**kwargs)
        assert session.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert job_count(db) == 0


async def test_calls_that_bind_are_enqueued(app: App, db: psycopg.Connection) -> None:
    tasks = _tasks(app)
    tasks["poll"].enqueue(export_id="x")
    tasks["poll"].enqueue(export_id="x", retries=2)
    await tasks["flexible"].enqueue_async(export_id="x", whatever=[1], more={"a": 1})
    tasks["keyword_only"].enqueue(export_id="x")
    tasks["decorated"].enqueue(export_id="x")
    assert job_count(db) == 5


async def test_one_call_that_can_never_run_in_a_batch_inserts_nothing(
    app: App, db: psycopg.Connection
) -> None:
    poll = _tasks(app)["poll"]
    batch = [{"export_id": str(n)} for n in range(250)]
    batch[180] = {"export_id": "x", "typo": True}
    with pytest.raises(TypeError, match="unexpected keyword argument 'typo'"):
        poll.enqueue_many(batch)
    with pytest.raises(TypeError, match="unexpected keyword argument 'typo'"):
        await poll.enqueue_many_async(iter(batch))  # any iterable, checked before the insert
    assert job_count(db) == 0
    assert len(poll.enqueue_many(batch[:180])) == 180


async def test_a_schedule_whose_args_the_task_cannot_take_fails_at_declaration(
    app: App,
) -> None:
    poll = _tasks(app)["poll"]
    with pytest.raises(TypeError, match="unexpected keyword argument 'id'"):
        poll.schedule(trigger="* * * * *", args={"export_id": "x", "id": "x"})
    with pytest.raises(TypeError, match="missing a required argument"):
        app.add_schedule("by-name", "exports.poll", trigger="* * * * *")
    # A task that is not registered here is someone else's: nothing to check against.
    app.add_schedule("elsewhere", "other.service.task", trigger="* * * * *", args={"a": 1})
    assert poll.schedule(trigger="* * * * *", args={"export_id": "x"}).task == "exports.poll"


async def test_a_job_checked_at_enqueue_still_runs_with_its_arguments(
    app: App, db: psycopg.Connection
) -> None:
    seen: list[tuple[str, int]] = []

    @app.task("exports.record")
    async def record(export_id: str, retries: int = 0) -> None:
        seen.append((export_id, retries))

    record.enqueue(export_id="a", retries=4)
    job_id = record.enqueue(export_id="b")
    async with running(Worker(app, slots=2, **FAST)):
        await wait_until(lambda: len(seen) == 2, timeout=10)
        await wait_until(lambda: job(db, job_id)["state"] == "succeeded", timeout=10)
    assert sorted(seen) == [("a", 4), ("b", 0)]


# --- a database without the schema -----------------------------------------------------------


@pytest.fixture
def bare_app(empty_database_url: str) -> Any:
    application = App(empty_database_url)
    yield application
    application.close()


async def test_every_enqueue_on_a_database_without_the_schema_raises_schema_missing(
    bare_app: App, empty_database_url: str
) -> None:
    poll = _tasks(bare_app)["poll"]
    attempts: list[Callable[[], Any]] = [
        lambda: poll.enqueue(export_id="x"),
        lambda: poll.configure(unique_key="k").enqueue(export_id="x"),
        lambda: poll.enqueue_many([{"export_id": "x"}]),
    ]
    for attempt in attempts:
        with pytest.raises(SchemaMissing) as raised:
            attempt()
        _assert_one_clear_line(str(raised.value), "akadze migrate")
    for coroutine in (poll.enqueue_async(export_id="x"),
                      poll.enqueue_many_async([{"export_id": "x"}])):
        with pytest.raises(SchemaMissing) as raised:
            await coroutine
        _assert_one_clear_line(str(raised.value), "akadze migrate")
    with psycopg.connect(empty_database_url) as session, pytest.raises(SchemaMissing):
        poll.using(session=session).enqueue(export_id="x")
    session_async = await psycopg.AsyncConnection.connect(empty_database_url)
    async with session_async:
        with pytest.raises(SchemaMissing):
            await poll.using(session=session_async).enqueue(export_id="x")
        await session_async.rollback()  # the caller's transaction is theirs to end
        with pytest.raises(SchemaMissing):
            await poll.using(session=session_async).enqueue_many([{"export_id": "x"}])
    await bare_app.close_async()


def test_delay_and_send_task_on_a_database_without_the_schema_name_the_facades_command(
    empty_database_url: str,
) -> None:
    celery = Celery("proj", broker=empty_database_url)

    @celery.task
    def add(x: int, y: int) -> int:
        return x + y

    for attempt in (lambda: add.delay(1, 2), lambda: add.apply_async((1, 2), countdown=5),
                    lambda: celery.send_task("proj.add", (1, 2))):
        with pytest.raises(SchemaMissing) as raised:
            attempt()
        _assert_one_clear_line(str(raised.value), "akadze-compat -A proj migrate")
    celery.close()


def _assert_one_clear_line(message: str, command: str) -> None:
    assert message == f"the akadze schema is not applied to this database: run `{command}`"
