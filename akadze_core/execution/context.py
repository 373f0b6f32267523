"""``current()``: what the running job is, and ``complete_tx`` to finish it in your transaction."""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

import psycopg

from ..model.errors import NotOwner
from ..model.jobs import Job
from ..model.serialization import encode_args
from ..store import database

if TYPE_CHECKING:
    from ..app import App

_current: contextvars.ContextVar[JobContext] = contextvars.ContextVar("akadze_current_job")


class JobContext:
    """The running job as its task sees it."""

    __slots__ = ("_claim", "_job", "_meta", "_row", "app", "completed", "last_error", "worker_id")

    def __init__(self, app: App, job: Job | None = None, worker_id: int | None = None,
                 last_error: dict[str, Any] | None = None) -> None:
        self.app = app
        self._job = job
        self._claim: tuple[Mapping[str, Any], Any, Any] | None = None
        #: The claimed row while no ``Job`` is built: the fields below read it directly.
        self._row: Mapping[str, Any] | None = None
        self._meta: dict[str, Any] | None = None
        self.worker_id = worker_id
        #: The newest ``errors`` entry of the job when it was claimed (None on a clean
        #: record): what went wrong on the previous attempt, without another query.
        self.last_error = last_error
        #: Set once the run's outcome is written (complete_tx committed the job's success,
        #: or the Celery facade stored its outcome before task_postrun); the worker then
        #: writes nothing.
        self.completed = False

    @classmethod
    def claimed(cls, app: App, row: Mapping[str, Any], args: Any, upstream_results: Any,
                worker_id: int | None, last_error: dict[str, Any] | None) -> JobContext:
        """The context of a claimed ``row`` whose args (and upstream results) are decoded:
        its ``job`` is built on first use, so a body that never asks for it does not pay
        for a frozen dataclass of 27 fields (the biggest part of a no-op's run)."""
        # Each field set once, without ``__init__``'s call (once per job on the hot path).
        context = cls.__new__(cls)
        context.app = app
        context._job = None
        context._claim = (row, args, upstream_results)
        context._row = row
        context._meta = None
        context.worker_id = worker_id
        context.last_error = last_error
        context.completed = False
        return context

    @property
    def job(self) -> Job:
        """The job's record, as claimed."""
        job = self._job
        if job is None:
            assert self._claim is not None, "a JobContext needs a job or a claimed row"
            job = self._job = Job.from_claim(*self._claim, meta=self._meta)
            self._row = None
        return job

    def __repr__(self) -> str:
        return (f"JobContext(job={self.job!r}, worker_id={self.worker_id!r}, "
                f"completed={self.completed!r})")

    @property
    def id(self) -> int:
        """The job id."""
        row = self._row
        return row["id"] if row is not None else self.job.id

    @property
    def attempt(self) -> int:
        """This run's attempt number (1 for the first)."""
        row = self._row
        return row["attempt"] if row is not None else self.job.attempt

    @property
    def max_attempts(self) -> int:
        """The job's attempt budget, the first run included."""
        row = self._row
        return row["max_attempts"] if row is not None else self.job.max_attempts

    @property
    def run_count(self) -> int:
        """How many times the job was claimed, this run included (with the claim's random
        token, the run's fencing token)."""
        row = self._row
        return row["run_count"] if row is not None else self.job.run_count

    @property
    def task(self) -> str:
        """The task name."""
        row = self._row
        return row["task"] if row is not None else self.job.task

    @property
    def queue(self) -> str:
        """The queue the job was claimed from."""
        row = self._row
        return row["queue"] if row is not None else self.job.queue

    @property
    def priority(self) -> int:
        """The job's priority."""
        row = self._row
        return row["priority"] if row is not None else self.job.priority

    @property
    def expires_at(self) -> datetime | None:
        """When the job expires (None: never)."""
        row = self._row
        return row.get("expires_at") if row is not None else self.job.expires_at

    @property
    def position(self) -> int | None:
        """The job's position among the members sent in one bulk call (None outside one)."""
        row = self._row
        return row.get("position") if row is not None else self.job.position

    @property
    def claim_token(self) -> int | None:
        """The claim's random token (with ``run_count``, the run's fence)."""
        row = self._row
        return row.get("claim_token") if row is not None else self.job.claim_token

    @property
    def meta(self) -> dict[str, Any]:
        """The job's meta as claimed (the same dict as ``job.meta``): read without building
        the whole ``Job``, which a run that needs a few fields does not pay for."""
        if self._row is None:
            return self.job.meta
        meta = self._meta
        if meta is None:
            meta = self._meta = Job.claimed_meta(self._row)
        return meta

    @property
    def args(self) -> Any:
        """The job's arguments, decoded."""
        return self.job.args

    def _encode(self, patch: dict[str, Any]) -> str:
        # Same checks as job arguments: a clear error now instead of a jsonb error later.
        return encode_args(patch, self.app.json_dumps, self.app.max_args_bytes)

    async def update_meta(self, patch: dict[str, Any]) -> bool:
        """Merge ``patch`` into the job's ``meta`` while this run owns it (e.g. progress).

        Returns False when the run no longer owns the job (nothing was written).
        """
        patch_text = self._encode(patch)

        async def run(connection: psycopg.AsyncConnection) -> bool:
            return await database.update_job_meta_async(connection, self.id, self.run_count,
                                                        patch_text, self.claim_token)

        return bool(await self.app.connections.run_pooled_async(run))

    def update_meta_sync(self, patch: dict[str, Any]) -> bool:
        """Sync twin of ``update_meta`` (for plain ``def`` tasks)."""
        patch_text = self._encode(patch)
        return bool(self.app.connections.run_pooled(lambda connection: database.update_job_meta(
            connection, self.id, self.run_count, patch_text, self.claim_token)))

    def hand_over(self, connection: psycopg.Connection, to: int) -> None:
        """Pass what waits on this job (a chain's next step, a fan-in's callback, link
        callbacks) to the job ``to``, and mark this one ``replaced_by`` it: Celery's
        ``Task.replace``. Call it on ``complete_tx()``'s connection, after inserting ``to``
        there: the replacement, the hand-over and this job's success commit together or
        not at all (a run killed before the commit leaves nothing; its rerun replaces
        again). Raises ``NotOwner`` when this run no longer owns the job."""
        row = database.fetch_one(connection, "job_hand_over", id=self.id,
                                 run_count=self.run_count,
                                 claim_token=self.claim_token, to=to)
        if row is None:
            raise NotOwner(f"job {self.id} run {self.run_count} no longer owns the job; "
                           "nothing was handed over")

    async def hand_over_async(self, connection: psycopg.AsyncConnection, to: int) -> None:
        """Async twin of ``hand_over``."""
        row = await database.fetch_one_async(connection, "job_hand_over", id=self.id,
                                             run_count=self.run_count,
                                             claim_token=self.claim_token, to=to)
        if row is None:
            raise NotOwner(f"job {self.id} run {self.run_count} no longer owns the job; "
                           "nothing was handed over")

    def complete_tx(self) -> CompleteTx:
        """A connection whose transaction also moves this job to succeeded.

        ``async with current().complete_tx() as connection:`` (or ``with`` in a sync task):
        your writes and the job's success commit together or not at all. If this run no longer
        owns the job, ``NotOwner`` is raised and your writes roll back.
        """
        return CompleteTx(self)


class CompleteTx:
    """The context manager behind ``JobContext.complete_tx`` (async and sync)."""

    def __init__(self, context: JobContext) -> None:
        self._context = context
        self._pool: Any = None
        self._tx: Any = None

    def _owner_lost(self) -> NotOwner:
        return NotOwner(f"job {self._context.id} run {self._context.run_count} no longer owns "
                        "the job (it was rescued or already finished); nothing was committed")

    async def __aenter__(self) -> psycopg.AsyncConnection:
        app = self._context.app
        pool = await app.connections.opened_async_pool()
        # A connection a restart killed while idle is replaced before BEGIN is sent.
        connection = await app.connections.live_pooled_async(pool)
        self._pool = pool
        self._tx = connection.transaction()
        try:
            await self._tx.__aenter__()
        except BaseException:
            await pool.putconn(connection)
            raise
        self._connection = connection
        return connection

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            if exc is None:
                try:
                    if not await database.complete_job_in_tx_async(
                            self._connection, self._context.id, self._context.run_count,
                            self._context.job.claim_token):
                        raise self._owner_lost()
                except BaseException as error:
                    await self._tx.__aexit__(type(error), error, error.__traceback__)
                    raise
                await self._tx.__aexit__(None, None, None)
                self._context.completed = True
            else:
                await self._tx.__aexit__(exc_type, exc, tb)
        finally:
            await self._pool.putconn(self._connection)

    def __enter__(self) -> psycopg.Connection:
        app = self._context.app
        pool = app.connections.pool()
        connection = app.connections.live_pooled(pool)
        self._pool = pool
        self._tx = connection.transaction()
        try:
            self._tx.__enter__()
        except BaseException:
            pool.putconn(connection)
            raise
        self._sync_connection = connection
        return connection

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc is None:
                try:
                    if not database.complete_job_in_tx(
                            self._sync_connection, self._context.id, self._context.run_count,
                            self._context.job.claim_token):
                        raise self._owner_lost()
                except BaseException as error:
                    self._tx.__exit__(type(error), error, error.__traceback__)
                    raise
                self._tx.__exit__(None, None, None)
                self._context.completed = True
            else:
                self._tx.__exit__(exc_type, exc, tb)
        finally:
            self._pool.putconn(self._sync_connection)


def current() -> JobContext:
    """The job the calling task is running. Raises ``LookupError`` outside a job."""
    try:
        return _current.get()
    except LookupError:
        raise LookupError("current() is only available inside a running akadze job") from None


#: The context variable ``current()`` reads, for the worker's own path (one call fewer a
#: run than ``set_current`` and ``reset_current``, which set and reset it).
CURRENT = _current


def set_current(context: JobContext) -> contextvars.Token[JobContext]:
    """Make ``context`` the current job (used by the worker)."""
    return _current.set(context)


def reset_current(token: contextvars.Token[JobContext]) -> None:
    """Undo ``set_current``."""
    _current.reset(token)
