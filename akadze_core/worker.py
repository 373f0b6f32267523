"""The worker: claims jobs into free slots, runs them, and keeps the fleet healthy.

Collaborators, each small (after River): the claim loop here, ``executor.execute`` that runs
one job and classifies its outcome, the ``Completer`` that writes outcomes in batches, a
listener that turns NOTIFY into wake-ups, and the maintenance round (heartbeat, rescue,
prune, schedules) that every worker runs, so the fleet needs no separate supervisor.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
import os
import random
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg_pool

from . import database, fair_index, lookup
from .completer import Completer
from .dberrors import (
    fatal_message,
    is_lock_timeout,
    is_prepared_statement_lost,
    is_too_many_connections,
    is_transient,
)
from .deadlines import cancel_and_wait, within, within_lease
from .dsn import listen_url
from .errors import AkadzeError, SchemaMissing
from .executor import execute
from .floors import Floors
from .gate import BodyGate
from .listener import listen_for_jobs
from .maintenance import Service, first_of
from .outcomes import (
    RETRY,
    UNSTARTED,
    Outcome,
    error_entry,
    raised,
)
from .panel import ControlPanel
from .processes import ProcessPool, ProcessPoolError
from .retry import default_backoff
from .run_log import Run as _Run
from .run_log import log_outcomes
from .schedules import MIN_CHECK_INTERVAL, SCHEDULE_CHANGE_GRACE, Scheduler
from .threads import ThreadRunner
from .worker_config import Hook, Seconds, WorkerConfig, seconds
from .worker_metrics import WorkerMetrics

if TYPE_CHECKING:
    from .app import App

logger = logging.getLogger("akadze.worker")

Maintenance = Callable[[psycopg.AsyncConnection], Awaitable[None]]

#: Seconds a step waits for an answer while the heartbeats show the server alive (at least
#: heartbeat_ttl). A slow answer is not an outage: a claim that waits on a busy server is
#: waited for, and the worker goes on claiming. Only a connection that fails, or a lease that
#: runs out because the heartbeats get no answer either, makes it stop claiming and back off.
#: This bounds the rest: one connection gone silent alone, or a statement that never ends.
SLOW_ANSWER_CAP = 60.0

AUTOVACUUM_OFF = (
    "autovacuum does not run on akadze.jobs (autovacuum or track_counts is off on the "
    "server, or autovacuum_enabled = false on the table): every claim steps over the index "
    "entries of the jobs finished since the last VACUUM, so claims slow down as jobs finish "
    "(about 10x behind 1,000,000). Turn autovacuum on, or run VACUUM akadze.jobs regularly")


class WorkerError(AkadzeError):
    """The worker stopped on an error that retrying cannot fix; the message says what to do."""


class _FromConfig:
    def __repr__(self) -> str:
        return "<WorkerConfig default>"


# A keyword left at this takes the config's value (WorkerConfig holds the defaults).
_FROM_CONFIG: Any = _FromConfig()


class Worker:
    """Runs the jobs of ``queues`` with ``slots`` concurrent runs per queue.

    ``slots`` is an int for every queue or a mapping ``{queue: slots}``. ``fair=True``
    rotates claims across the task names of a queue so one flooding task cannot starve the
    others (at the cost of a slightly heavier claim query). Every worker also enqueues the
    due runs of the app's schedules, whatever its queues, unless ``schedules=False``.

    The settings (defaults and checks) are a ``WorkerConfig``: pass one as ``config=``, or
    the same names as keywords (they override the config's values).
    """

    def __init__(
        self,
        app: App,
        queues: Iterable[str] = _FROM_CONFIG,
        slots: int | Mapping[str, int] = _FROM_CONFIG,
        heartbeat_interval: Seconds = _FROM_CONFIG,
        heartbeat_ttl: Seconds = _FROM_CONFIG,
        poll_interval: Seconds = _FROM_CONFIG,
        shutdown_timeout: Seconds = _FROM_CONFIG,
        fair: bool = _FROM_CONFIG,
        *,
        config: WorkerConfig | None = None,
        name: str | None = _FROM_CONFIG,
        prune_interval: Seconds = _FROM_CONFIG,
        prune_batch: int = _FROM_CONFIG,
        on_startup: Iterable[Hook] = _FROM_CONFIG,
        on_shutdown: Iterable[Hook] = _FROM_CONFIG,
        health_file: str | os.PathLike[str] | None = _FROM_CONFIG,
        max_pending_outcomes: int | None = _FROM_CONFIG,
        schedules: bool = _FROM_CONFIG,
        max_running: int | None = _FROM_CONFIG,
        process_pool: ProcessPool | None = _FROM_CONFIG,
        outcome_log_level: int = _FROM_CONFIG,
        concurrency: int | None = _FROM_CONFIG,
        lock_timeout: Seconds | None = _FROM_CONFIG,
        max_connections: int | None = _FROM_CONFIG,
    ) -> None:
        given: dict[str, Any] = {
            "queues": queues, "slots": slots, "heartbeat_interval": heartbeat_interval,
            "heartbeat_ttl": heartbeat_ttl, "poll_interval": poll_interval,
            "shutdown_timeout": shutdown_timeout, "fair": fair, "name": name,
            "prune_interval": prune_interval, "prune_batch": prune_batch,
            "on_startup": on_startup, "on_shutdown": on_shutdown, "health_file": health_file,
            "max_pending_outcomes": max_pending_outcomes, "schedules": schedules,
            "max_running": max_running, "process_pool": process_pool,
            "outcome_log_level": outcome_log_level, "concurrency": concurrency,
            "lock_timeout": lock_timeout, "max_connections": max_connections,
        }
        # A keyword overrides the config's value; the config checks the result.
        changes = {key: value for key, value in given.items() if value is not _FROM_CONFIG}
        if config is None:
            config = WorkerConfig(**changes)
        elif changes:
            config = config.replace(**changes)
        #: The settings this worker runs with (checked).
        self.config = config
        self.app = app
        self.queues = list(config.queues)
        self.slots = config.slots_per_queue()
        self.heartbeat_interval = seconds(config.heartbeat_interval)
        self.heartbeat_ttl = seconds(config.heartbeat_ttl)
        self.poll_interval = seconds(config.poll_interval)
        self.shutdown_timeout = seconds(config.shutdown_timeout)
        self.fair = config.fair
        self.name = config.name or f"{socket.gethostname()}:{os.getpid()}"
        self.prune_interval = seconds(config.prune_interval)
        self.prune_batch = config.prune_batch
        self.on_startup = list(config.on_startup)
        self.on_shutdown = list(config.on_shutdown)
        self.health_file = Path(config.health_file) if config.health_file else None
        #: A cap on runs across all queues (Celery's ``-c``), on top of the per-queue slots;
        #: when it binds, queues are served in the order given.
        self.max_running = config.max_running
        #: At most this many bodies run at once (threads; Celery's -c): the runs beyond it
        #: are claimed ahead and wait for one to end (Celery's prefetch). None: every
        #: claimed run starts at once.
        self.concurrency = concurrency = config.concurrency
        #: Run bodies in these child processes (Celery's prefork) instead of this process;
        #: the worker starts and closes it. Slots beyond its processes are claimed ahead
        #: and wait for a free process; while its runs are short the worker may also take
        #: jobs beyond the slots (``ProcessPool.ahead``).
        self.process_pool = config.process_pool
        #: The level of the one line per finished run (the Celery facade, which logs
        #: Celery's own lines, lowers it to DEBUG).
        self.outcome_log_level = config.outcome_log_level
        #: Seconds each statement of the worker may wait for a lock (see WorkerConfig).
        self.lock_timeout = config.lock_timeout_seconds()
        max_pending_outcomes = config.max_pending_outcomes
        schedules = config.schedules
        # Backpressure: stop claiming while this many outcomes wait to be written. Kept near
        # the slot count, so few finished bodies sit 'running' (a crash would re-run them).
        self.max_pending_outcomes = max_pending_outcomes or max(100, 4 * sum(self.slots.values()))
        #: Shared with the startup/shutdown hooks (ARQ's ctx): put your clients here.
        self.context: dict[str, Any] = {}
        #: Extra maintenance run each round while healthy (integrations hook in here).
        self.maintenance: list[Maintenance] = []
        #: Called with (job id, task name) when a claimed job's task is not registered in
        #: this worker, in place of the core's WARNING line (the Celery facade logs Celery's
        #: "Received unregistered task" line here). The job fails with NotRegistered either way.
        self.on_unregistered: Callable[[int, str], None] | None = None
        self._scheduler = Scheduler(app) if schedules else None
        #: Runs started (claimed) since the worker started, by task name (Celery's stats
        #: "total").
        self.accepted: collections.Counter[str] = collections.Counter()
        #: Remote control (``control.broadcast``): the commands this worker answers are
        #: ``control.commands``; integrations add theirs there.
        self.control = ControlPanel(self)
        # The queues the listener wakes us for: changed in place by add_queue/remove_queue.
        self._watched = set(self.queues)
        self.worker_id: int | None = None
        self._running: dict[int, _Run] = {}
        # Running jobs whose terminate request was acted on (signal sent, or warned about).
        self._terminating: set[int] = set()
        # The concurrency gate, where the runs claimed ahead wait (claimed, not started).
        self._bodies = BodyGate(concurrency) if concurrency is not None else None
        self._busy = dict.fromkeys(self.queues, 0)
        # fair=True: the task of each queue's last fair claim, where the rotation goes on.
        self._fair_cursor: dict[str, str | None] = dict.fromkeys(self.queues)
        # Where each queue's next claim starts reading (issue 21; akadze_core/floors.py).
        self._floors = Floors()
        # Runs whose outcome is waiting in the completer, for the one log line per outcome.
        self._finished: dict[tuple[int, int], _Run] = {}
        # asyncio.Event binds to a loop only when first awaited, so these can exist before
        # run() and request_stop() works from any point.
        self._stop = asyncio.Event()
        self._stop_now = asyncio.Event()
        self._wake = asyncio.Event()
        # Set while claims and maintenance may run: cleared by a transient database error,
        # set again by the next heartbeat that succeeds.
        self._health = asyncio.Event()
        # Asks the heartbeat service to look again at _next_heartbeat (moved earlier).
        self._beat_soon = asyncio.Event()
        # Transient errors so far: a heartbeat that overlapped one does not restore health.
        self._errors = 0
        # Claims and the orphans check exclude each other: a claim in flight has jobs the
        # database gives this worker that _running does not list yet.
        self._claim_lock = asyncio.Lock()
        # The steps whose last statement gave up on a lock: the worker says so once, when
        # the first one does, and once more when the last of them gets through.
        self._locked: set[str] = set()
        #: This worker's Prometheus series and /metrics (``metrics_port``), else None.
        self.metrics = WorkerMetrics(
            self, busy=self._busy, connection=self._connection,
            ready=lambda: hasattr(self, "_pool") and not self._pool.closed,
            pending=lambda: self._completer.pending if hasattr(self, "_completer") else 0,
        ) if config.metrics_port is not None else None
        # Claims stopped because max_pending_outcomes outcomes wait to be written: the next
        # written batch wakes the claim loop.
        self._held_back = False

    # --- public control -------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop gracefully; a second call stops at once (running jobs go back to the queue)."""
        if self._stop.is_set():
            logger.warning("second stop request: returning running jobs and exiting now")
            self._stop_now.set()
        else:
            logger.info("stopping: no new claims; waiting up to %gs for %d running jobs",
                        self.shutdown_timeout, len(self._running))
            self._stop.set()
        self._wake.set()

    async def add_queue(self, queue: str, slots: int | None = None) -> bool:
        """Start claiming from ``queue`` too (``slots`` runs at once; default: as many as the
        busiest of the others); False when it already did. The workers table says so at once
        (``list_workers``), and an enqueue on it wakes this worker."""
        if queue in self.queues:
            return False
        self.slots[queue] = slots if slots is not None else max(self.slots.values(), default=1)
        self._busy.setdefault(queue, 0)
        self._fair_cursor.setdefault(queue, None)
        # A new list, not an append: a claim round iterating the old one is not disturbed.
        self.queues = [*self.queues, queue]
        self._watched.add(queue)
        await self._store_queues()
        self._wake.set()
        logger.info("now consuming from queue %s", queue)
        return True

    async def remove_queue(self, queue: str) -> bool:
        """Stop claiming from ``queue``; its runs under way finish. False when it did not
        claim from it."""
        if queue not in self.queues:
            return False
        self.queues = [name for name in self.queues if name != queue]
        self._watched.discard(queue)
        await self._store_queues()
        logger.info("no longer consuming from queue %s", queue)
        return True

    async def _store_queues(self) -> None:
        async def store(connection: psycopg.AsyncConnection) -> None:
            await database.fetch_one_async(connection, "worker_set_queues", id=self.worker_id,
                                           queues=self.queues)

        await self._guard(store, "queues")

    def running(self) -> dict[int, bool]:
        """The jobs this worker holds, by id: True for those whose body runs, False for
        those claimed ahead and waiting for a body slot or a process."""
        return {job_id: not self._waiting(job_id) for job_id in self._running}

    def resize(self, concurrency: int | None = None, *, slots: int | None = None,
               max_running: int | None = None) -> None:
        """Change, while running, how many bodies run at once (``concurrency``: the threads
        of the body gate; not a process pool's processes), the slots of every queue and the
        cap on runs. More start the runs claimed ahead at once; fewer take effect as runs
        end (none is interrupted)."""
        if concurrency is not None:
            if self._bodies is None or concurrency < 1:
                raise ValueError("only a worker with a concurrency limit (threads) can be "
                                 "resized, to at least 1")
            self._bodies.resize(concurrency)
            self.concurrency = concurrency
        if slots is not None:
            self.slots = dict.fromkeys(self.slots, max(1, slots))
        if max_running is not None:
            self.max_running = max(1, max_running)
        self._wake.set()

    def run_sync(self, install_signal_handlers: bool = True) -> int:
        """Run in a new event loop until stopped; returns the exit code (0, or 1)."""

        async def main() -> int:
            if install_signal_handlers:
                loop = asyncio.get_running_loop()
                for signum in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(signum, self.request_stop)
            return await self.run()

        return asyncio.run(main())

    async def run(self) -> int:
        """Run until stopped. Returns 0, or 1 when the database was lost for longer than the
        heartbeat TTL; raises ``WorkerError`` on errors that retrying cannot fix."""
        self._exit_code = 0
        self._fatal: str | None = None
        total_slots = sum(self.slots.values())
        # Twice the slots: a sync body past its timeout keeps its thread until it returns.
        if self.metrics is not None:  # a port already taken stops the worker before it starts
            await self.metrics.serve(self.config.metrics_port or 0, self.config.metrics_address)
        self._threads = ThreadRunner(max_threads=total_slots * 2 + 4)
        started = await self._start(total_slots)
        try:
            if started and await self._ready():
                await self._loop()
        finally:
            await self._shutdown(started)
            if self.metrics is not None:
                await self.metrics.close()
        if self._fatal:
            raise WorkerError(self._fatal)
        if self._exit_code == 1:
            # The last line, for the operator: exiting is the design (seed: a worker that
            # cannot heartbeat stops, since its jobs may be rescued and re-run elsewhere),
            # and coming back is the supervisor's job (see migration_guide/deployment.md).
            logger.error("exiting with status 1: the database was unreachable for longer than "
                         "heartbeat_ttl (%gs), so this worker's jobs may be rescued and re-run "
                         "by other workers; run it under a supervisor that restarts it "
                         "(systemd Restart=always, a container restart policy, Kubernetes): "
                         "once started again it waits for the database", self.heartbeat_ttl)
        return self._exit_code

    # --- start and stop --------------------------------------------------------------------

    async def _start(self, total_slots: int) -> bool:
        url = self.app.database_url
        failures = 0
        fair_index_ready = not self.fair
        while not self._stop.is_set():
            try:
                if not fair_index_ready:
                    # Before registering: a long build must not pass for a silent worker.
                    await fair_index.ensure(url, self._connect_kwargs(), self._stop,
                                            redact=self.app.redact)
                    fair_index_ready = True
                    continue  # to the stop check, then the start proper
                async with await psycopg.AsyncConnection.connect(
                        url, **self._connect_kwargs()) as connection:
                    # Bounded: a server that stops answering mid-start is retried like one
                    # that cannot be reached.
                    with database.lock_timeout(self.lock_timeout):
                        self.worker_id = await within(
                            self.heartbeat_ttl, connection, self._prepare(connection),
                            "the start")
                break
            except Exception as exc:
                if isinstance(exc, SchemaMissing) or not is_transient(exc):
                    self._fatal = self.app.redact(fatal_message(exc))
                    return False
                failures += 1
                delay = self._backoff(failures)
                if is_too_many_connections(exc):
                    logger.warning("the server has no free connections (too many clients "
                                   "already: max_connections is reached); retrying in %.1fs",
                                   delay)
                else:
                    logger.warning("cannot reach the database (%s); retrying in %.1fs",
                                   self.app.redact(" ".join(str(exc).split())
                                                   or type(exc).__name__), delay)
                await self._pause(delay)
        else:
            return False
        pool_size = self.config.pool_size()
        self._pool = psycopg_pool.AsyncConnectionPool(
            # Two at once: a heartbeat need not wait for the pool to grow. It grows when the
            # steps overlap, and a server out of connections only stops it growing: the
            # steps share what it has (a step waits up to 5 s for one, then retries).
            url, min_size=min(2, pool_size), max_size=pool_size, timeout=5,
            kwargs=self._connect_kwargs(), name=f"akadze-worker-{self.worker_id}",
            open=False)
        await self._pool.open(wait=False)
        await self.app.connections.use_async_pool(self._pool)
        self._completer = Completer(self._connection, self._outcomes_written,
                                    lock_timeout=self.lock_timeout, on_lock=self._lock_seen,
                                    lease_end=self._lease_end,
                                    cap=self._answer_cap(), redact=self.app.redact)
        self._completer_task = asyncio.create_task(self._completer.run(), name="completer")
        self._listener_task = asyncio.create_task(
            listen_for_jobs(listen_url(url), self._watched, self._wake.set, self._backoff,
                            self._cancelled, connect_kwargs=self._connect_kwargs(),
                            schedules_changed=self._schedules_changed
                            if self._scheduler is not None else None,
                            control=self.control.heard, terminate=self._terminate,
                            jobs_heard=self._floors.heard, connected=self._floors.set_listening),
            name="listener")
        self._health.set()
        self._last_heartbeat_ok = time.monotonic()
        self._heartbeat_failures = 0
        self._next_heartbeat = time.monotonic() + self.heartbeat_interval
        # Set by any connection error: a claim may have committed and lost its answer.
        # Claims wait until the orphans service has handed such jobs back.
        self._orphans_pending = False
        self._services = self._make_services()
        self._services["rescue"].trigger()
        logger.info("worker %s (id %s) started: queues %s, slots %s%s", self.name,
                    self.worker_id, ",".join(self.queues), total_slots,
                    ", fair" if self.fair else "")
        return True

    async def _ready(self) -> bool:
        """Run the on_startup hooks, then announce readiness (the health file). A failing
        hook stops the worker cleanly with a clear error instead of half-starting it."""
        if self.process_pool is not None:
            try:
                await self.process_pool.start()
            except ProcessPoolError as exc:
                self._fatal = self.app.redact(str(exc))
                return False
        for hook in self.on_startup:
            try:
                await _maybe_await(hook(self.context))
            except Exception as exc:
                logger.exception("on_startup hook failed")
                name = getattr(hook, "__qualname__", repr(hook))
                self._fatal = self.app.redact(f"on_startup hook {name} failed: {exc!r}")
                return False
        if self.health_file:
            self.health_file.touch()
        return True

    def _connect_kwargs(self) -> dict[str, Any]:
        # The app's (keepalives, tcp_user_timeout), with a shorter connect timeout: a worker
        # that cannot connect retries with backoff, and must notice a lost lease in time.
        return {**self.app.connection_kwargs, "connect_timeout": 5}

    async def _prepare(self, connection: psycopg.AsyncConnection) -> int:
        """Check the schema (and autovacuum), then register; returns the worker id."""
        await database.check_schema_async(connection)
        # The key of derived task ids, read here once: the process children get it with
        # each job, and the app needs no query of its own for it.
        key = await lookup.task_id_key_async(connection)
        self.app.use_task_id_key(key)
        if self.process_pool is not None:
            self.process_pool.task_id_key = key
        if await database.autovacuum_runs(connection) is False:
            logger.warning(AUTOVACUUM_OFF)
        return await self._register(connection)

    async def _register(self, connection: psycopg.AsyncConnection) -> int:
        row = await database.fetch_one_async(
            connection, "worker_register", name=self.name, hostname=socket.gethostname(),
            pid=os.getpid(), queues=self.queues, heartbeat_ttl=self.heartbeat_ttl,
            slots=[self.slots[queue] for queue in self.queues])
        assert row is not None
        return int(row["id"])

    async def _shutdown(self, started: bool) -> None:
        if started:
            await self._drain()
            for hook in self.on_shutdown:
                try:
                    await _maybe_await(hook(self.context))
                except Exception:
                    logger.exception("on_shutdown hook failed")
            if self.process_pool is not None:
                await self.process_pool.close()
            await cancel_and_wait(self._listener_task)
            self.app.connections.forget_async_pool(self._pool)
            # After the heartbeat was lost, connection attempts may hang in a partition
            # until their connect_timeout: do not wait for them.
            await self._pool.close(timeout=5.0 if self._exit_code == 0 else 1.0)
        if self.health_file:
            self.health_file.unlink(missing_ok=True)
        # A sync task's thread cannot be stopped; do not wait for it.
        self._threads.close()
        if started:  # one that never started says why instead (the fatal line)
            logger.info("worker %s stopped", self.name)

    async def _drain(self) -> None:
        """Seed 000's stop: wait up to shutdown_timeout, then return what is left unspent."""
        # Jobs claimed ahead for the process pool and not started yet go back at once, as
        # Celery's warm shutdown releases its reserved (prefetched) tasks.
        held_back = [run for run in self._running.values() if self._waiting(run.job_id)]
        for run in held_back:
            run.future.cancel()
        await asyncio.gather(*(run.future for run in held_back), return_exceptions=True)
        if self._running and not self._stop_now.is_set():
            all_done = asyncio.ensure_future(
                asyncio.wait([run.future for run in self._running.values()]))
            stop_now = asyncio.ensure_future(self._stop_now.wait())
            # Keep the lease while waiting: a shutdown_timeout longer than the TTL must not
            # let another worker rescue (and run again) a job that is still finishing here.
            beating = asyncio.create_task(self._beat_while_draining(), name="drain-heartbeat")
            await asyncio.wait({all_done, stop_now}, timeout=self.shutdown_timeout,
                               return_when=asyncio.FIRST_COMPLETED)
            for waiter in (all_done, stop_now, beating):
                waiter.cancel()
            await asyncio.gather(beating, return_exceptions=True)
        unfinished = list(self._running.values())
        # Once: a body's own cleanup after its cancel may take its time (cancel_and_wait
        # would cancel that cleanup too).
        for run in unfinished:
            run.future.cancel()
        await asyncio.gather(*(run.future for run in unfinished), return_exceptions=True)
        # After the heartbeat was lost the database is likely gone: try briefly, then leave
        # the jobs to the rescue, which other workers may have started already.
        timeout = 5.0 if self._exit_code == 0 else min(5.0, max(1.0, self.heartbeat_interval))
        flushed = await self._completer.close(timeout=timeout)
        await cancel_and_wait(self._completer_task)
        returned = await self._return_jobs(
            [run.fence for run in held_back + unfinished], timeout)
        if flushed and returned:
            await self._unregister(timeout)
        else:
            logger.warning("could not hand back every job: they are rescued once this "
                           "worker's heartbeat is older than %gs", self.heartbeat_ttl)

    async def _beat_while_draining(self) -> None:
        while not self._stop_now.is_set():
            await asyncio.sleep(max(0.0, self._next_heartbeat - time.monotonic()))
            await self._heartbeat()

    async def _return_jobs(self, runs: list[tuple[int, int, int | None]],
                           timeout: float) -> bool:
        if not runs:
            return True
        try:
            async with self._connection(timeout) as connection:
                with database.lock_timeout(min(timeout, self.lock_timeout)):
                    rows = await within(timeout, connection,
                                        database.return_many(connection, runs), "the hand-back")
        except Exception as exc:
            logger.warning("returning %d jobs failed: %s", len(runs), type(exc).__name__)
            return False
        logger.info("returned %d unfinished jobs to the queue without spending an attempt",
                    len(rows))
        return True

    async def _unregister(self, timeout: float) -> None:
        try:
            async with self._connection(timeout) as connection:
                with database.lock_timeout(min(timeout, self.lock_timeout)):
                    await within(timeout, connection,
                                 database.unregister_worker(connection, self.worker_id),
                                 "unregistering")
        except Exception as exc:
            logger.warning("unregistering failed: %s", type(exc).__name__)

    # --- the loop ----------------------------------------------------------------------------

    @property
    def _healthy(self) -> bool:
        return self._health.is_set()

    def _make_services(self) -> dict[str, Service]:
        """The maintenance duties, each on its own clock (see ``maintenance``)."""
        now = time.monotonic()
        services = {
            # After every heartbeat that succeeds.
            "rescue": Service("rescue", self._rescue),
            # After a database error, once healthy again; claims wait for it.
            "orphan check": Service("orphan check", self._orphan_check),
            # About once a minute, the first at a random point so workers spread out.
            "prune": Service("prune", self._prune,
                             first_due=now + random.uniform(0, self.prune_interval),
                             interval=lambda: self.prune_interval * random.uniform(0.9, 1.1)),
        }
        if self._scheduler is not None:
            # At most about once a second; the step moves it to the next tick.
            services["schedules"] = Service(
                "schedules", self._enqueue_schedules, first_due=now,
                interval=lambda: MIN_CHECK_INTERVAL, enabled=self._scheduling)
        return services

    async def _loop(self) -> None:
        tasks = [asyncio.create_task(self._heartbeats(), name="heartbeat"),
                 asyncio.create_task(self.control.run(self._guard, self._health, self._stop),
                                     name="control")]
        tasks += [asyncio.create_task(service.run(self._guard, self._health, self._stop),
                                      name=name) for name, service in self._services.items()]
        for task in tasks:
            task.add_done_callback(self._service_ended)
        try:
            while not self._stop.is_set():
                self._wake.clear()
                if self._completer_task.done():
                    self._completer_failed()
                    return
                await self._round()
                if self._fatal or self._stop.is_set():
                    return
                await self._sleep()
        finally:
            # A step in flight (a prune waiting on a lock) is abandoned: its statement is
            # atomic, and stopping must not wait for it.
            for task in tasks:
                task.remove_done_callback(self._service_ended)
            await cancel_and_wait(*tasks)

    def _service_ended(self, task: asyncio.Task[None]) -> None:
        # Steps run in the guard, so only a bug in akadze ends a service early: stop rather
        # than carry on without, say, heartbeats.
        if task.cancelled() or self._stop.is_set():
            return
        exc = task.exception()
        logger.error("the %s service stopped: %r", task.get_name(), exc)
        self._fatal = self.app.redact(f"the {task.get_name()} service stopped: {exc!r}")
        self._stop.set()
        self._wake.set()

    async def _round(self) -> None:
        # Maintenance runs in its services; this loop only claims, and only while healthy
        # and once jobs a lost claim answer left behind are handed back.
        if not self._healthy or self._fatal or self._orphans_pending:
            return
        for hook in self.maintenance:
            await self._guard(hook, "maintenance")
        await self._claim()

    async def _sleep(self) -> None:
        free = any(self._free(queue) > 0 for queue in self.queues)
        timeout = random.uniform(self.poll_interval / 2, self.poll_interval) if free \
            else self.heartbeat_interval
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    async def _heartbeats(self) -> None:
        """The heartbeat service: beat every heartbeat_interval (sooner, with backoff, after
        a database error); after a beat that succeeds, check the runs claimed ahead."""
        while not self._stop.is_set():
            self._beat_soon.clear()
            wait = self._next_heartbeat - time.monotonic()
            if wait > 0:
                await first_of(self._stop, self._beat_soon, timeout=wait)
                continue
            await self._heartbeat()
            if self._healthy and not self._fatal and not self._stop.is_set():
                await self._check_waiting()

    @contextlib.asynccontextmanager
    async def _connection(self, timeout: float | None = None
                          ) -> AsyncIterator[psycopg.AsyncConnection]:
        """A connection of the worker's pool, as ``pool.connection()`` gives, but never one
        found dead (``found_dead``): a restart or ``pg_terminate_backend`` kills every idle
        pooled connection at once, and taking them one by one made each step in turn fail
        (heartbeats past the TTL on a large pool). Nothing was sent on a dead one, so
        replacing it changes nothing else; but it says the connections were cut, so the
        orphan check runs as after any connection error (a claim in flight on another one
        may have committed and lost its answer)."""
        dead = 0

        def found() -> None:
            nonlocal dead
            dead += 1

        connection = await self.app.connections.live_pooled_async(self._pool, timeout, found)
        if dead:
            logger.warning("replaced %d dead connections of the pool (server restart or "
                           "terminated backends)", dead)
            self._orphans_pending = True
            self._services["orphan check"].trigger()
        try:
            async with connection:  # what pool.connection() does: commit or roll back
                yield connection
        except psycopg.Error as exc:
            # Behind a transaction pooler: the statement ran nothing; every step and write
            # retries a transient error, and the retry goes unprepared.
            if is_prepared_statement_lost(exc):
                self.app.connections.stop_preparing()
                connection.prepare_threshold = None
            raise
        finally:
            await self._pool.putconn(connection)

    async def _guard(self, step: Callable[[psycopg.AsyncConnection], Awaitable[Any]],
                     what: str) -> bool:
        """Run one database step; transient errors make the worker unhealthy (no claims
        until a heartbeat succeeds), other errors stop it with a clear message."""
        try:
            async with self._connection(self._connection_timeout()) as connection:
                # No step outlives the lease: past it the jobs may be rescued elsewhere, and
                # a step hung on a silent network (a partition) must not keep the worker
                # from noticing that and stopping (the heartbeat's check runs after it).
                # But the lease is read again when reached: a slow answer while heartbeats
                # get through is a busy server, not an outage, and is waited for (up to
                # SLOW_ANSWER_CAP) rather than abandoned, which stopped claims until the
                # next heartbeat and the orphan check.
                with database.lock_timeout(self.lock_timeout):
                    await within_lease(self._lease_end, self._answer_cap(), connection,
                                       step(connection), what)
        except Exception as exc:
            if is_lock_timeout(exc):
                # Not a connection problem: the statement gave up on a lock and changed
                # nothing, and the connection is fine, so health and orphans stay as they
                # are. The step is simply retried when next due (a claim, at the next
                # round), so at most one statement per step waits on the lock.
                self._lock_seen(what, True)
                return False
            if not is_transient(exc):
                self._fatal = self.app.redact(fatal_message(exc))
                logger.error("%s failed: %s", what, self._fatal)
                self._stop.set()
                self._wake.set()
                return False
            logger.warning("%s failed (%s): no claims until a heartbeat succeeds", what,
                           self.app.redact(" ".join(str(exc).split()) or type(exc).__name__))
            self._errors += 1
            self._health.clear()
            self._orphans_pending = True
            self._services["orphan check"].trigger()
            self._next_heartbeat = min(self._next_heartbeat, time.monotonic()
                                       + self._backoff(self._heartbeat_failures + 1))
            self._beat_soon.set()
            return False
        self._lock_seen(what, False)
        return True

    def _lock_seen(self, what: str, locked: bool) -> None:
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

    async def _heartbeat(self) -> None:
        errors = self._errors
        ok = await self._guard(self._beat, "heartbeat")
        now = time.monotonic()
        if ok:
            self._heartbeat_failures = 0
            self._last_heartbeat_ok = now
            if self._errors != errors:
                # Another step failed while this beat was in flight: health comes back
                # only with a beat that succeeds after the error (the guard made it soon).
                return
            self._next_heartbeat = now + self.heartbeat_interval
            self._health.set()
            if self.health_file:
                # Its mtime is the last good heartbeat: a liveness probe can check its age
                # (see migration_guide/deployment.md), not only that it exists.
                with contextlib.suppress(OSError):
                    self.health_file.touch()
            self._services["rescue"].trigger()
            self._wake.set()
            return
        self._heartbeat_failures += 1
        self._next_heartbeat = now + min(self.heartbeat_interval,
                                         self._backoff(self._heartbeat_failures))
        if now - self._last_heartbeat_ok > self.heartbeat_ttl and not self._fatal:
            logger.error("no heartbeat for longer than heartbeat_ttl (%gs): stopping",
                         self.heartbeat_ttl)
            self._exit_code = 1
            self._stop.set()
            self._stop_now.set()
            self._wake.set()

    async def _beat(self, connection: psycopg.AsyncConnection) -> None:
        row = await database.fetch_one_async(connection, "worker_heartbeat", id=self.worker_id)
        if row is not None and row.get("control_pending"):
            self.control.poke()  # a remote-control request whose NOTIFY was missed
        if row is None:
            # Another worker judged us dead and rescued our jobs. Our runs still in flight
            # will have their outcomes rejected by fencing; we go on under a new identity.
            # Under the claim lock: no claim is in flight under the old id meanwhile.
            old = self.worker_id
            async with self._claim_lock:
                self.worker_id = await self._register(connection)
            logger.warning("worker id %s was declared dead by another worker and its jobs "
                           "rescued; continuing as worker id %s", old, self.worker_id)

    async def _rescue(self, connection: psycopg.AsyncConnection) -> None:
        rows = await database.rescue_jobs(connection)
        for row in rows:
            logger.warning("rescued job %s from a dead worker: now %s (%s)", row["id"],
                           row["state"], _rescued(row))

    async def _orphan_check(self, connection: psycopg.AsyncConnection) -> None:
        async with self._claim_lock:
            await self._return_orphans(connection)
        self._wake.set()  # claims waited for this

    async def _return_orphans(self, connection: psycopg.AsyncConnection) -> None:
        """Hand back jobs the database says this worker runs but it never heard of: the
        claim committed and its answer was lost with the connection. No rescue would touch
        them while this worker heartbeats. Jobs whose outcome is still queued for writing
        are known too. The caller holds the claim lock, so no claim is in flight meanwhile."""
        assert self.worker_id is not None
        known = set(self._running) | self._completer.pending_jobs()
        rows = await database.return_orphans(connection, self.worker_id, sorted(known))
        self._orphans_pending = False
        for row in rows:
            logger.warning("job %s was claimed by a query whose answer was lost: returned to "
                           "the queue without spending an attempt", row["id"])

    async def _prune(self, connection: psycopg.AsyncConnection) -> None:
        await self.control.prune(connection)
        for _ in range(10):  # bounded, so a huge backlog of old rows cannot stall the round
            pruned = await database.prune_jobs(
                connection, finished_retention=self.app.succeeded_retention,
                failed_retention=self.app.failed_retention, limit=self.prune_batch)
            if pruned < self.prune_batch:
                break

    def _scheduling(self) -> bool:
        # Runtime schedules may appear at any time: a scheduling worker always looks (a
        # clock read and, every RUNTIME_POLL_INTERVAL, one aggregate when there are none).
        return self._scheduler is not None

    def _schedules_changed(self, name: str) -> None:
        """A runtime schedule changed (the listener heard it): take it in at once."""
        if self._scheduler is None:
            return
        self._scheduler.changed(name)
        service = getattr(self, "_services", {}).get("schedules")
        if service is not None:
            # A few milliseconds' grace: a burst of changes (a bulk add) makes one pass.
            service.trigger(SCHEDULE_CHANGE_GRACE)

    async def _enqueue_schedules(self, connection: psycopg.AsyncConnection) -> None:
        assert self._scheduler is not None
        # The scheduler says when its next tick is due (measured on the database clock, so
        # only a duration is carried over to the monotonic clock here).
        wait = await self._scheduler.enqueue_due(connection)
        if self._scheduler.pending:  # heard of a change during the pass
            wait = SCHEDULE_CHANGE_GRACE
        self._services["schedules"].next_due = time.monotonic() + wait

    async def _claim(self) -> None:
        async with self._claim_lock:
            await self._claim_queues()

    async def _claim_queues(self) -> None:
        for queue in self.queues:
            while not self._stop.is_set() and self._healthy:
                free = self._free(queue)
                if free <= 0:
                    break
                if self._completer.pending >= self.max_pending_outcomes:
                    # Backpressure. The slots may all be free already (short runs finish
                    # before their outcomes are written), so no slot release will wake the
                    # loop: the completer's next written batch does (_outcomes_written).
                    self._held_back = True
                    break
                rows: list[dict[str, Any]] = []

                async def claim(connection: psycopg.AsyncConnection, limit: int = free,
                                queue: str = queue, rows: list[dict[str, Any]] = rows) -> None:
                    assert self.worker_id is not None
                    rows.extend(await database.claim_jobs(
                        connection, queue, limit, self.worker_id, self.fair,
                        after_task=self._fair_cursor[queue], floors=self._floors))

                if not await self._guard(claim, "claim"):
                    return
                if rows:
                    self._fair_cursor[queue] = rows[-1]["task"]
                for row in rows:
                    if row["state"] == "cancelled":
                        logger.info("job %s %s cancelled before it started", row["id"],
                                    row["task"])
                    else:
                        self._start_run(row)
                if len(rows) < free:
                    break  # the queue is drained; a full claim means claim again at once

    def _free(self, queue: str) -> int:
        # A process pool of short runs may take jobs ahead of its slots (ProcessPool.ahead).
        ahead = self.process_pool.ahead if self.process_pool is not None else 0
        free = self.slots[queue] + ahead - self._busy[queue]
        if self.max_running is not None:
            free = min(free, self.max_running + ahead - len(self._running))
        return free

    def _waiting(self, job_id: int) -> bool:
        """Whether the run was claimed ahead and has not started (no body, no attempt)."""
        if self.process_pool is not None:
            return self.process_pool.waiting(job_id)
        return self._bodies is not None and self._bodies.waiting(job_id)

    # --- cancel and expiry of runs claimed ahead ---------------------------------------------
    # Seed 003: a job cancelled or expired before it starts ends cancelled without running.
    # The claim checks that for the runs that start at once; a run claimed ahead (waiting
    # for a body slot or a process) is dropped when the worker hears of its cancel (the
    # akadze_cancel NOTIFY, checked again every heartbeat) or its expiry (a timer), and its
    # 'unstarted' outcome goes through the completer: the database judges cancelled (its
    # own clock for the expiry) or queued again. No statement per job: runs that never wait,
    # and waits nobody cancels, cost nothing.

    def _drop(self, job_id: int, why: str) -> bool:
        """Drop the run of ``job_id`` if it still waits to start: it ends unstarted."""
        if self.process_pool is not None:
            dropped = self.process_pool.drop(job_id)
        else:
            dropped = self._bodies is not None and self._bodies.drop(job_id)
        if dropped:
            run = self._running.get(job_id)
            logger.info("job %s %s %s while claimed ahead: it is not started", job_id,
                        run.task if run else "", why)
        return dropped

    def _cancelled(self, job_id: int) -> None:
        """A cancel of running job ``job_id`` was requested (NOTIFY): any worker hears it;
        only the one holding it claimed ahead does something."""
        if job_id in self._running and not self._drop(job_id, "was cancelled"):
            # Started, or claimed so recently that its run's task has not handed it to the
            # pool or the body slots yet: once more on the next loop turn, for the latter.
            asyncio.get_running_loop().call_soon(self._cancelled_handed, job_id)

    def _cancelled_handed(self, job_id: int) -> None:
        """``_cancelled``'s second try, after the run's task has started."""
        if job_id in self._running:
            self._drop(job_id, "was cancelled")

    def _terminate(self, job_id: int, signum: int) -> None:
        """A cancel with terminate of running job ``job_id`` (NOTIFY, or the heartbeat's
        check): a process pool sends ``signum`` to the process running its body. Bodies run
        in this process (threads, the event loop) cannot be stopped: there it is a cancel
        request like any other."""
        if job_id not in self._running:
            return
        if self.process_pool is not None:
            if job_id not in self._terminating:
                if self.process_pool.terminate(job_id, signum):
                    self._terminating.add(job_id)
                else:
                    # Claimed, but its run's task has not handed it to the pool yet (the
                    # request came in between): again once it has. Not marked acted on, so
                    # the heartbeat's check still covers it if that finds nothing either.
                    asyncio.get_running_loop().call_soon(self._terminate_handed, job_id,
                                                         signum)
        elif not self._drop(job_id, "was cancelled") and job_id not in self._terminating:
            # Running, or not handed to the body slots yet: told apart on the next turn.
            asyncio.get_running_loop().call_soon(self._terminate_handed, job_id, signum)

    def _terminate_handed(self, job_id: int, signum: int) -> None:
        """``_terminate``'s second try, after the run's task has started."""
        if job_id not in self._running or job_id in self._terminating:
            return
        if self.process_pool is not None:
            if self.process_pool.terminate(job_id, signum):
                self._terminating.add(job_id)
        elif not self._drop(job_id, "was cancelled"):
            self._terminating.add(job_id)
            logger.warning("job %s: terminate requested, but this worker runs bodies in "
                           "threads, which cannot be stopped: it runs on (it ends "
                           "cancelled if it raises)", job_id)

    def _expired(self, job_id: int) -> None:
        run = self._running.get(job_id)
        if run is not None:
            run.timer = None
            self._drop(job_id, "expired")

    async def _check_waiting(self) -> None:
        """Every heartbeat, while runs wait: one statement finds those cancelled or expired
        meanwhile, in case a notification was lost with the LISTEN connection."""
        waiting = [run.fence for run in self._running.values()
                   if self._waiting(run.job_id)]
        # A process pool's running bodies: terminate requests missed the same way.
        started = [run.fence for run in self._running.values()
                   if self.process_pool is not None and not self._waiting(run.job_id)
                   and run.job_id not in self._terminating]
        if not waiting and not started:
            return
        found: list[int] = []
        terminate: list[tuple[int, int]] = []

        async def check(connection: psycopg.AsyncConnection) -> None:
            if waiting:
                found.extend(await database.list_revoked(connection, waiting))
            if started:
                terminate.extend(await database.list_terminating(connection, started))

        if await self._guard(check, "cancel check"):
            for job_id in found:
                self._drop(job_id, "was cancelled or expired")
            for job_id, signum in terminate:
                self._terminate(job_id, signum)

    def _start_run(self, row: dict[str, Any]) -> None:
        queue = row["queue"]
        self.accepted[row["task"]] += 1
        if self.metrics is not None:
            self.metrics.claimed(row)
        self._busy[queue] += 1
        future = asyncio.create_task(self._run_job(row), name=f"job-{row['id']}")
        run = self._running[row["id"]] = _Run(row["id"], row["run_count"], queue, row["task"],
                                              row["attempt"], row["max_attempts"],
                                              time.monotonic(), future, row["claim_token"])
        expires_at = row.get("expires_at")
        if expires_at is not None:
            # Both times are the database's (the claim's now() is started_at): only the
            # duration is carried over to this clock, and the database judges when it fires.
            left = (expires_at - row["started_at"]).total_seconds()
            run.timer = asyncio.get_running_loop().call_later(left, self._expired, row["id"])

    async def _run_job(self, row: dict[str, Any]) -> None:
        try:
            if self.process_pool is not None:
                outcome = await self.process_pool.execute(self.app, row, self.worker_id)
            elif self._bodies is not None:
                if await self._bodies.enter(row["id"]):
                    try:
                        outcome = await execute(self.app, row, self.worker_id, self._threads)
                    finally:
                        self._bodies.release()
                else:  # dropped while it waited: cancelled or expired
                    outcome = Outcome(row["id"], row["run_count"], UNSTARTED,
                                      claim_token=row["claim_token"])
            else:
                outcome = await execute(self.app, row, self.worker_id, self._threads)
        except asyncio.CancelledError as exc:
            if self._stop.is_set():
                return  # stopping: the job goes back to the queue unspent
            # The body cancelled itself (not us): an exception like any other.
            outcome = raised(row["id"], row["run_count"], row["attempt"], exc, None,
                             self.app.redact, claim_token=row["claim_token"])
        except Exception as exc:  # a bug in akadze itself: keep the job, spend the attempt
            logger.exception("job %s: internal error while running it", row["id"])
            outcome = Outcome(row["id"], row["run_count"], RETRY,
                              delay=default_backoff(row["attempt"]),
                              error=error_entry(exc, redact=self.app.redact),
                              claim_token=row["claim_token"])
        finally:
            run = self._running.pop(row["id"], None)
            self._terminating.discard(row["id"])
            if run is not None and run.timer is not None:
                run.timer.cancel()
            self._busy[row["queue"]] -= 1
            self._wake.set()
        if self.metrics is not None and run is not None:
            self.metrics.ran(run, outcome)
        if outcome is not None:
            if run is not None:
                self._finished[(run.job_id, run.run_count)] = run
            self._completer.submit(outcome, urgent=bool(row.get("releases")))
        elif run is not None:
            logger.log(self.outcome_log_level,
                       # complete_tx (a success), or a Celery task that stored its own
                       # outcome before task_postrun (any outcome): not known here
                       "job %s %s ended in %.3fs (attempt %s, outcome written by the task)",
                       run.job_id, run.task, time.monotonic() - run.started, run.attempt)

    def _outcomes_written(self, batch: Any, rows: list[dict[str, Any]]) -> None:
        # Once per written batch, not per job.
        if self._held_back:
            # Claims stopped at max_pending_outcomes: claim again now. Without this the loop
            # slept a whole poll_interval with every slot free and jobs queued (issue 21).
            # The completer drops the batch from its pending list right after this call,
            # before it next yields, so the woken loop sees the smaller count.
            self._held_back = False
            self._wake.set()
        # Retries, snoozes and runs dropped unstarted are queued again below where this
        # worker's next claims would start reading: they lower its floors.
        self._floors.requeued(row for row in rows if row["state"] == "queued")
        if rows and rows[0].get("settled"):
            # The write released workflow jobs (committed already): claim now rather than
            # when the NOTIFY comes back.
            self._wake.set()
        if self.metrics is not None:
            self.metrics.written(batch, rows, self._finished)
        log_outcomes(batch, rows, self._finished, self.outcome_log_level, self.app.redact,
                     self.on_unregistered)

    def _completer_failed(self) -> None:
        exc = self._completer_task.exception()
        self._fatal = self.app.redact(fatal_message(exc) if exc else "the completer stopped")
        logger.error("writing outcomes failed: %s", self._fatal)
        self._stop.set()

    # --- helpers -------------------------------------------------------------------------------

    def _connection_timeout(self) -> float:
        """How long a step may wait for a pooled connection: at most 5 s, and never much
        past the heartbeat TTL, so a worker that lost the database notices in time."""
        return min(5.0, self._lease_left())

    def _lease_end(self) -> float:
        """The ``time.monotonic()`` at which the last good heartbeat is older than the TTL."""
        return self._last_heartbeat_ok + self.heartbeat_ttl

    def _answer_cap(self) -> float:
        """How long a step waits for an answer while the lease holds (SLOW_ANSWER_CAP)."""
        return max(SLOW_ANSWER_CAP, self.heartbeat_ttl)

    def _lease_left(self) -> float:
        """Seconds until the last good heartbeat is older than the TTL (at least 0.1 s, so
        a call made at the end of the lease still gets a chance to answer)."""
        return max(0.1, self._last_heartbeat_ok + self.heartbeat_ttl - time.monotonic())

    def _backoff(self, failures: int) -> float:
        return min(self.heartbeat_interval, 0.1 * 2 ** failures) * random.uniform(0.5, 1.0)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)


def _rescued(row: dict[str, Any]) -> str:
    """What became of a rescued run, after the rescue line's "now <state>"."""
    lost = (f"{row['task']} attempt {row['attempt']}/{row['max_attempts']} lost: WorkerLost: "
            f"its worker stopped heartbeating")
    if row["state"] == "queued":
        return f"{lost}; retry in {max(0.0, row['retry_in']):.1f}s"
    if row["state"] == "failed":
        return f"{lost}; no attempts left"
    return f"{lost}; a cancel was requested or it expired"


async def _maybe_await(value: Any) -> None:
    if inspect.isawaitable(value):
        await value
