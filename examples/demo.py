"""A worker processing a small demo project: `python -m examples.demo`.

With no AKADZE_DATABASE_URL it runs on the embedded Postgres of the project: .akadze/ of the
repository root (the nearest directory upwards with pyproject.toml), wherever you run it from
inside the repository, or $AKADZE_HOME if set. It enqueues a few jobs that show each outcome
(success, retry, snooze, fail, out of attempts, a chain built with complete_tx), runs a
worker until they have all finished, and prints the jobs table: the result of each job, or
the error type and message that made it fail.
Pass --forever to keep the worker running afterwards (Ctrl-C stops it gracefully).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import timedelta

from akadze_core import App, Fail, Snooze, Worker, current

app = App()


@app.task("demo.add")
async def add(a: int, b: int) -> int:
    """Succeeds at once with a JSON result."""
    return a + b


@app.task("demo.flaky", backoff=lambda attempt: timedelta(milliseconds=300))
async def flaky(name: str) -> str:
    """Fails on its first two attempts, then succeeds: each failure spends an attempt."""
    if current().attempt < 3:
        raise ConnectionError(f"vendor unavailable (attempt {current().attempt})")
    return f"synced {name}"


@app.task("demo.poll")
async def poll(export_id: str, ready_after: int = 2) -> str:
    """Polls a (pretend) vendor: Snooze does not spend an attempt."""
    polled = current().job.run_count
    if polled <= ready_after:
        raise Snooze(timedelta(milliseconds=300))
    return f"export {export_id} ready after {polled} polls"


@app.task("demo.reject", max_attempts=5)
def reject(reason: str) -> None:
    """A plain `def` task (runs in a thread) that fails for good with Fail."""
    raise Fail(reason)


@app.task("demo.down", max_attempts=2, backoff=lambda attempt: timedelta(milliseconds=300))
async def down(region: str) -> None:
    """Fails every attempt: after its second one it is failed for good."""
    raise ConnectionError(f"vendor unreachable in {region}")


@app.task("demo.report")
async def report(report_id: int) -> None:
    """Builds a report and enqueues the notification in the same transaction as its success."""
    async with current().complete_tx() as connection:
        await notify.using(session=connection).enqueue(report_id=report_id)


@app.task("demo.notify")
async def notify(report_id: int) -> str:
    """The second step of the chain: exists only if the first step succeeded."""
    return f"report {report_id} sent"


async def main(forever: bool) -> None:
    """Enqueue the demo jobs, run a worker until they finish, print the jobs."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    ids = [
        await add.enqueue_async(a=2, b=3),
        await flaky.enqueue_async(name="crm"),
        await poll.enqueue_async(export_id="exp-1"),
        await reject.enqueue_async(reason="vendor rejected the export"),
        await down.enqueue_async(region="eu-west"),
        await report.enqueue_async(report_id=7),
        *await add.enqueue_many_async([{"a": i, "b": i} for i in range(3)]),
    ]
    worker = Worker(app, slots=4, poll_interval=0.2, heartbeat_interval=1, heartbeat_ttl=10)
    runner = asyncio.create_task(worker.run())
    async with await app.connect_async(autocommit=True) as connection:
        while not forever:
            cursor = await connection.execute(
                "SELECT count(*) FROM akadze.jobs WHERE state IN ('queued', 'running')")
            row = await cursor.fetchone()
            if row is not None and row[0] == 0:
                break
            await asyncio.sleep(0.1)
        if not forever:
            worker.request_stop()
        await runner
        # A failed job's reason is its last error: what `akadze jobs show` prints in full.
        cursor = await connection.execute(
            "SELECT id, task, state, attempt, result, errors -> -1 ->> 'type',"
            " errors -> -1 ->> 'message' FROM akadze.jobs WHERE id >= %s ORDER BY id",
            (min(ids),))
        print(f"\n{'id':>4}  {'task':<12} {'state':<10} {'attempt':>7}  result or reason")
        for job_id, task, state, attempt, result, kind, message in await cursor.fetchall():
            outcome = f"{kind}: {message}" if state == "failed" else result
            print(f"{job_id:>4}  {task:<12} {state:<10} {attempt:>7}  {outcome}")
    await app.close_async()


if __name__ == "__main__":
    asyncio.run(main(forever="--forever" in sys.argv))
