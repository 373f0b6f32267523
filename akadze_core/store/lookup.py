"""Reading jobs back: by id or external id, listed, and waited for until they finish.

Waiting LISTENs on ``akadze_done``, which every statement that finishes a job notifies
with the job ids, and re-reads the row on each wake-up; a slow poll covers a lost
notification (e.g. behind pgbouncer in transaction mode).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import psycopg

from ..model.errors import SchemaMissing
from ..model.jobs import FINISHED_STATES, Job
from . import database

DONE_CHANNEL = "akadze_done"


def _job(row: dict[str, Any] | None) -> Job | None:
    return Job.from_row(row) if row is not None else None


def get_job(connection: psycopg.Connection, job_id: int) -> Job | None:
    """The job with this id, or None."""
    return _job(database.fetch_one(connection, "job_get", id=job_id))


async def get_job_async(connection: psycopg.AsyncConnection, job_id: int) -> Job | None:
    """Async twin of ``get_job``."""
    return _job(await database.fetch_one_async(connection, "job_get", id=job_id))


def find_job(connection: psycopg.Connection, task_id: str,
             derived: int | None = None) -> Job | None:
    """The newest job whose ``meta.task_id`` is ``task_id``, else (when ``derived`` is the
    job id ``task_id`` was derived from: ``TaskIds.job_id``) that job if it has no
    ``meta.task_id`` of its own; or None."""
    return _job(database.fetch_one(connection, "job_find_by_task_id", task_id=task_id,
                                   derived=derived))


async def find_job_async(connection: psycopg.AsyncConnection, task_id: str,
                         derived: int | None = None) -> Job | None:
    """Async twin of ``find_job``."""
    return _job(await database.fetch_one_async(connection, "job_find_by_task_id",
                                               task_id=task_id, derived=derived))


def task_id_key(connection: psycopg.Connection) -> str:
    """The database's key for derived task ids (``akadze_core.model.task_ids``)."""
    return _key(database.fetch_one(connection, "task_id_key"))


async def task_id_key_async(connection: psycopg.AsyncConnection) -> str:
    """Async twin of ``task_id_key``."""
    return _key(await database.fetch_one_async(connection, "task_id_key"))


def _key(row: dict[str, Any] | None) -> str:
    if row is None:  # migration 0014 inserts it: a schema made some other way
        raise SchemaMissing("akadze.task_id_key is empty: apply the schema with akadze's "
                            "migrations")
    return str(row["key"])


def _mentions(payload: str, job_id: int) -> bool:
    return str(job_id) in payload.split(",")


def _next_wait(job_id: int, timeout: float | None, deadline: float | None,
               poll_interval: float) -> float:
    """How long to listen before looking again; TimeoutError once the deadline passed."""
    if deadline is None:
        return poll_interval
    wait = min(poll_interval, deadline - time.monotonic())
    if wait <= 0:
        raise TimeoutError(f"job {job_id} did not finish within {timeout:g}s")
    return wait


def wait_for_job(connection: psycopg.Connection, job_id: int, timeout: float | None,
                 poll_interval: float = 5.0) -> Job:
    """Block until the job is succeeded, failed or cancelled; raise TimeoutError after
    ``timeout`` seconds. ``connection`` must be in autocommit mode and is left listening."""
    return wait_for_jobs(connection, [job_id], timeout, poll_interval)[job_id]


async def wait_for_job_async(connection: psycopg.AsyncConnection, job_id: int,
                             timeout: float | None, poll_interval: float = 5.0) -> Job:
    """Async twin of ``wait_for_job``."""
    deadline = None if timeout is None else time.monotonic() + timeout
    await database.listen_async(connection, [DONE_CHANNEL])
    while True:
        job = await get_job_async(connection, job_id)
        if job is not None and job.state in FINISHED_STATES:
            return job
        wait = _next_wait(job_id, timeout, deadline, poll_interval)
        async for notify in connection.notifies(timeout=wait):
            if _mentions(notify.payload, job_id):
                break


def get_jobs(connection: psycopg.Connection, job_ids: Iterable[int]) -> dict[int, Job]:
    """The jobs with these ids, by id (missing ones are absent), in one query."""
    rows = database.fetch_all(connection, "job_get_many", ids=list(job_ids))
    return {int(row["id"]): Job.from_row(row) for row in rows}


def wait_for_jobs(connection: psycopg.Connection, job_ids: Iterable[int],
                  timeout: float | None, poll_interval: float = 5.0) -> dict[int, Job]:
    """Block until every job is finished (a missing one counts as never finishing); one
    LISTEN for all of them, and each wake-up re-reads only the unfinished ones, in one
    query. Returns them by id."""
    wanted = list(dict.fromkeys(job_ids))
    deadline = None if timeout is None else time.monotonic() + timeout
    database.listen(connection, [DONE_CHANNEL])
    done: dict[int, Job] = {}
    while True:
        pending = [job_id for job_id in wanted if job_id not in done]
        if pending:
            for job_id, job in get_jobs(connection, pending).items():
                if job.state in FINISHED_STATES:
                    done[job_id] = job
            pending = [job_id for job_id in pending if job_id not in done]
        if not pending:
            return {job_id: done[job_id] for job_id in wanted}
        left = set(pending)
        wait = _next_wait(pending[0], timeout, deadline, poll_interval)
        for notify in connection.notifies(timeout=wait):
            if any(int(part) in left for part in notify.payload.split(",") if part):
                break


def list_jobs(connection: psycopg.Connection, *, state: str | None = None,
              queue: str | None = None, task: str | None = None, limit: int = 100) -> list[Job]:
    """The newest jobs matching the filters."""
    rows = database.fetch_all(connection, "job_list", state=state, queue=queue, task=task,
                              limit=limit)
    return [Job.from_row(row) for row in rows]


def list_scheduled(connection: psycopg.Connection, limit: int = 100) -> list[Job]:
    """Queued jobs that are not due yet, soonest first."""
    rows = database.fetch_all(connection, "job_list_scheduled", limit=limit)
    return [Job.from_row(row) for row in rows]


def list_workers(connection: psycopg.Connection, live: bool = False) -> list[dict[str, Any]]:
    """The registered workers with their last heartbeat (only live ones with ``live``)."""
    return database.fetch_all(connection, "worker_list", live=live)


def job_counts(connection: psycopg.Connection) -> dict[str, dict[str, int]]:
    """Queue -> state -> number of jobs."""
    counts: dict[str, dict[str, int]] = {}
    for row in database.fetch_all(connection, "job_stats"):
        counts.setdefault(row["queue"], {})[row["state"]] = int(row["jobs"])
    return counts


def purge(connection: psycopg.Connection, queues: list[str] | None = None) -> int:
    """Delete the queued jobs of ``queues`` (all when None); returns how many."""
    return database.purge_jobs(connection, queues)
