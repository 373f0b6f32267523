#!/usr/bin/env python3
"""awa (Python SDK, ``awa-pg``) adapter for the pgjqb harness, for the side-by-side run.

The harness's own ``awa-python-bench`` directory is not in its repository snapshot, so this
one is written the same way as ours: ``bench/pgjqb/contract.py`` for the contract, and
awa's public ``AsyncClient`` API: ``migrate``, ``task``, ``enqueue_many_copy`` (its
documented COPY bulk path into queue storage), ``start`` / ``shutdown``, and
``queue_stats`` for the depth (``available``). Event tables as the harness's ``awa-bench``
manifest lists them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import awa

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.pgjqb.contract import LongHorizon, run

QUEUE = "pgjqb_bench"


@dataclass
class BenchJob:
    """The benchmark job's arguments."""

    seq: int
    created_at: float
    padding: str = ""


class Awa(LongHorizon):
    """awa: ``enqueue_many_copy`` to insert, ``start([(queue, WORKER_COUNT)])`` to run."""

    system = "awa-python"
    event_tables = [  # noqa: RUF012
        "awa.queue_ring_state", "awa.queue_ring_slots", "awa.lease_ring_state",
        "awa.lease_ring_slots", "awa.claim_ring_state", "awa.claim_ring_slots",
        "awa.queue_lanes", "awa.attempt_state", "awa.deferred_jobs", "awa.dlq_entries"]

    def __init__(self) -> None:
        super().__init__()
        self.version = f"awa-pg {version('awa-pg')}"
        self.client: Any = None

    async def setup(self) -> None:
        """The client (it needs a running loop), its task, ``migrate`` (awa's own install
        path)."""
        self.client = awa.AsyncClient(self.url, max_connections=max(10, self.worker_count))

        @self.client.task(BenchJob, queue=QUEUE)
        async def handle(job: Any) -> None:
            await self.job_body(job.args.created_at)

        await self.client.migrate()

    async def insert(self, rows: list[dict[str, Any]]) -> None:
        """One ``enqueue_many_copy`` call (COPY into queue storage)."""
        await self.client.enqueue_many_copy([BenchJob(**row) for row in rows], queue=QUEUE)

    async def consume(self) -> None:
        """``start``: awa's runtime runs in the background until ``shutdown``."""
        await self.client.start([(QUEUE, self.worker_count)])

    async def stop_consumer(self) -> None:
        """``shutdown``: stop claiming, drain in-flight jobs (up to 3 s)."""
        await self.client.shutdown(timeout_ms=3000)

    async def depth(self) -> int:
        """``queue_stats``: the queue's available jobs."""
        for stat in await self.client.queue_stats():
            if stat.queue == QUEUE:
                return int(stat.available)
        return 0


if __name__ == "__main__":
    run(Awa)
