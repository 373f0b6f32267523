"""The worker's lifecycle: start, the claim loop, stop.

The rooms it is built of each own their state (after River): the lease (registration,
heartbeat, health file, and the guard every database step goes through;
``worker_lease``), the producer (claims, wake-ups, floors; ``worker_producer``), the runs in
flight (the window, cancel and expiry of runs claimed ahead; ``worker_runs``), and the
maintenance services, one duty a file (``worker_rescue``, ``worker_orphans``,
``worker_prune``, ``worker_schedules``), so the fleet needs no separate supervisor. Beside
them: ``Runs`` runs each job through the executor's ``prepare`` and classifies its
outcome (``returned_outcome``, ``raised_outcome``), the ``Completer`` writes outcomes in
batches, and a listener turns NOTIFY into wake-ups.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg_pool

from ..execution import eager
from ..execution.children import ProcessPoolError
from ..execution.threads import ThreadRunner
from ..model.dsn import listen_url
from ..model.errors import AkadzeError, SchemaMissing
from ..schedules.scheduler import Scheduler
from ..store import database, fair_index, limits, lookup
from ..store.dberrors import fatal_message, is_too_many_connections, is_transient
from ..store.deadlines import cancel_and_wait, within
from ..store.listener import listen_for_jobs
from .completer import Completer
from .config import WorkerConfig, seconds
from .lease import Lease
from .loop_threads import LoopThreads
from .maintenance import Service
from .metrics import WorkerMetrics
from .orphans import Orphans
from .panel import ControlPanel
from .producer import Producer
from .prune import Prune
from .rescue import Rescue
from .run_log import Run, log_outcomes
from .runs import Runs
from .schedules import Schedules
from .signals import Signals

if TYPE_CHECKING:
    from collections import Counter

    from ..app import App
    from .config import Hook

logger = logging.getLogger("akadze.worker")

Maintenance = Callable[[psycopg.AsyncConnection], Awaitable[None]]


AUTOVACUUM_OFF = (
    "autovacuum does not run on akadze.jobs (autovacuum or track_counts is off on the "
    "server, or autovacuum_enabled = false on the table): every claim steps over the index "
    "entries of the jobs finished since the last VACUUM, so claims slow down as jobs finish "
    "(about 10x behind 1,000,000). Turn autovacuum on, or run VACUUM akadze.jobs regularly")


class WorkerError(AkadzeError):
    """The worker stopped on an error that retrying cannot fix; the message says what to do."""


class Worker:
    """Runs the jobs of ``queues`` with ``slots`` concurrent runs per queue.

    ``slots`` is an int for every queue or a mapping ``{queue: slots}``. ``fair=True``
    rotates claims across the task names of a queue so one flooding task cannot starve the
    others (at the cost of a slightly heavier claim query). Every worker also enqueues the
    due runs of the app's schedules, whatever its queues, unless ``schedules=False``.

    The settings (defaults and checks) are a ``WorkerConfig``: pass one as ``config``, or
    its field names as keywords (they override the config's values).
    """

    def __init__(self, app: App, config: WorkerConfig | None = None,
                 **overrides: Any) -> None:
        if config is not None and not isinstance(config, WorkerConfig):
            raise TypeError("Worker(app, config, **settings): config is a WorkerConfig "
                            f"(or None), not {type(config).__name__}; pass queues= and the "
                            "other settings as keywords")
        if config is None:
            config = WorkerConfig(**overrides)
        elif overrides:
            config = config.replace(**overrides)
        #: The settings this worker runs with (checked): the one owner of their defaults.
        self.config = config
        self.app = app
        #: The name in akadze.workers.
        self.name = config.worker_name()
        #: At most this many bodies run at once (threads; Celery's -c): the runs beyond it
        #: are claimed ahead and wait for one to end (Celery's prefetch). None: every
        #: claimed run starts at once.
        self.concurrency = config.concurrency
        #: Run bodies in these child processes (Celery's prefork) instead of this process;
        #: the worker starts and closes it. Slots beyond its processes are claimed ahead
        #: and wait for a free process; while its runs are short the worker may also take
        #: jobs beyond the slots (``ProcessPool.ahead``).
        self.process_pool = config.process_pool
        #: Run with ``context`` before the first claim, and after the last run (integrations
        #: add theirs here).
        self.on_startup: list[Hook] = list(config.on_startup)
        self.on_shutdown: list[Hook] = list(config.on_shutdown)
        #: Shared with the startup/shutdown hooks (ARQ's ctx): put your clients here.
        self.context: dict[str, Any] = {}
        #: Extra maintenance run each round while healthy (integrations hook in here).
        self.maintenance: list[Maintenance] = []
        #: Called with (job id, task name) when a claimed job's task is not registered in
        #: this worker, in place of the core's WARNING line (the Celery facade logs Celery's
        #: "Received unregistered task" line here). The job fails with NotRegistered either way.
        self.on_unregistered: Callable[[int, str], None] | None = None
        #: Remote control (``control.broadcast``): the commands this worker answers are
        #: ``control.commands``; integrations add theirs there.
        self.control = ControlPanel(self)
        self._signals = signals = Signals()
        self._lease = Lease(
            app, signals, name=self.name, heartbeat_interval=seconds(config.heartbeat_interval),
            heartbeat_ttl=seconds(config.heartbeat_ttl), lock_timeout=config.lock_timeout_seconds(),
            health_file=config.health_file_path(), control_pending=self.control.poke)
        self._runs = Runs(app, signals, self._lease, queues=config.queues,
                          process_pool=config.process_pool, concurrency=config.concurrency,
                          outcome_log_level=config.outcome_log_level)
        self._producer = Producer(
            signals, self._lease, self._runs, queues=config.queues,
            slots=config.slots_per_queue(), fair=config.fair, max_running=config.max_running,
            max_pending_outcomes=config.pending_outcomes_limit(),
            poll_interval=seconds(config.poll_interval),
            heartbeat_interval=seconds(config.heartbeat_interval),
            process_pool=config.process_pool)
        self._orphans = Orphans(worker_id=lambda: self._lease.worker_id,
                                known=self._known_jobs, claim_lock=self._lease.claim_lock,
                                wake=signals.wake)
        self._schedules = Schedules(Scheduler(app)) if config.schedules else None
        self._pool: psycopg_pool.AsyncConnectionPool | None = None
        self._completer: Completer | None = None
        #: This worker's Prometheus series and /metrics (``metrics_port``), else None.
        self.metrics = WorkerMetrics(
            self, busy=self._runs.busy, connection=self._lease.connection,
            ready=lambda: self._pool is not None and not self._pool.closed,
            pending=lambda: self._completer.pending if self._completer is not None else 0,
        ) if config.metrics_port is not None else None
        self._runs.metrics = self.metrics

    # --- what it is and holds -------------------------------------------------------------

    @property
    def worker_id(self) -> int | None:
        """This worker's id in akadze.workers (None until registered)."""
        return self._lease.worker_id

    @property
    def queues(self) -> list[str]:
        """The queues claimed from, in order."""
        return self._producer.queues

    @property
    def slots(self) -> dict[str, int]:
        """Concurrent runs per queue."""
        return self._producer.slots

    @property
    def max_running(self) -> int | None:
        """A cap on runs across all queues (Celery's ``-c``), on top of the per-queue
        slots; when it binds, queues are served in the order given."""
        return self._producer.max_running

    @property
    def accepted(self) -> Counter[str]:
        """Runs started (claimed) since the worker started, by task name (Celery's stats
        "total")."""
        return self._runs.accepted

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between heartbeats."""
        return seconds(self.config.heartbeat_interval)

    @property
    def heartbeat_ttl(self) -> float:
        """Seconds after the last heartbeat at which other workers rescue this one's jobs."""
        return seconds(self.config.heartbeat_ttl)

    @property
    def poll_interval(self) -> float:
        """The most seconds between claims while slots are free (NOTIFY wakes it sooner)."""
        return seconds(self.config.poll_interval)

    def running(self) -> dict[int, bool]:
        """The jobs this worker holds, by id: True for those whose body runs, False for
        those claimed ahead and waiting for a body slot or a process."""
        return self._runs.held()

    # --- public control -------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop gracefully; a second call stops at once (running jobs go back to the queue)."""
        signals = self._signals
        if signals.stop.is_set():
            logger.warning("second stop request: returning running jobs and exiting now")
            signals.stop_now.set()
        else:
            logger.info("stopping: no new claims; waiting up to %gs for %d running jobs",
                        seconds(self.config.shutdown_timeout), len(self._runs.running))
            signals.stop.set()
        signals.wake.set()

    async def add_queue(self, queue: str, slots: int | None = None) -> bool:
        """Start claiming from ``queue`` too (``slots`` runs at once; default: as many as the
        busiest of the others); False when it already did. The workers table says so at once
        (``list_workers``), and an enqueue on it wakes this worker."""
        if not self._producer.add_queue(queue, slots):
            return False
        await self._store_queues()
        self._signals.wake.set()
        logger.info("now consuming from queue %s", queue)
        return True

    async def remove_queue(self, queue: str) -> bool:
        """Stop claiming from ``queue``; its runs under way finish. False when it did not
        claim from it."""
        if not self._producer.remove_queue(queue):
            return False
        await self._store_queues()
        logger.info("no longer consuming from queue %s", queue)
        return True

    async def _store_queues(self) -> None:
        async def store(connection: psycopg.AsyncConnection) -> None:
            await database.fetch_one_async(connection, "worker_set_queues", id=self.worker_id,
                                           queues=self.queues)

        await self._lease.guard(store, "queues")

    def resize(self, concurrency: int | None = None, *, slots: int | None = None,
               max_running: int | None = None) -> None:
        """Change, while running, how many bodies run at once (``concurrency``: the threads
        of the body gate; not a process pool's processes), the slots of every queue and the
        cap on runs. More start the runs claimed ahead at once; fewer take effect as runs
        end (none is interrupted), except that runs claimed ahead beyond a new cap on runs
        go back to the queue unstarted."""
        producer = self._producer
        if concurrency is not None:
            if self._runs.bodies is None or concurrency < 1:
                raise ValueError("only a worker with a concurrency limit (threads) can be "
                                 "resized, to at least 1")
            self._runs.bodies.resize(concurrency)
            self.concurrency = concurrency
        if slots is not None:
            producer.slots = dict.fromkeys(producer.slots, max(1, slots))
        if max_running is not None:
            producer.max_running = max(1, max_running)
            self._runs.give_back(producer.max_running)
        self._signals.wake.set()

    def run_sync(self, install_signal_handlers: bool = True) -> int:
        """Run in a new event loop until stopped; returns the exit code (0, or 1). The
        loop's leftover ``asyncio.to_thread`` threads are not waited for (``LoopThreads``)."""

        async def main() -> int:
            loop = asyncio.get_running_loop()
            # asyncio.run joins the default executor's threads on its way out, without a
            # timeout: one a cancelled task left waiting in the network would hold the exit.
            loop.set_default_executor(LoopThreads())
            if install_signal_handlers:
                for signum in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(signum, self.request_stop)
            return await self.run()

        # On a loop that takes a run's first step where its task is made (eager.run).
        return eager.run(main())

    async def run(self) -> int:
        """Run until stopped. Returns 0, or 1 when the database was lost for longer than the
        heartbeat TTL; raises ``WorkerError`` on errors that retrying cannot fix."""
        signals = self._signals
        signals.exit_code = 0
        signals.fatal = None
        total_slots = sum(self.slots.values())
        if self.metrics is not None:  # a port already taken stops the worker before it starts
            await self.metrics.serve(self.config.metrics_port or 0, self.config.metrics_address)
        # Twice the slots: a sync body past its timeout keeps its thread until it returns.
        self._threads = ThreadRunner(max_threads=total_slots * 2 + 4)
        started = await self._start(total_slots)
        try:
            if started and await self._ready():
                await self._loop()
        finally:
            await self._shutdown(started)
            if self.metrics is not None:
                await self.metrics.close()
        if signals.fatal:
            raise WorkerError(signals.fatal)
        if signals.exit_code == 1:
            # The last line, for the operator: exiting is the design (seed: a worker that
            # cannot heartbeat stops, since its jobs may be rescued and re-run elsewhere),
            # and coming back is the supervisor's job (see migration_guide/deployment.md).
            logger.error("exiting with status 1: the database was unreachable for longer than "
                         "heartbeat_ttl (%gs), so this worker's jobs may be rescued and re-run "
                         "by other workers; run it under a supervisor that restarts it "
                         "(systemd Restart=always, a container restart policy, Kubernetes): "
                         "once started again it waits for the database", self.heartbeat_ttl)
        return signals.exit_code

    # --- start and stop --------------------------------------------------------------------

    async def _start(self, total_slots: int) -> bool:
        url = self.app.database_url
        failures = 0
        fair_index_ready = not self.config.fair
        signals = self._signals
        while not signals.stop.is_set():
            try:
                if not fair_index_ready:
                    # Before registering: a long build must not pass for a silent worker.
                    await fair_index.ensure(url, self._connect_kwargs(), signals.stop,
                                            redact=self.app.redact)
                    fair_index_ready = True
                    continue  # to the stop check, then the start proper
                async with await psycopg.AsyncConnection.connect(
                        url, **self._connect_kwargs()) as connection:
                    # Bounded: a server that stops answering mid-start is retried like one
                    # that cannot be reached.
                    with database.lock_timeout(self._lease.lock_timeout):
                        await within(self.heartbeat_ttl, connection,
                                     self._prepare(connection), "the start")
                break
            except Exception as exc:
                if isinstance(exc, SchemaMissing) or not is_transient(exc):
                    signals.fatal = self.app.redact(fatal_message(exc))
                    return False
                failures += 1
                delay = self._lease.backoff(failures)
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
        self._pool = pool = psycopg_pool.AsyncConnectionPool(
            # Two at once: a heartbeat need not wait for the pool to grow. It grows when the
            # steps overlap, and a server out of connections only stops it growing: the
            # steps share what it has (a step waits up to 5 s for one, then retries).
            url, min_size=min(2, pool_size), max_size=pool_size, timeout=5,
            kwargs=self._connect_kwargs(), name=f"akadze-worker-{self.worker_id}",
            open=False)
        await pool.open(wait=False)
        await self.app.connections.use_async_pool(pool)
        lease = self._lease
        self._completer = completer = Completer(
            functools.partial(lease.connection, keep="write"), self._outcomes_written,
            lock_timeout=lease.lock_timeout,
            on_lock=lease.lock_seen, lease_end=lease.end, cap=lease.answer_cap(),
            redact=self.app.redact, writers=self.app.outcome_writers)
        self._completer_task = asyncio.create_task(completer.run(), name="completer")
        self._runs.open(completer, self._threads)
        self._producer.open(completer)
        self._services = self._make_services()
        lease.open(pool, beaten=self._services["rescue"].trigger,
                   lost=self._orphans.lost_answer)
        self._listener_task = asyncio.create_task(
            listen_for_jobs(listen_url(url), self._producer.watched, signals.wake.set,
                            lease.backoff, self._runs.cancelled,
                            connect_kwargs=self._connect_kwargs(),
                            schedules_changed=self._schedules.changed
                            if self._schedules is not None else None,
                            control=self.control.heard, terminate=self._runs.terminate,
                            jobs_heard=self._producer.followups.heard,
                            connected=self._producer.listening,
                            paused=self._producer.heard_pause),
            name="listener")
        self._services["rescue"].trigger()
        logger.info("worker %s (id %s) started: queues %s, slots %s%s", self.name,
                    self.worker_id, ",".join(self.queues), total_slots,
                    ", fair" if self.config.fair else "")
        return True

    async def _ready(self) -> bool:
        """Run the on_startup hooks, then announce readiness (the health file). A failing
        hook stops the worker cleanly with a clear error instead of half-starting it."""
        if self.process_pool is not None:
            try:
                await self.process_pool.start()
            except ProcessPoolError as exc:
                self._signals.fatal = self.app.redact(str(exc))
                return False
        for hook in self.on_startup:
            try:
                await _maybe_await(hook(self.context))
            except Exception as exc:
                logger.exception("on_startup hook failed")
                name = getattr(hook, "__qualname__", repr(hook))
                self._signals.fatal = self.app.redact(f"on_startup hook {name} failed: {exc!r}")
                return False
        if self._lease.health_file:
            self._lease.health_file.touch()
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
        # The rate limits this app's tasks declare hold for the whole fleet: set them.
        await limits.declare(connection, self.app.declared_rate_limits())
        return await self._lease.register(connection, self._producer.registration)

    async def _shutdown(self, started: bool) -> None:
        if started:
            assert self._pool is not None
            await self._drain()
            for hook in self.on_shutdown:
                try:
                    await _maybe_await(hook(self.context))
                except Exception:
                    logger.exception("on_shutdown hook failed")
            if self.process_pool is not None:
                await self.process_pool.close()
            await cancel_and_wait(self._listener_task)
            self._producer.followups.close()
            await self._lease.release_kept()
            self.app.connections.forget_async_pool(self._pool)
            # After the heartbeat was lost, connection attempts may hang in a partition
            # until their connect_timeout: do not wait for them.
            await self._pool.close(timeout=5.0 if self._signals.exit_code == 0 else 1.0)
        if self._lease.health_file:
            self._lease.health_file.unlink(missing_ok=True)
        # A sync task's thread cannot be stopped; do not wait for it.
        self._threads.close()
        if started:  # one that never started says why instead (the fatal line)
            logger.info("worker %s stopped", self.name)

    async def _drain(self) -> None:
        """Seed 000's stop: wait up to shutdown_timeout, then return what is left unspent."""
        running = self._runs.running
        stop_now = self._signals.stop_now
        assert self._completer is not None
        # Jobs claimed ahead for the process pool and not started yet go back at once, as
        # Celery's warm shutdown releases its reserved (prefetched) tasks.
        held_back = [run for run in running.values() if self._runs.waiting(run.job_id)]
        for run in held_back:
            self._runs.cancel(run)
        await asyncio.gather(*_tasks(held_back), return_exceptions=True)
        if running and not stop_now.is_set():
            all_done = asyncio.ensure_future(self._runs.ended())
            stopped_now = asyncio.ensure_future(stop_now.wait())
            # Keep the lease while waiting: a shutdown_timeout longer than the TTL must not
            # let another worker rescue (and run again) a job that is still finishing here.
            beating = asyncio.create_task(self._lease.beat_while_draining(),
                                          name="drain-heartbeat")
            await asyncio.wait({all_done, stopped_now},
                               timeout=seconds(self.config.shutdown_timeout),
                               return_when=asyncio.FIRST_COMPLETED)
            for waiter in (all_done, stopped_now, beating):
                waiter.cancel()
            await asyncio.gather(beating, return_exceptions=True)
        unfinished = list(running.values())
        # Once: a body's own cleanup after its cancel may take its time (cancel_and_wait
        # would cancel that cleanup too).
        for run in unfinished:
            self._runs.cancel(run)
        await asyncio.gather(*_tasks(unfinished), return_exceptions=True)
        # After the heartbeat was lost the database is likely gone: try briefly, then leave
        # the jobs to the rescue, which other workers may have started already.
        timeout = 5.0 if self._signals.exit_code == 0 \
            else min(5.0, max(1.0, self.heartbeat_interval))
        flushed = await self._completer.close(timeout=timeout)
        await cancel_and_wait(self._completer_task)
        returned = await self._lease.hand_back(
            [run.fence for run in held_back + unfinished], timeout)
        if flushed and returned:
            await self._lease.unregister(timeout)
        else:
            logger.warning("could not hand back every job: they are rescued once this "
                           "worker's heartbeat is older than %gs", self.heartbeat_ttl)

    # --- the loop ----------------------------------------------------------------------------

    def _make_services(self) -> dict[str, Service]:
        """The maintenance duties, each on its own clock (see ``maintenance``)."""
        services = {
            "rescue": Rescue().service,
            "orphan check": self._orphans.service,
            "prune": Prune(self.app, interval=seconds(self.config.prune_interval),
                           batch=self.config.prune_batch, extra=self.control.prune).service,
        }
        if self._schedules is not None:
            services["schedules"] = self._schedules.service
        return services

    def _known_jobs(self) -> set[int]:
        assert self._completer is not None
        return set(self._runs.running) | self._completer.pending_jobs()

    async def _loop(self) -> None:
        signals, lease = self._signals, self._lease
        guard = lease.guard
        tasks = [asyncio.create_task(lease.run(self._after_beat), name="heartbeat"),
                 asyncio.create_task(self.control.run(guard, lease.health, signals.stop),
                                     name="control")]
        tasks += [asyncio.create_task(service.run(guard, lease.health, signals.stop),
                                      name=name) for name, service in self._services.items()]
        for task in tasks:
            task.add_done_callback(self._service_ended)
        try:
            while not signals.stop.is_set():
                signals.wake.clear()
                if self._completer_task.done():
                    self._completer_failed()
                    return
                await self._round()
                if signals.fatal or signals.stop.is_set():
                    return
                await self._producer.sleep()
        finally:
            # A step in flight (a prune waiting on a lock) is abandoned: its statement is
            # atomic, and stopping must not wait for it.
            for task in tasks:
                task.remove_done_callback(self._service_ended)
            await cancel_and_wait(*tasks)

    async def _after_beat(self) -> None:
        await self._runs.check_waiting(self._lease.guard)

    def _service_ended(self, task: asyncio.Task[None]) -> None:
        # Steps run in the guard, so only a bug in akadze ends a service early: stop rather
        # than carry on without, say, heartbeats.
        if task.cancelled() or self._signals.stop.is_set():
            return
        exc = task.exception()
        logger.error("the %s service stopped: %r", task.get_name(), exc)
        self._signals.fail(self.app.redact(f"the {task.get_name()} service stopped: {exc!r}"))

    async def _round(self) -> None:
        # Maintenance runs in its services; this loop only claims, and only while healthy
        # and once jobs a lost claim answer left behind are handed back.
        if not self._lease.health.is_set() or self._signals.fatal or self._orphans.pending:
            return
        for hook in self.maintenance:
            await self._lease.guard(hook, "maintenance")
        await self._producer.claim()

    def _outcomes_written(self, batch: Any, rows: list[dict[str, Any]]) -> None:
        # Once per written batch, not per job.
        self._producer.written(rows)
        finished = self._runs.finished
        if self.metrics is not None:
            self.metrics.written(batch, rows, finished)
        log_outcomes(batch, rows, finished, self.config.outcome_log_level, self.app.redact,
                     self.on_unregistered)

    def _completer_failed(self) -> None:
        exc = self._completer_task.exception()
        fatal = self.app.redact(fatal_message(exc) if exc else "the completer stopped")
        self._signals.fatal = fatal
        logger.error("writing outcomes failed: %s", fatal)
        self._signals.stop.set()

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._signals.stop.wait(), seconds)


async def _maybe_await(value: Any) -> None:
    if inspect.isawaitable(value):
        await value


def _tasks(runs: list[Run]) -> list[asyncio.Task[None]]:
    """The tasks of those ``runs`` that run in one (the others end when cancelled)."""
    return [run.future for run in runs if run.future is not None]
