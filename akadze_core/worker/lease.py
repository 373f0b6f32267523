"""The worker's lease: its registration, its heartbeat, its health, and the guard every
database step of the worker goes through.

A worker holds its jobs as long as its heartbeat is younger than its TTL; past that, other
workers rescue them. So no step may outlive the lease, a transient error makes the worker
unhealthy (no claims or maintenance) until a heartbeat succeeds, and a worker whose
heartbeat fails for longer than the TTL stops (exit status 1) rather than run jobs that
may be re-run elsewhere. The health file's mtime is the last good heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg_pool

from ..store import database
from ..store.dberrors import (
    fatal_message,
    is_lock_timeout,
    is_prepared_statement_lost,
    is_transient,
)
from ..store.deadlines import within, within_lease
from ..store.listener import first_of
from .signals import Signals

if TYPE_CHECKING:
    from ..app import App

logger = logging.getLogger("akadze.worker")

#: Seconds a step waits for an answer while the heartbeats show the server alive (at least
#: heartbeat_ttl). A slow answer is not an outage: a claim that waits on a busy server is
#: waited for, and the worker goes on claiming. Only a connection that fails, or a lease that
#: runs out because the heartbeats get no answer either, makes it stop claiming and back off.
#: This bounds the rest: one connection gone silent alone, or a statement that never ends.
SLOW_ANSWER_CAP = 60.0

#: The queues and their slots a worker registers with.
Registration = Callable[[], tuple[list[str], list[int]]]


class Lease:
    """One worker's lease on its jobs. ``open`` hands it the pool and what to do after a
    good heartbeat (``beaten``) and after a connection error (``lost``)."""

    def __init__(self, app: App, signals: Signals, *, name: str, heartbeat_interval: float,
                 heartbeat_ttl: float, lock_timeout: float, health_file: Path | None,
                 control_pending: Callable[[], None]) -> None:
        self._app = app
        self._signals = signals
        self.name = name
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_ttl = heartbeat_ttl
        self.lock_timeout = lock_timeout
        self.health_file = health_file
        self._control_pending = control_pending
        #: This worker's id in akadze.workers (None until registered; a new one after
        #: another worker declared it dead).
        self.worker_id: int | None = None
        #: Set while claims and maintenance may run: cleared by a transient database
        #: error, set again by the next heartbeat that succeeds.
        self.health = asyncio.Event()
        #: Claims, the orphans check and a new registration exclude each other: a claim in
        #: flight has jobs the database gives this worker that it does not list yet.
        self.claim_lock = asyncio.Lock()
        # Asks the heartbeat service to look again at next_beat (moved earlier).
        self._beat_soon = asyncio.Event()
        # Transient errors so far: a heartbeat that overlapped one does not restore health.
        self._errors = 0
        # The steps whose last statement gave up on a lock: said once when the first one
        # does, and once more when one of them gets through.
        self._locked: set[str] = set()
        self._last_ok = 0.0
        self._failures = 0
        self.next_beat = 0.0
        self._pool: psycopg_pool.AsyncConnectionPool | None = None
        # The connections kept between two calls of a step that runs back to back
        # (``connection(keep=...)``), by step.
        self._kept: dict[str, psycopg.AsyncConnection] = {}
        self._registration: Registration = lambda: ([], [])
        self._beaten: Callable[[], None] = lambda: None
        self._lost: Callable[[], None] = lambda: None

    # --- registration -----------------------------------------------------------------------

    async def register(self, connection: psycopg.AsyncConnection,
                       registration: Registration) -> int:
        """Register this worker (its queues and slots); returns and keeps its id."""
        self._registration = registration
        queues, slots = registration()
        row = await database.fetch_one_async(
            connection, "worker_register", name=self.name, hostname=socket.gethostname(),
            pid=os.getpid(), queues=queues, heartbeat_ttl=self.heartbeat_ttl, slots=slots)
        assert row is not None
        self.worker_id = int(row["id"])
        return self.worker_id

    async def hand_back(self, fences: list[tuple[int, int, int | None]],
                        timeout: float) -> bool:
        """Return the jobs of ``fences`` to the queue without spending an attempt (at a
        stop); False when that failed (they are rescued once the lease runs out)."""
        if not fences:
            return True
        try:
            async with self.connection(timeout) as connection:
                with database.lock_timeout(min(timeout, self.lock_timeout)):
                    rows = await within(timeout, connection,
                                        database.return_many(connection, fences),
                                        "the hand-back")
        except Exception as exc:
            logger.warning("returning %d jobs failed: %s", len(fences), type(exc).__name__)
            return False
        logger.info("returned %d unfinished jobs to the queue without spending an attempt",
                    len(rows))
        return True

    async def unregister(self, timeout: float) -> None:
        """Leave akadze.workers (at a clean stop): the lease ends."""
        try:
            async with self.connection(timeout) as connection:
                with database.lock_timeout(min(timeout, self.lock_timeout)):
                    await within(timeout, connection,
                                 database.unregister_worker(connection, self.worker_id),
                                 "unregistering")
        except Exception as exc:
            logger.warning("unregistering failed: %s", type(exc).__name__)

    def open(self, pool: psycopg_pool.AsyncConnectionPool, *, beaten: Callable[[], None],
             lost: Callable[[], None]) -> None:
        """Start the lease (the registration just made counts as a heartbeat) on ``pool``."""
        self._pool = pool
        self._beaten = beaten
        self._lost = lost
        self.health.set()
        self._last_ok = time.monotonic()
        self._failures = 0
        self.next_beat = time.monotonic() + self.heartbeat_interval

    # --- clocks -----------------------------------------------------------------------------

    def left(self) -> float:
        """Seconds until the last good heartbeat is older than the TTL (at least 0.1 s, so
        a call made at the end of the lease still gets a chance to answer)."""
        return max(0.1, self._last_ok + self.heartbeat_ttl - time.monotonic())

    def end(self) -> float:
        """The ``time.monotonic()`` at which the last good heartbeat is older than the TTL."""
        return self._last_ok + self.heartbeat_ttl

    def answer_cap(self) -> float:
        """How long a step waits for an answer while the lease holds (SLOW_ANSWER_CAP)."""
        return max(SLOW_ANSWER_CAP, self.heartbeat_ttl)

    def connection_timeout(self) -> float:
        """How long a step may wait for a pooled connection: at most 5 s, and never much
        past the heartbeat TTL, so a worker that lost the database notices in time."""
        return min(5.0, self.left())

    def backoff(self, failures: int) -> float:
        """The wait before retry number ``failures`` (jittered, at most an interval)."""
        return min(self.heartbeat_interval, 0.1 * 2 ** failures) * random.uniform(0.5, 1.0)

    # --- connections and the guard ----------------------------------------------------------

    @contextlib.asynccontextmanager
    async def connection(self, timeout: float | None = None, *, keep: str | None = None
                         ) -> AsyncIterator[psycopg.AsyncConnection]:
        """A connection of the worker's pool, as ``pool.connection()`` gives, but never one
        found dead (``found_dead``): a restart or ``pg_terminate_backend`` kills every idle
        pooled connection at once, and taking them one by one made each step in turn fail
        (heartbeats past the TTL on a large pool). Nothing was sent on a dead one, so
        replacing it changes nothing else; but it says the connections were cut, so the
        orphan check runs as after any connection error (a claim in flight on another one
        may have committed and lost its answer).

        ``keep`` names a step that runs back to back (the claims, the outcome writes): the
        connection it ended well with is kept for its next call instead of going back to
        the pool, which hands out the connection idle the longest. Each step then stays on
        one backend, its function and plans compiled and its caches warm, where taking
        turns over the pool moved both steps across every backend (drains of no-ops ~10 %
        slower). Kept connections go back to the pool at each heartbeat
        (``release_kept``), so the pool still ages and shrinks them, and are only kept
        while the pool has room for two more steps at once (the heartbeat's among them).
        """
        pool = self._pool
        assert pool is not None
        dead = 0

        def found() -> None:
            nonlocal dead
            dead += 1

        connection = self._kept.pop(keep, None) if keep is not None else None
        if connection is not None and not self._app.connections.usable(connection):
            found()
            await connection.close()
            await pool.putconn(connection)
            connection = None
        if connection is None:
            connection = await self._app.connections.live_pooled_async(pool, timeout, found)
        if dead:
            logger.warning("replaced %d dead connections of the pool (server restart or "
                           "terminated backends)", dead)
            self._lost()
        ended_well = False
        try:
            async with connection:  # what pool.connection() does: commit or roll back
                yield connection
            ended_well = True
        except psycopg.Error as exc:
            # Behind a transaction pooler: the statement ran nothing; every step and write
            # retries a transient error, and the retry goes unprepared.
            if is_prepared_statement_lost(exc):
                self._app.connections.stop_preparing()
                connection.prepare_threshold = None
            raise
        finally:
            if ended_well and keep is not None and keep not in self._kept \
                    and self._keepable(pool, connection):
                self._kept[keep] = connection
            else:
                await pool.putconn(connection)

    def _keepable(self, pool: psycopg_pool.AsyncConnectionPool,
                  connection: psycopg.AsyncConnection) -> bool:
        # Never one in a transaction or broken (the pool's putconn sorts those out), nor
        # past what leaves the pool room for two steps more at once.
        return (not pool.closed and not connection.closed and not connection.broken
                and connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                and len(self._kept) + 1 <= pool.max_size - 2)

    async def release_kept(self) -> None:
        """Give the connections kept between a step's calls back to the pool (at each
        heartbeat, and before the pool closes)."""
        pool = self._pool
        kept, self._kept = self._kept, {}
        for connection in kept.values():
            assert pool is not None
            await pool.putconn(connection)

    async def guard(self, step: Callable[[psycopg.AsyncConnection], Awaitable[Any]],
                    what: str, *, keep: bool = False) -> bool:
        """Run one database step; transient errors make the worker unhealthy (no claims
        until a heartbeat succeeds), other errors stop it with a clear message. ``keep``:
        the step runs back to back, on the connection it kept (``connection(keep=what)``)."""
        try:
            async with self.connection(self.connection_timeout(),
                                       keep=what if keep else None) as connection:
                # No step outlives the lease: past it the jobs may be rescued elsewhere, and
                # a step hung on a silent network (a partition) must not keep the worker
                # from noticing that and stopping (the heartbeat's check runs after it).
                # But the lease is read again when reached: a slow answer while heartbeats
                # get through is a busy server, not an outage, and is waited for (up to
                # SLOW_ANSWER_CAP) rather than abandoned, which stopped claims until the
                # next heartbeat and the orphan check.
                with database.lock_timeout(self.lock_timeout):
                    await within_lease(self.end, self.answer_cap(), connection,
                                       step(connection), what)
        except Exception as exc:
            if is_lock_timeout(exc):
                # Not a connection problem: the statement gave up on a lock and changed
                # nothing, and the connection is fine, so health and orphans stay as they
                # are. The step is simply retried when next due (a claim, at the next
                # round), so at most one statement per step waits on the lock.
                self.lock_seen(what, True)
                return False
            if not is_transient(exc):
                message = self._app.redact(fatal_message(exc))
                logger.error("%s failed: %s", what, message)
                self._signals.fail(message)
                return False
            logger.warning("%s failed (%s): no claims until a heartbeat succeeds", what,
                           self._app.redact(" ".join(str(exc).split()) or type(exc).__name__))
            self._errors += 1
            self.health.clear()
            self._lost()
            self.next_beat = min(self.next_beat,
                                 time.monotonic() + self.backoff(self._failures + 1))
            self._beat_soon.set()
            return False
        self.lock_seen(what, False)
        return True

    def lock_seen(self, what: str, locked: bool) -> None:
        """``what`` gave up on a lock (``locked``) or got through: one line when the first
        step meets a lock, one when one of them gets through, none per retry. One getting
        through ends the episode for all: a service due again only in a minute (prune)
        must not keep it open."""
        if locked:
            if not self._locked:
                table = "akadze.workers" if what == "heartbeat" else "akadze.jobs"
                logger.warning("%s is locked by another session (LOCK TABLE or a migration?): "
                               "%s and the other steps that need it wait, retrying after "
                               "each %gs lock_timeout until the lock is released", table,
                               what, self.lock_timeout)
            self._locked.add(what)
        elif what in self._locked:
            self._locked.clear()
            logger.warning("the lock is released: %s got through; the other steps go on",
                           what)

    # --- the heartbeat ----------------------------------------------------------------------

    async def run(self, after_beat: Callable[[], Awaitable[None]]) -> None:
        """The heartbeat service: beat every heartbeat_interval (sooner, with backoff, after
        a database error); after a beat that succeeds, ``after_beat()``."""
        stop = self._signals.stop
        while not stop.is_set():
            self._beat_soon.clear()
            wait = self.next_beat - time.monotonic()
            if wait > 0:
                await first_of(stop, self._beat_soon, timeout=wait)
                continue
            await self.heartbeat()
            if self.health.is_set() and not self._signals.fatal and not stop.is_set():
                await after_beat()

    async def beat_while_draining(self) -> None:
        """Keep the lease while the runs under way finish (until a stop now)."""
        while not self._signals.stop_now.is_set():
            await asyncio.sleep(max(0.0, self.next_beat - time.monotonic()))
            await self.heartbeat()

    async def heartbeat(self) -> None:
        """Beat once: health back after a good one; past the TTL without one, stop."""
        errors = self._errors
        await self.release_kept()
        ok = await self.guard(self._beat, "heartbeat")
        now = time.monotonic()
        signals = self._signals
        if ok:
            self._failures = 0
            self._last_ok = now
            if self._errors != errors:
                # Another step failed while this beat was in flight: health comes back
                # only with a beat that succeeds after the error (the guard made it soon).
                return
            self.next_beat = now + self.heartbeat_interval
            self.health.set()
            if self.health_file:
                # Its mtime is the last good heartbeat: a liveness probe can check its age
                # (see migration_guide/deployment.md), not only that it exists.
                with contextlib.suppress(OSError):
                    self.health_file.touch()
            self._beaten()
            signals.wake.set()
            return
        self._failures += 1
        self.next_beat = now + min(self.heartbeat_interval, self.backoff(self._failures))
        if now - self._last_ok > self.heartbeat_ttl and not signals.fatal:
            logger.error("no heartbeat for longer than heartbeat_ttl (%gs): stopping",
                         self.heartbeat_ttl)
            signals.exit_code = 1
            signals.stop.set()
            signals.stop_now.set()
            signals.wake.set()

    async def _beat(self, connection: psycopg.AsyncConnection) -> None:
        row = await database.fetch_one_async(connection, "worker_heartbeat", id=self.worker_id)
        if row is not None and row.get("control_pending"):
            self._control_pending()  # a remote-control request whose NOTIFY was missed
        if row is None:
            # Another worker judged us dead and rescued our jobs. Our runs still in flight
            # will have their outcomes rejected by fencing; we go on under a new identity.
            # Under the claim lock: no claim is in flight under the old id meanwhile.
            old = self.worker_id
            async with self.claim_lock:
                await self.register(connection, self._registration)
            logger.warning("worker id %s was declared dead by another worker and its jobs "
                           "rescued; continuing as worker id %s", old, self.worker_id)


__all__ = ["Lease", "Registration"]
