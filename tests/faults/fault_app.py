"""The fault suite's worker process: ``python -m tests.faults.fault_app [options]``.

The tasks of ``tests/workers/worker_app.py`` (sleep, sleep_sync, quick: each records its start
in ``runs``) plus the ones the fault scenarios need: a poison pill that SIGKILLs its own
process, results and errors that cannot be stored as they are, a soak task, a task that
fails on its first attempt, one whose ``asyncio.to_thread`` thread sleeps in the server,
and the workflow tasks of ``workflow_tasks.py``. Same exit protocol as worker_app: the
worker's exit code, or ``akadze: error: <message>`` and 1.

``AKADZE_FAKE_CLOCK_OFFSET=<seconds>`` skews this process's wall clock (``fake_clock``) before
akadze is imported; the worker then logs ``fake clock offset ...`` once at start.
"""

from __future__ import annotations

# psycopg first: its date/time adapters must be built on the real datetime classes.
import psycopg  # isort: skip

from tests.faults import fake_clock  # isort: skip

CLOCK_OFFSET = fake_clock.install_from_env()

import argparse  # noqa: E402
import asyncio  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timedelta, timezone  # noqa: E402
from typing import Any  # noqa: E402

import psycopg_pool  # noqa: E402

from akadze_core import App, ConfigurationError, Worker, WorkerError, current  # noqa: E402
from akadze_core.execution.processes import ProcessPool, is_child, serve  # noqa: E402
from akadze_core.model.serialization import strict_dumps  # noqa: E402
from tests.faults.workflow_tasks import register_workflow_tasks  # noqa: E402
from tests.workers.worker_app import (  # noqa: E402
    TASK_APPLICATION_NAME,
    _record_start,
    build_app,
)

#: A result of the ``raw_result`` task: the app's dumps writes this text as is, and it is not
#: JSON, so the database refuses it when the outcome is written (the completer's fallback).
RAW_MARKER = "__raw_json_text__"
#: Set by ``--processes`` for the pool's children: the pid of the worker process they run
#: bodies for, which the fleet tasks record (the test kills workers, not children).
WORKER_PID_ENV = "FAULT_APP_WORKER_PID"
#: The fleet tasks record their run; the INSERT is idempotent, so a lost answer (the
#: server restarted, the backend terminated) is retried until it is known to be stored.
FLEET_RECORD = ("INSERT INTO runs (job_id, run_count, pid) SELECT %(id)s, %(run_count)s, %(pid)s"
                " WHERE NOT EXISTS (SELECT 1 FROM runs WHERE job_id = %(id)s"
                " AND run_count = %(run_count)s)")
#: How long a fleet task keeps retrying its record while the database is away.
FLEET_RECORD_FOR = 60.0
#: What a fleet task's record may raise while the database is away: the App's sync pool,
#: opened on first use, checks the URL with one direct connection and reports a refused one
#: as ConfigurationError (a first connection to a wrong host fails at once).
FLEET_OUTAGE = (psycopg.Error, psycopg_pool.PoolTimeout, ConfigurationError)
#: ``App(max_result_bytes=...)`` of the worker and its pool's children, when set (the
#: tests use a small one, for fast results over the limit).
MAX_RESULT_BYTES_ENV = "FAULT_APP_MAX_RESULT_BYTES"
#: What ``bad_error`` raises: a message with a NUL and a lone surrogate.
BAD_MESSAGE = "bad\x00byte and a lone \ud800 surrogate"


def _dumps(value: Any) -> str:
    if isinstance(value, dict) and set(value) == {RAW_MARKER}:
        return str(value[RAW_MARKER])
    return strict_dumps(value)


def build_fault_app(url: str) -> App:
    """worker_app's App plus the fault tasks."""
    app = build_app(url)
    app.json_dumps = _dumps
    if os.environ.get(MAX_RESULT_BYTES_ENV):
        app.max_result_bytes = int(os.environ[MAX_RESULT_BYTES_ENV])
    register_workflow_tasks(app)

    @app.task("suicide", max_attempts=3)
    async def suicide() -> None:
        """Record the start, then SIGKILL the worker process running it (a poison pill)."""
        await asyncio.to_thread(_record_start, url)
        os.kill(os.getpid(), signal.SIGKILL)

    @app.task("flaky_sleep", backoff=lambda attempt: timedelta(seconds=0.1))
    async def flaky_sleep(seconds: float) -> dict[str, float]:
        """Record the start; the first attempt raises, later ones sleep ``seconds``."""
        await asyncio.to_thread(_record_start, url)
        if current().attempt == 1:
            raise ValueError("first attempt fails")
        await asyncio.sleep(seconds)
        return {"slept": seconds}

    @app.task("slow_first_run")
    async def slow_first_run(seconds: float) -> str:
        """Record the start; the first run sleeps ``seconds`` (long enough to be killed or
        frozen mid-run however loaded the machine is), later runs return at once."""
        await asyncio.to_thread(_record_start, url)
        if current().run_count == 1:
            await asyncio.sleep(seconds)
        return "done"

    @app.task("sleep_in_thread")
    async def sleep_in_thread(seconds: float) -> str:
        """Record the start and then sleep ``seconds`` in the server, both on one connection
        of the task's own, in an ``asyncio.to_thread`` thread: through a partition, that thread
        waits for an answer until it heals, whatever becomes of the task."""
        await asyncio.to_thread(_record_start_and_sleep, url, seconds)
        return "done"

    @app.task("nul_result")
    async def nul_result() -> dict[str, str]:
        await asyncio.to_thread(_record_start, url)
        return {"text": "a\x00b"}

    @app.task("surrogate_result")
    async def surrogate_result() -> str:
        await asyncio.to_thread(_record_start, url)
        return "lone \udc00"

    @app.task("raw_result")
    async def raw_result() -> dict[str, str]:
        await asyncio.to_thread(_record_start, url)
        return {RAW_MARKER: "{this is not json"}

    @app.task("big_result")
    async def big_result(size: int, char: str = "x") -> str:
        """A result of ``size`` times ``char`` (over the app's max_result_bytes in tests)."""
        await asyncio.to_thread(_record_start, url)
        return char * size

    @app.task("deep_raw_result")
    async def deep_raw_result(depth: int) -> dict[str, str]:
        """A result written as is, small but nested ``depth`` levels deep: past the server's
        stack (100,000 levels is 200 KB), Postgres refuses it with a class 54 error."""
        await asyncio.to_thread(_record_start, url)
        return {RAW_MARKER: "[" * depth + "]" * depth}

    @app.task("bad_error", backoff=lambda attempt: timedelta(seconds=0.1))
    async def bad_error() -> str:
        """Raise a message Postgres cannot store as is, twice; then succeed."""
        await asyncio.to_thread(_record_start, url)
        if current().attempt < 3:
            raise ValueError(BAD_MESSAGE)
        return "recovered"

    @app.task("bad_error_type", backoff=lambda attempt: timedelta(seconds=0.1))
    async def bad_error_type() -> str:
        """Raise an exception whose class claims a module name with a NUL and a lone
        surrogate (Python refuses both in a class name itself)."""
        await asyncio.to_thread(_record_start, url)
        if current().attempt < 2:
            unstorable = type("Unstorable", (Exception,), {"__module__": "mod\x00ule \udfff"})
            raise unstorable("the type is the problem")
        return "recovered"

    @app.task("pooled_sleep")
    async def pooled_sleep(seconds: float) -> float:
        """Hold one connection of the worker's pool for ``seconds`` (grows the pool)."""
        await app.run_pooled_async(lambda connection: connection.execute("SELECT pg_sleep(%s)",
                                                                  (seconds,)))
        return seconds

    @app.task("soak", max_attempts=25)
    async def soak(n: int) -> int:
        """Record the start on the worker's own pool (cheap), return ``n``."""
        context = current()

        async def record(connection: psycopg.AsyncConnection) -> None:
            await connection.execute(
                "INSERT INTO runs (job_id, run_count, pid) VALUES (%s, %s, %s)",
                (context.id, context.run_count, os.getpid()))

        await app.run_pooled_async(record)
        return n

    def fleet_params() -> dict[str, int]:
        context = current()
        return {"id": context.id, "run_count": context.run_count,
                "pid": int(os.environ.get(WORKER_PID_ENV, os.getpid()))}

    @app.task("fleet", max_attempts=25)
    async def fleet(n: int) -> int:
        """Record the run (riding through database outages, see ``FLEET_RECORD``) on the
        worker's own pool (in a pool child: the child's), return ``n``."""
        params = fleet_params()

        async def record(connection: psycopg.AsyncConnection) -> None:
            await connection.execute(FLEET_RECORD, params)

        deadline = time.monotonic() + FLEET_RECORD_FOR
        while True:
            try:
                await app.run_pooled_async(record)
                return n
            except FLEET_OUTAGE:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    @app.task("fleet_sync", max_attempts=25)
    def fleet_sync(n: int) -> int:
        """``fleet`` as a sync body (the worker's thread pool), on the App's sync pool."""
        params = fleet_params()
        deadline = time.monotonic() + FLEET_RECORD_FOR
        while True:
            try:
                app.run_pooled(lambda connection: connection.execute(FLEET_RECORD, params))
                return n
            except FLEET_OUTAGE:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    return app


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """worker_app's options, plus --fair, --prune-interval and --processes."""
    parser = argparse.ArgumentParser(prog="fault_app", description=__doc__)
    parser.add_argument("--queue", action="append", dest="queues")
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--heartbeat-interval", type=float, default=0.2)
    parser.add_argument("--heartbeat-ttl", type=float, default=1.0)
    parser.add_argument("--poll-interval", type=float, default=0.1)
    parser.add_argument("--shutdown-timeout", type=float, default=1.0)
    parser.add_argument("--prune-interval", type=float, default=60.0)
    parser.add_argument("--fair", action="store_true")
    parser.add_argument("--processes", type=int, default=0,
                        help="run bodies in this many child processes (akadze --processes)")
    return parser.parse_args(argv)


def _record_start_and_sleep(url: str, seconds: float) -> None:
    context = current()
    with psycopg.connect(url, autocommit=True, application_name=TASK_APPLICATION_NAME) as conn:
        conn.execute("INSERT INTO runs (job_id, run_count, pid) VALUES (%s, %s, %s)",
                     (context.id, context.run_count, os.getpid()))
        conn.execute("SELECT pg_sleep(%s)", (seconds,))


def main(argv: list[str] | None = None) -> None:
    """Run the worker until it stops, then exit the process with its code."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if is_child():
        # A --processes child: same command line as its worker; it only runs bodies.
        application = build_fault_app(os.environ["AKADZE_DATABASE_URL"])
        os._exit(serve(application))
    options = parse_args(argv)
    if CLOCK_OFFSET:
        logging.getLogger("fault_app").info(
            "fake clock offset %+gs: this process believes it is %s (epoch %.3f)", CLOCK_OFFSET,
            datetime.now(timezone.utc).isoformat(), time.time())
    app = build_fault_app(os.environ["AKADZE_DATABASE_URL"])
    pool = None
    if options.processes:
        pool = ProcessPool(options.processes,
                           [sys.executable, "-m", "tests.faults.fault_app", *sys.argv[1:]],
                           env={WORKER_PID_ENV: str(os.getpid())})
    worker = Worker(
        app, queues=options.queues or ["default"], slots=options.slots,
        heartbeat_interval=options.heartbeat_interval, heartbeat_ttl=options.heartbeat_ttl,
        poll_interval=options.poll_interval, shutdown_timeout=options.shutdown_timeout,
        prune_interval=options.prune_interval, fair=options.fair, process_pool=pool,
    )
    try:
        code = worker.run_sync()
    except WorkerError as exc:
        print(f"akadze: error: {exc}", file=sys.stderr)
        code = 1
    print(f"fault_app: exit {code}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
