"""Chains with complete_tx, polling with Snooze (akadze_core): `python -m examples.core_chain`.

``examples.demo`` shows every outcome once; this example goes deeper into the two patterns
that replace Celery's canvas chains and polling loops:

- **A chain whose steps commit with their own writes.** ``charge`` marks the order charged,
  enqueues ``ship`` and marks its own job succeeded in one transaction
  (``current().complete_tx()``). Its first attempt fails *after* the write and the enqueue:
  both roll back with it, so the retry does not find a half-charged order or a ``ship`` job
  already waiting. The order itself is inserted in the same transaction that enqueues
  ``charge`` (``task.using(session=conn)``).
- **Polling without spending attempts.** ``poll_export`` asks a (pretend) vendor whether an
  export is ready; while it is not, ``raise Snooze(delay)`` runs it again later and the
  attempt is given back, so a job with ``max_attempts=3`` can poll as long as it needs.

Without ``AKADZE_DATABASE_URL`` it runs on the embedded Postgres of the project (``.akadze/``
of the repository root, or ``$AKADZE_HOME``; see ``akadze_core.store.embedded``). The
example's own tables live in the schema ``akadze_example`` (dropped and recreated on each
run). Progress goes to stdout, the worker's log to stderr.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import timedelta

from akadze_core import App, Snooze, Worker, current

app = App()

SCHEMA_SQL = """
DROP SCHEMA IF EXISTS akadze_example CASCADE;
CREATE SCHEMA akadze_example;
CREATE TABLE akadze_example.orders (
    id int PRIMARY KEY, state text NOT NULL, history text[] NOT NULL DEFAULT '{}');
CREATE TABLE akadze_example.exports (id text PRIMARY KEY, status text NOT NULL, url text);
"""

#: Retry quickly in this example (the default backoff starts at about a second).
QUICK = {"backoff": lambda attempt: timedelta(milliseconds=200)}


def say(text: str) -> None:
    print(text, flush=True)


# --- the chain: charge -> ship -> email ---------------------------------------------------------

@app.task("orders.charge", max_attempts=3, **QUICK)
async def charge(order_id: int) -> None:
    job = current()
    async with job.complete_tx() as connection:
        await connection.execute(
            "UPDATE akadze_example.orders SET state = 'charged', "
            "history = array_append(history, %s) WHERE id = %s",
            (f"charged (attempt {job.attempt})", order_id))
        await ship.using(session=connection).enqueue(order_id=order_id)
        if job.attempt == 1:
            # Fails after the write and the enqueue: the transaction rolls both back and
            # the attempt is retried. No 'ship' job escapes from a failed attempt.
            raise ConnectionError("payment gateway timed out before confirming")


@app.task("orders.ship")
async def ship(order_id: int) -> None:
    async with current().complete_tx() as connection:
        await connection.execute(
            "UPDATE akadze_example.orders SET state = 'shipped', "
            "history = array_append(history, 'shipped') WHERE id = %s", (order_id,))
        await email.using(session=connection).enqueue(order_id=order_id, kind="shipped")


@app.task("orders.email")
async def email(order_id: int, kind: str) -> str:
    return f"'{kind}' mail sent for order {order_id}"  # the last step: a plain result


# --- polling: Snooze until the vendor is done -----------------------------------------------------

@app.task("exports.poll", max_attempts=3)
async def poll_export(export_id: str) -> str:
    job = current()
    async with await app.connect_async(autocommit=True) as connection:
        cursor = await connection.execute(
            "SELECT status, url FROM akadze_example.exports WHERE id = %s", (export_id,))
        row = await cursor.fetchone()
    if row is None or row[0] != "ready":
        await job.update_meta({"polls": job.run_count})  # progress, visible to readers
        raise Snooze(timedelta(milliseconds=200))  # not ready: look again, no attempt spent
    return f"export {export_id} ready at {row[1]}"


# --- the run ------------------------------------------------------------------------------------

async def vendor_finishes(export_id: str, after: float) -> None:
    """The pretend vendor: the export becomes ready ``after`` seconds from now."""
    await asyncio.sleep(after)
    async with await app.connect_async(autocommit=True) as connection:
        await connection.execute(
            "UPDATE akadze_example.exports SET status = 'ready', url = %s WHERE id = %s",
            (f"https://vendor.example/exports/{export_id}.csv", export_id))
    say(f"   (vendor: export {export_id} is ready now)")


async def wait_until_idle(timeout: float = 30) -> None:
    """Wait until no job of this example's tasks is queued or running."""
    async with await app.connect_async(autocommit=True) as connection:
        for _ in range(int(timeout / 0.1)):
            cursor = await connection.execute(
                "SELECT count(*) FROM akadze.jobs WHERE task = ANY(%s) "
                "AND state IN ('queued', 'running')", (list(app.tasks),))
            row = await cursor.fetchone()
            if row is not None and row[0] == 0:
                return
            await asyncio.sleep(0.1)
    raise TimeoutError(f"the example's jobs did not finish within {timeout}s")


async def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app.migrate()  # idempotent: creates the akadze schema if this database has none
    async with await app.connect_async(autocommit=True) as connection:
        await connection.execute(SCHEMA_SQL)

        say("1. the order and its first step commit together (transactional enqueue)")
        async with connection.transaction():
            await connection.execute(
                "INSERT INTO akadze_example.orders (id, state) VALUES (7, 'new')")
            charge_id = await charge.using(session=connection).enqueue(order_id=7)
        say(f"   order 7 inserted, orders.charge enqueued as job {charge_id}")

        await connection.execute(
            "INSERT INTO akadze_example.exports (id, status) VALUES ('exp-1', 'pending')")
        poll_id = await poll_export.enqueue_async(export_id="exp-1")
        say(f"2. export exp-1 requested, exports.poll enqueued as job {poll_id}")

        worker = Worker(app, slots=4, poll_interval=0.2, heartbeat_interval=1,
                        heartbeat_ttl=10)
        runner = asyncio.create_task(worker.run())
        vendor = asyncio.create_task(vendor_finishes("exp-1", after=1.0))
        try:
            polled = await app.wait_for_job_async(poll_id, timeout=30)
            await vendor
            await wait_until_idle()
        finally:
            worker.request_stop()
            await runner

        say("\n3. the chain")
        cursor = await connection.execute(
            "SELECT id, task, state, attempt, jsonb_array_length(errors), result "
            "FROM akadze.jobs WHERE task LIKE 'orders.%%' AND id >= %s ORDER BY id",
            (charge_id,))
        for job_id, task, state, attempt, errors, result in await cursor.fetchall():
            say(f"   job {job_id:>3}  {task:<13} {state:<9} attempt {attempt}  "
                f"errors {errors}  result {result!r}")
        cursor = await connection.execute(
            "SELECT state, history FROM akadze_example.orders WHERE id = 7")
        state, history = await cursor.fetchone() or (None, None)
        say(f"   order 7: {state}, history {history}")
        cursor = await connection.execute(
            "SELECT count(*) FROM akadze.jobs WHERE task = 'orders.ship' AND id > %s",
            (charge_id,))
        ships = (await cursor.fetchone() or (0,))[0]
        say(f"   orders.ship jobs: {ships} (the failed attempt's enqueue was rolled back; "
            "its job id was spent)")
        say("   steps finished with complete_tx have no result (None): their output is "
            "in your tables")

        say("\n4. the poll")
        say(f"   job {polled.id} {polled.state}: {polled.result!r}")
        say(f"   runs {polled.run_count}, attempts spent {polled.attempt} of "
            f"{polled.max_attempts} (Snooze gives the attempt back), "
            f"meta polls={polled.meta.get('polls')}")
    await app.close_async()


if __name__ == "__main__":
    asyncio.run(main())
