"""Values Postgres cannot store, met by a real worker process.

Seed 000: "Исход, который сохранить нельзя вообще (например, символ NUL в результате),
завершает задание в failed без новых попыток." An error whose text cannot be stored is not
such an outcome: its text is sanitized (U+FFFD) and the job retries as usual.

Bad args at enqueue (NUL, lone surrogates, NaN, sets, bytes, oversized: error, zero rows) are
tests/integration/test_enqueue.py::test_bad_args_raise_invalid_args_and_insert_nothing and
test_args_over_the_size_limit_are_refused; a pickle blob, an array or a number written straight
into the args column is tests/integration/test_maintenance.py::
test_tampered_args_fail_with_args_decode_error_and_nothing_is_unpickled. Added here: args too
deeply nested to decode, written by hand, under a worker process.
"""

from __future__ import annotations

import signal

import psycopg
import pytest

from akadze_core import App
from akadze_core.model.serialization import sanitize_text
from tests.faults.conftest import SpawnWorker
from tests.faults.fault_app import BAD_MESSAGE, MAX_RESULT_BYTES_ENV
from tests.faults.support import error_types, rows_by_id, wait_until
from tests.workers.support import runs

pytestmark = pytest.mark.slow

FAST = ("--heartbeat-interval", "0.2", "--heartbeat-ttl", "1.5", "--poll-interval", "0.1")
UNSTORABLE_RESULTS = ("nul_result", "surrogate_result", "raw_result")


def test_unstorable_results_fail_at_once_and_unstorable_errors_retry_sanitized(
    app: App, database_url: str, runs_db: psycopg.Connection, spawn_worker: SpawnWorker
) -> None:
    unstorable = {name: app.tasks[name].enqueue() for name in UNSTORABLE_RESULTS}
    fine = app.tasks["quick"].enqueue_many([{}] * 6)  # share the completer's batches
    bad_error = app.tasks["bad_error"].enqueue()
    bad_type = app.tasks["bad_error_type"].enqueue()
    ids = [*unstorable.values(), *fine, bad_error, bad_type]
    worker = spawn_worker(database_url, *FAST, "--slots", "4")

    def settled() -> bool:
        rows = rows_by_id(runs_db, ids)
        return all(row["state"] in ("succeeded", "failed") for row in rows.values())

    wait_until(settled, timeout=20, what="every job to succeed or fail")
    rows = rows_by_id(runs_db, ids)

    # A result that can never be stored: failed on the first attempt, no more runs.
    for name, job_id in unstorable.items():
        row = rows[job_id]
        assert (row["state"], row["attempt"], row["max_attempts"], row["result"]) == \
            ("failed", 1, 3, None), (name, row)
        assert error_types(row) == ["UnstorableOutcome"], (name, row)
        assert len(runs(runs_db, job_id)) == 1, name
    # "{this is not json" passed the Python-side checks and was refused by Postgres: the
    # completer wrote that batch row by row and replaced only this outcome with a failure.
    assert "could not be stored" in rows[unstorable["raw_result"]]["errors"][0]["message"]
    for job_id in fine:
        assert (rows[job_id]["state"], rows[job_id]["result"]) == ("succeeded", "ok")

    # An error message with a NUL and a lone surrogate: stored sanitized, normal retries.
    row = rows[bad_error]
    assert (row["state"], row["attempt"], row["result"]) == ("succeeded", 3, "recovered"), row
    assert error_types(row) == ["ValueError", "ValueError"], row
    for entry in row["errors"]:
        assert entry["message"] == sanitize_text(BAD_MESSAGE) == \
            "bad\ufffdbyte and a lone \ufffd surrogate"
    assert len(runs(runs_db, bad_error)) == 3

    # The same holds for an exception class whose module name cannot be stored.
    row = rows[bad_type]
    assert (row["state"], row["attempt"], row["result"]) == ("succeeded", 2, "recovered"), row
    [entry] = row["errors"]
    assert (entry["type"], entry["module"]) == ("Unstorable", "mod\ufffdule \ufffd"), entry
    assert entry["message"] == "the type is the problem"

    worker.signal(signal.SIGTERM)
    assert worker.wait_exit()[0] == 0, worker.log()


@pytest.mark.parametrize("pool", [(), ("--processes", "2")], ids=["worker", "process-pool"])
def test_results_over_the_limit_or_refused_by_postgres_fail_alone_and_the_worker_goes_on(
    app: App, database_url: str, runs_db: psycopg.Connection, spawn_worker: SpawnWorker,
    pool: tuple[str, ...],
) -> None:
    """Seed 000: an outcome that can never be stored fails that job, with no more attempts;
    nothing else. A result over max_result_bytes (1 MiB here) is refused before it is
    written (or sent back from a pool's child); one that passes every check here but that
    Postgres refuses with a program limit (class 54: nesting past the server's stack; a
    jsonb string of 256 MiB is the same class) fails alone within its batch."""
    big = app.tasks["big_result"].enqueue(size=2 * 1024 * 1024)
    # 600 Ki characters, 1.2 MiB of UTF-8: over the limit by its bytes, not its length.
    utf8 = app.tasks["big_result"].enqueue(size=600 * 1024, char="é")
    deep = app.tasks["deep_raw_result"].enqueue(depth=100_000)
    fine = app.tasks["quick"].enqueue_many([{}] * 6)  # share the completer's batches
    just_under = app.tasks["big_result"].enqueue(size=1024 * 1024 - 2)  # with its quotes
    worker = spawn_worker(database_url, *FAST, "--slots", "4", *pool,
                          env={MAX_RESULT_BYTES_ENV: str(1024 * 1024)})
    ids = [big, utf8, deep, *fine, just_under]

    def settled() -> bool:
        rows = rows_by_id(runs_db, ids)
        return all(row["state"] in ("succeeded", "failed") for row in rows.values())

    wait_until(settled, timeout=30, what="every job to succeed or fail")
    rows = rows_by_id(runs_db, ids)
    for job_id, kind in ((big, "ResultTooLarge"), (utf8, "ResultTooLarge"),
                         (deep, "UnstorableOutcome")):
        row = rows[job_id]
        assert (row["state"], row["attempt"], row["result"]) == ("failed", 1, None), row
        assert error_types(row) == [kind], row
        assert len(runs(runs_db, job_id)) == 1, row  # no attempt re-spent
    assert "max_result_bytes" in rows[big]["errors"][0]["message"]
    assert "is 1228802 bytes as JSON, over the limit of 1048576" in \
        rows[utf8]["errors"][0]["message"]
    assert "could not be stored" in rows[deep]["errors"][0]["message"]
    assert (rows[just_under]["state"], len(rows[just_under]["result"])) == \
        ("succeeded", 1024 * 1024 - 2)
    for job_id in fine:
        assert (rows[job_id]["state"], rows[job_id]["result"]) == ("succeeded", "ok")

    # The same worker (and pool) goes on: a job enqueued now runs.
    later = app.tasks["quick"].enqueue()
    wait_until(lambda: rows_by_id(runs_db, [later])[later]["state"] == "succeeded",
               what="a later job to run")
    log = worker.log()
    assert "internal error" not in log and "Traceback" not in log, log
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit()[0] == 0, worker.log()


def test_args_too_deeply_nested_to_decode_fail_with_a_decode_error(
    app: App, database_url: str, runs_db: psycopg.Connection, spawn_worker: SpawnWorker
) -> None:
    """jsonb stores 3000 levels of nesting; Python's decoder gives up (RecursionError). The
    job fails at once with ArgsDecodeError and the worker goes on."""
    victim = app.tasks["quick"].enqueue()
    deep = '{"x": ' + "[" * 3000 + "]" * 3000 + "}"
    runs_db.execute("UPDATE akadze.jobs SET args = %s::jsonb WHERE id = %s", (deep, victim))
    after = app.tasks["quick"].enqueue()
    worker = spawn_worker(database_url, *FAST)

    def status(job_id: int) -> tuple[str, int, list[str]]:
        # Not SELECT *: the test's own json decoder would choke on these args too.
        row = runs_db.execute("SELECT state, attempt, errors FROM akadze.jobs WHERE id = %s",
                              (job_id,)).fetchone()
        assert row is not None
        return row[0], row[1], [entry["type"] for entry in row[2]]

    wait_until(lambda: status(victim)[0] == "failed" and status(after)[0] == "succeeded",
               what="both jobs to finish")
    assert status(victim) == ("failed", 1, ["ArgsDecodeError"])
    assert runs(runs_db, victim) == []  # the body never ran
    assert "internal error" not in worker.log()
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit()[0] == 0, worker.log()
