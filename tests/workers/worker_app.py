"""A worker process for the subprocess tests: ``python -m tests.workers.worker_app [options]``.

It builds ``App(AKADZE_DATABASE_URL)`` with a few tasks, runs one ``Worker`` with the options
given on the command line, and exits the way a CLI would: the worker's exit code, or
``akadze: error: <message>`` on stderr and 1 when the worker stopped on an error retrying
cannot fix. It leaves with ``os._exit`` because a sync task's thread cannot be stopped and
would otherwise keep the interpreter alive.

Every task records its start in the table ``runs(job_id, run_count, pid, started)`` (the test
creates it) through a connection of its own, named ``akadze-test-task``, so tests that kill
the worker's connections (``application_name`` of the worker's URL) leave it alone.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import threading
import time

import psycopg

from akadze_core import App, Worker, WorkerError, current

TASK_APPLICATION_NAME = "akadze-test-task"

#: Ids of the sync tasks whose body is still running (reported when the process exits).
sync_running: set[int] = set()
_sync_lock = threading.Lock()


def _record_start(url: str) -> None:
    """Insert this run's row into ``runs`` (own connection, committed at once)."""
    context = current()
    with psycopg.connect(url, autocommit=True, application_name=TASK_APPLICATION_NAME) as conn:
        conn.execute("INSERT INTO runs (job_id, run_count, pid) VALUES (%s, %s, %s)",
                     (context.id, context.run_count, os.getpid()))


def build_app(url: str) -> App:
    """The App with the test tasks; the tests use it to enqueue, the worker to run."""
    app = App(url)

    @app.task("sleep")
    async def sleep(seconds: float) -> dict[str, float]:
        """Record the start, then sleep ``seconds`` without blocking the event loop."""
        await asyncio.to_thread(_record_start, url)
        await asyncio.sleep(seconds)
        return {"slept": seconds}

    @app.task("sleep_sync")
    def sleep_sync(seconds: float) -> dict[str, float]:
        """Record the start, then block this thread for ``seconds``."""
        job_id = current().id
        with _sync_lock:
            sync_running.add(job_id)
        try:
            _record_start(url)
            time.sleep(seconds)
        finally:
            with _sync_lock:
                sync_running.discard(job_id)
        return {"slept": seconds}

    @app.task("quick")
    async def quick() -> str:
        """Record the start and return at once."""
        await asyncio.to_thread(_record_start, url)
        return "ok"

    @app.task("nap")
    async def nap(seconds: float) -> str:
        """Sleep ``seconds`` without opening a connection (for a server with none free)."""
        await asyncio.sleep(seconds)
        return "ok"

    return app


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The worker options, with short test-friendly defaults."""
    parser = argparse.ArgumentParser(prog="worker_app", description=__doc__)
    parser.add_argument("--queue", action="append", dest="queues")
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--heartbeat-interval", type=float, default=0.2)
    parser.add_argument("--heartbeat-ttl", type=float, default=1.5)
    parser.add_argument("--poll-interval", type=float, default=0.1)
    parser.add_argument("--shutdown-timeout", type=float, default=1.5)
    parser.add_argument("--lock-timeout", type=float, default=None)
    parser.add_argument("--max-connections", type=int, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Run the worker until it stops, then exit the process with its code."""
    options = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = build_app(os.environ["AKADZE_DATABASE_URL"])
    worker = Worker(
        app, queues=options.queues or ["default"], slots=options.slots,
        heartbeat_interval=options.heartbeat_interval, heartbeat_ttl=options.heartbeat_ttl,
        poll_interval=options.poll_interval, shutdown_timeout=options.shutdown_timeout,
        lock_timeout=options.lock_timeout, max_connections=options.max_connections,
    )
    try:
        code = worker.run_sync()
    except WorkerError as exc:
        print(f"akadze: error: {exc}", file=sys.stderr)
        code = 1
    with _sync_lock:
        still = sorted(sync_running)
    print(f"worker_app: exit {code}; sync tasks still running: {still}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
