#!/usr/bin/env python3
"""akadze adapter for the hardbyte/postgresql-job-queue-benchmarking harness.

The contract's machinery (environment, JSONL samples, pacing, bounded-memory percentiles,
SIGTERM) is ``bench/pgjqb/contract.py``; this file is akadze's part, through its public API
only: ``akadze_core.App`` (``migrate``), ``App.task``, ``Task.enqueue_many_async`` (the
bulk insert: one multi-row INSERT per call) and ``Worker``. The one piece of SQL is the
observer's depth probe (queued jobs of the bench queue, on the claim index), as the
harness's other Python adapters read their own tables.

- The producer has its own ``App`` (and so its own pool): a ``Worker`` starting in the
  same event loop replaces its app's pool there, and an enqueue still waiting for the old
  pool then fails. Two apps sidestep that without touching akadze.
- ``Worker.run()`` returns 1 when the database was gone longer than ``heartbeat_ttl`` (the
  seeds require it); a deployment's supervisor starts it again. This process plays that
  supervisor: it logs the exit on stderr and starts a new ``Worker``; the count is the
  ``worker_restarts`` sample.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from akadze_core import App, Worker
from bench.pgjqb.contract import LongHorizon, run

QUEUE = "pgjqb_bench"
TASK_NAME = "pgjqb_job"


def akadze_version() -> str:
    """The checkout's git revision (akadze is run from source), else 'source'."""
    try:
        out = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)),
                              "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5, check=False)
        return f"git:{out.stdout.strip()}" if out.returncode == 0 else "source"
    except OSError:
        return "source"


class Akadze(LongHorizon):
    """akadze: ``enqueue_many_async`` to insert, one ``Worker`` with WORKER_COUNT slots."""

    system = "akadze"
    event_tables = ["akadze.jobs", "akadze.workers"]  # noqa: RUF012

    def __init__(self) -> None:
        super().__init__()
        self.version = akadze_version()
        self.producer_app = App(self.url)
        self.worker_app = App(self.url)
        self.producer_task = self.producer_app.task(TASK_NAME, queue=QUEUE)(self.job)
        self.worker_app.task(TASK_NAME, queue=QUEUE)(self.job)
        self.worker: Worker | None = None
        self.stopping = False
        self.gauges["worker_restarts"] = 0
        self.depth_conn: psycopg.AsyncConnection[Any] | None = None

    async def job(self, seq: int, created_at: float, padding: str = "") -> None:
        """The benchmark job."""
        await self.job_body(created_at)

    def log_error(self, what: str, exc: BaseException) -> None:
        """One stderr line, any password in it redacted by the app."""
        first = str(exc).splitlines()[0] if str(exc) else ""
        print(f"[akadze] {what}: {type(exc).__name__}: {self.producer_app.redact(first)}",
              file=sys.stderr, flush=True)

    async def setup(self) -> None:
        """``App.migrate``: akadze's own install path."""
        await asyncio.to_thread(self.producer_app.migrate)

    async def insert(self, rows: list[dict[str, Any]]) -> None:
        """One ``enqueue_many_async`` call: a single multi-row INSERT."""
        await self.producer_task.enqueue_many_async(rows)

    async def consume(self) -> None:
        """Run a Worker; start a new one (like a supervisor) when it exits unasked."""
        while not self.stopping:
            self.worker = Worker(self.worker_app, queues=[QUEUE], slots=self.worker_count,
                                 schedules=False)
            try:
                reason = f"exit code {await self.worker.run()}"
            except Exception as exc:
                reason = f"{type(exc).__name__}: {self.worker_app.redact(str(exc))}"
            if self.stopping:
                return
            self.gauges["worker_restarts"] += 1
            print(f"[akadze] the worker stopped unasked ({reason}); starting a new one "
                  f"(restart {self.gauges['worker_restarts']:.0f})", file=sys.stderr,
                  flush=True)
            await asyncio.sleep(1.0)

    async def stop_consumer(self) -> None:
        """``request_stop``; a second one after 3 s returns the running jobs at once."""
        self.stopping = True
        if self.worker is None or self.consumer_task is None:
            return
        self.worker.request_stop()
        done, _ = await asyncio.wait({self.consumer_task}, timeout=3.0)
        if not done:
            self.worker.request_stop()
            await asyncio.wait({self.consumer_task}, timeout=0.8)

    async def depth(self) -> int:
        """Queued jobs of the bench queue (the partial claim index covers them)."""
        if self.depth_conn is None or self.depth_conn.closed:
            self.depth_conn = await psycopg.AsyncConnection.connect(
                self.url, autocommit=True, connect_timeout=5)
        try:
            cur = await self.depth_conn.execute(
                "SELECT count(*) FROM akadze.jobs WHERE state = 'queued' AND queue = %s",
                (QUEUE,))
            row = await cur.fetchone()
        except psycopg.Error:
            await self.depth_conn.close()
            raise
        return int(row[0]) if row else 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="[akadze] %(levelname)s %(name)s: %(message)s")
    run(Akadze)
