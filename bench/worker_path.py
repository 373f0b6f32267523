"""``python -m bench.worker_path``: the core worker's own CPU per job, without a database.

The path of a ``--slots 64`` drain's async no-op from its claimed row to its log line, in
this process: claims of 64 rows (as ``akadze.claim_jobs`` returns them), each row
started (``Runs.start_many``, or ``Runs.start`` by row in a tree without it) into a free
slot of the queue's body gate (its run and its task), as the claim loop starts a claim's
rows once the next claim is sent; the loop run until every body
(``bench.apps.core_app``'s no-op) ended and handed its outcome to a ``Completer``; then the
completer's written batch as the worker handles it (``log_outcomes`` through the CLI's own
logging, stderr sent to /dev/null). Prints the process time per job of each piece, best of
``--repeat``: start, run, line, and their total. No SQL is timed: the claim and the outcome
write are left out.

Process times move with the machine's load; a count does not. For instructions a job, run
it under ``valgrind --tool=callgrind --callgrind-out-file=/dev/null`` with ``--repeat 1
--jobs 6400`` and again with ``--jobs 640``, and divide the difference of the two
``Collected`` totals by 5,760 (start-up cancels out); ``PYTHONPATH`` picks the tree measured.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import logging
import os
import sys
import time
from typing import Any

SLOTS = 64
QUEUE = "default"


def claimed_rows(first_id: int, count: int) -> list[dict[str, Any]]:
    """Rows as a claim of the benchmark's no-ops returns them (akadze.claim_jobs' columns)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return [{
        "id": job_id, "task": "bench.noop", "queue": QUEUE, "args": '{"n": 1}',
        "state": "running", "priority": 0, "scheduled_at": now, "attempt": 1,
        "max_attempts": 3, "run_count": 1, "claim_token": 1234567890123 + job_id,
        "expires_at": None, "meta": "{}", "created_at": now, "started_at": now,
        "cancel_requested": False, "last_error": None, "upstreams": None,
        "upstream_results": None, "result_arg": None, "position": None, "releases": False,
        "notified": False,
    } for job_id in range(first_id, first_id + count)]


class _Lease:
    worker_id = 1


class _Threads:
    pass


async def _drain(claims: list[list[dict[str, Any]]], times: dict[str, float]) -> None:
    from akadze_core.cli.base import SECRETS
    from bench.apps.core_app import make_app

    app = make_app("postgresql://bench@127.0.0.1/unused")
    # As the CLI's worker: each line is scrubbed by the app's redact too (until the end).
    SECRETS.redactors.append(app.redact)
    try:
        await _claims(app, claims, times)
    finally:
        SECRETS.redactors.remove(app.redact)


async def _claims(app: Any, claims: list[list[dict[str, Any]]],
                  times: dict[str, float]) -> None:
    from akadze_core.worker.completer import Completer
    from akadze_core.worker.run_log import log_outcomes
    from akadze_core.worker.runs import Runs
    from akadze_core.worker.signals import Signals

    signals = Signals()
    runs = Runs(app, signals, _Lease(), queues=[QUEUE], process_pool=None,  # type: ignore[arg-type]
                concurrency=None, outcome_log_level=logging.INFO)
    written: list[Any] = []

    def on_written(batch: Any, rows: list[dict[str, Any]]) -> None:
        written.append(len(rows))
        log_outcomes(batch, rows, runs.finished, logging.INFO, app.redact, None)

    completer = Completer(lambda: None, on_written)
    runs.open(completer, _Threads())  # type: ignore[arg-type]
    runs._short_in_row = SLOTS  # a drain of short runs: claims are made ahead
    clock = time.process_time
    # As the claim loop starts a claim's rows (``Producer._start``), in either tree.
    start_many = getattr(runs, "start_many", None)
    for rows in claims:
        t0 = clock()
        runs.limit(QUEUE, SLOTS)
        if start_many is not None:
            start_many(rows)
        else:  # a tree whose claim loop starts its rows one by one
            for row in rows:
                runs.start(row)
        t2 = clock()
        while runs.running:
            await asyncio.sleep(0)
        t3 = clock()
        batch = completer._next_batch()
        changed = [{"id": outcome.job_id, "run_count": outcome.run_count,
                    "state": "succeeded", "queue": QUEUE, "priority": 0,
                    "scheduled_at": None, "settled": 0} for outcome in batch]
        t4 = clock()
        completer._on_written(batch, changed)
        del completer._pending[: len(batch)]
        await asyncio.sleep(0)  # the handler's held lines are written at the turn's end
        t5 = clock()
        times["start"] += t2 - t0
        times["run"] += t3 - t2
        times["line"] += t5 - t4


def measure(jobs: int) -> dict[str, float]:
    """Process seconds per job of each piece for one drain of ``jobs`` no-ops."""
    claims = [claimed_rows(1 + start, SLOTS) for start in range(0, jobs, SLOTS)]
    times = dict.fromkeys(("start", "run", "line"), 0.0)
    try:  # the loop the worker runs on
        from akadze_core.execution.eager import run
    except ImportError:  # a tree from before it
        run = asyncio.run
    run(_drain(claims, times))
    count = len(claims) * SLOTS
    return {name: value / count for name, value in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=9600)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args(argv)
    from akadze_core.cli.base import stderr_logging

    real_stderr = sys.stderr
    best: dict[str, float] = {}
    totals: list[float] = []
    with open(os.devnull, "w") as devnull:
        sys.stderr = devnull
        try:
            with stderr_logging("INFO"):
                for _ in range(args.repeat):
                    figures = measure(args.jobs)
                    totals.append(sum(figures.values()))
                    for name, value in figures.items():
                        best[name] = min(best.get(name, value), value)
        finally:
            sys.stderr = real_stderr
    pieces = " · ".join(f"{name} {value * 1e6:.2f}" for name, value in best.items())
    print(f"µs a job, best of {args.repeat} x {args.jobs}: {pieces} · "
          f"total {min(totals) * 1e6:.2f} (sum of bests {sum(best.values()) * 1e6:.2f})")


if __name__ == "__main__":
    main()
