"""``celery.worker.control``: the remote-control commands a worker answers, and the decorators
that register more (``control_command`` / ``inspect_command``).

Celery's worker answers them from its memory; here each live worker answers in its loop,
reached through the database (``akadze_core.ops.control``), from what it holds (the jobs it
runs and has claimed ahead, its queues, its pool) and, where the database is the truth,
from the database: ``scheduled`` lists the jobs waiting for their eta (each under one of the
live workers consuming its queue, so the replies add up to every one), ``revoked`` the tasks
revoked in the last three hours (Celery's ``REVOKE_EXPIRES``), the same list on every
worker as in Celery, where every worker hears every revoke.

A command is ``fun(state, **arguments)`` as in Celery; ``state`` has ``app``, ``hostname``,
``consumer`` (``consumer.controller`` is the worker's ``WorkController``) and ``worker``,
akadze's worker. A plain function runs in a thread (it may block: query the database,
call a service); an ``async def`` one runs in the worker's loop.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import resource
import threading
import time
from collections import namedtuple
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from akadze_core import Job
from akadze_core.integration import NO_REPLY, revoked_task_ids, scheduled_jobs

from ..app.defaults import TO_NEW_NAME
from ..utils.time import rate

if TYPE_CHECKING:
    from akadze_core import Worker

__all__ = ["Panel", "control_command", "inspect_command", "install", "request_info"]

logger = logging.getLogger("celery.worker.control")

#: Celery's ``registered`` default attributes.
DEFAULT_TASK_INFO_ITEMS = ("exchange", "routing_key", "rate_limit")
#: Celery's worker keeps revoked ids this long (``REVOKE_EXPIRES``), at most this many.
REVOKE_EXPIRES = 10800.0
REVOKES_MAX = 50000
#: At most this many eta jobs per ``scheduled`` reply.
SCHEDULED_MAX = 1000

controller_info_t = namedtuple("controller_info_t", [
    "alias", "type", "visible", "default_timeout", "help", "signature", "args", "variadic"])


def ok(value: Any) -> dict[str, Any]:
    """Celery's success reply."""
    return {"ok": value}


def nok(value: Any) -> dict[str, Any]:
    """Celery's error reply."""
    return {"error": value}


class Panel:
    """The registry of remote-control commands (Celery's ``Panel``): ``data`` (name ->
    function) and ``meta`` (name -> ``controller_info_t``), shared by every worker and by
    the ``inspect``/``control`` commands' argument parsing."""

    data: ClassVar[dict[str, Callable[..., Any]]] = {}
    meta: ClassVar[dict[str, controller_info_t]] = {}

    @classmethod
    def register(cls, *args: Any, **kwargs: Any) -> Any:
        """Register a command: ``Panel.register(fun)`` or ``@Panel.register(name=...)``."""
        if args:
            return cls._register(**kwargs)(*args)
        return cls._register(**kwargs)

    @classmethod
    def _register(cls, name: str | None = None, alias: str | None = None,
                  type: str = "control", visible: bool = True, default_timeout: float = 1.0,
                  help: str | None = None, signature: str | None = None,
                  args: Iterable[tuple[str, Any]] | None = None,
                  variadic: str | None = None) -> Callable[[Callable[..., Any]], Any]:
        def inner(fun: Callable[..., Any]) -> Callable[..., Any]:
            control_name = name or fun.__name__
            text = help or (fun.__doc__ or "").strip().split("\n")[0]
            cls.data[control_name] = fun
            cls.meta[control_name] = controller_info_t(
                alias, type, visible, default_timeout, text, signature,
                list(args) if args is not None else None, variadic)
            if alias:
                cls.data[alias] = fun
            return fun
        return inner


def control_command(**kwargs: Any) -> Any:
    """Register a control command (it acts): ``@control_command(args=[("n", int)])``."""
    return Panel.register(type="control", **kwargs)


def inspect_command(**kwargs: Any) -> Any:
    """Register an inspect command (it only reads)."""
    return Panel.register(type="inspect", **kwargs)


class Consumer:
    """What commands find at ``state.consumer``: the worker's controller, app and pool."""

    def __init__(self, app: Any, hostname: str, controller: Any, worker: Worker) -> None:
        self.app = app
        self.hostname = hostname
        self.controller = controller
        self.pool = getattr(controller, "pool", None)
        #: akadze's worker (claims, queues, slots).
        self.worker = worker
        #: Celery's consumer has no task consumer before it starts; queues are here.
        self.task_consumer = None


class ControlState:
    """``state``, the first argument of every command (Celery's pidbox state)."""

    def __init__(self, app: Any, hostname: str, controller: Any, worker: Worker) -> None:
        self.app = app
        self.hostname = hostname
        self.consumer = Consumer(app, hostname, controller, worker)
        #: akadze's worker.
        self.worker = worker
        #: The jobs the worker held when the request came, by id: True when started.
        self.running: dict[int, bool] = {}
        self.started = time.monotonic()
        #: The event groups a Celery worker's dispatcher would send (empty: all), None
        #: where it would have no dispatcher: what ``enable_events``/``disable_events``
        #: change and answer from. akadze has no event stream, so they change nothing else.
        self.event_groups: set[str] | None = set()
        #: Celery's Lamport clock counts the events and messages a worker saw; there are
        #: none here, so this one counts the control requests answered (always > 0).
        self.clock = 0
        self._clock_lock = threading.Lock()

    def tick(self) -> int:
        """Advance the logical clock and return it."""
        with self._clock_lock:
            self.clock += 1
            return self.clock

    @staticmethod
    def tset(items: Iterable[Any]) -> set[Any]:
        """Celery's copy of a set taken in the worker's thread."""
        return set(items)


def _conf(app: Any, key: str) -> Any:
    conf = getattr(app, "conf", None)
    return conf.get(key) if conf is not None else None


def event_groups(app: Any, options: Mapping[str, Any]) -> set[str] | None:
    """The groups a Celery worker started with ``options`` would send events of (Celery's
    ``Events`` bootstep): all (an empty set) with ``-E``/``worker_send_task_events``, else
    the worker's own; None (no dispatcher) when neither task events, nor gossip, nor
    heartbeats are on."""
    task_events = options.get("task_events")
    if task_events is None:
        task_events = _conf(app, "worker_send_task_events")
    if not task_events and options.get("without_gossip") and options.get("without_heartbeat"):
        return None
    return set() if task_events else {"worker"}


def install(worker: Worker, app: Any, hostname: str, controller: Any,
            options: Mapping[str, Any] | None = None) -> None:
    """Answer Celery's commands, and every command registered with ``control_command`` /
    ``inspect_command`` so far, on akadze's ``worker`` (started with the worker command's
    ``options``)."""
    state = ControlState(app, hostname, controller, worker)
    state.event_groups = event_groups(app, options or {})
    for name, fun in Panel.data.items():
        worker.control.commands[name] = _adapter(state, fun)


def _adapter(state: ControlState, fun: Callable[..., Any]) -> Callable[..., Any]:
    async def command(worker: Worker, **arguments: Any) -> Any:
        # Taken in the loop: the worker changes it there, the thread below only reads it.
        state.running = worker.running()
        state.tick()
        if inspect.iscoroutinefunction(fun):
            return await fun(state, **arguments)
        return await asyncio.to_thread(lambda: fun(state, **arguments))

    return command


#: The priority Celery's worker gives the timer entry of every ETA task (``scheduled``).
ETA_TIMER_PRIORITY = 6


# --- what a job looks like to Celery's inspect --------------------------------------------------

def request_info(job: Job, task_id: str, hostname: str | None,
                 pid: int | None) -> dict[str, Any]:
    """A job (known by ``task_id``: ``App.task_id_of``) as Celery's ``Request.info()``:
    what ``active``, ``reserved`` and ``query_task`` list."""
    args = job.args if isinstance(job.args, dict) else {}
    meta = job.meta.get("celery")
    sent: dict[str, Any] = meta if isinstance(meta, dict) else {}
    return {
        "id": task_id, "name": job.task,
        "args": args.get("args", []), "kwargs": args.get("kwargs", {}), "type": job.task,
        "hostname": hostname,
        "time_start": job.started_at.timestamp() if job.started_at else None,
        "acknowledged": job.state == "running",
        "delivery_info": {"exchange": sent.get("exchange") or "",
                          "routing_key": sent.get("routing_key") or job.queue,
                          "priority": job.priority, "redelivered": job.run_count > 1},
        "worker_pid": pid,
    }


def _held(state: ControlState, started: bool) -> list[Job]:
    ids = [job_id for job_id, running in state.running.items() if running == started]
    jobs = state.app.core.get_jobs(ids) if ids else {}
    return [jobs[job_id] for job_id in ids if job_id in jobs]


def _pid(state: ControlState) -> int:
    pool = state.worker.process_pool
    return pool.pids[0] if pool is not None and pool.pids else os.getpid()


# --- inspect commands -------------------------------------------------------------------------

@inspect_command(default_timeout=0.2)
async def ping(state: ControlState, **kwargs: Any) -> Any:
    """Ping worker(s)."""
    return ok("pong")


@inspect_command()
def report(state: ControlState, **kwargs: Any) -> Any:
    """Information about Celery installation for bug reports."""
    return ok(state.app.bugreport())


@inspect_command()
def clock(state: ControlState, **kwargs: Any) -> Any:
    """Get current logical clock value."""
    return {"clock": state.tick()}


@inspect_command(alias="dump_active")
def active(state: ControlState, safe: bool = False, **kwargs: Any) -> Any:
    """List of tasks currently being executed."""
    task_id_of = state.app.core.task_id_of
    info = []
    for job in _held(state, started=True):
        entry = request_info(job, task_id_of(job), state.hostname, _pid(state))
        entry["acknowledged"] = True
        info.append(entry)
    return info


@inspect_command(alias="dump_reserved")
def reserved(state: ControlState, **kwargs: Any) -> Any:
    """List of currently reserved tasks, not including scheduled/active."""
    task_id_of = state.app.core.task_id_of
    info = []
    for job in _held(state, started=False):
        entry = request_info(job, task_id_of(job), state.hostname, None)
        entry["acknowledged"] = False
        entry["time_start"] = None
        info.append(entry)
    return info


@inspect_command(alias="dump_schedule")
def scheduled(state: ControlState, **kwargs: Any) -> Any:
    """List of currently scheduled ETA/countdown tasks."""
    task_id_of = state.app.core.task_id_of
    worker = state.worker
    jobs = scheduled_jobs(state.app.core, worker.worker_id, worker.queues, SCHEDULED_MAX)
    # "priority" is that of Celery's ETA timer entry, which is always 6 (the task's own
    # priority is in delivery_info).
    return [{"eta": job.scheduled_at.isoformat(), "priority": ETA_TIMER_PRIORITY,
             "request": {**request_info(job, task_id_of(job), state.hostname, None),
                         "time_start": None,
                         "acknowledged": False}}
            for job in jobs]


@inspect_command(alias="dump_revoked")
def revoked(state: ControlState, **kwargs: Any) -> Any:
    """List of revoked task-ids."""
    return revoked_task_ids(state.app.core, REVOKE_EXPIRES, REVOKES_MAX)


@inspect_command(variadic="ids", signature="[id1 [id2 [... [idN]]]]")
def query_task(state: ControlState, ids: Any, **kwargs: Any) -> Any:
    """Query for task information by id."""
    task_id_of = state.app.core.task_id_of
    wanted = {ids} if isinstance(ids, str) else {str(one) for one in ids or ()}
    found: dict[str, Any] = {}
    for started in (True, False):
        for job in _held(state, started):
            info = request_info(job, task_id_of(job), state.hostname,
                                _pid(state) if started else None)
            if info["id"] in wanted:
                found[info["id"]] = ["active" if started else "reserved", info]
    return found


@inspect_command(alias="dump_tasks", variadic="taskinfoitems",
                 signature="[attr1 [attr2 [... [attrN]]]]")
def registered(state: ControlState, taskinfoitems: Any = None, builtins: bool = False,
               **kwargs: Any) -> Any:
    """List of registered tasks."""
    tasks = state.app.tasks
    items = taskinfoitems or DEFAULT_TASK_INFO_ITEMS

    def describe(name: str) -> str:
        task = tasks[name]
        fields = {field: str(getattr(task, field, None)) for field in items
                  if getattr(task, field, None) is not None}
        if fields:
            return "{} [{}]".format(name, " ".join("=".join(pair) for pair in fields.items()))
        return name

    return [describe(name) for name in sorted(tasks)
            if builtins or not name.startswith("celery.")]


@inspect_command()
def stats(state: ControlState, **kwargs: Any) -> Any:
    """Request worker statistics/information."""
    worker = state.worker
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "total": dict(sorted(worker.accepted.items())),
        "pid": os.getpid(),
        "clock": str(state.clock),
        # Celery rounds the seconds since the worker started.
        "uptime": round(time.monotonic() - state.started),
        "pool": _pool_info(state),
        "broker": _broker(state.app),
        "prefetch_count": sum(worker.slots.get(queue, 0) for queue in worker.queues),
        "rusage": {name[3:]: getattr(usage, name) for name in dir(usage)
                   if name.startswith("ru_")},
    }


def _pool_info(state: ControlState) -> dict[str, Any]:
    """Celery's pool section, for the pool the worker runs (``-P``)."""
    worker = state.worker
    kind = getattr(state.consumer.controller, "pool_cls", "threads")
    conf = state.app.conf
    if worker.process_pool is not None:
        return {"implementation": "akadze:prefork",
                "max-concurrency": worker.process_pool.processes,
                "processes": worker.process_pool.pids,
                "max-tasks-per-child": getattr(state.consumer.controller,
                                               "max_tasks_per_child", None) or "N/A",
                "put-guarded-by-semaphore": False,
                "timeouts": [conf.get("task_soft_time_limit") or 0,
                             conf.get("task_time_limit") or 0],
                "writes": "N/A"}
    if kind == "solo":
        return {"implementation": "akadze:solo", "max-concurrency": 1,
                "processes": [os.getpid()], "max-tasks-per-child": None,
                "put-guarded-by-semaphore": True, "timeouts": []}
    bodies = worker.concurrency or worker.max_running or 1
    return {"implementation": f"akadze:{kind}", "max-concurrency": bodies, "threads": bodies}


def _broker(app: Any) -> dict[str, Any]:
    """Celery's broker section, for the database (no password)."""
    parts = urlsplit(app.core.database_url)
    return {"hostname": parts.hostname or "", "userid": parts.username or "",
            "virtual_host": parts.path.lstrip("/"), "port": parts.port or 5432,
            "insist": False, "ssl": False, "transport": "postgresql",
            "connect_timeout": 4, "transport_options": {}, "login_method": None,
            "uri_prefix": None, "heartbeat": 0.0, "failover_strategy": None,
            "alternates": [], "credential_provider": None}


@inspect_command()
def active_queues(state: ControlState, **kwargs: Any) -> Any:
    """List the task queues a worker is currently consuming from."""
    return [_queue_info(name) for name in state.worker.queues]


def _queue_info(name: str) -> dict[str, Any]:
    """A queue as kombu's ``Queue.as_dict(recurse=True)`` for an automatic queue."""
    exchange = {"name": name, "type": "direct", "arguments": None, "durable": True,
                "passive": False, "auto_delete": False, "delivery_mode": None,
                "no_declare": False}
    return {"name": name, "exchange": exchange, "routing_key": name,
            "queue_arguments": None, "binding_arguments": None, "consumer_arguments": None,
            "durable": True, "exclusive": False, "auto_delete": False, "no_ack": False,
            "alias": None, "bindings": [], "no_declare": None, "expires": None,
            "message_ttl": None, "max_length": None, "max_length_bytes": None,
            "max_priority": None}


@inspect_command(alias="dump_conf", signature="[include_defaults=False]",
                 args=[("with_defaults", lambda value: str(value).lower() in
                        ("1", "true", "yes", "y", "on"))])
def conf(state: ControlState, with_defaults: bool = False, **kwargs: Any) -> Any:
    """List configuration."""
    table = state.app.conf.table(with_defaults=with_defaults)
    answer = {key: _plain(value) for key, value in table.items()
              if isinstance(key, str) and not key.startswith("__")}
    # Celery's settings object stores the old-style names it was given under this key
    # (None when there were none), so its conf() answer always carries it.
    answer.setdefault("deprecated_settings", _plain(_deprecated_names(table)))
    return answer


def _deprecated_names(table: dict[str, Any]) -> set[str] | None:
    """The old-style setting names (``CELERY_RESULT_BACKEND``...) among ``table``'s."""
    found = {key for key in table if isinstance(key, str) and key in TO_NEW_NAME}
    return found or None


def _plain(value: Any) -> Any:
    """A setting as JSON: containers kept, other values their repr (Celery's jsonify)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return repr(value)  # a set too, as Celery's jsonify leaves it to repr


# --- control commands ---------------------------------------------------------------------------

@control_command()
async def shutdown(state: ControlState, msg: str = "Got shutdown from remote",
                   **kwargs: Any) -> Any:
    """Shutdown worker(s)."""
    logger.warning(msg)
    # As Celery's: the worker stops (warm) and the sender gets no reply from it.
    state.worker.control.after_reply(state.worker.request_stop)
    return NO_REPLY


@control_command()
def enable_events(state: ControlState, **kwargs: Any) -> Any:
    """Tell worker(s) to send task-related events."""
    groups = state.event_groups
    if groups is None:
        return nok("event dispatcher unavailable")
    if groups and "task" not in groups:
        groups.add("task")
        logger.info("Events of group {task} enabled by remote.")
        return ok("task events enabled")
    return ok("task events already enabled")


@control_command()
def disable_events(state: ControlState, **kwargs: Any) -> Any:
    """Tell worker(s) to stop sending task-related events."""
    groups = state.event_groups
    if groups is None:
        return nok("event dispatcher unavailable")
    if "task" in groups:
        groups.discard("task")
        logger.info("Events of group {task} disabled by remote.")
        return ok("task events disabled")
    return ok("task events already disabled")


@control_command(args=[("n", int)], signature="[N=1]")
async def pool_grow(state: ControlState, n: int = 1, **kwargs: Any) -> Any:
    """Grow pool by n processes/threads."""
    return _resize(state, int(n), "grow")


@control_command(args=[("n", int)], signature="[N=1]")
async def pool_shrink(state: ControlState, n: int = 1, **kwargs: Any) -> Any:
    """Shrink pool by n processes/threads."""
    return _resize(state, -int(n), "shrink")


def _resize(state: ControlState, delta: int, verb: str) -> Any:
    worker = state.worker
    kind = "prefork" if worker.process_pool is not None \
        else getattr(state.consumer.controller, "pool_cls", "threads")
    if kind in ("prefork", "solo") or worker.concurrency is None:
        return nok(f"pool_{verb} is not supported by the {kind} pool here (the threads pool "
                   f"supports it): restart the worker with another -c")
    bodies = max(1, worker.concurrency + delta)
    window = worker.max_running or bodies
    # Celery's prefetch moves by the multiplier per process; the window here is the slots.
    per_body = max(1, window // max(1, worker.concurrency))
    worker.resize(bodies, slots=bodies * per_body, max_running=bodies * per_body)
    logger.info("pool now runs %d tasks at once", bodies)
    return ok(f"pool will {verb}")


@control_command(args=[("queue", str), ("exchange", str), ("exchange_type", str),
                       ("routing_key", str)],
                 signature="<queue> [exchange [type [routing_key]]]")
async def add_consumer(state: ControlState, queue: str, exchange: str | None = None,
                       exchange_type: str | None = None, routing_key: str | None = None,
                       **options: Any) -> Any:
    """Tell worker(s) to consume from task queue by name."""
    if await state.worker.add_queue(queue):
        logger.info("Started consuming from %s", queue)
    return ok(f"add consumer {queue}")


@control_command(args=[("queue", str)], signature="<queue>")
async def cancel_consumer(state: ControlState, queue: str, **kwargs: Any) -> Any:
    """Tell worker(s) to stop consuming from task queue by name."""
    await state.worker.remove_queue(queue)
    return ok(f"no longer consuming from {queue}")


@control_command(args=[("task_name", str), ("soft", float), ("hard", float)],
                 signature="<task_name> <soft_secs> [hard_secs]")
def time_limit(state: ControlState, task_name: str | None = None, hard: float | None = None,
               soft: float | None = None, **kwargs: Any) -> Any:
    """Tell worker(s) to modify the time limit for task by type."""
    task = state.app.tasks.get(task_name)
    if task is None:
        logger.error("Change time limit attempt for unknown task %s", task_name)
        return nok("unknown task")
    task.soft_time_limit = soft
    task.time_limit = hard
    logger.info("New time limits for tasks of type %s: soft=%s hard=%s", task_name, soft, hard)
    if state.worker.process_pool is not None:
        return ok("time limits set successfully (in this process: prefork children keep "
                  "the limits they started with until they are replaced)")
    return ok("time limits set successfully")


@control_command(args=[("task_name", str), ("rate_limit", str)],
                 signature="<task_name> <rate_limit (e.g., 5/s | 5/m | 5/h)>")
def rate_limit(state: ControlState, task_name: str, rate_limit: Any, **kwargs: Any) -> Any:
    """Tell worker(s) to modify the rate limit for a task by type (the limit itself is
    global, in the database: ``app.control.rate_limit`` sets it before it broadcasts)."""
    try:
        rate(rate_limit)
    except ValueError as exc:
        return nok(f"Invalid rate limit string: {exc!r}")
    task = state.app.tasks.get(task_name)
    if task is None:
        logger.error("Rate limit attempt for unknown task %s", task_name)
        return nok("unknown task")
    task.rate_limit = rate_limit
    if not rate_limit:
        return ok("rate limit disabled successfully")
    logger.info("New rate limit for tasks of type %s: %s", task_name, rate_limit)
    return ok("new rate limit set successfully")
