"""``akadze-compat worker``: Celery's worker command on akadze_core workers.

Pools: ``threads -c N`` is one akadze_core Worker running at most N tasks at once across
its queues (Celery's total); ``solo`` runs one; ``prefork -c N`` (Celery's default) is the
same Worker running task bodies in N child processes, one each (``worker_pool``);
``eventlet``/``gevent`` run as ``threads`` (warned).

Celery's worker signals are sent with Celery's senders and arguments, at the same points:
``celeryd_init`` and ``worker_init`` first, then ``setup_logging`` (a receiver takes logging
over), ``after_setup_logger``, ``after_setup_task_logger``; ``worker_process_init`` in each
prefork child and in a solo worker. A prefork child is a fresh interpreter, not a fork, so
it sends ``celeryd_init`` and ``worker_init`` (and the logging signals) again before its
``worker_process_init``: what their receivers set up in a Celery worker's process is
inherited by its forked children, and must be there in ours. ``worker_ready`` once
claiming; ``worker_shutting_down`` on a stop signal; ``worker_process_shutdown`` as a
prefork child exits; ``worker_shutdown`` last.

Hidden environment overrides (seconds), for tests and tuning: ``AKADZE_POLL_INTERVAL``,
``AKADZE_HEARTBEAT_INTERVAL``, ``AKADZE_HEARTBEAT_TTL``, ``AKADZE_SHUTDOWN_TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import click

from akadze_core import Worker, WorkerConfig
from akadze_core.integration import (
    DEFAULTS,
    LoopThreads,
    ProcessPool,
    run_worker_loop,
    scrubbed_stdio,
    serve,
    settle_heap,
)

from .. import beat, bootsteps, signals
from .._billiard import pool as billiard_pool
from ..utils.timer2 import Timer
from ..worker import control, entry
from ..worker.pool import CeleryProcessPool, ChildInfo, child_info, install_child_limits
from .base import CliError, cli_state, exit_now, host_format, report, secrets
from .logs import setup_worker_logging
from .worker_options import (
    WorkerSettings,
    settings_from_options,
    warn_unsupported,
    worker_options,
)

__all__ = ["WorkController", "worker_command"]

logger = logging.getLogger("celery.worker")
#: Celery's consumer logs what arrives for a task it does not know.
consumer_logger = logging.getLogger("celery.worker.consumer")


class WorkController:
    """What Celery's worker signals get as ``sender``/``instance``: this worker's facts."""

    def __init__(self, app: Any, settings: WorkerSettings) -> None:
        self.app = app
        self.hostname = settings.hostname
        self.concurrency = settings.concurrency
        self.pool_cls = settings.pool
        self.queues = settings.queues
        self.loglevel = settings.loglevel
        self.logfile = settings.logfile
        self.max_tasks_per_child = settings.max_tasks_per_child
        self.pid = os.getpid()
        self.options = settings.options
        #: Celery's consumer (``worker_ready``'s sender) points back to its controller.
        self.controller = self
        #: The started boot steps (``celery.bootsteps.StartStopStep.include`` adds to it).
        self.steps: list[Any] = []
        #: The boot steps created on this worker (Celery's ``worker.blueprint``): it keeps
        #: them alive, with what they hold (receivers a step connected weakly, as
        #: django-structlog's does).
        self.blueprint: bootsteps.Blueprint | None = None
        #: What boot steps schedule their periodic calls on (``celery.utils.timer2``).
        self.timer = Timer(name=f"{settings.hostname}-timer")

    def __repr__(self) -> str:
        return f"<WorkController {self.hostname} {self.pool_cls}:{self.concurrency}>"


#: The command's help; its shutdown wait is the core worker's default.
WORKER_HELP = f"""Start a worker (Celery's `celery worker`), until SIGTERM or SIGINT.

The first signal stops claiming and lets running tasks finish (for up to
{DEFAULTS.shutdown_timeout:g} s, then they go back to the queue without spending a retry); a
second one stops at once.
"""


@click.command("worker", help=WORKER_HELP,
               context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@worker_options
@click.pass_context
def worker_command(ctx: click.Context, **options: Any) -> None:
    """Start a worker: see ``WORKER_HELP``."""

    child = child_info()
    if child is None:
        warn_unsupported(options, ctx.args)
    state = cli_state(ctx)
    app = state.load_app()
    # What the tasks print goes out scrubbed of passwords, as the log lines do (Celery
    # sends it to the log instead: worker_redirect_stdouts is not honoured).
    ctx.with_resource(scrubbed_stdio(secrets.scrub))
    settings = settings_from_options(app, options, child, quiet=state.quiet)
    instance = WorkController(app, settings)
    if child is not None:
        exit_now(_run_child(app, settings, instance, child))
    with _pidfile(settings.pidfile):
        code = _run_single(app, settings, instance, state.invocation)
    # os._exit: a task thread the worker gave up on at shutdown must not keep us alive.
    exit_now(code)


# --- the steps every mode shares ------------------------------------------------------------

def _init(app: Any, settings: WorkerSettings, instance: WorkController, *,
          main_process: bool = True) -> Any:
    """Celery's start-up order; returns the core app to run."""
    app.set_current()
    entry.worker_hostname = settings.hostname  # request.hostname in the tasks
    if settings.include:
        app.conf.include = [*(app.conf.include or ()), *settings.include]
    if settings.time_limit is not None:
        app.conf.task_time_limit = settings.time_limit
    if settings.soft_time_limit is not None:
        app.conf.task_soft_time_limit = settings.soft_time_limit
    if settings.scheduler:
        app.conf.beat_scheduler = settings.scheduler
    # Also in each prefork child: Celery's children are forks of a process that ran these
    # receivers, so what they set up (sentry_sdk.init in celeryd_init, as Sentry's docs
    # show) is there when tasks run; ours are fresh interpreters, which must run them too.
    signals.celeryd_init.send(sender=settings.hostname, instance=instance, conf=app.conf,
                              options=settings.options)
    signals.worker_init.send(sender=instance)
    setup_worker_logging(app, settings.loglevel, settings.logfile)
    for line in settings.notes if main_process else ():
        logger.info("%s", line)
    if main_process:
        beat.warn_unhonoured_scheduler(app, settings.options.get("scheduler"))
    core = app.prepare_worker()
    _ = core.database_url  # a bad broker URL fails here, once, as one line
    if core.redact not in secrets.redactors:
        secrets.redactors.append(core.redact)  # its password, however the URL was given
    if main_process:
        # Celery sends it once the worker is set up (queues, logging), before it starts.
        signals.celeryd_after_setup.send(sender=settings.hostname, instance=instance,
                                         conf=app.conf)
    if main_process and settings.purge:
        purged = core.purge(settings.queues)
        logger.warning("purged %d queued tasks from %s", purged, ", ".join(settings.queues))
    return core


def _boot_steps(app: Any, instance: WorkController) -> bootsteps.Blueprint:
    """The project's boot steps (``app.steps``), created on the worker: Celery creates its
    worker's and its consumer's after ``worker_init``; here both get the worker."""
    blueprint = bootsteps.Blueprint([*app.steps["worker"], *app.steps["consumer"]],
                                    name="Worker")
    try:
        instance.blueprint = blueprint.apply(instance)
        return instance.blueprint
    except Exception as exc:
        raise CliError(f"a boot step failed to start: {type(exc).__name__}: {exc}") from exc


def _banner(app: Any, settings: WorkerSettings, core: Any) -> None:
    if settings.quiet:
        return
    lines = [
        f"akadze-compat worker {settings.hostname}",
        f"  app:         {app.main or '__main__'}",
        f"  database:    {secrets.scrub(core.database_url)}",
        f"  pool:        {settings.pool} (concurrency {settings.concurrency})",
        f"  queues:      {', '.join(settings.queues)}",
    ]
    if settings.loglevel <= logging.INFO:
        lines.append("  tasks:")
        # Celery's banner leaves its built-ins (celery.map...) out above DEBUG.
        lines.extend(f"    . {name}" for name in sorted(app.tasks)
                     if settings.loglevel <= logging.DEBUG or not name.startswith("celery."))
    click.echo("\n".join(lines))


def _worker(core: Any, settings: WorkerSettings, slots: int,
            on_startup: list[Callable[[dict[str, Any]], Any]],
            process_pool: ProcessPool | None = None, concurrency: int | None = None) -> Worker:
    try:
        # Celery's -c is a total across queues: slots per queue, capped by max_running.
        config = WorkerConfig(queues=settings.queues, slots=slots, max_running=slots,
                              name=settings.hostname, on_startup=on_startup,
                              process_pool=process_pool, concurrency=concurrency,
                              # Celery's own "Task ... succeeded/raised/retry" lines say it
                              # at INFO.
                              outcome_log_level=logging.DEBUG, **settings.worker_kwargs)
    except ValueError as exc:  # e.g. AKADZE_HEARTBEAT_TTL not above the interval
        raise CliError(str(exc), exit_code=2) from None
    worker = Worker(core, config=config)
    worker.on_unregistered = _unregistered
    return worker


def _unregistered(job_id: int, task: str) -> None:
    """The worker's line for a job of a task no module here registered, in the words Celery
    users look for; the core fails the job with NotRegistered (``AsyncResult`` raises it)."""
    consumer_logger.error("Received unregistered task of type %r. Job %s failed with "
                          "NotRegistered: is the module that defines it imported by this "
                          "worker (-A, include, imports or autodiscover_tasks)?", task, job_id)


def _run_worker(worker: Worker, on_signal: Callable[[int], None]) -> int:
    """Run ``worker`` in a new event loop, with ``on_signal`` handling stop signals."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        # Not asyncio's: its shutdown would wait, without a timeout, for a thread a
        # cancelled task left waiting in the network.
        loop.set_default_executor(LoopThreads())
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
            loop.add_signal_handler(signum, on_signal, signum)
        return await worker.run()

    # The command owns this process, whose start-up is over: it only runs jobs now.
    settle_heap()
    try:
        return run_worker_loop(main())
    except Exception as exc:  # WorkerError: schema missing, permission denied, ...
        return report(exc)


def _shutting_down(settings: WorkerSettings, signum: int, how: str) -> None:
    """Celery's stop announcement, on stdout, and ``worker_shutting_down``."""
    click.echo(f"worker: {how} shutdown (MainProcess)")
    signals.worker_shutting_down.send(sender=settings.hostname,
                                      sig=signal.Signals(signum).name, how=how,
                                      exitcode=1 if how == "Cold" else 0)


# --- the worker process: threads, solo, and prefork's parent --------------------------------

def _run_single(app: Any, settings: WorkerSettings, instance: WorkController,
                invocation: list[str]) -> int:
    core = _init(app, settings, instance)
    blueprint = _boot_steps(app, instance)
    _banner(app, settings, core)
    if settings.pool == "solo":
        # Celery's solo pool sends it; its threads pool does not.
        signals.worker_process_init.send(sender=settings.hostname)
    received: list[str] = []

    def ready(context: dict[str, Any]) -> None:
        signals.worker_ready.send(sender=instance)
        logger.info("%s ready.", settings.hostname)

    bodies = 1 if settings.pool == "solo" else settings.concurrency
    slots = prefetch_slots(bodies, settings.prefetch_multiplier,
                           bool(app.conf.get("task_acks_late")))
    if settings.pool == "prefork":
        worker = _worker(core, settings, slots, [ready], _process_pool(app, settings, invocation))
    else:  # threads: at most ``bodies`` run at once, the rest of the window waits for one
        worker = _worker(core, settings, slots, [ready], concurrency=bodies)
    # app.control / inspect: Celery's commands and the project's own (control_command).
    control.install(worker, app, settings.hostname, instance, settings.options)

    def on_signal(signum: int) -> None:
        cold = signum == signal.SIGQUIT or bool(received)
        received.append("Cold" if cold else "Warm")
        _shutting_down(settings, signum, received[-1])
        worker.request_stop()
        if signum == signal.SIGQUIT and len(received) == 1:
            worker.request_stop()  # the second call stops at once

    try:
        blueprint.start(instance)  # before the first claim, so before worker_ready
    except Exception as exc:
        blueprint.stop(instance)
        raise CliError(f"a boot step failed to start: {type(exc).__name__}: {exc}") from exc
    code = _run_worker(worker, on_signal)
    # As Celery: the steps stop, in reverse order, then worker_shutdown.
    blueprint.stop(instance, terminate="Cold" in received)
    instance.timer.stop()
    signals.worker_shutdown.send(sender=instance)
    # Celery exits 1 after a cold shutdown.
    return 1 if code == 0 and "Cold" in received else code


def prefetch_slots(bodies: int, prefetch_multiplier: int, acks_late: bool) -> int:
    """How many tasks a worker holds at once: Celery's prefetch window, in every pool.

    Claims (one statement for many) run ahead of the processes or threads; a claimed task
    waits for a free one, never queued behind a busy one. Celery's window counts the
    messages not acknowledged yet, ``prefetch_multiplier`` per process (or thread). With
    early acknowledgement (its default) a task is acknowledged when it starts, so each
    process also has one running outside the window: "-c 10 may reserve at most 20 tasks"
    at a multiplier of 1, in Celery's words. With ``task_acks_late`` running tasks stay in
    the window.
    """
    return bodies * prefetch_multiplier + (0 if acks_late else bodies)


# --- prefork: this process claims, its children run the bodies ------------------------------


def _process_pool(app: Any, settings: WorkerSettings, invocation: list[str]) -> ProcessPool:
    """Celery's ``-c`` processes, each re-running this command as a pool child (with
    Celery's time limits and terminate: ``CeleryProcessPool``)."""
    return CeleryProcessPool(app, settings.concurrency,
                             [sys.executable, "-m", "akadze_compat", *invocation],
                             max_tasks_per_child=settings.max_tasks_per_child)


def _run_child(app: Any, settings: WorkerSettings, instance: WorkController,
               info: ChildInfo) -> int:
    multiprocessing.current_process().name = f"ForkPoolWorker-{info.number}"
    core = _init(app, settings, instance, main_process=False)
    # Celery forks its pool children after the boot steps were created (their __init__ and
    # create ran in the worker process), so what those did is in every child: the signal
    # receivers django-structlog's step connects, for one. Ours are fresh interpreters: the
    # steps are created here too, at the same point, and never started (start and stop
    # run in the worker process, as in Celery).
    _boot_steps(app, instance)
    signals.worker_process_init.send(sender=settings.hostname)
    install_child_limits()

    def on_exit(pid: int, exitcode: int) -> None:
        with contextlib.suppress(Exception):
            signals.worker_process_shutdown.send(sender=settings.hostname, pid=pid,
                                                 exitcode=exitcode)

    # Through billiard's names, as a Celery pool child, so that agents wrapping
    # Worker.workloop / Worker._do_exit (to flush or shut down) act here too.
    return billiard_pool.Worker(lambda: serve(core), on_exit)()


@contextlib.contextmanager
def _pidfile(path: str | None) -> Any:
    """Write the main process's pid to ``path`` (``--pidfile``), refusing a live one."""
    if not path:
        yield
        return
    path = host_format(path)
    with contextlib.suppress(FileNotFoundError, ValueError):
        with open(path, encoding="ascii") as existing:
            pid = int(existing.read().strip() or 0)
        if pid and pid != os.getpid():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                pass
            else:
                raise CliError(f"pidfile {path} names a running process ({pid})")
    with open(path, "w", encoding="ascii") as file:
        file.write(f"{os.getpid()}\n")
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
