"""The no-op worker of the Oban drain: Oban's documented ``@worker`` class.

Oban stores the worker's import path in each row (``oban_bench_app.NoopWorker``) and the
``oban start`` process imports it from there, so this module is on the worker's PYTHONPATH.
"""

from __future__ import annotations

from typing import Any

from oban import worker

QUEUE = "bench"


@worker(queue=QUEUE)
class NoopWorker:
    """Does nothing: the drain measures the queue, not the job."""

    async def process(self, job: Any) -> None:
        return None
