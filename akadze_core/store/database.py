"""The one module that executes SQL. Sync and async faces share every statement and its
parameters; only the awaiting differs."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from ..model.errors import SchemaMissing
from ..model.outcomes import Outcome, OutcomeWriter
from ..model.retry import DEFAULT_BACKOFF_CAP
from ..model.serialization import check_name
from .arrays import float_array, int_array, text_array
from .floors import Floors
from .migrations import MIGRATE_COMMAND, SCHEMA_EXISTS, SCHEMA_VERSION, check_version
from .notices import NoticeLimiter
from .queries import query

NOTIFY_CHANNEL = "akadze_jobs"
#: request_cancel of a running job notifies it with the job id (see job_request_cancel).
CANCEL_CHANNEL = "akadze_cancel"
#: Every change of a runtime schedule notifies its name (empty: unknown, compare them all).
SCHEDULES_CHANNEL = "akadze_schedules"
#: A remote-control request was sent; the payload lists its target worker ids (control_send).
CONTROL_CHANNEL = "akadze_control"
#: A worker answered a remote-control request; the payload is the request id.
CONTROL_REPLY_CHANNEL = "akadze_control_reply"


@dataclass(frozen=True, slots=True)
class JobRequest:
    """One job to insert; ``args`` and ``meta`` are already-validated JSON text."""

    task: str
    queue: str
    args: str
    priority: int = 0
    scheduled_at: datetime | None = None
    delay: float = 0.0
    max_attempts: int = 3
    expires_at: datetime | None = None
    unique_key: str | None = None
    meta: str = "{}"

    def __post_init__(self) -> None:
        # Every path that builds a row checks its names before anything is inserted: one
        # Postgres cannot index or notify would fail the insert (or, for a workflow's later
        # step, the write of its upstream's outcome) with a raw error.
        check_name(self.task, "a task name")
        check_name(self.queue, "a queue name")
        check_name(self.unique_key, "a unique key", key=True)

    def params(self) -> dict[str, Any]:
        params = {
            "task": self.task, "queue": self.queue, "args": self.args,
            "priority": self.priority, "scheduled_at": self.scheduled_at, "delay": self.delay,
            "max_attempts": self.max_attempts, "expires_at": self.expires_at,
            "unique_key": self.unique_key, "meta": self.meta,
        }
        if self.unique_key is None:
            del params["unique_key"]
        return params


def _many_params(template: JobRequest, arrays: Sequence[str]) -> dict[str, Any]:
    if template.unique_key:
        raise ValueError("unique_key is not supported by bulk enqueue; enqueue those one by one")
    params = template.params()
    params["args"] = list(arrays)
    return params


def _outcome_params(outcomes: Sequence[Outcome],
                    lock_timeout: str | None = None) -> dict[str, Any]:
    # Array literals (akadze_core.store.arrays): psycopg's dump of a list element by
    # element was the biggest part of a worker's CPU per outcome.
    return {
        "lock_timeout": lock_timeout,
        "id": int_array([o.job_id for o in outcomes]),
        "run_count": int_array([o.run_count for o in outcomes]),
        "claim_token": int_array([o.claim_token for o in outcomes]),
        "kind": text_array([o.kind for o in outcomes]),
        "result": text_array([o.result for o in outcomes]),
        "delay": float_array([o.delay for o in outcomes]),
        "error": text_array([o.error for o in outcomes]),
        "max_attempts": int_array([o.max_attempts for o in outcomes]),
    }


# --- sync face (enqueue from sync code, CLI) -------------------------------------------------

def insert_job(connection: psycopg.Connection, request: JobRequest) -> int:
    """Insert one job (or find the active one holding its unique key); returns its id."""
    return insert_job_params(connection, request.params())


def insert_job_params(target: psycopg.Connection | psycopg.Cursor[Any],
                      params: dict[str, Any]) -> int:
    """``insert_job`` from the parameters ``JobRequest.params`` returns (a ``unique_key``
    entry only when set), on a connection or on a cursor kept for reuse; returns the id."""
    statement = query("job_insert_unique" if "unique_key" in params else "job_insert")
    while True:
        row = target.execute(statement, params).fetchone()
        if row is not None:
            return int(row[0])
        # The key's holder committed after our snapshot was taken: look again.


def _quiet_key(params: dict[str, Any]) -> tuple[str, int] | None:
    """The (queue, priority) whose notice limits this insert's, or None when it must notify:
    only a job due at its own ``now()`` (no eta, no countdown) without a unique key may skip
    it (akadze_core.store.notices)."""
    if params["scheduled_at"] is not None or params["delay"] or "unique_key" in params:
        return None
    return params["queue"], params["priority"]


def insert_job_limited(target: psycopg.Connection | psycopg.Cursor[Any],
                       params: dict[str, Any], limiter: NoticeLimiter) -> int:
    """``insert_job_params`` as its own transaction (an autocommit connection, never the
    caller's transaction), its notice skipped while ``limiter`` says this process sent one
    for the job's queue and priority moments ago; returns the id."""
    key = _quiet_key(params)
    started = time.monotonic()
    opened = None if key is None else limiter.quiet_since(*key, started)
    if key is None or opened is None:
        job_id = insert_job_params(target, params)
        if key is not None:
            limiter.sent(*key, started)
        return job_id
    row = target.execute(query("job_insert_quiet"), params).fetchone()
    assert row is not None
    ended = time.monotonic()
    if not limiter.quiet(opened, started, ended) and row[1]:
        # Committed after the window: the follow-up claim may have run before it.
        target.execute(query("job_notice_send"), {"id": row[0]})
        limiter.sent(*key, ended)
    return int(row[0])


def insert_jobs(connection: psycopg.Connection, template: JobRequest,
                arrays: Sequence[str]) -> list[int]:
    """Insert the jobs whose args are the items of the JSON arrays ``arrays`` (as
    ``encoding.encode_many`` makes them), all otherwise like ``template``, in one statement;
    returns their ids in order."""
    if not arrays:
        return []
    row = connection.execute(query("job_insert_many"), _many_params(template, arrays)).fetchone()
    return list(row[0]) if row else []


def _graph_statement(params: dict[str, Any]) -> str:
    # Without edges nor errbacks (a group), the plain insert: no ids drawn beforehand.
    return query("job_insert_graph" if "external" in params else "job_insert_rows")


def insert_graph(connection: psycopg.Connection, params: dict[str, Any]) -> list[int]:
    """Insert a workflow's jobs (``Workflow.params``) in one statement; returns their ids in
    order."""
    row = connection.execute(_graph_statement(params), params).fetchone()
    return list(row[0]) if row else []


def insert_rows_pipelined(connection: psycopg.Connection, parts: Iterable[dict[str, Any]],
                          meanwhile: Callable[[], object] | None = None) -> list[int]:
    """``job_insert_rows`` of each of ``parts`` (a workflow's jobs in parts: ``Workflow``'s
    params of each), in one transaction, each statement sent as soon as its part is made
    (pipeline mode) so that the database inserts a part while the next one is made; the ids
    in order. An error making a part rolls back what was sent: nothing is inserted.
    ``meanwhile`` is called once every part is sent, before the results are waited for."""
    statement = query("job_insert_rows")
    cursors = []
    with connection.pipeline(), connection.transaction():
        for params in parts:
            cursors.append(connection.execute(statement, params))
        if meanwhile is not None:
            meanwhile()
    ids: list[int] = []
    for cursor in cursors:
        row = cursor.fetchone()
        if row:
            ids.extend(row[0])
    return ids


def fetch_one(connection: psycopg.Connection, name: str, /, **params: Any) -> dict[str, Any] | None:
    """Run a named query and return its first row as a dict."""
    with connection.cursor(row_factory=dict_row) as cursor:
        return cursor.execute(query(name), params).fetchone()


def fetch_all(connection: psycopg.Connection, name: str, /, **params: Any) -> list[dict[str, Any]]:
    """Run a named query and return every row as a dict."""
    with connection.cursor(row_factory=dict_row) as cursor:
        return cursor.execute(query(name), params).fetchall()


def complete_many_sync(connection: psycopg.Connection,
                       outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """Sync twin of ``complete_many``: a body that must see its own outcome stored before
    it goes on (the Celery facade's ``task_postrun``) writes it this way, fenced the same."""
    return fetch_all(connection, "job_complete_many", **_outcome_params(outcomes))


def write_outcome_extras_sync(connection: psycopg.Connection, writers: Sequence[OutcomeWriter],
                              rows: Sequence[dict[str, Any]]) -> None:
    """Run each writer over the jobs of ``rows`` (the outcomes just written), in the
    caller's transaction, so that both are committed or neither is."""
    ids = {"ids": [int(row["id"]) for row in rows]}
    for writer in writers:
        with connection.cursor(row_factory=dict_row) as cursor:
            made = writer.statement(cursor.execute(writer.select, ids).fetchall())
            if made is not None:
                cursor.execute(made[0], made[1])


async def write_outcome_extras(connection: psycopg.AsyncConnection,
                               writers: Sequence[OutcomeWriter],
                               rows: Sequence[dict[str, Any]]) -> None:
    """Async twin of ``write_outcome_extras_sync``."""
    ids = {"ids": [int(row["id"]) for row in rows]}
    for writer in writers:
        async with connection.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(writer.select, ids)
            made = writer.statement(await cursor.fetchall())
            if made is not None:
                await cursor.execute(made[0], made[1])


def update_job_meta(connection: psycopg.Connection, job_id: int, run_count: int,
                    patch: str, claim_token: int | None = None) -> bool:
    """Merge the JSON object ``patch`` into the job's meta while run ``run_count``, claimed
    with ``claim_token``, owns it; False when it no longer does (nothing written)."""
    return connection.execute(query("job_update_meta"), {
        "id": job_id, "run_count": run_count, "claim_token": claim_token,
        "patch": patch}).fetchone() is not None


def complete_job_in_tx(connection: psycopg.Connection, job_id: int, run_count: int,
                       claim_token: int | None = None) -> bool:
    """Move the job to succeeded in the caller's transaction while run ``run_count``,
    claimed with ``claim_token``, owns it; False when it no longer does."""
    return connection.execute(query("job_complete_in_tx"), {
        "id": job_id, "run_count": run_count, "claim_token": claim_token,
        "result": None}).fetchone() is not None


def cancel_job(connection: psycopg.Connection, job_id: int, signal: int | None = None) -> bool:
    """Request cancellation of an active job (see ``control.request_cancel``; ``signal``:
    terminate a running body's process with it); False when it is not active."""
    return connection.execute(query("job_request_cancel"),
                              {"id": job_id, "signal": signal}).fetchone() is not None


def requeue_job(connection: psycopg.Connection, job_id: int) -> bool:
    """Move a failed job back to queued (see ``control.requeue``); False when it is not
    failed."""
    return connection.execute(query("job_requeue"), {"id": job_id}).fetchone() is not None


def purge_jobs(connection: psycopg.Connection, queues: list[str] | None) -> int:
    """Delete the queued jobs of ``queues`` (all when None); returns how many."""
    return connection.execute(query("job_purge"), {"queues": queues}).rowcount


def _listen(channels: Iterable[str]) -> sql.Composed:
    # One round trip (statements without parameters may share a query); channel names are
    # identifiers, hence psycopg.sql rather than a named block with parameters.
    return sql.SQL(" ").join(sql.SQL("LISTEN {};").format(sql.Identifier(channel))
                             for channel in channels)


def listen(connection: psycopg.Connection, channels: Iterable[str]) -> None:
    """LISTEN on ``channels`` (the connection must be in autocommit mode)."""
    connection.execute(_listen(channels))


#: Whether the functions of functions.sql that this code's hot statements call exist: a
#: database migrated by older code has the current schema version but lacks them until
#: ``migrate`` re-applies the file (the version counts versioned migrations only).
_FUNCTIONS_PRESENT = ("SELECT to_regproc('akadze.claim_jobs') IS NOT NULL"
                      " AND to_regproc('akadze.claim_jobs_fair') IS NOT NULL"
                      " AND to_regproc('akadze.complete_jobs') IS NOT NULL")


def _check_functions(row: tuple[Any, ...] | None) -> None:
    if not (row and row[0]):
        raise SchemaMissing(f"the akadze functions of this database are older than this "
                            f"code: run `{MIGRATE_COMMAND}`")


def check_schema(connection: psycopg.Connection) -> None:
    """Raise ``SchemaMissing`` unless the schema is applied and current."""
    exists = connection.execute(SCHEMA_EXISTS).fetchone()
    version = connection.execute(SCHEMA_VERSION).fetchone() if exists and exists[0] else None
    check_version(version[0] if version else None)
    _check_functions(connection.execute(_FUNCTIONS_PRESENT).fetchone())


# --- async face (worker, async enqueue) ------------------------------------------------------

# Seconds the worker's statements may wait for a lock (None: no bound, the session's own).
_LOCK_TIMEOUT: ContextVar[float | None] = ContextVar("akadze_lock_timeout", default=None)


@contextlib.contextmanager
def lock_timeout(seconds: float | None) -> Iterator[None]:
    """Within this block (this task and what it awaits), the async statements of this module
    give up waiting for a lock after ``seconds`` with 55P03 lock_not_available, so an
    operator's ``LOCK TABLE`` or a migration never leaves the worker's statements queued
    behind it (and in front of everyone else's). The claim and the outcome write pass the
    bound to their SQL function (akadze.claim_jobs, akadze.complete_jobs), which sets it
    before its statement takes any relation lock; every other statement is sent in a
    pipeline after a transaction-local ``set_config``. One round trip either way, and
    nothing stays set on the session (safe behind PgBouncer in transaction mode)."""
    token = _LOCK_TIMEOUT.set(seconds)
    try:
        yield
    finally:
        _LOCK_TIMEOUT.reset(token)


def _bound() -> str | None:
    """The lock timeout ``lock_timeout`` set, as a setting's text (None: no bound)."""
    seconds = _LOCK_TIMEOUT.get()
    return None if seconds is None else f"{max(1, round(seconds * 1000))}ms"


async def _execute_async(cursor: psycopg.AsyncCursor[Any], statement: str,
                         params: dict[str, Any]) -> None:
    """``cursor.execute``, under the lock timeout of ``lock_timeout`` when one is set."""
    bound = _bound()
    if bound is None:
        await cursor.execute(statement, params)
        return
    connection = cursor.connection
    # Measured on an idle queue, a claim this way costs ~0.1 ms more than alone (4,400 vs
    # 7,500 claims/s on loopback; 1,800 vs 2,400 with 1,000 queued): two statements, one
    # round trip. BEGIN ... COMMIT instead would be two round trips (2,100 claims/s).
    async with connection.pipeline():
        await connection.execute(query("statement_lock_timeout"), {"timeout": bound})
        await cursor.execute(statement, params)

async def insert_job_params_async(connection: psycopg.AsyncConnection,
                                  params: dict[str, Any]) -> int:
    """Async insert of one job from ``JobRequest.params``-style parameters (see
    ``insert_job_params``); returns its id."""
    statement = query("job_insert_unique" if "unique_key" in params else "job_insert")
    while True:
        cursor = await connection.execute(statement, params)
        row = await cursor.fetchone()
        if row is not None:
            return int(row[0])


async def insert_job_limited_async(connection: psycopg.AsyncConnection,
                                   params: dict[str, Any], limiter: NoticeLimiter) -> int:
    """Async twin of ``insert_job_limited``."""
    key = _quiet_key(params)
    started = time.monotonic()
    opened = None if key is None else limiter.quiet_since(*key, started)
    if key is None or opened is None:
        job_id = await insert_job_params_async(connection, params)
        if key is not None:
            limiter.sent(*key, started)
        return job_id
    cursor = await connection.execute(query("job_insert_quiet"), params)
    row = await cursor.fetchone()
    assert row is not None
    ended = time.monotonic()
    if not limiter.quiet(opened, started, ended) and row[1]:
        await connection.execute(query("job_notice_send"), {"id": row[0]})
        limiter.sent(*key, ended)
    return int(row[0])


async def insert_jobs_async(
    connection: psycopg.AsyncConnection, template: JobRequest, arrays: Sequence[str]
) -> list[int]:
    """Async twin of ``insert_jobs``."""
    if not arrays:
        return []
    cursor = await connection.execute(query("job_insert_many"), _many_params(template, arrays))
    row = await cursor.fetchone()
    return list(row[0]) if row else []


async def insert_graph_async(connection: psycopg.AsyncConnection,
                             params: dict[str, Any]) -> list[int]:
    """Async twin of ``insert_graph``."""
    cursor = await connection.execute(_graph_statement(params), params)
    row = await cursor.fetchone()
    return list(row[0]) if row else []


async def fetch_one_async(
    connection: psycopg.AsyncConnection, name: str, /, **params: Any
) -> dict[str, Any] | None:
    """Async twin of ``fetch_one``."""
    async with connection.cursor(row_factory=dict_row) as cursor:
        await _execute_async(cursor, query(name), params)
        return await cursor.fetchone()


async def fetch_all_async(
    connection: psycopg.AsyncConnection, name: str, /, **params: Any
) -> list[dict[str, Any]]:
    """Async twin of ``fetch_all``."""
    async with connection.cursor(row_factory=dict_row) as cursor:
        await _execute_async(cursor, query(name), params)
        return await cursor.fetchall()


async def execute_query(connection: psycopg.AsyncConnection, name: str, /,
                        **params: Any) -> int:
    """Run a named statement that returns no rows; how many rows it changed."""
    async with connection.cursor() as cursor:
        await _execute_async(cursor, query(name), params)
        return cursor.rowcount


def run_statement_sync(connection: psycopg.Connection, statement: str, /,
                       **params: Any) -> list[dict[str, Any]]:
    """Sync twin of ``run_statement``."""
    with connection.cursor(row_factory=dict_row) as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description is not None else []


async def run_statement(connection: psycopg.AsyncConnection, statement: str, /,
                        **params: Any) -> list[dict[str, Any]]:
    """Run one statement of an integration's own SQL file (``queries.load_queries``), under
    the lock timeout like ours; its rows as dicts (none when it returns no rows)."""
    async with connection.cursor(row_factory=dict_row) as cursor:
        await _execute_async(cursor, statement, params)
        return await cursor.fetchall() if cursor.description is not None else []


async def check_schema_async(connection: psycopg.AsyncConnection) -> None:
    """Async twin of ``check_schema``."""
    exists = await (await connection.execute(SCHEMA_EXISTS)).fetchone()
    version = None
    if exists and exists[0]:
        version = await (await connection.execute(SCHEMA_VERSION)).fetchone()
    check_version(version[0] if version else None)
    _check_functions(await (await connection.execute(_FUNCTIONS_PRESENT)).fetchone())


async def update_job_meta_async(connection: psycopg.AsyncConnection, job_id: int,
                                run_count: int, patch: str,
                                claim_token: int | None = None) -> bool:
    """Async twin of ``update_job_meta``."""
    cursor = await connection.execute(query("job_update_meta"), {
        "id": job_id, "run_count": run_count, "claim_token": claim_token, "patch": patch})
    return await cursor.fetchone() is not None


async def complete_job_in_tx_async(connection: psycopg.AsyncConnection, job_id: int,
                                   run_count: int, claim_token: int | None = None) -> bool:
    """Async twin of ``complete_job_in_tx``."""
    cursor = await connection.execute(query("job_complete_in_tx"), {
        "id": job_id, "run_count": run_count, "claim_token": claim_token, "result": None})
    return await cursor.fetchone() is not None


async def cancel_job_async(connection: psycopg.AsyncConnection, job_id: int,
                           signal: int | None = None) -> bool:
    """Async twin of ``cancel_job``."""
    cursor = await connection.execute(query("job_request_cancel"),
                                      {"id": job_id, "signal": signal})
    return await cursor.fetchone() is not None


async def requeue_job_async(connection: psycopg.AsyncConnection, job_id: int) -> bool:
    """Async twin of ``requeue_job``."""
    cursor = await connection.execute(query("job_requeue"), {"id": job_id})
    return await cursor.fetchone() is not None


async def listen_async(connection: psycopg.AsyncConnection, channels: Iterable[str]) -> None:
    """Async twin of ``listen``."""
    await connection.execute(_listen(channels))


async def autovacuum_runs(connection: psycopg.AsyncConnection) -> bool | None:
    """Whether autovacuum will vacuum ``akadze.jobs`` (None: this role cannot tell).

    Without it every claim steps over the index entries of the jobs finished since the last
    VACUUM: claims slow down about tenfold behind a million finished jobs.
    """
    try:
        row = await (await connection.execute(query("autovacuum_runs"))).fetchone()
    except psycopg.errors.Error:
        return None
    return None if row is None else bool(row[0])


@dataclass(frozen=True, slots=True)
class FairIndexState:
    """``jobs_fair_claim_idx`` as the catalog shows it (``fair_index_state``)."""

    valid: bool
    building: bool


async def fair_index_state(connection: psycopg.AsyncConnection) -> FairIndexState | None:
    """The fair-claim index's state, or None when it does not exist."""
    row = await (await connection.execute(query("fair_index_state"))).fetchone()
    return None if row is None else FairIndexState(bool(row[0]), bool(row[1]))


async def fair_index_try_lock(connection: psycopg.AsyncConnection, key: int) -> bool:
    """Take the session-level advisory lock ``key`` if free (the fair index's builder)."""
    row = await (await connection.execute(query("fair_index_try_lock"), {"key": key})).fetchone()
    return bool(row and row[0])


async def fair_index_unlock(connection: psycopg.AsyncConnection, key: int) -> None:
    """Release what ``fair_index_try_lock`` took."""
    await connection.execute(query("fair_index_unlock"), {"key": key})


async def fair_index_build(connection: psycopg.AsyncConnection, *, drop_first: bool) -> None:
    """Build the fair-claim index CONCURRENTLY (an autocommit session of its own, with no
    statement or lock timeout left); ``drop_first``: drop an invalid one left before."""
    await connection.execute(query("fair_index_untimed"))
    if drop_first:
        await connection.execute(query("fair_index_drop"))
    await connection.execute(query("fair_index_create"))


#: ``autovacuum_runs`` by its older name: it has no sync twin, so no suffix (the twin rule).
autovacuum_runs_async = autovacuum_runs


async def claim_jobs(
    connection: psycopg.AsyncConnection, queue: str, limit: int, worker_id: int, fair: bool,
    after_task: str | None = None, floors: Floors | None = None,
) -> list[dict[str, Any]]:
    """Claim up to ``limit`` due jobs of ``queue`` (running ones and cancelled-at-claim ones).

    With ``fair``, pass the task of the last row of the previous fair claim as ``after_task``
    so the rotation across task names goes on where it stopped. ``floors``: where this
    worker's claims of the queue start reading (akadze_core.store.floors; not for fair claims),
    moved on by the rows claimed; without, the queue is read from its head.
    """
    # The claim bounds its own lock waits (akadze.claim_jobs, akadze.claim_jobs_fair): one
    # statement, no pipeline. Its rows come in binary: the same values and types as in text,
    # without the server writing and psycopg parsing their timestamps as text.
    if fair:
        async with connection.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(query("job_claim_fair"), {
                "lock_timeout": _bound(), "queue": queue, "limit": limit,
                "worker_id": worker_id, "after_task": after_task}, binary=True)
            return await cursor.fetchall()
    priorities, ats, ids = floors.bounds(queue) if floors is not None else ([], [], [])
    async with connection.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(query("job_claim"), {
            "lock_timeout": _bound(), "queue": queue, "limit": limit, "worker_id": worker_id,
            "floor_priority": priorities, "floor_at": ats, "floor_id": ids}, binary=True)
        rows = await cursor.fetchall()
    if floors is not None:
        floors.claimed(queue, rows)
    return rows


async def complete_many(
    connection: psycopg.AsyncConnection, outcomes: Sequence[Outcome]
) -> list[dict[str, Any]]:
    """Write a batch of fenced outcomes; returns the rows that changed."""
    # The write bounds its own lock waits (akadze.complete_jobs): one statement, no pipeline.
    async with connection.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(query("job_complete_many"), _outcome_params(outcomes, _bound()),
                             binary=True)
        return await cursor.fetchall()


async def return_many(
    connection: psycopg.AsyncConnection, runs: Sequence[tuple[int, int, int | None]]
) -> list[dict[str, Any]]:
    """Put unfinished runs back in the queue without spending their attempt."""
    return await fetch_all_async(
        connection, "job_return_many",
        id=[run[0] for run in runs], run_count=[run[1] for run in runs],
        claim_token=[run[2] for run in runs],
    )


async def return_orphans(
    connection: psycopg.AsyncConnection, worker_id: int, known: Sequence[int]
) -> list[dict[str, Any]]:
    """Hand back the running jobs of ``worker_id`` other than ``known`` (claims whose answer
    was lost), without spending their attempt."""
    return await fetch_all_async(connection, "job_return_orphans", worker_id=worker_id,
                                 known=list(known))


async def list_revoked(
    connection: psycopg.AsyncConnection, runs: Sequence[tuple[int, int, int | None]]
) -> list[int]:
    """Of ``runs`` (job id, run count, claim token), the jobs still running under that run
    and cancelled or expired on the database clock."""
    rows = await fetch_all_async(
        connection, "job_list_revoked",
        id=[run[0] for run in runs], run_count=[run[1] for run in runs],
        claim_token=[run[2] for run in runs])
    return [int(row["id"]) for row in rows]


async def list_terminating(
    connection: psycopg.AsyncConnection, runs: Sequence[tuple[int, int, int | None]]
) -> list[tuple[int, int]]:
    """Of ``runs`` (job id, run count, claim token), the jobs still running under that run
    and asked to be terminated: (job id, signal number) each."""
    rows = await fetch_all_async(
        connection, "job_list_terminating",
        id=[run[0] for run in runs], run_count=[run[1] for run in runs],
        claim_token=[run[2] for run in runs])
    return [(int(row["id"]), int(row["cancel_signal"])) for row in rows]


async def rescue_jobs(connection: psycopg.AsyncConnection) -> list[dict[str, Any]]:
    """Return the running jobs of dead workers to the queue (or fail them if out of attempts)."""
    return await fetch_all_async(connection, "job_rescue", cap=DEFAULT_BACKOFF_CAP)


async def prune_jobs(connection: psycopg.AsyncConnection, *, finished_retention: float,
                     failed_retention: float, limit: int) -> int:
    """Delete up to ``limit`` finished jobs past their retention (seconds); returns how many."""
    async with connection.cursor() as cursor:
        await _execute_async(cursor, query("job_prune"), {
            "finished_retention": finished_retention, "failed_retention": failed_retention,
            "limit": limit})
        return cursor.rowcount


async def unregister_worker(connection: psycopg.AsyncConnection, worker_id: int | None) -> None:
    """Remove the worker's row (it stopped and handed its jobs back)."""
    async with connection.cursor() as cursor:
        await _execute_async(cursor, query("worker_unregister"), {"id": worker_id})


# --- metrics (akadze_core.ops.metrics) ------------------------------------------------------

async def metrics_snapshot(
    connection: psycopg.AsyncConnection, *, count_cap: int, priority_groups: int,
    recent_window: float | None, recent_cap: int, bounds: Sequence[float],
) -> dict[str, list[dict[str, Any]]]:
    """The rows of the metrics queries, by query name: bounded counts per queue and state,
    per-state estimates, per-queue oldest job age and live workers, worker totals and, with
    ``recent_window`` (seconds), the jobs finished that recently (see queries.sql). Sent in
    one pipeline: one round trip for all of them (on a loaded host each round trip is a
    wait for the scheduler, twice)."""
    statements: dict[str, dict[str, Any]] = {
        "metrics_job_counts": {"cap": count_cap},
        "metrics_state_estimates": {},
        "metrics_queues": {"groups": priority_groups},
        "metrics_workers": {},
    }
    if recent_window is not None:
        statements["metrics_recent"] = {"window": recent_window, "cap": recent_cap,
                                        "bounds": list(bounds)}
    cursors = {name: connection.cursor(row_factory=dict_row) for name in statements}
    try:
        async with connection.pipeline():
            for name, params in statements.items():
                await cursors[name].execute(query(name), params)
        return {name: await cursor.fetchall() for name, cursor in cursors.items()}
    finally:
        for cursor in cursors.values():
            await cursor.close()
