"""Celery tasks run by a real akadze_core worker, in-process, on a real Postgres."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import akadze_compat
from akadze_compat import Celery, Task, states
from akadze_compat.app.publish import PLAIN_CALL
from akadze_compat.exceptions import (
    Ignore,
    MaxRetriesExceededError,
    Reject,
    SoftTimeLimitExceeded,
    TaskRevokedError,
    TimeLimitExceeded,
    TimeoutError,
)
from tests.compat.conftest import work
from tests.compat.signal_recorder import Recorder
from tests.helpers import is_uuid4, job


class PaymentDeclined(Exception):
    """A project's own exception: FAILURE must give back this type."""


def finished(*results: Any) -> Callable[[], bool]:
    return lambda: all(result.ready() for result in results)


async def test_delay_runs_and_result_reads_success(celery: Celery,
                                                   db: psycopg.Connection) -> None:
    @celery.task
    def add(x: int, y: int) -> int:
        return x + y

    result = add.delay(2, 3)
    assert is_uuid4(result.id)
    assert result.state == states.PENDING and not result.ready() and result.exists()
    await work(celery, finished(result))
    assert result.get(timeout=5) == 5
    assert (result.state, result.successful(), result.name, result.args, result.kwargs,
            result.retries, result.queue) == (states.SUCCESS, True, add.name, [2, 3], {}, 0,
                                              "celery")
    assert result.date_done is not None
    fresh = celery.AsyncResult(result.id)
    assert (fresh.state, fresh.result) == (states.SUCCESS, 5)
    assert job(db, result.job_id)["args"] == {"args": [2, 3], "kwargs": {}}


async def test_every_send_gets_a_uuid4_task_id_used_everywhere(
        celery: Celery, db: psycopg.Connection) -> None:
    seen: list[tuple[str, str | None, int]] = []

    @celery.task(bind=True, name="ids.flaky", max_retries=3, default_retry_delay=0)
    def flaky(self: Task, times: int) -> str:
        seen.append((self.request.id, self.request.correlation_id, self.request.retries))
        if self.request.retries < times:
            raise self.retry()
        return self.request.id

    plain, again = flaky.delay(2), flaky.delay(0)  # the kept plain call, twice
    assert flaky.__dict__.get(PLAIN_CALL) is not None
    # A publish receiver: the full path, whose message carries the id.
    recorder = Recorder("before_task_publish", "task_prerun", "task_retry", "task_postrun")
    full = flaky.apply_async((0,), countdown=0.01)
    sent = celery.send_task("ids.flaky", (0,))
    chosen = flaky.apply_async((0,), task_id="my-own-id")
    results = (plain, again, full, sent)
    assert all(is_uuid4(result.id) for result in results)
    assert len({result.id for result in results}) == len(results)
    assert chosen.id == "my-own-id"
    # Kept in the job's meta when something saw it before the insert (the receiver, the
    # caller), else derived from the job id; found by it either way.
    assert [job(db, result.job_id)["meta"].get("task_id") for result in (*results, chosen)] \
        == [None, None, full.id, sent.id, "my-own-id"]
    for result in (*results, chosen):
        assert celery.AsyncResult(result.id).job_id == result.job_id
    assert [call["headers"]["id"] for name, call in recorder.calls
            if name == "before_task_publish"] == [full.id, sent.id, "my-own-id"]
    await work(celery, finished(*results, chosen))
    # self.request.id is the task id, on every attempt: retries keep it.
    assert [entry for entry in seen if entry[0] == plain.id] == [
        (plain.id, plain.id, retries) for retries in range(3)]
    assert {entry[0] for entry in seen} == {result.id for result in (*results, chosen)}
    assert all(celery.AsyncResult(r.id).get(timeout=5) == r.id for r in (*results, chosen))
    assert job(db, plain.job_id)["attempt"] == 3
    recorder.close()
    for signal in ("task_prerun", "task_postrun"):
        assert [call["task_id"] for name, call in recorder.calls
                if name == signal].count(plain.id) == 3
    assert [call["request"].id for name, call in recorder.calls if name == "task_retry"] == \
        [plain.id, plain.id]
    # Revoke by the id, through the result and through control.
    late = flaky.apply_async((0,), countdown=3600)
    celery.control.revoke(late.id)
    assert celery.AsyncResult(late.id).state == states.REVOKED
    # A job's integer id is not its task id once it has one of its own.
    assert not celery.AsyncResult(str(chosen.job_id)).exists()


async def test_jobs_without_a_task_id_resolve_by_their_job_id(
        celery: Celery, db: psycopg.Connection) -> None:
    """Jobs sent before task ids were uuids (and jobs enqueued through akadze_core) have no
    meta["task_id"]: they run with the task id derived from their job id, and resolve by
    it and by their job id, as before."""

    @celery.task(bind=True, name="ids.old")
    def old(self: Task) -> str:
        return self.request.id

    sent = old.apply_async(task_id=str(uuid.uuid4()))  # stored, then taken out
    db.execute("UPDATE akadze.jobs SET meta = meta - 'task_id' WHERE id = %s", (sent.job_id,))
    db.commit()
    legacy = celery.AsyncResult(str(sent.job_id))
    assert legacy.exists() and legacy.name == "ids.old" and legacy.job_id == sent.job_id
    assert not celery.AsyncResult(sent.id).exists()
    await work(celery, legacy.ready)
    derived = celery.core.task_ids().derive(sent.job_id)
    assert legacy.get(timeout=5) == derived  # self.request.id
    assert celery.AsyncResult(derived).get(timeout=5) == derived
    late = old.apply_async(countdown=3600)
    db.execute("UPDATE akadze.jobs SET meta = meta - 'task_id' WHERE id = %s", (late.job_id,))
    db.commit()
    celery.control.revoke(str(late.job_id))
    assert celery.AsyncResult(str(late.job_id)).state == states.REVOKED


async def test_unknown_id_is_pending(celery: Celery) -> None:
    result = celery.AsyncResult("no-such-task")
    assert result.state == states.PENDING and not result.exists() and result.result is None
    with pytest.raises(TimeoutError):
        result.get(timeout=0.2, interval=0.05)


async def test_celery_types_round_trip_through_a_worker(celery: Celery) -> None:
    from datetime import datetime, timezone
    from decimal import Decimal
    from uuid import UUID

    @celery.task
    def echo(value: Any) -> Any:
        return {"got": value, "type": type(value["when"]).__name__}

    value = {"when": datetime(2024, 5, 1, tzinfo=timezone.utc), "price": Decimal("9.99"),
             "id": UUID(int=7), "blob": b"\x00\xff"}
    result = echo.delay(value)
    await work(celery, finished(result))
    assert result.get() == {"got": value, "type": "datetime"}


async def test_failure_gives_back_the_original_exception(celery: Celery) -> None:
    recorder = Recorder("task_failure", "task_postrun")

    @celery.task
    def charge(amount: int) -> None:
        raise PaymentDeclined(f"declined: {amount}")

    result = charge.delay(10)
    await work(celery, finished(result))
    recorder.close()
    assert result.state == states.FAILURE and result.failed()
    assert isinstance(result.result, PaymentDeclined)
    assert str(result.result) == "declined: 10"
    assert "PaymentDeclined" in (result.traceback or "")
    with pytest.raises(PaymentDeclined):
        result.get()
    assert isinstance(result.get(propagate=False), PaymentDeclined)
    # Celery never retries by itself: one attempt.
    assert result.retries == 0
    assert recorder.names() == ["task_failure", "task_postrun"]
    assert recorder.calls[1][1]["state"] == states.FAILURE


async def test_retry_until_success_keeps_the_task_id(celery: Celery) -> None:
    seen: list[tuple[str, int]] = []
    recorder = Recorder("task_retry", "task_success")

    @celery.task(bind=True, max_retries=3)
    def flaky(self: Task) -> str:
        seen.append((self.request.id, self.request.retries))
        if self.request.retries < 2:
            raise self.retry(countdown=0, exc=ConnectionError("try again"))
        return "ok"

    result = flaky.delay()
    await work(celery, finished(result))
    recorder.close()
    assert result.get() == "ok" and result.retries == 2
    assert seen == [(result.id, 0), (result.id, 1), (result.id, 2)]
    assert recorder.names() == ["task_retry", "task_retry", "task_success"]
    retry = recorder.calls[0][1]
    assert retry["sender"] is flaky and retry["request"].id == result.id
    assert isinstance(retry["reason"].exc, ConnectionError)


async def test_retry_state_and_its_exception(celery: Celery) -> None:
    @celery.task(bind=True)
    def later(self: Task) -> None:
        raise self.retry(countdown=3600, exc=ConnectionError("vendor down"))

    result = later.delay()
    await work(celery, lambda: result.state == states.RETRY)
    assert result.state == states.RETRY and not result.ready()
    assert isinstance(result.result, ConnectionError) and result.retries == 1


async def test_max_retries_then_failure(celery: Celery) -> None:
    @celery.task(bind=True, max_retries=2, default_retry_delay=0)
    def always(self: Task, with_exc: bool) -> None:
        raise self.retry(exc=PaymentDeclined("nope") if with_exc else None)

    plain, with_exc = always.delay(False), always.delay(True)
    await work(celery, finished(plain, with_exc))
    assert isinstance(plain.result, MaxRetriesExceededError)
    assert isinstance(with_exc.result, PaymentDeclined)
    assert plain.retries == with_exc.retries == 2


async def test_autoretry_for_with_backoff(celery: Celery, db: psycopg.Connection) -> None:
    calls: list[int] = []

    @celery.task(bind=True, autoretry_for=(ConnectionError,), max_retries=2,
                 retry_backoff=True, retry_jitter=False, retry_backoff_max=0)
    def fetch(self: Task) -> None:
        calls.append(self.request.retries)
        raise ConnectionError("flaky network")

    result = fetch.delay()
    await work(celery, finished(result))
    assert calls == [0, 1, 2]
    assert result.state == states.FAILURE and isinstance(result.result, ConnectionError)
    errors = job(db, result.job_id)["errors"]
    assert [entry["type"] for entry in errors] == ["ConnectionError"] * 3


async def test_retry_with_new_arguments(celery: Celery) -> None:
    @celery.task(bind=True)
    def countdown(self: Task, n: int) -> str:
        if n:
            raise self.retry(args=(n - 1,), countdown=0)
        return f"done after {self.request.retries}"

    result = countdown.delay(2)
    await work(celery, finished(result))
    assert result.get() == "done after 2"


async def test_a_retry_sends_the_publish_signals_and_keeps_what_they_set(
        celery: Celery) -> None:
    """Celery publishes a retry as a new message from ``retry()``: the publish signals get
    its headers there, and what a receiver sets in them (django-structlog's logging
    context) is what the next run's request has; without retry(args=...) the arguments
    stay the job's."""
    seen: list[tuple[int, Any, Any]] = []

    @celery.task(bind=True, max_retries=2)
    def flaky(self: Task, n: int) -> int:
        seen.append((self.request.retries, getattr(self.request, "ctx", None),
                     getattr(self.request, "tenant", None)))
        if self.request.retries < 2:
            raise self.retry(countdown=0)
        return n

    def add_context(headers: dict[str, Any], **_: Any) -> None:
        headers["ctx"] = {"sent_at_retry": headers["retries"]}

    result = flaky.apply_async((7,), headers={"tenant": "acme"})
    recorder = Recorder("before_task_publish", "after_task_publish")
    akadze_compat.signals.before_task_publish.connect(add_context)
    try:
        await work(celery, finished(result))
    finally:
        akadze_compat.signals.before_task_publish.disconnect(add_context)
        recorder.close()
    assert result.get() == 7
    assert seen == [(0, None, "acme"), (1, {"sent_at_retry": 1}, "acme"),
                    (2, {"sent_at_retry": 2}, "acme")]
    assert recorder.names() == ["before_task_publish", "after_task_publish"] * 2
    before = recorder.calls[0][1]
    assert before["sender"] == flaky.name
    assert before["headers"]["id"] == result.id and before["body"][0] == [7]
    assert before["routing_key"] == "celery"


async def test_request_fields(celery: Celery) -> None:
    seen: dict[str, Any] = {}

    @celery.task(bind=True)
    def child(self: Task) -> None:
        seen["child"] = (self.request.parent_id, self.request.root_id)

    @celery.task(bind=True, name="proj.inspect")
    def inspect(self: Task, x: int, y: int = 0) -> str:
        request = self.request
        seen.update(id=request.id, task=request.task, args=request.args,
                    kwargs=request.kwargs, retries=request.retries,
                    direct=request.called_directly, eager=request.is_eager,
                    hostname=request.hostname, delivery=request.delivery_info,
                    headers=request.headers, tenant=request.get("tenant"),
                    root=request.root_id, parent=request.parent_id, eta=request.eta,
                    expires=request.expires, limits=request.timelimit)
        seen["child_id"] = child.delay().id
        return "ok"

    result = inspect.apply_async((1,), {"y": 2}, priority=3, headers={"tenant": "acme"},
                                 expires=600, time_limit=30, soft_time_limit=20)
    await work(celery, lambda: "child" in seen)
    assert seen["id"] == result.id and seen["task"] == "proj.inspect"
    assert (seen["args"], seen["kwargs"], seen["retries"]) == ([1], {"y": 2}, 0)
    assert seen["direct"] is False and seen["eager"] is False
    assert seen["hostname"].startswith("celery@")
    assert seen["delivery"]["queue"] == "celery" and seen["delivery"]["priority"] == 3
    assert seen["delivery"]["routing_key"] == "celery"
    assert seen["headers"] == {"tenant": "acme"} and seen["tenant"] == "acme"
    assert seen["root"] == result.id and seen["parent"] is None
    assert seen["expires"] is not None and seen["limits"] == (30, 20)
    assert seen["child"] == (result.id, result.id)


async def test_update_state_progress_is_readable_while_running(celery: Celery) -> None:
    release = threading.Event()

    @celery.task(bind=True)
    def long_job(self: Task) -> str:
        self.update_state(state="PROGRESS", meta={"current": 5, "total": 10})
        release.wait(10)
        return "finished"

    result = long_job.delay()
    observed: list[Any] = []

    def progress_seen() -> bool:
        if result.state == "PROGRESS":
            observed.append(result.info)
            release.set()
        return result.ready()

    await work(celery, progress_seen)
    assert observed[0] == {"current": 5, "total": 10}
    assert result.get() == "finished" and result.state == states.SUCCESS


async def test_track_started(celery: Celery) -> None:
    release = threading.Event()
    celery.conf.task_track_started = True

    @celery.task
    def slow() -> None:
        release.wait(10)

    result = slow.delay()
    states_seen: list[str] = []

    def started() -> bool:
        states_seen.append(result.state)
        if states_seen[-1] == states.STARTED:
            release.set()
        return result.ready()

    await work(celery, started)
    assert states.STARTED in states_seen


async def test_signals_and_handlers_in_the_worker(celery: Celery) -> None:
    recorder = Recorder("before_task_publish", "after_task_publish", "task_prerun",
                        "task_success", "task_postrun")
    events: list[str] = []

    class Base(Task):
        def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
            events.append("before_start")

        def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
            events.append(f"on_success {retval}")

        def after_return(self, status: str, retval: Any, task_id: str, args: Any,
                         kwargs: Any, einfo: Any) -> None:
            events.append(f"after_return {status}")

    @celery.task(base=Base)
    def greet(name: str) -> str:
        return f"hi {name}"

    result = greet.delay("ada")
    await work(celery, finished(result))
    recorder.close()
    assert events == ["before_start", "on_success hi ada", "after_return SUCCESS"]
    assert recorder.names() == ["before_task_publish", "after_task_publish", "task_prerun",
                                "task_success", "task_postrun"]
    publish = recorder.calls[0][1]
    assert publish["sender"] == greet.name and publish["routing_key"] == "celery"
    assert publish["body"][0] == ["ada"] and publish["headers"]["task"] == greet.name
    assert recorder.calls[1][1]["headers"]["id"] == result.id
    prerun = recorder.calls[2][1]
    assert prerun["task_id"] == result.id and prerun["args"] == ["ada"]
    assert recorder.calls[3][1]["result"] == "hi ada"


async def test_transaction_commit_and_rollback(celery: Celery, database_url: str,
                                               db: psycopg.Connection) -> None:
    @celery.task
    def noop(tag: str) -> str:
        return tag

    with psycopg.connect(database_url) as connection:
        with pytest.raises(RuntimeError), akadze_compat.transaction(connection):
            rolled_back = noop.delay("rolled back")
            raise RuntimeError("abort")
        with akadze_compat.transaction(connection):
            committed = noop.delay("committed")
        connection.commit()
        # apply_async(connection=...) joins the connection's open transaction.
        in_tx = noop.apply_async(("later",), connection=connection)
        assert not celery.AsyncResult(in_tx.id).exists()
        connection.rollback()
    count = db.execute("SELECT count(*) FROM akadze.jobs").fetchone()[0]
    assert count == 1 and not rolled_back.exists() and not in_tx.exists()
    await work(celery, finished(committed))
    assert committed.get() == "committed"


async def test_custom_task_id(celery: Celery) -> None:
    @celery.task
    def double(x: int) -> int:
        return 2 * x

    result = double.apply_async((21,), task_id="order-42")
    assert result.id == "order-42"
    await work(celery, finished(result))
    again = celery.AsyncResult("order-42")
    assert again.get() == 42 and again.name == double.name


async def test_send_task_by_name_and_routes(celery: Celery, db: psycopg.Connection) -> None:
    celery.conf.task_routes = {"feeds.*": {"queue": "feeds"}}

    @celery.task(name="feeds.fetch")
    def fetch(url: str) -> str:
        return url

    routed = fetch.delay("a")
    sent = celery.send_task("feeds.fetch", args=["b"])
    explicit = celery.send_task("feeds.fetch", args=["c"], queue="special")
    assert [job(db, r.job_id)["queue"] for r in (routed, sent, explicit)] == [
        "feeds", "feeds", "special"]
    await work(celery, finished(routed, sent), queues=("feeds",))
    assert (routed.get(), sent.get()) == ("a", "b")


async def test_ignore_reject_and_ignore_result(celery: Celery) -> None:
    @celery.task
    def ignored() -> None:
        raise Ignore()

    @celery.task
    def rejected() -> None:
        raise Reject("bad input", requeue=False)

    @celery.task(ignore_result=True)
    def quiet() -> int:
        return 1

    results = ignored.delay(), rejected.delay(), quiet.delay()
    await work(celery, lambda: all(celery.core.get_job(r.job_id).state in (
        "succeeded", "failed", "cancelled") for r in results))
    # Ignore: Celery stores nothing, so the state stays PENDING (test_surface has more)
    assert results[0].state == states.PENDING and results[0].result is None
    assert results[1].state == states.FAILURE and isinstance(results[1].result, Reject)
    assert results[2].get() is None
    assert celery.AsyncResult(results[2].id).result is None


async def test_revoke(celery: Celery) -> None:
    @celery.task
    def never() -> None:
        raise AssertionError("revoked tasks do not run")

    result = never.apply_async(countdown=3600)
    result.revoke()
    assert result.state == states.REVOKED and result.ready()
    with pytest.raises(TaskRevokedError):
        result.get()
    other = never.apply_async(countdown=3600)
    celery.control.revoke([other.id])
    assert other.state == states.REVOKED


async def test_soft_time_limit_in_sync_and_async_bodies(celery: Celery) -> None:
    @celery.task(soft_time_limit=0.3)
    def spin() -> str:
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                sum(range(100))
        except SoftTimeLimitExceeded:
            return "cleaned up"
        return "not interrupted"

    @celery.task(soft_time_limit=0.3)
    async def wait() -> str:
        try:
            await asyncio.sleep(10)
        except SoftTimeLimitExceeded:
            return "cleaned up async"
        return "not interrupted"

    results = spin.delay(), wait.delay()
    await work(celery, finished(*results))
    assert [r.get() for r in results] == ["cleaned up", "cleaned up async"]


async def test_hard_time_limit_fails_the_task(celery: Celery) -> None:
    @celery.task(time_limit=0.3)
    def runaway() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            sum(range(100))

    result = runaway.delay()
    await work(celery, finished(result))
    assert result.state == states.FAILURE and isinstance(result.result, TimeLimitExceeded)


async def test_async_task(celery: Celery) -> None:
    @celery.task(bind=True)
    async def fetch(self: Task, x: int) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"x": x, "id": self.request.id}

    result = fetch.delay(3)
    await work(celery, finished(result))
    assert result.get() == {"x": 3, "id": result.id}


async def test_result_that_is_not_json_fails(celery: Celery) -> None:
    @celery.task
    def bad() -> object:
        return object()

    result = bad.delay()
    await work(celery, finished(result))
    assert result.state == states.FAILURE
    assert type(result.result).__name__ == "EncodeError"


async def test_delay_on_commit_joins_the_django_transaction(
        celery: Celery, database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    @celery.task
    def noop() -> str:
        return "ok"

    with psycopg.connect(database_url) as connection:
        # Django is not a dependency: a stand-in with the names delay_on_commit reads.
        django_db = types.ModuleType("django.db")
        django_db.connection = types.SimpleNamespace(  # type: ignore[attr-defined]
            in_atomic_block=True, connection=connection)
        django_db.transaction = types.SimpleNamespace(  # type: ignore[attr-defined]
            on_commit=lambda callback: None)
        monkeypatch.setitem(sys.modules, "django", types.ModuleType("django"))
        monkeypatch.setitem(sys.modules, "django.db", django_db)
        result = noop.delay_on_commit()
        assert is_uuid4(result.id) and not celery.AsyncResult(result.id).exists()
        connection.commit()
    await work(celery, finished(result))
    assert result.get() == "ok"


async def test_revoke_while_running_ends_revoked_with_the_signal(celery: Celery) -> None:
    recorder = Recorder("task_revoked", "task_failure")
    started = threading.Event()
    release = threading.Event()

    @celery.task
    def interruptible() -> None:
        started.set()
        release.wait(10)
        raise RuntimeError("stopped after the revoke")

    result = interruptible.delay()

    def revoke_when_started() -> bool:
        if started.is_set() and not release.is_set():
            result.revoke()
            release.set()
        return result.ready()

    await work(celery, revoke_when_started)
    recorder.close()
    assert result.state == states.REVOKED
    assert recorder.names() == ["task_revoked"]
    revoked = recorder.calls[0][1]
    assert revoked["sender"] is interruptible and revoked["request"].id == result.id
    assert revoked["terminated"] is False and revoked["expired"] is False


async def test_reject_with_requeue_runs_again_without_spending_a_retry(celery: Celery) -> None:
    runs: list[int] = []

    @celery.task(bind=True)
    def picky(self: Task) -> int:
        runs.append(self.request.retries)
        if len(runs) == 1:
            raise Reject("not yet", requeue=True)
        return len(runs)

    result = picky.delay()
    await work(celery, finished(result))
    assert result.get() == 2 and runs == [0, 0]


async def test_retry_beyond_the_max_retries_the_job_was_sent_with(
        celery: Celery, db: psycopg.Connection) -> None:
    runs: list[int] = []

    @celery.task(bind=True, max_retries=1)
    def stubborn(self: Task) -> None:
        runs.append(self.request.retries)
        raise self.retry(countdown=0, max_retries=5)

    @celery.task(bind=True, max_retries=1)
    def patient(self: Task) -> str:
        if self.request.retries < 3:
            raise self.retry(countdown=0, max_retries=10)
        return f"done after {self.request.retries}"

    result, other = stubborn.delay(), patient.delay()
    await work(celery, finished(result, other))
    # As in Celery: the call's max_retries decides, whatever the job was sent with.
    assert runs == [0, 1, 2, 3, 4, 5]
    assert isinstance(result.result, MaxRetriesExceededError) and result.retries == 5
    assert job(db, result.job_id)["max_attempts"] == 6
    assert other.get() == "done after 3"


async def test_autoretry_with_retry_kwargs_max_retries(celery: Celery) -> None:
    calls: list[int] = []

    @celery.task(bind=True, autoretry_for=(ConnectionError,), default_retry_delay=0,
                 retry_kwargs={"max_retries": 4})
    def fetch(self: Task) -> None:
        calls.append(self.request.retries)
        raise ConnectionError("flaky network")

    result = fetch.delay()
    await work(celery, finished(result))
    # The task's max_retries is 3 (Celery's default), retry_kwargs allow 4.
    assert calls == [0, 1, 2, 3, 4]
    assert isinstance(result.result, ConnectionError)


async def test_a_hand_raised_retry_without_attempts_left_fails(celery: Celery) -> None:
    from akadze_compat.exceptions import Retry

    @celery.task(bind=True, max_retries=0)
    def manual(self: Task) -> None:
        raise Retry("by hand", when=0)

    result = manual.delay()
    await work(celery, finished(result))
    assert isinstance(result.result, MaxRetriesExceededError)


async def test_hard_limit_backstop_when_the_body_is_stuck_in_c_code(
        celery: Celery, db: psycopg.Connection) -> None:
    recorder = Recorder("task_failure")

    @celery.task(time_limit=0.2)
    def stuck() -> None:
        time.sleep(3)  # the exception raised in the thread waits for sleep() to return

    result = stuck.delay()
    await work(celery, finished(result))
    recorder.close()
    assert result.state == states.FAILURE and isinstance(result.result, TimeLimitExceeded)
    errors = job(db, result.job_id)["errors"]
    assert [entry["type"] for entry in errors] == ["JobTimeout", "TimeLimitExceeded"]
    assert recorder.names()[:1] == ["task_failure"]


async def test_scheduling_options(celery: Celery, db: psycopg.Connection) -> None:
    from datetime import datetime, timedelta, timezone

    @celery.task
    def later() -> None: ...

    now = datetime.now(timezone.utc)
    eta = later.apply_async(eta=(now + timedelta(hours=1)).isoformat())
    naive = later.apply_async(eta=(now + timedelta(hours=2)).replace(tzinfo=None))
    counted = later.apply_async(countdown=600, priority=7, expires=now + timedelta(days=1),
                                exchange="ignored", routing_key="ignored", retry=True,
                                retry_policy={"max_retries": 1}, compression="zlib",
                                serializer="json", producer=object())
    rows = [job(db, result.job_id) for result in (eta, naive, counted)]
    assert abs(rows[0]["scheduled_at"] - (now + timedelta(hours=1))) < timedelta(seconds=5)
    assert abs(rows[1]["scheduled_at"] - (now + timedelta(hours=2))) < timedelta(seconds=5)
    assert abs(rows[2]["scheduled_at"] - (now + timedelta(minutes=10))) < timedelta(seconds=5)
    assert rows[2]["priority"] == 7
    assert abs(rows[2]["expires_at"] - (now + timedelta(days=1))) < timedelta(seconds=1)
    assert all(result.state == states.PENDING for result in (eta, naive, counted))
    with pytest.raises(akadze_compat.exceptions.ImproperlyConfigured):
        later.apply_async(serializer="pickle")


async def test_send_task_by_name_uses_the_workers_max_retries(celery: Celery,
                                                              database_url: str) -> None:
    runs: list[int] = []

    @celery.task(bind=True, name="remote.stubborn", max_retries=5)
    def stubborn(self: Task) -> None:
        runs.append(self.request.retries)
        raise self.retry(countdown=0)

    client = Celery("client", broker=database_url, set_as_current=False)
    try:
        result = client.send_task("remote.stubborn")
        await work(celery, lambda: celery.AsyncResult(result.id).ready())
        assert runs == [0, 1, 2, 3, 4, 5]
        assert isinstance(result.result, MaxRetriesExceededError)
    finally:
        client.close()


async def test_lost_workers_count_against_max_retries(celery: Celery, database_url: str,
                                                      db: psycopg.Connection) -> None:
    runs: list[int] = []

    @celery.task(name="remote.crashy", max_retries=1)
    def crashy() -> None:
        runs.append(1)

    # Sent by name from a process that does not know the task: no core attempt limit, so
    # the facade bounds the reruns after lost workers with the worker's max_retries.
    client = Celery("client", broker=database_url, set_as_current=False)
    result = client.send_task("remote.crashy")
    client.close()
    # What two rescues of jobs whose worker died leave behind (see the core's job_rescue).
    db.execute("""UPDATE akadze.jobs SET attempt = 2, errors = jsonb_build_array(
                      jsonb_build_object('type', 'WorkerLost', 'attempt', 1),
                      jsonb_build_object('type', 'WorkerLost', 'attempt', 2))
                  WHERE id = %s""", (result.job_id,))
    result = celery.AsyncResult(result.id)
    await work(celery, finished(result))
    assert runs == []
    assert result.state == states.FAILURE
    assert type(result.result).__name__ == "WorkerLostError"
