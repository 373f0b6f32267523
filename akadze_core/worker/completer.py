"""Write run outcomes in batches (River's completer): one fenced UPDATE per flush.

Outcomes that arrive while a flush is in flight are written together by the next one, and the
first outcome after an idle spell waits ``GATHER`` seconds for the others finishing with it,
so a busy worker batches by itself and an idle one writes within a couple of milliseconds.
A transient failure keeps the batch and retries it with backoff: the write is fenced, so
retrying can never clobber a newer run, and the job is never re-run just because its outcome
was slow to land.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import psycopg

from ..model.errors import UnstorableOutcome
from ..model.outcomes import FAIL, Outcome, OutcomeWriter, error_entry
from ..store import database
from ..store.dberrors import is_lock_timeout, is_transient
from ..store.deadlines import within_lease

logger = logging.getLogger("akadze.worker")

Connect = Callable[[], Any]  # returns an async context manager yielding a connection
Written = Callable[[Sequence[Outcome], list[dict[str, Any]]], None]

#: Seconds the first outcome after an idle spell waits before its flush. Without it a pool
#: of a few processes finishing a job every half millisecond wrote one or two outcomes per
#: flush, each its own commit: 2 ms cut the database's CPU per job by a tenth (prefork,
#: -c 2). Only the write waits: the job's slot is free as soon as its run ends.
GATHER = 0.002


#: Seconds of writes one step makes back to back on its connection (``Completer._write``)
#: before it gives way to a new one.
WRITES_PER_STEP = 0.2

#: The completer's step, as ``on_lock`` names it.
WRITING = "writing outcomes"

#: Characters of results and errors one write sends at most (but for a single outcome
#: larger than this): each outcome is bounded by ``App(max_result_bytes)``, a batch of them
#: is bounded here, far below the 1 GiB Postgres allows a statement's parameter.
MAX_BATCH_CHARS = 64 * 1024 * 1024


def is_unstorable(exc: BaseException) -> bool:
    """Whether a write of outcomes failed because a value in it can never be stored: a data
    error (class 22: a NUL, text that is not JSON) or a program limit (class 54: a jsonb
    string of 256 MiB or more, nesting too deep for the server's stack). Retrying the same
    batch cannot help; splitting it finds the culprit."""
    if isinstance(exc, psycopg.DataError):
        return True
    return isinstance(exc, psycopg.Error) and (exc.sqlstate or "").startswith("54")


def _failure(outcome: Outcome, exc: Exception,
             redact: Callable[[str], str] | None) -> Outcome:
    """The failure written instead of ``outcome``, which Postgres refused with ``exc``."""
    error = UnstorableOutcome(f"the outcome could not be stored: {exc}")
    logger.warning("job %s: its outcome could not be stored (%s): failing it",
                   outcome.job_id, type(exc).__name__)
    return Outcome(outcome.job_id, outcome.run_count, FAIL,
                   error=error_entry(error, redact=redact), claim_token=outcome.claim_token)


def _writers(app: object) -> Sequence[OutcomeWriter]:
    return getattr(app, "outcome_writers", None) or ()


def _complete_sync(connection: psycopg.Connection, outcomes: Sequence[Outcome],
                   writers: Sequence[OutcomeWriter]) -> list[dict[str, Any]]:
    """``complete_many_sync``, and ``writers`` in the same transaction when there are any."""
    if not writers:
        return database.complete_many_sync(connection, outcomes)
    with connection.transaction():
        rows = database.complete_many_sync(connection, outcomes)
        if rows:
            database.write_outcome_extras_sync(connection, writers, rows)
    return rows


async def _complete(connection: psycopg.AsyncConnection, outcomes: Sequence[Outcome],
                    writers: Sequence[OutcomeWriter]) -> list[dict[str, Any]]:
    """Async twin of ``_complete_sync``."""
    if not writers:
        return await database.complete_many(connection, outcomes)
    async with connection.transaction():
        rows = await database.complete_many(connection, outcomes)
        if rows:
            await database.write_outcome_extras(connection, writers, rows)
    return rows


class Pooled(Protocol):
    """What ``store_outcome_sync`` needs of an ``App``: its pooled connections and its
    redaction (a protocol, so this module does not depend on the app's)."""

    def run_pooled(self, call: Callable[[psycopg.Connection], Any]) -> Any: ...
    async def run_pooled_async(self, call: Callable[[psycopg.AsyncConnection], Any]) \
        -> Any: ...
    def redact(self, text: str) -> str: ...


def store_outcome_sync(app: Pooled, outcome: Outcome) -> bool:
    """Write one run's outcome at once, outside the worker's batches (for a framework that
    must see it stored before it goes on: the Celery facade's ``task_postrun``): the
    completer's write, fenced by the run's ``run_count`` and claim token, and an outcome
    Postgres refuses as unstorable failing the job as a batch's would. True when it was
    written, False when the run no longer owns the job. A failure to write (a lost
    connection) is raised: the worker's completer then writes the outcome as usual. The
    app's ``outcome_writers`` run in the outcome's transaction."""
    writers = _writers(app)

    def write(connection: psycopg.Connection) -> list[dict[str, Any]]:
        try:
            return _complete_sync(connection, [outcome], writers)
        except psycopg.Error as exc:
            if not is_unstorable(exc):
                raise
            # Autocommit, or a transaction rolled back: the refused statement wrote nothing.
            return _complete_sync(connection, [_failure(outcome, exc, app.redact)], writers)

    return bool(app.run_pooled(write))


async def store_outcome(app: Pooled, outcome: Outcome) -> bool:
    """``store_outcome_sync`` from a coroutine (an ``async def`` body)."""
    writers = _writers(app)

    async def write(connection: psycopg.AsyncConnection) -> list[dict[str, Any]]:
        try:
            return await _complete(connection, [outcome], writers)
        except psycopg.Error as exc:
            if not is_unstorable(exc):
                raise
            return await _complete(connection, [_failure(outcome, exc, app.redact)], writers)

    return bool(await app.run_pooled_async(write))


class Completer:
    """Batches outcomes and writes them with ``job_complete_many``.

    ``lease_end()``, if given, bounds each write (``deadlines.within_lease``, at most ``cap``
    seconds): one the database does not answer while the lease holds (a partition) abandons
    its connection and is retried like a lost one; a slow one on a live server is waited for.
    ``redact`` scrubs the error entry of an outcome that could not be stored. ``writers``
    (``OutcomeWriter``) run in each write's transaction."""

    def __init__(self, connection: Connect, on_written: Written, max_batch: int = 1000,
                 retry_cap: float = 5.0, gather: float = GATHER,
                 lock_timeout: float | None = None,
                 on_lock: Callable[[str, bool], None] | None = None,
                 lease_end: Callable[[], float] | None = None, cap: float = 60.0,
                 redact: Callable[[str], str] | None = None,
                 writers: Sequence[OutcomeWriter] = ()) -> None:
        self._connection = connection
        self._writers = writers
        # Each write gives up on a lock after this many seconds (None: waits as long as the
        # session would) and reports it to on_lock(step, locked) instead of a line per try.
        self._lock_timeout = lock_timeout
        self._on_lock = on_lock
        self._lease_end = lease_end
        self._cap = cap
        self._redact = redact
        self._gather = gather
        self._on_written = on_written
        self._max_batch = max_batch
        self._retry_cap = retry_cap
        self._pending: list[Outcome] = []
        self._arrived = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self._urgent = False
        # The size of the batch taken last (``_take``), for its failure's line.
        self._writing = 0

    @property
    def pending(self) -> int:
        """Outcomes not written yet (the worker stops claiming when this grows too large)."""
        return len(self._pending)

    def pending_jobs(self) -> set[int]:
        """Ids of the jobs whose outcome is not written yet (the batch in flight included)."""
        return {outcome.job_id for outcome in self._pending}

    def submit(self, outcome: Outcome, *, urgent: bool = False) -> None:
        """Queue an outcome for the next flush. ``urgent``: another job waits on this one (a
        workflow's next step), so the flush does not wait ``gather`` for company."""
        pending = self._pending
        pending.append(outcome)
        if urgent:
            self._urgent = True
        if len(pending) == 1:
            # Only the first of a batch: while outcomes are pending, ``_idle`` stays clear
            # and ``_arrived`` set (``run`` changes them only with none pending), and two
            # events' calls per outcome are spared.
            self._idle.clear()
            self._arrived.set()

    async def run(self) -> None:
        """Flush until ``close`` is called and everything is written."""
        failures = 0
        while True:
            if not self._pending:
                self._idle.set()
                if self._closing:
                    return
                self._arrived.clear()
                await self._arrived.wait()
                if self._gather > 0 and not self._closing and not self._urgent:
                    await asyncio.sleep(self._gather)
                continue
            try:
                await self._write()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                failures += 1
                delay = min(self._retry_cap, 0.05 * 2 ** failures) * (0.5 + random.random() / 2)
                if self._on_lock is not None and is_lock_timeout(exc):
                    self._on_lock(WRITING, True)
                    await asyncio.sleep(delay)
                    continue
                logger.warning("writing %d outcomes failed (%s); retrying in %.2fs",
                               self._writing, type(exc).__name__, delay)
                await asyncio.sleep(delay)
                continue
            failures = 0

    def _take(self) -> list[Outcome]:
        """The next batch to write (``_next_batch``): it carries any urgent outcome
        pending, and its size is the one a failure's line gives."""
        self._urgent = False
        batch = self._next_batch()
        self._writing = len(batch)
        return batch

    def _next_batch(self) -> list[Outcome]:
        """The pending outcomes the next write sends: at most ``max_batch`` of them, with at
        most ``MAX_BATCH_CHARS`` of results and errors (but the first, whatever its size)."""
        batch = self._pending[: self._max_batch]
        total = 0
        for index, outcome in enumerate(batch):
            # Its result and error, inline (a call per outcome was most of this loop).
            total += len(outcome.result or "") + len(outcome.error or "")
            if total > MAX_BATCH_CHARS and index > 0:
                return batch[:index]
        return batch

    async def _write(self) -> None:
        """Write the pending outcomes, a batch a statement (the first taken now, before the
        connection), back to back on one connection while more are pending (at most
        ``WRITES_PER_STEP`` seconds): each next statement goes out in the turn the last
        answer is read. A failed write raises with its batch still pending; those written
        before it are dropped from the list."""
        batch = self._take()
        async with self._connection() as connection:
            with database.lock_timeout(self._lock_timeout):
                if self._lease_end is None:
                    await self._writes(connection, batch)
                else:
                    await within_lease(self._lease_end, self._cap, connection,
                                       self._writes(connection, batch), "the outcome write")

    async def _writes(self, connection: Any, batch: list[Outcome]) -> None:
        until = time.monotonic() + WRITES_PER_STEP
        while True:
            rows = await self._store(connection, batch)
            self._on_written(batch, rows)
            del self._pending[: len(batch)]
            if self._on_lock is not None:
                self._on_lock(WRITING, False)
            if not self._pending or time.monotonic() >= until:
                return
            batch = self._take()

    async def _store(self, connection: Any, batch: list[Outcome]) -> list[dict[str, Any]]:
        try:
            return await _complete(connection, batch, self._writers)
        except psycopg.Error as exc:
            if not is_unstorable(exc):
                raise
            if len(batch) == 1:
                return await self._write_failure(connection, batch[0], exc)
            # Something in the batch cannot be stored: write each half on its own, down to
            # the offending outcomes, each replaced by a failure; the others are stored.
            # Each statement is its own transaction (autocommit): the failed one wrote nothing.
            middle = len(batch) // 2
            return [*await self._store(connection, batch[:middle]),
                    *await self._store(connection, batch[middle:])]

    async def _write_failure(self, connection: Any, outcome: Outcome,
                             exc: Exception) -> list[dict[str, Any]]:
        """Fail the job of ``outcome``, which Postgres refused with ``exc``, at once: the
        same outcome would be refused again on every attempt."""
        return await _complete(connection, [_failure(outcome, exc, self._redact)],
                               self._writers)

    async def close(self, timeout: float | None = None) -> bool:
        """Stop after writing what is pending; returns False if that did not finish in time."""
        self._closing = True
        self._arrived.set()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def wait_idle(self) -> None:
        """Wait until every submitted outcome is written."""
        await self._idle.wait()
