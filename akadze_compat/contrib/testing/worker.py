"""An embedded worker for tests (Celery's ``celery.contrib.testing.worker``).

``start_worker(app)`` runs a real akadze worker for ``app`` in a daemon thread of the test
process, on the app's database, with its own event loop: it claims, heartbeats and writes
outcomes exactly as ``akadze-compat worker`` does, so ``task.delay(...).get(timeout=10)``
in the test waits for a real run. Tasks are looked up when a job is claimed, so a task
defined after the worker started (``@celery_app.task`` inside the test) runs too.

Pools: ``solo`` (Celery's test default) runs one task at a time; ``threads`` runs
``concurrency`` at once. ``prefork``, ``eventlet`` and ``gevent`` run as ``threads`` here:
the point of an embedded worker is that the task bodies run in the test's own process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from akadze_compat import Celery, signals
from akadze_compat.utils.nodenames import anon_nodename
from akadze_compat.worker import control
from akadze_core import Worker

# Registers celery.ping, the task of the start-up check.
from . import tasks as _tasks  # noqa: F401
from .app import ensure_schema

__all__ = ["TestWorkController", "start_worker", "test_worker_started",
           "test_worker_starting", "test_worker_stopped"]

logger = logging.getLogger("akadze_compat.contrib.testing.worker")

#: Celery's knob for the embedded worker's log level (accepted; pytest captures the logs).
WORKER_LOGLEVEL = os.environ.get("WORKER_LOGLEVEL", "error")
#: How long the worker may take to connect and register before start_worker gives up.
START_TIMEOUT = 60.0

test_worker_starting = signals.Signal(name="test_worker_starting", providing_args=set())
test_worker_started = signals.Signal(name="test_worker_started",
                                     providing_args={"worker", "consumer"})
test_worker_stopped = signals.Signal(name="test_worker_stopped", providing_args={"worker"})


class TestWorkController:
    """The worker ``start_worker`` yields: its facts (``app``, ``hostname``, ``concurrency``,
    ``pool_cls``, ``queues``) and the akadze_core ``Worker`` it runs (``worker``)."""

    # Imported into test modules, it must not look like a test class to pytest.
    __test__ = False

    def __init__(self, app: Celery, worker: Worker, hostname: str, pool: str,
                 concurrency: int, loglevel: str | int, logfile: str | None) -> None:
        self.app = app
        self.worker = worker
        self.hostname = hostname
        self.pool_cls = pool
        self.concurrency = concurrency
        self.queues = list(worker.queues)
        self.loglevel = loglevel
        self.logfile = logfile
        self.pid = os.getpid()
        #: Celery's consumer (``worker_ready``'s sender) points back to its controller.
        self.controller = self
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None
        self._exit_code: int | None = None
        self._thread = threading.Thread(target=self._run, name=f"akadze-test-worker-{hostname}",
                                        daemon=True)

    def __repr__(self) -> str:
        return f"<TestWorkController {self.hostname} {self.pool_cls}:{self.concurrency}>"

    def _run(self) -> None:
        async def main() -> int:
            self._loop = asyncio.get_running_loop()
            return await self.worker.run()

        try:
            self._exit_code = asyncio.run(main())
        except BaseException as exc:  # reported by ensure_started or stop, in the test
            self._error = exc

    def _on_ready(self, context: dict[str, Any]) -> None:
        signals.worker_ready.send(sender=self)
        self._started.set()
        test_worker_started.send(sender=self.app, worker=self, consumer=self)

    def start(self) -> None:
        """Start the worker thread (``ensure_started`` waits until it claims)."""
        self.worker.on_startup.append(self._on_ready)
        self._thread.start()

    def ensure_started(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until the worker is registered and claiming; raise what stopped it, if it
        stopped first (a database without the schema, a wrong URL)."""
        while not self._started.wait(0.05):
            if not self._thread.is_alive():
                if self._error is not None:
                    raise RuntimeError(f"the test worker did not start: {self._error}") \
                        from self._error
                raise RuntimeError(f"the test worker exited with code {self._exit_code} "
                                   "before it started")
            timeout -= 0.05
            if timeout <= 0:
                raise RuntimeError("the test worker did not start within "
                                   f"{START_TIMEOUT:g}s")

    def reload(self, modules: Any = None, reload: bool = False, reloader: Any = None) -> None:
        """Import ``modules`` (task modules) into the app. Celery's docs call this after
        ``@celery_app.task`` in a test; here that task runs without it, as tasks are looked
        up when a job is claimed."""
        for module in modules or ():
            self.app.loader.import_task_module(module)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop gracefully (running tasks get the worker's ``shutdown_timeout``) and wait up
        to ``timeout`` seconds for the thread to end."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            # The worker's stop events belong to its loop: set them from that loop's thread.
            # RuntimeError: the loop closed in between, the worker is gone already.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self.worker.request_stop)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError("Worker thread failed to exit within the allocated timeout. "
                               "Consider raising `shutdown_timeout` if your tasks take "
                               "longer to execute.")
        if self._error is not None:
            raise RuntimeError(f"the test worker failed: {self._error}") from self._error


def _queues(app: Celery, queues: Any) -> list[str]:
    """The queues to consume: ``queues=`` as given, else ``task_queues``, else the default
    queue (what ``akadze-compat worker`` without ``-Q`` consumes)."""
    if isinstance(queues, str):
        return [name.strip() for name in queues.split(",") if name.strip()]
    if queues:
        return [str(getattr(queue, "name", queue)) for queue in queues]
    declared = app.conf.task_queues
    if isinstance(declared, dict):
        return [str(name) for name in declared]
    if declared:
        return [str(getattr(queue, "name", queue)) for queue in declared]
    return [app.conf.task_default_queue or "celery"]


@contextmanager
def start_worker(app: Celery, concurrency: int = 1, pool: str = "solo",
                 loglevel: str | int = WORKER_LOGLEVEL, logfile: str | None = None,
                 perform_ping_check: bool = True, ping_task_timeout: float = 10.0,
                 shutdown_timeout: float = 10.0, **kwargs: Any) -> Iterator[TestWorkController]:
    """Run a worker for ``app`` in a thread for the block (Celery's ``start_worker``).

    With ``perform_ping_check`` the block starts once the worker answered ``celery.ping``.
    At the end the worker stops gracefully: tasks still running get ``shutdown_timeout``
    seconds, then go back to the queue; RuntimeError if the thread is still alive then.
    Also accepted: ``hostname``, ``queues``, and the akadze_core ``Worker`` options
    ``poll_interval``, ``heartbeat_interval``, ``heartbeat_ttl``, ``fair``; Celery's other
    WorkController options (``without_heartbeat``, ...) are accepted and ignored.
    """
    test_worker_starting.send(sender=app)
    controller: TestWorkController | None = None
    try:
        controller = _make_controller(app, concurrency, pool, loglevel, logfile,
                                      shutdown_timeout, kwargs)
        controller.start()
        try:
            controller.ensure_started()
            if perform_ping_check:
                assert "celery.ping" in app.tasks
                answer = app.tasks["celery.ping"].delay().get(timeout=ping_task_timeout)
                assert answer == "pong", f"celery.ping answered {answer!r}"
            yield controller
        finally:
            # A grace period on top of the worker's own: it hands back unfinished jobs and
            # unregisters after shutdown_timeout.
            controller.stop(shutdown_timeout + 10.0)
            signals.worker_shutdown.send(sender=controller)
    finally:
        test_worker_stopped.send(sender=app, worker=controller)


def _make_controller(app: Celery, concurrency: int, pool: str, loglevel: str | int,
                     logfile: str | None, shutdown_timeout: float,
                     options: dict[str, Any]) -> TestWorkController:
    # Celery's setup_app_for_worker: the worker's app is the current and default one, so
    # shared tasks called in the test go to it.
    app.set_current()
    app.set_default()
    # Celery's default, which its suites look for in inspect() replies.
    hostname = str(options.pop("hostname", None) or anon_nodename())
    if pool not in ("solo", "threads"):
        logger.info("pool %r runs as 'threads' in the embedded test worker", pool)
        pool = "threads"
    bodies = 1 if pool == "solo" else max(1, int(concurrency))
    core_options = {name: options.pop(name) for name in
                    ("poll_interval", "heartbeat_interval", "heartbeat_ttl", "fair")
                    if name in options}
    # Short enough that a countdown task or a missed wake-up costs a test little.
    core_options.setdefault("poll_interval", 0.2)
    queues = _queues(app, options.pop("queues", None))
    core = app.prepare_worker()
    # Celery's start_worker checks the broker connection first; the schema is this
    # broker's "queue declared".
    ensure_schema(core.database_url)
    worker = Worker(core, queues=queues, slots=bodies, max_running=bodies, name=hostname,
                    shutdown_timeout=shutdown_timeout, concurrency=bodies,
                    # One line per finished task is noise in a test's captured log.
                    outcome_log_level=logging.DEBUG, **core_options)
    controller = TestWorkController(app, worker, hostname, pool, bodies, loglevel, logfile)
    # app.control / inspect answered as by ``akadze-compat worker``: Celery's test Manager
    # (t/integration) waits for inspect().active() to come back empty after each test.
    control.install(worker, app, hostname, controller)
    signals.worker_init.send(sender=controller)
    if pool == "solo":
        signals.worker_process_init.send(sender=hostname)
    return controller
