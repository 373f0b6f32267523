"""Seed 003's outcome table on real Postgres, one real in-process worker per test.

| run outcome                    | attempt spent | next                                  |
| returned a JSON value or None  | —             | succeeded (result stored)             |
| returned a non-JSON value      | yes           | retry after backoff (ResultNotJson)   |
| raised any exception           | yes           | retry after backoff                   |
| exceeded timeout               | yes           | retry after backoff                   |
| raise Retry(delay)             | yes           | retry after delay                     |
| raise Snooze(delay)            | no            | run again after delay                 |
| raise Fail("reason")           | yes           | failed at once                        |
| raise Cancel()                 | —             | cancelled at once                     |
| worker vanished, rescued       | yes           | retry after the default backoff       |
| graceful worker stop           | no            | back to queued                        |

Out of attempts (max_attempts, default 3) → failed. Every assertion reads the job row; delays
are measured on the database clock.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime, timedelta
from typing import Any

import psycopg

from akadze_core import App, Cancel, Fail, Retry, Snooze, current
from tests.helpers import job
from tests.integration.outcome_helpers import (
    fast_worker,
    hurried,
    ran,
    retry_delay,
    run_until,
    running,
    wait_event,
    wait_until,
)

ERROR_KEYS = {"attempt", "at", "type", "module", "message", "traceback"}
YEAR = timedelta(days=365).total_seconds()


def error_types(row: dict[str, Any]) -> list[str]:
    return [entry["type"] for entry in row["errors"]]


async def test_returned_json_or_none_succeeds_with_the_result(
    app: App, db: psycopg.Connection
) -> None:
    @app.task("values")
    async def values(kind: str) -> Any:
        return {
            "dict": {"a": [1, 2.5, None, True], "é": "😀"},
            "none": None,
            "text": "literal \\u0000 stays text",
            "number": 42,
        }[kind]

    @app.task("values_sync")
    def values_sync() -> list[int]:
        return [1, 2, 3]

    ids = {kind: values.enqueue(kind=kind) for kind in ("dict", "none", "text", "number")}
    ids["sync"] = values_sync.enqueue()
    await run_until(app, lambda: all(job(db, i)["state"] == "succeeded" for i in ids.values()),
                    slots=3)
    results = {kind: job(db, i)["result"] for kind, i in ids.items()}
    assert results == {
        "dict": {"a": [1, 2.5, None, True], "é": "😀"},
        "none": None,
        "text": "literal \\u0000 stays text",
        "number": 42,
        "sync": [1, 2, 3],
    }
    for job_id in ids.values():
        row = job(db, job_id)
        assert (row["attempt"], row["run_count"], row["errors"]) == (1, 1, [])
        assert row["worker_id"] is None
        assert row["finished_at"] is not None and row["finished_at"] >= row["started_at"]


async def test_non_json_return_spends_the_attempt_and_retries_with_result_not_json(
    app: App, db: psycopg.Connection
) -> None:
    @app.task("returns_datetime")
    async def returns_datetime() -> datetime:
        return datetime(2024, 1, 1)

    job_id = returns_datetime.enqueue()
    await run_until(app, ran(db, job_id))
    row = job(db, job_id)
    assert row["state"] == "queued"
    assert (row["attempt"], row["run_count"]) == (1, 1)
    assert row["result"] is None
    assert row["finished_at"] is None
    assert error_types(row) == ["ResultNotJson"]
    assert row["errors"][0]["attempt"] == 1
    assert "not JSON" in row["errors"][0]["message"]
    # Default curve after attempt 1: 1 s with jitter in [50 %, 100 %], in the future.
    assert 0.5 <= retry_delay(db, job_id) <= 1.0
    assert db.execute("SELECT scheduled_at > (errors -> 0 ->> 'at')::timestamptz "
                      "FROM akadze.jobs WHERE id = %s", (job_id,)).fetchone() == (True,)


async def test_exception_retries_with_backoff_and_records_each_attempt(
    app: App, db: psycopg.Connection
) -> None:
    @app.task("flaky")
    async def flaky() -> str:
        attempt = current().attempt
        if attempt < 3:
            raise ValueError(f"boom on attempt {attempt}")
        return "finally"

    job_id = flaky.enqueue()
    await run_until(app, ran(db, job_id))
    row = job(db, job_id)
    assert row["state"] == "queued"
    assert (row["attempt"], row["run_count"]) == (1, 1)
    [entry] = row["errors"]
    assert set(entry) == ERROR_KEYS
    assert entry["attempt"] == 1
    assert entry["type"] == "ValueError"
    assert entry["message"] == "boom on attempt 1"
    assert "Traceback (most recent call last)" in entry["traceback"]
    assert "in flaky" in entry["traceback"]
    assert "ValueError: boom on attempt 1" in entry["traceback"]
    # `at` is the database's time of the outcome write: after the claim, not in the future.
    assert db.execute(
        "SELECT (errors -> 0 ->> 'at')::timestamptz BETWEEN started_at AND now() "
        "FROM akadze.jobs WHERE id = %s", (job_id,)).fetchone() == (True,)
    assert 0.5 <= retry_delay(db, job_id) <= 1.0

    # Make it due (no waiting out the backoff): the second failure doubles the curve.
    db.execute("UPDATE akadze.jobs SET scheduled_at = now() WHERE id = %s", (job_id,))
    await run_until(app, ran(db, job_id, runs=2))
    row = job(db, job_id)
    assert row["state"] == "queued"
    assert [(e["attempt"], e["message"]) for e in row["errors"]] == [
        (1, "boom on attempt 1"), (2, "boom on attempt 2")]
    assert 1.0 <= retry_delay(db, job_id) <= 2.0

    db.execute("UPDATE akadze.jobs SET scheduled_at = now() WHERE id = %s", (job_id,))
    await run_until(app, ran(db, job_id, runs=3))
    row = job(db, job_id)
    assert row["state"] == "succeeded"
    assert row["result"] == "finally"
    assert (row["attempt"], row["run_count"], len(row["errors"])) == (3, 3, 2)


async def test_out_of_attempts_fails_default_three(app: App, db: psycopg.Connection) -> None:
    calls: list[int] = []

    @app.task("always_broken")
    def always_broken() -> None:
        calls.append(current().attempt)
        raise RuntimeError("still broken")

    job_id = always_broken.enqueue()
    once = always_broken.configure(max_attempts=1).enqueue()
    assert job(db, job_id)["max_attempts"] == 3
    await run_until(app, lambda: hurried(db, job_id, "failed")()
                    and job(db, once)["state"] == "failed")
    row = job(db, job_id)
    assert (row["state"], row["attempt"], row["run_count"]) == ("failed", 3, 3)
    assert [e["attempt"] for e in row["errors"]] == [1, 2, 3]
    assert error_types(row) == ["RuntimeError"] * 3
    assert row["finished_at"] is not None
    assert sorted(calls) == [1, 1, 2, 3]
    row = job(db, once)
    assert (row["state"], row["attempt"], row["run_count"]) == ("failed", 1, 1)


async def test_timeout_of_an_async_task_spends_the_attempt(
    app: App, db: psycopg.Connection
) -> None:
    cancelled = asyncio.Event()

    @app.task("slow_async", timeout=0.2)
    async def slow_async() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "too late"

    job_id = slow_async.enqueue()
    started = time.monotonic()
    await run_until(app, ran(db, job_id))
    assert time.monotonic() - started < 3
    row = job(db, job_id)
    assert (row["state"], row["attempt"]) == ("queued", 1)
    assert error_types(row) == ["JobTimeout"]
    assert "timeout of 0.2s" in row["errors"][0]["message"]
    assert 0.5 <= retry_delay(db, job_id) <= 1.0
    assert cancelled.is_set(), "an async body past its timeout is cancelled"


async def test_timeout_of_a_sync_task_spends_the_attempt(
    app: App, db: psycopg.Connection
) -> None:
    release = threading.Event()

    @app.task("slow_sync", timeout=0.2, max_attempts=1)
    def slow_sync() -> str:
        release.wait(10)  # the thread cannot be killed; it runs on and its result is dropped
        return "too late"

    job_id = slow_sync.enqueue()
    try:
        await run_until(app, ran(db, job_id))
    finally:
        release.set()
    row = job(db, job_id)
    # max_attempts=1: the timed-out attempt was the last one.
    assert (row["state"], row["attempt"], row["result"]) == ("failed", 1, None)
    assert error_types(row) == ["JobTimeout"]


async def test_retry_delay_is_used_as_given_on_the_database_clock(
    app: App, db: psycopg.Connection
) -> None:
    @app.task("retry_later")
    async def retry_later(seconds: float) -> None:
        raise Retry(timedelta(seconds=seconds))

    short = retry_later.enqueue(seconds=42)
    # Not clamped to 365 days, unlike a policy's delays.
    long = retry_later.enqueue(seconds=timedelta(days=400).total_seconds())
    db_before = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    await run_until(app, lambda: ran(db, short)() and ran(db, long)())
    db_after = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    for job_id, seconds in ((short, 42.0), (long, timedelta(days=400).total_seconds())):
        row = job(db, job_id)
        assert (row["state"], row["attempt"]) == ("queued", 1)
        assert error_types(row) == ["Retry"]
        assert abs(retry_delay(db, job_id) - seconds) < 0.001
        delay = timedelta(seconds=seconds)
        assert db_before + delay <= row["scheduled_at"] <= db_after + delay


async def test_retry_out_of_attempts_fails(app: App, db: psycopg.Connection) -> None:
    @app.task("retry_forever", max_attempts=2)
    async def retry_forever() -> None:
        raise Retry(0.01)

    job_id = retry_forever.enqueue()
    await run_until(app, lambda: job(db, job_id)["state"] == "failed")
    row = job(db, job_id)
    assert (row["attempt"], row["run_count"]) == (2, 2)
    assert error_types(row) == ["Retry", "Retry"]


async def test_snooze_does_not_spend_the_attempt(app: App, db: psycopg.Connection) -> None:
    @app.task("poll")
    async def poll() -> str:
        if current().run_count == 1:
            raise ValueError("vendor down")  # spends attempt 1
        raise Snooze(timedelta(seconds=30))

    job_id = poll.enqueue()
    await run_until(app, ran(db, job_id))
    assert job(db, job_id)["attempt"] == 1
    db.execute("UPDATE akadze.jobs SET scheduled_at = now() WHERE id = %s", (job_id,))
    await run_until(app, ran(db, job_id, runs=2))
    row = job(db, job_id)
    assert row["state"] == "queued"
    # The snoozed run gave its attempt back: attempt is what it was before the claim.
    assert (row["attempt"], row["run_count"]) == (1, 2)
    assert error_types(row) == ["ValueError"], "a snooze is not an error"
    assert row["finished_at"] is None and row["worker_id"] is None
    # Due 30 s after the run, on the database clock.
    waited = db.execute("SELECT extract(epoch FROM scheduled_at - started_at)::float8 "
                        "FROM akadze.jobs WHERE id = %s", (job_id,)).fetchone()[0]  # type: ignore[index]
    assert 30.0 <= waited < 32.0


async def test_snooze_never_runs_out_of_attempts(app: App, db: psycopg.Connection) -> None:
    @app.task("poll_until_ready", max_attempts=1)
    async def poll_until_ready() -> str:
        if current().run_count < 5:
            raise Snooze(0.01)
        return "ready"

    job_id = poll_until_ready.enqueue()
    # One read per check: two reads could see "running" then "queued" (the next snooze).
    await run_until(app, lambda: job(db, job_id)["state"] not in ("queued", "running"))
    row = job(db, job_id)
    assert (row["state"], row["result"]) == ("succeeded", "ready")
    assert (row["attempt"], row["run_count"], row["errors"]) == (1, 5, [])


async def test_fail_fails_at_once_with_attempts_left(app: App, db: psycopg.Connection) -> None:
    @app.task("reject")
    async def reject() -> None:
        raise Fail("vendor rejected the export")

    job_id = reject.enqueue()
    await run_until(app, ran(db, job_id))
    row = job(db, job_id)
    assert (row["state"], row["attempt"], row["max_attempts"]) == ("failed", 1, 3)
    assert error_types(row) == ["Fail"]
    assert row["errors"][0]["message"] == "vendor rejected the export"
    assert row["finished_at"] is not None


async def test_cancel_cancels_at_once(app: App, db: psycopg.Connection) -> None:
    @app.task("give_up")
    async def give_up() -> None:
        if current().run_count == 1:
            raise RuntimeError("first run fails")
        raise Cancel("not needed any more")

    job_id = give_up.enqueue()
    await run_until(app, hurried(db, job_id, "cancelled", "failed", "succeeded"))
    row = job(db, job_id)
    assert (row["state"], row["run_count"]) == ("cancelled", 2)
    assert row["attempt"] < row["max_attempts"], "cancelled with attempts left, not failed"
    assert error_types(row) == ["RuntimeError", "Cancel"]
    assert row["finished_at"] is not None


async def test_custom_backoff_policy_is_used(app: App, db: psycopg.Connection) -> None:
    @app.task("sync", backoff=lambda attempt: timedelta(minutes=attempt))
    async def sync_task() -> datetime:
        if current().run_count == 1:
            raise ConnectionError("vendor down")
        return datetime(2024, 1, 1)  # non-JSON: also retried on the task's curve

    job_id = sync_task.enqueue()
    await run_until(app, ran(db, job_id))
    assert abs(retry_delay(db, job_id) - 60.0) < 0.001
    db.execute("UPDATE akadze.jobs SET scheduled_at = now() WHERE id = %s", (job_id,))
    await run_until(app, ran(db, job_id, runs=2))
    row = job(db, job_id)
    assert error_types(row) == ["ConnectionError", "ResultNotJson"]
    assert abs(retry_delay(db, job_id) - 120.0) < 0.001


async def test_policy_delays_are_clamped(app: App, db: psycopg.Connection) -> None:
    @app.task("too_long", backoff=lambda attempt: timedelta(days=1000))
    async def too_long() -> None:
        raise RuntimeError("x")

    @app.task("negative", backoff=lambda attempt: timedelta(seconds=-60))
    async def negative() -> str:
        if current().run_count == 1:
            raise RuntimeError("x")
        return "second run"

    long_id, negative_id = too_long.enqueue(), negative.enqueue()
    # The negative delay becomes 0: due at once, so the job runs again and succeeds (a success
    # leaves scheduled_at as the retry set it).
    await run_until(app, lambda: ran(db, long_id)()
                    and job(db, negative_id)["state"] == "succeeded", slots=2)
    assert abs(retry_delay(db, long_id) - YEAR) < 0.001
    row = job(db, negative_id)
    assert error_types(row) == ["RuntimeError"]
    assert row["run_count"] == 2
    assert retry_delay(db, negative_id) == 0.0


async def test_bad_policy_falls_back_to_the_default_curve(
    app: App, db: psycopg.Connection
) -> None:
    def raising(attempt: int) -> timedelta:
        raise ZeroDivisionError("bad policy")

    @app.task("bad_raises", backoff=raising)
    async def bad_raises() -> None:
        raise RuntimeError("x")

    @app.task("bad_type", backoff=lambda attempt: 3600)  # type: ignore[arg-type,return-value]
    async def bad_type() -> None:
        raise RuntimeError("x")

    ids = [bad_raises.enqueue(), bad_type.enqueue()]
    await run_until(app, lambda: all(ran(db, job_id)() for job_id in ids), slots=2)
    for job_id in ids:
        row = job(db, job_id)
        assert (row["state"], row["attempt"]) == ("queued", 1)
        assert error_types(row) == ["RuntimeError"], "the policy's error is not the job's"
        assert 0.5 <= retry_delay(db, job_id) <= 1.0


async def test_retry_beats_the_policy(app: App, db: psycopg.Connection) -> None:
    @app.task("retry_with_policy", backoff=lambda attempt: timedelta(hours=1))
    async def retry_with_policy() -> None:
        raise Retry(timedelta(seconds=5))

    job_id = retry_with_policy.enqueue()
    await run_until(app, ran(db, job_id))
    assert abs(retry_delay(db, job_id) - 5.0) < 0.001


async def test_nul_in_the_result_fails_with_no_more_attempts(
    app: App, db: psycopg.Connection
) -> None:
    @app.task("nul_result")
    async def nul_result() -> dict[str, str]:
        return {"text": "a\x00b"}

    job_id = nul_result.enqueue()
    await run_until(app, ran(db, job_id))
    row = job(db, job_id)
    assert (row["state"], row["attempt"], row["result"]) == ("failed", 1, None)
    assert error_types(row) == ["UnstorableOutcome"]


async def test_rescued_job_spends_the_attempt_on_the_default_curve(
    app: App, db: psycopg.Connection
) -> None:
    @app.task("long_haul", backoff=lambda attempt: timedelta(days=10))
    async def long_haul() -> None:
        raise AssertionError("a rescued job with a future retry must not run in this test")

    # Running under a worker that does not exist (it vanished), far into its attempt budget:
    # the default curve applies (capped at 300 s), never the task's policy.
    job_ids = [db.execute(
        "INSERT INTO akadze.jobs (task, queue, state, attempt, max_attempts, run_count, "
        "worker_id, started_at) VALUES ('long_haul', 'default', 'running', %s, 5000, %s, "
        "999999, now()) RETURNING id", (attempt, attempt)).fetchone()[0]  # type: ignore[index]
        for attempt in (1, 2000)]
    await run_until(app, lambda: all(job(db, i)["state"] == "queued" for i in job_ids))
    for job_id, low, high in ((job_ids[0], 0.5, 1.0), (job_ids[1], 150.0, 300.0)):
        row = job(db, job_id)
        assert row["attempt"] == row["run_count"], "the rescue keeps the attempt spent"
        assert error_types(row) == ["WorkerLost"]
        assert low <= retry_delay(db, job_id) <= high


async def test_graceful_stop_returns_the_job_without_spending_the_attempt(
    app: App, db: psycopg.Connection
) -> None:
    started = asyncio.Event()

    @app.task("stubborn")
    async def stubborn() -> None:
        started.set()
        await asyncio.sleep(30)

    job_id = stubborn.enqueue()
    async with running(fast_worker(app, shutdown_timeout=0.2)):
        await wait_event(started, what="the job to start")
        await wait_until(lambda: job(db, job_id)["attempt"] == 1, what="the claim")
    row = job(db, job_id)
    assert (row["state"], row["attempt"], row["run_count"]) == ("queued", 0, 1)
    assert row["errors"] == [] and row["worker_id"] is None
