"""Flower's HTTP API and Prometheus series, served by ``akadze-compat flower`` beside the
dashboard's pages.

The paths, parameters, status codes and JSON shapes are Flower 2.2's (``flower/api``): a
script or a Grafana dashboard written for Flower keeps working. What Flower learns from the
event stream comes here from the database: the tasks from the jobs table (the newest
``TASK_WINDOW`` jobs, as Flower keeps its last ``max_tasks`` in memory), the workers' details
from the workers themselves (``inspect``, as Flower asks them), the controls through their
remote control. The API sits behind the dashboard's own rules (``Dashboard.api``):
credentials as Flower's ``--basic-auth`` (or a bearer token), no action from a browser on
another site, none in read-only mode.

Every name and id that comes in is checked (not empty, not longer than ``MAX_NAME``, no
control characters) and answered 400 otherwise; a task is looked up in the app's registry,
never imported, and nothing read from a row is imported or evaluated.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import threading
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import parse_qs

import psycopg

from akadze_core import Job, integration
from akadze_core.integration import load_queries, run_statement_sync, signal_number

from . import states
from .backends.base import celery_meta, failure_traceback, job_result, job_state, lookup_job
from .contrib.abortable import AbortableAsyncResult
from .exceptions import TimeoutError as CeleryTimeoutError
from .serialization import revive

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute

    from .app.base import Celery

logger = logging.getLogger("akadze.flower")

#: The newest jobs the task list and task types look at (Flower's ``--max_tasks`` default).
TASK_WINDOW = 100_000
#: The most tasks one ``/api/tasks`` answer lists when no ``limit`` is given.
LIST_CAP = 10_000
#: The longest task name, task id, worker name, queue name or rate accepted.
MAX_NAME = 255
#: The longest ``search`` (Flower's MAX_QUERY_LENGTH).
MAX_SEARCH = 2048
#: The longest wait ``/api/task/result?timeout=`` and ``apply`` options may ask for.
MAX_WAIT = 300.0
#: Seconds the API waits for workers' replies (Flower's ``--inspect_timeout``, 1 s).
INSPECT_TIMEOUT = 1.0
#: Flower's inspect calls, and the ones only made for one named worker.
INSPECT_METHODS = ("stats", "active_queues", "registered", "scheduled", "active", "reserved",
                   "revoked", "conf")
TASK_INSPECT_METHODS = ("scheduled", "active", "reserved", "revoked")
#: The sort keys of ``/api/tasks?sort_by=`` (a leading ``-``: descending).
SORT_KEYS = frozenset({"name", "state", "received", "started"})
#: ``eta``/``expires`` as Flower parses them in an apply's options.
DATE_FORMAT = "%Y-%m-%d %H:%M:%S.%f"
#: The options an apply may pass to ``apply_async``/``send_task`` (others: 400).
APPLY_OPTIONS = frozenset({"queue", "routing_key", "exchange", "priority", "countdown", "eta",
                           "expires", "task_id", "time_limit", "soft_time_limit", "shadow",
                           "ignore_result", "retries"})
#: A Celery state as the job states it can be (a filter of the task list).
STATE_FILTER = {
    states.PENDING: ["queued", "waiting"], states.RETRY: ["queued", "running"],
    states.RECEIVED: ["running"], states.STARTED: ["running"],
    states.SUCCESS: ["succeeded"], states.FAILURE: ["failed"], states.REVOKED: ["cancelled"],
}
#: Seconds a finished job is left before the metrics count it: its finished_at is its
#: transaction's start, so one committing now may carry an earlier time.
METRICS_LAG = 2.0
#: The most finished jobs per final state one scrape adds to the counters (the rest wait
#: for the next scrape).
METRICS_BATCH = 20_000
#: Flower's ``--task_runtime_metric_buckets`` default (prometheus_client's).
RUNTIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                   7.5, 10.0, math.inf)
_TRUE = ("y", "yes", "t", "true", "on", "1")
_FALSE = ("n", "no", "f", "false", "off", "0")


def _queries() -> dict[str, str]:
    return load_queries("akadze_compat", "sql/flower.sql")


def _run(connection: psycopg.Connection, name: str, /, **params: Any) -> list[dict[str, Any]]:
    return run_statement_sync(connection, _queries()[name], **params)


class HTTPError(Exception):
    """An answer other than 200: ``status`` and a plain-text ``message`` (Flower's)."""

    def __init__(self, status: int, message: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def checked(value: str, what: str) -> str:
    """``value`` as a name or id: 400 when empty, longer than ``MAX_NAME`` or holding a
    control character (the value is not echoed)."""
    if not value:
        raise HTTPError(400, f"Missing {what}")
    if len(value) > MAX_NAME:
        raise HTTPError(400, f"Invalid {what}: longer than {MAX_NAME} characters")
    if any(ord(char) < 32 or 0x7F <= ord(char) < 0xA0 for char in value):
        raise HTTPError(400, f"Invalid {what}: control characters")
    return value


def _truth(value: str, name: str) -> bool:
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise HTTPError(400, f"Invalid argument '{name}' of type 'bool'")


class Arguments:
    """A request's arguments as Flower's ``get_argument`` reads them: the query string,
    then a urlencoded body; the last value of a name wins."""

    def __init__(self, request: Request, body: bytes) -> None:
        self.values: dict[str, str] = {}
        for key, value in request.query_params.multi_items():
            self.values[key] = value
        kind = request.headers.get("content-type", "")
        if body and kind.startswith("application/x-www-form-urlencoded"):
            for key, values in parse_qs(body.decode("utf-8", "replace"),
                                        keep_blank_values=True).items():
                self.values[key] = values[-1]

    def text(self, name: str, default: str | None = None, *, required: bool = False
             ) -> str | None:
        """The argument ``name`` (stripped), ``default`` when absent; 400 when required
        and missing."""
        value = self.values.get(name)
        value = value.strip() if value is not None else default
        if required and not value:
            raise HTTPError(400, f"Missing argument {name}")
        return value

    def number(self, name: str, kind: type[int] | type[float], default: Any = None, *,
               required: bool = False) -> Any:
        """The argument ``name`` as ``kind``; 400 when it is not one."""
        value = self.text(name, required=required)
        if value is None:
            return default
        try:
            number = kind(value)
        except ValueError:
            raise HTTPError(400, f"Invalid argument '{name}' of type "
                                 f"'{kind.__name__}'") from None
        if isinstance(number, float) and not math.isfinite(number):
            raise HTTPError(400, f"Invalid argument '{name}' of type 'float'")
        return number

    def flag(self, name: str) -> bool:
        """The argument ``name`` as Flower's ``strtobool`` reads it (absent: False)."""
        value = self.text(name)
        return False if value is None else _truth(value, name)


def _epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    return value.isoformat() if isinstance(value, datetime) else str(value)


def safe_result(value: Any) -> Any:
    """A result as Flower writes it: itself when JSON takes it, else its ``repr``."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def _text_repr(value: Any) -> str | None:
    """Arguments and results as a worker's events carry them: their ``repr``."""
    return None if value is None else repr(value)


def task_fields(job: Job, task_id: str, worker: str | None, track_started: bool = True,
                task_id_of: Callable[[int], str] | None = None) -> dict[str, Any]:
    """A job as Flower's task (``celery.events.state.Task.as_dict``): its fields in that
    order, the times as epoch seconds, args, kwargs and result as their repr. A running
    job is STARTED (Flower learns it from the task-started event, whatever
    ``track_started`` says)."""
    state = job_state(job, track_started)
    meta = celery_meta(job)
    call = job.args if isinstance(job.args, dict) else {}
    finished = _epoch(job.finished_at)
    started = _epoch(job.started_at)
    result: Any = None
    exception = traceback = None
    if state == states.SUCCESS:
        result = _text_repr(revive(job.result))
    elif state in (states.FAILURE, states.RETRY, states.REVOKED):
        failure = job_result(job, state, task_id_of)
        exception = repr(failure) if failure is not None else None
        traceback = failure_traceback(job) if state != states.REVOKED else None
    runtime = (finished - started) if state == states.SUCCESS and finished is not None \
        and started is not None else None
    root_id = meta.get("root_id") or task_id
    parent_id = meta.get("parent_id")
    timestamp = finished or started or _epoch(job.created_at)
    return {
        "uuid": task_id, "name": job.task, "state": state,
        "received": _epoch(job.created_at), "sent": None,
        "started": started if job.started_at is not None else None,
        "rejected": None,
        "succeeded": finished if state == states.SUCCESS else None,
        "failed": finished if state == states.FAILURE else None,
        "retried": None,
        "revoked": finished if state == states.REVOKED else None,
        "args": _text_repr(revive(call.get("args", []))),
        "kwargs": _text_repr(revive(call.get("kwargs", {}))),
        "eta": _iso(meta.get("eta")), "expires": _iso(job.expires_at),
        "retries": max(0, job.attempt - 1) if job.state != "queued" else job.attempt,
        "worker": worker, "result": result, "exception": exception,
        "timestamp": timestamp, "runtime": runtime, "traceback": traceback,
        "exchange": None, "routing_key": None, "clock": job.run_count, "client": None,
        "root": root_id, "root_id": root_id, "parent": parent_id, "parent_id": parent_id,
        "children": [],
    }


class FlowerApi:
    """The API's handlers for one dashboard and its Celery app; ``routes()`` lists them."""

    def __init__(self, app: Celery, dashboard: Any) -> None:
        self.app = app
        self.dashboard = dashboard
        #: Worker name -> what ``inspect`` said (Flower's ``application.workers``).
        self.workers: dict[str, dict[str, Any]] = defaultdict(dict)
        self.metrics = FlowerMetrics()

    # --- plumbing ---------------------------------------------------------------------------

    def routes(self) -> list[BaseRoute]:
        """Flower's API paths, each behind ``Dashboard.api``; ``/metrics`` with Flower's
        series added."""
        from starlette.routing import Route  # the dashboard extra, needed only here

        api = self.dashboard.api

        def get(path: str, handler: Callable[..., Awaitable[Any]]) -> Route:
            return Route(path, api(self._json(handler)), methods=["GET"])

        def post(path: str, handler: Callable[..., Awaitable[Any]]) -> Route:
            return Route(path, api(self._json(handler), action=True), methods=["POST"])

        return [
            get("/api/workers", self.list_workers),
            post("/api/worker/shutdown/{name:path}", self.worker_shutdown),
            post("/api/worker/pool/restart/{name:path}", self.pool_restart),
            post("/api/worker/pool/grow/{name:path}", self.pool_grow),
            post("/api/worker/pool/shrink/{name:path}", self.pool_shrink),
            post("/api/worker/pool/autoscale/{name:path}", self.pool_autoscale),
            post("/api/worker/queue/add-consumer/{name:path}", self.add_consumer),
            post("/api/worker/queue/cancel-consumer/{name:path}", self.cancel_consumer),
            get("/api/tasks", self.list_tasks),
            get("/api/task/types", self.task_types),
            get("/api/task/info/{name:path}", self.task_info),
            post("/api/task/apply/{name:path}", self.task_apply),
            post("/api/task/async-apply/{name:path}", self.task_async_apply),
            post("/api/task/send-task/{name:path}", self.task_send),
            get("/api/task/result/{name:path}", self.task_result),
            post("/api/task/abort/{name:path}", self.task_abort),
            post("/api/task/timeout/{name:path}", self.task_timeout),
            post("/api/task/rate-limit/{name:path}", self.task_rate_limit),
            post("/api/task/revoke/{name:path}", self.task_revoke),
            Route("/metrics", api(self.render_metrics), methods=["GET"]),
        ]

    def _json(self, handler: Callable[..., Awaitable[Any]]
              ) -> Callable[[Request], Awaitable[Response]]:
        """A handler of (arguments, path name) as an endpoint: its value as JSON, an
        ``HTTPError`` as its status and text; Flower's 401 when no credential guards the
        API and ``FLOWER_UNAUTHENTICATED_API`` does not say that is meant."""
        from starlette.responses import JSONResponse, PlainTextResponse, Response

        async def endpoint(request: Request) -> Response:
            try:
                if not self.dashboard.config.has_credentials and os.environ.get(
                        "FLOWER_UNAUTHENTICATED_API", "").strip().lower() not in _TRUE:
                    raise HTTPError(401, "FLOWER_UNAUTHENTICATED_API environment variable is "
                                         "required to enable API without authentication")
                body = await request.body() if request.method == "POST" else b""
                arguments = Arguments(request, body)
                name = request.path_params.get("name")
                value = await (handler(arguments, body, name) if name is not None
                               else handler(arguments, body))
            except HTTPError as exc:
                return PlainTextResponse(exc.message, status_code=exc.status)
            if isinstance(value, Response):
                return value
            return JSONResponse(value)
        return endpoint

    async def read(self, call: Callable[[psycopg.Connection], Any]) -> Any:
        """``call(connection)`` on the dashboard's pool, in the thread pool."""
        return await self.dashboard.read(call)

    async def worker_rows(self) -> list[dict[str, Any]]:
        """The registered workers: id, name, live."""
        return await self.read(lambda connection: _run(connection, "workers"))  # type: ignore[no-any-return]

    async def is_worker(self, name: str) -> bool:
        """Whether ``name`` is a worker Flower would know: inspected, or registered."""
        if name in self.workers:
            return True
        return any(row["name"] == name for row in await self.worker_rows())

    async def known_worker(self, name: str) -> str:
        """``name`` checked, 404 when no such worker."""
        checked(name, "worker name")
        if not await self.is_worker(name):
            raise HTTPError(404, f"Unknown worker '{name}'")
        return name

    def _refuse_read_only(self) -> None:
        if self.dashboard.config.read_only:
            raise HTTPError(403, "Read only mode is enabled")

    # --- workers ----------------------------------------------------------------------------

    def _inspect(self, method: str, workername: str | None) -> None:
        """One inspect call, its replies kept per worker (Flower's ``Inspector``)."""
        destination = [workername] if workername else None
        inspect = self.app.control.inspect(timeout=INSPECT_TIMEOUT, destination=destination)
        call = getattr(inspect, method)
        replies = call(safe=True) if method == "active" else call()
        for name, reply in (replies or {}).items():
            if method == "stats" and isinstance(reply, dict):
                broker = reply.get("broker")
                if isinstance(broker, dict):
                    broker.pop("alternates", None)
            info = self.workers[name]
            info[method] = reply
            info["timestamp"] = datetime.now(timezone.utc).timestamp()

    async def update_workers(self, workername: str | None) -> None:
        """Ask the workers (one, or all) what Flower asks them."""
        methods = INSPECT_METHODS if workername else tuple(
            method for method in INSPECT_METHODS if method not in TASK_INSPECT_METHODS)
        await asyncio.gather(*(asyncio.to_thread(self._inspect, method, workername)
                               for method in methods))

    async def list_workers(self, arguments: Arguments, body: bytes) -> Any:
        """``GET /api/workers``: what the workers said (``?refresh`` asks them again;
        ``?status`` lists name -> online; ``?workername`` one of them)."""
        refresh = arguments.flag("refresh")
        status = arguments.flag("status")
        workername = arguments.text("workername")
        if workername is not None:
            checked(workername, "worker name")
        if refresh or not self.workers:
            try:
                await self.update_workers(workername)
            except (psycopg.Error, OSError) as exc:
                raise HTTPError(503, f"Failed to update workers: {type(exc).__name__}") from None
        if status:
            return {row["name"]: bool(row["live"]) for row in await self.worker_rows()}
        if workername and not await self.is_worker(workername):
            raise HTTPError(404, f"Unknown worker '{workername}'")
        if workername:
            return {workername: self.workers.get(workername, {})}
        return dict(self.workers)

    async def _control(self, name: str, command: str, arguments: Mapping[str, Any],
                       done: Callable[[Any], str], failed: str) -> Any:
        """Send ``command`` to worker ``name`` and wait for its reply: ``{"message":
        done(ok)}``, or 403 with ``failed`` and the worker's reason (Flower's answers)."""
        response = await asyncio.to_thread(
            self.app.control.broadcast, command, arguments=dict(arguments),
            destination=[name], reply=True, timeout=INSPECT_TIMEOUT)
        reply = response[0].get(name) if response else None
        if isinstance(reply, dict) and "ok" in reply:
            return {"message": done(reply["ok"])}
        reason = reply.get("error", "Unknown reason") if isinstance(reply, dict) \
            else "Unknown reason"
        logger.error("%s on %s: %s", command, name, response)
        raise HTTPError(403, f"{failed}: {reason}")

    async def worker_shutdown(self, arguments: Arguments, body: bytes, name: str) -> Any:
        """``POST /api/worker/shutdown/<worker>``."""
        self._refuse_read_only()
        name = await self.known_worker(name)
        logger.info("Shutting down '%s' worker", name)
        await asyncio.to_thread(self.app.control.broadcast, "shutdown", destination=[name])
        return {"message": "Shutting down!"}

    async def pool_restart(self, arguments: Arguments, body: bytes, name: str) -> Any:
        """``POST /api/worker/pool/restart/<worker>``."""
        self._refuse_read_only()
        name = await self.known_worker(name)
        return await self._control(name, "pool_restart", {"reload": False},
                                   lambda ok: f"Restarting '{name}' worker's pool",
                                   f"Failed to restart the '{name}' pool")

    async def pool_grow(self, arguments: Arguments, body: bytes, name: str) -> Any:
        """``POST /api/worker/pool/grow/<worker>?n=1``."""
        self._refuse_read_only()
        name = await self.known_worker(name)
        n = arguments.number("n", int, 1)
        return await self._control(name, "pool_grow", {"n": n},
                                   lambda ok: f"Growing '{name}' worker's pool by {n}",
                                   f"Failed to grow '{name}' worker's pool")

    async def pool_shrink(self, arguments: Arguments, body: bytes, name: str) -> Any:
        """``POST /api/worker/pool/shrink/<worker>?n=1``."""
        self._refuse_read_only()
        name = await self.known_worker(name)
        n = arguments.number("n", int, 1)
        return await self._control(name, "pool_shrink", {"n": n},
                                   lambda ok: f"Shrinking '{name}' worker's pool by {n}",
                                   f"Failed to shrink '{name}' worker's pool")

    async def pool_autoscale(self, arguments: Arguments, body: bytes, name: str) -> Any:
        """``POST /api/worker/pool/autoscale/<worker>?min=&max=``."""
        self._refuse_read_only()
        name = await self.known_worker(name)
        low = arguments.number("min", int, required=True)
        high = arguments.number("max", int, required=True)
        return await self._control(
            name, "autoscale", {"min": low, "max": high},
            lambda ok: f"Autoscaling '{name}' worker (min={low}, max={high})",
            f"Failed to autoscale '{name}' worker")

    async def add_consumer(self, arguments: Arguments, body: bytes, name: str) -> Any:
        """``POST /api/worker/queue/add-consumer/<worker>?queue=``."""
        self._refuse_read_only()
        name = await self.known_worker(name)
        queue = checked(arguments.text("queue", required=True) or "", "queue")
        return await self._control(name, "add_consumer", {"queue": queue}, str,
                                   f"Failed to add '{queue}' consumer to '{name}' worker")

    async def cancel_consumer(self, arguments: Arguments, body: bytes, name: str) -> Any:
        """``POST /api/worker/queue/cancel-consumer/<worker>?queue=``."""
        self._refuse_read_only()
        name = await self.known_worker(name)
        queue = checked(arguments.text("queue", required=True) or "", "queue")
        return await self._control(name, "cancel_consumer", {"queue": queue}, str,
                                   f"Failed to cancel '{queue}' consumer from '{name}' worker")

    # --- tasks: reading ---------------------------------------------------------------------

    def _task_of(self, row: dict[str, Any], codec: Any) -> tuple[str, dict[str, Any]]:
        job = Job.from_row(row)
        task_id = codec.of(job.id, job.meta)
        return task_id, task_fields(job, task_id, row.get("worker_name"),
                                    True)

    async def list_tasks(self, arguments: Arguments, body: bytes) -> Any:
        """``GET /api/tasks``: the newest tasks, filtered and sorted as Flower's."""
        limit = arguments.number("limit", int)
        offset = max(arguments.number("offset", int, 0), 0)
        worker = arguments.text("workername")
        task = arguments.text("taskname")
        state = arguments.text("state")
        sort_by = arguments.text("sort_by")
        search = arguments.text("search")
        worker = None if worker in (None, "", "All") else checked(worker, "worker name")
        task = None if task in (None, "", "All") else checked(task, "task name")
        state = None if state in (None, "", "All") else checked(state, "state")
        if sort_by and sort_by.lstrip("-") not in SORT_KEYS:
            raise HTTPError(400, f"Invalid sort_by '{sort_by[:MAX_NAME]}', expected one of "
                                 f"{', '.join(sorted(SORT_KEYS))}")
        since = self._received(arguments.text("received_start"))
        until = self._received(arguments.text("received_end"))
        text, terms = self._search(search)
        worker = terms.get("worker", worker)
        task = terms.get("name", task)
        state = terms.get("state", state)
        job_states = None
        if state is not None:
            job_states = STATE_FILTER.get(state.upper(), [])
        params = {
            "window": TASK_WINDOW, "task": task, "states": job_states, "worker": worker,
            "since": since, "until": until, "text": text,
            "sort": (sort_by or "").lstrip("-") or "id",
            "descending": bool(sort_by and sort_by.startswith("-")),
            "limit": min(limit, LIST_CAP) if limit is not None and limit >= 0 else LIST_CAP,
            "offset": offset}

        def read(connection: psycopg.Connection) -> list[tuple[str, dict[str, Any]]]:
            codec = self.app.core.task_ids()
            listed = [self._task_of(row, codec) for row in _run(connection, "tasks", **params)]
            return [(task_id, fields) for task_id, fields in listed
                    if state is None or fields["state"] == state.upper()]

        tasks = await self.read(read)
        answer = {}
        for task_id, fields in tasks:
            if fields["worker"] is None:
                del fields["worker"]  # Flower lists a worker only when one is known
            answer[task_id] = fields
        return answer

    @staticmethod
    def _received(value: str | None) -> datetime | None:
        if not value:
            return None
        try:
            return datetime.strptime(value, "%Y-%m-%d %H:%M").replace(tzinfo=timezone.utc)
        except ValueError:
            raise HTTPError(400, "Invalid received_start or received_end, expected format "
                                 "'YYYY-MM-DD HH:MM'") from None

    @staticmethod
    def _search(search: str | None) -> tuple[str | None, dict[str, str]]:
        """A search as (text, {field: value}): ``name:``, ``state:`` and ``worker:`` terms
        filter on those fields; the other words must be in the task's name (or be its id)."""
        if not search:
            return None, {}
        if len(search) > MAX_SEARCH:
            raise HTTPError(400, f"Query exceeds {MAX_SEARCH} characters.")
        terms: dict[str, str] = {}
        words: list[str] = []
        for word in search.split():
            field, colon, value = word.partition(":")
            if colon and field in ("name", "state", "worker") and value:
                terms[field] = checked(value.strip("\"'"), field)
            else:
                words.append(word)
        return (" ".join(words) or None), terms

    async def task_types(self, arguments: Arguments, body: bytes) -> Any:
        """``GET /api/task/types``: the task names of the newest jobs."""
        rows = await self.read(lambda c: _run(c, "task_types", window=TASK_WINDOW))
        return {"task-types": [row["task"] for row in rows]}

    def _job(self, task_id: str) -> Job | None:
        return lookup_job(self.app.core, task_id)

    async def task_info(self, arguments: Arguments, body: bytes, name: str) -> Any:
        """``GET /api/task/info/<task id>``: the task, with ``worker`` its name."""
        task_id = checked(name, "task id")

        def read(connection: psycopg.Connection) -> dict[str, Any] | None:
            job = self._job(task_id)
            if job is None:
                return None
            worker = None
            if job.worker_id is not None:
                rows = _run(connection, "worker_of", id=job.worker_id)
                worker = rows[0]["name"] if rows else None
            return task_fields(job, task_id, worker, True)
        found = await self.read(read)
        if found is None:
            raise HTTPError(404, f"Unknown task '{task_id}'")
        return found

    async def task_result(self, arguments: Arguments, body: bytes, name: str) -> Any:
        """``GET /api/task/result/<task id>?timeout=``: state, and the result once ready."""
        task_id = checked(name, "task id")
        timeout = arguments.number("timeout", float)
        if timeout is not None:
            timeout = min(max(timeout, 0.0), MAX_WAIT)
        return await asyncio.to_thread(self._read_result, task_id, timeout)

    def _read_result(self, task_id: str, timeout: float | None) -> dict[str, Any]:
        result = self.app.AsyncResult(task_id)
        response: dict[str, Any] = {"task-id": task_id, "state": result.state}
        if timeout:
            try:
                result.get(timeout=timeout, propagate=False)
            except CeleryTimeoutError:
                return response
            response["state"] = result.state
            self._update_result(response, result)
        elif result.ready():
            self._update_result(response, result)
        return response

    @staticmethod
    def _update_result(response: dict[str, Any], result: Any) -> None:
        response["result"] = safe_result(result.result)
        if result.state == states.FAILURE:
            response["traceback"] = result.traceback

    # --- tasks: acting ----------------------------------------------------------------------

    @staticmethod
    def _task_args(body: bytes) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
        """Flower's JSON body: ``{"args": [...], "kwargs": {...}, options...}``."""
        try:
            options = json.loads(body) if body else {}
        except (ValueError, UnicodeDecodeError):
            raise HTTPError(400, "Invalid JSON body") from None
        if not isinstance(options, dict):
            raise HTTPError(400, "invalid options")
        args = options.pop("args", [])
        kwargs = options.pop("kwargs", {})
        if not isinstance(args, list):
            raise HTTPError(400, "args must be an array")
        if not isinstance(kwargs, dict):
            raise HTTPError(400, "kwargs must be an object")
        return args, kwargs, options

    @staticmethod
    def _normalize(options: dict[str, Any]) -> dict[str, Any]:
        """Flower's ``normalize_options``, and only the options an apply may pass."""
        unknown = sorted(set(options) - APPLY_OPTIONS)
        if unknown:
            raise HTTPError(400, "Invalid option")
        try:
            if "eta" in options:
                options["eta"] = datetime.strptime(str(options["eta"]), DATE_FORMAT)
            if "countdown" in options:
                options["countdown"] = min(float(options["countdown"]), 10 * 365 * 86400.0)
            if "expires" in options:
                try:
                    options["expires"] = float(options["expires"])
                except (TypeError, ValueError):
                    options["expires"] = datetime.strptime(str(options["expires"]),
                                                           DATE_FORMAT)
        except (TypeError, ValueError, OverflowError):
            raise HTTPError(400, "Invalid option") from None
        for key in ("queue", "routing_key", "exchange", "task_id", "shadow"):
            if key in options:
                if not isinstance(options[key], str):
                    raise HTTPError(400, "Invalid option")
                checked(options[key], key)
        return options

    def _registered(self, name: str) -> Any:
        task = self.app.tasks.get(checked(name, "task name"))
        if task is None:
            raise HTTPError(404, f"Unknown task '{name}'")
        return task

    async def _publish(self, send: Callable[..., Any], name: str, args: list[Any],
                       kwargs: dict[str, Any], options: dict[str, Any]) -> Any:
        try:
            return await asyncio.to_thread(lambda: send(args=args, kwargs=kwargs, **options))
        except (TypeError, ValueError) as exc:
            # Arguments JSON cannot carry, a bad priority: the caller's mistake.
            raise HTTPError(400, f"Cannot send '{name}': {type(exc).__name__}") from None

    async def task_apply(self, arguments: Arguments, body: bytes, name: str) -> Any:
        """``POST /api/task/apply/<task name>``: send it and wait for its result."""
        self._refuse_read_only()
        task = self._registered(name)
        args, kwargs, options = self._task_args(body)
        timeout = options.pop("timeout", None)
        try:
            timeout = min(float(timeout), MAX_WAIT) if timeout is not None else MAX_WAIT
        except (TypeError, ValueError):
            raise HTTPError(400, "Invalid timeout") from None
        options = self._normalize(options)
        result = await self._publish(task.apply_async, name, args, kwargs, options)
        response: dict[str, Any] = {"task-id": result.id}

        def wait() -> dict[str, Any]:
            try:
                result.get(propagate=False, timeout=timeout)
            except CeleryTimeoutError:
                response["state"] = result.state
                return response
            self._update_result(response, result)
            response["state"] = result.state
            return response
        return await asyncio.to_thread(wait)

    async def task_async_apply(self, arguments: Arguments, body: bytes, name: str) -> Any:
        """``POST /api/task/async-apply/<task name>``: send it; its id and state."""
        self._refuse_read_only()
        task = self._registered(name)
        args, kwargs, options = self._task_args(body)
        options = self._normalize(options)
        result = await self._publish(task.apply_async, name, args, kwargs, options)
        state = await asyncio.to_thread(lambda: result.state)
        return {"task-id": result.id, "state": state}

    async def task_send(self, arguments: Arguments, body: bytes, name: str) -> Any:
        """``POST /api/task/send-task/<task name>``: send by name (no registration needed:
        the worker that takes it must know it)."""
        self._refuse_read_only()
        name = checked(name, "task name")
        args, kwargs, options = self._task_args(body)
        options = self._normalize(options)
        result = await self._publish(lambda **kw: self.app.send_task(name, **kw), name, args,
                                     kwargs, options)
        state = await asyncio.to_thread(lambda: result.state)
        return {"task-id": result.id, "state": state}

    async def task_revoke(self, arguments: Arguments, body: bytes, name: str) -> Any:
        """``POST /api/task/revoke/<task id>?terminate=&signal=``."""
        self._refuse_read_only()
        task_id = checked(name, "task id")
        terminate = arguments.flag("terminate")
        signal = arguments.text("signal", "SIGTERM") or "SIGTERM"
        try:
            signal_number(signal)
        except ValueError:
            raise HTTPError(400, "Invalid argument 'signal'") from None
        logger.info("Revoking task '%s'", task_id)
        await asyncio.to_thread(self.app.control.revoke, task_id, terminate=terminate,
                                signal=signal)
        return {"message": f"Revoked '{task_id}'"}

    async def task_abort(self, arguments: Arguments, body: bytes, name: str) -> Any:
        """``POST /api/task/abort/<task id>``: ask an abortable task to stop."""
        self._refuse_read_only()
        task_id = checked(name, "task id")
        logger.info("Aborting task '%s'", task_id)
        await asyncio.to_thread(AbortableAsyncResult(task_id, app=self.app).abort)
        return {"message": f"Aborted '{task_id}'"}

    async def _task_control(self, arguments: Arguments, name: str, command: str,
                            extra: dict[str, Any], failed: str) -> Any:
        workername = arguments.text("workername", required=True) or ""
        self._registered(name)
        workername = await self.known_worker(workername)
        response = await asyncio.to_thread(
            self.app.control.broadcast, command, arguments={"task_name": name, **extra},
            destination=[workername], reply=True, timeout=INSPECT_TIMEOUT)
        reply = response[0].get(workername) if response else None
        if isinstance(reply, dict) and "ok" in reply:
            return {"message": reply["ok"]}
        reason = reply.get("error", "Unknown reason") if isinstance(reply, dict) \
            else "Unknown reason"
        raise HTTPError(403, f"{failed}: '{reason}'")

    async def task_timeout(self, arguments: Arguments, body: bytes, name: str) -> Any:
        """``POST /api/task/timeout/<task name>?workername=&hard=&soft=``."""
        self._refuse_read_only()
        hard = arguments.number("hard", float)
        soft = arguments.number("soft", float)
        return await self._task_control(arguments, name, "time_limit",
                                        {"hard": hard, "soft": soft}, "Failed to set timeouts")

    async def task_rate_limit(self, arguments: Arguments, body: bytes, name: str) -> Any:
        """``POST /api/task/rate-limit/<task name>?workername=&ratelimit=``."""
        self._refuse_read_only()
        rate = checked(arguments.text("ratelimit", required=True) or "", "ratelimit")
        # The limit is global (app.control.rate_limit's): set in the database, then the
        # worker named is told as Flower's API does.
        with contextlib.suppress(ValueError):
            await asyncio.to_thread(self.app.core.set_rate_limit, rate or None, task=name)
        return await self._task_control(arguments, name, "rate_limit", {"rate_limit": rate},
                                        "Failed to set rate limit")

    # --- metrics ----------------------------------------------------------------------------

    async def render_metrics(self, request: Request) -> Response:
        """``/metrics``: akadze's series and Flower's."""
        from starlette.responses import Response

        families = await integration.read_database(self.app.core)
        families += await self.read(self.metrics.collect)
        return Response(integration.exposition(families),
                        media_type=integration.CONTENT_TYPE)


class FlowerMetrics:
    """Flower's Prometheus series (``flower/events.py``), from the database.

    ``flower_events_total`` and ``flower_task_runtime_seconds`` count, in this process, the
    jobs that finished since its first scrape (as Flower counts the events it received
    since it started): each finished job adds its ``task-received`` and (when it ran)
    ``task-started`` event and its final one (``task-succeeded``, ``task-failed``,
    ``task-revoked``), and a succeeded job its run time. A finished job no longer names
    its worker: the ``worker`` label is the one a scrape saw it running on, "" for a job
    that ran between two scrapes. The gauges are read at each
    scrape: ``flower_worker_online`` from the workers' heartbeats,
    ``flower_worker_number_of_currently_executing_tasks`` from the running jobs.
    ``flower_task_prefetch_time_seconds`` and ``flower_worker_prefetched_tasks`` are
    declared without samples: a claimed job is running from its claim, so the database
    does not know the time a job waited in a worker before its body started.
    """

    FINAL: ClassVar[dict[str, str]] = {"succeeded": "task-succeeded", "failed": "task-failed",
             "cancelled": "task-revoked"}

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._marks: dict[str, tuple[datetime, int]] = {}
        self._events: dict[tuple[str, str, str], int] = defaultdict(int)
        self._runtime: dict[tuple[str, str], list[float]] = {}
        self._runtime_sum: dict[tuple[str, str], float] = defaultdict(float)
        #: Job id -> the worker the last two scrapes saw running it.
        self._ran_on: dict[int, str] = {}
        self._seen_last: set[int] = set()

    def _count(self, connection: psycopg.Connection) -> None:
        if not self._marks:
            now = _run(connection, "clock")[0]["now"]
            self._marks = {state: (now, 0) for state in self.FINAL}
            return
        for state, event in self.FINAL.items():
            after, after_id = self._marks[state]
            rows = _run(connection, "finished_since", state=state, after=after,
                        after_id=after_id, lag=METRICS_LAG, limit=METRICS_BATCH)
            for row in rows:
                worker = self._ran_on.get(int(row["id"]), "")
                task = row["task"]
                self._events[(worker, "task-received", task)] += 1
                if row["started_at"] is not None:
                    self._events[(worker, "task-started", task)] += 1
                self._events[(worker, event, task)] += 1
                if state == "succeeded" and row["runtime"] is not None:
                    self._observe(worker, task, float(row["runtime"]))
            if rows:
                self._marks[state] = (rows[-1]["finished_at"], int(rows[-1]["id"]))

    def _observe(self, worker: str, task: str, runtime: float) -> None:
        counts = self._runtime.setdefault((worker, task), [0] * len(RUNTIME_BUCKETS))
        for index, bound in enumerate(RUNTIME_BUCKETS):
            if runtime <= bound:
                counts[index] += 1
        self._runtime_sum[(worker, task)] += runtime

    def collect(self, connection: psycopg.Connection) -> list[Metric]:
        """Flower's families, the counters brought up to date first."""
        from prometheus_client.core import (  # the metrics extra, needed only here
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        with self._lock:
            self._count(connection)
            events = CounterMetricFamily("flower_events_total", "Number of events",
                                         labels=["worker", "type", "task"])
            for (worker, kind, task), value in sorted(self._events.items()):
                events.add_metric([worker, kind, task], value)
            runtime = HistogramMetricFamily("flower_task_runtime_seconds", "Task runtime",
                                            labels=["worker", "task"])
            for (worker, task), counts in sorted(self._runtime.items()):
                buckets = [("+Inf" if math.isinf(bound) else f"{bound:g}", float(count))
                           for bound, count in zip(RUNTIME_BUCKETS, counts, strict=True)]
                runtime.add_metric([worker, task], buckets, self._runtime_sum[(worker, task)])
        prefetch = GaugeMetricFamily(
            "flower_task_prefetch_time_seconds", "The time the task spent waiting at the "
            "celery worker to be executed.", labels=["worker", "task"])
        prefetched = GaugeMetricFamily(
            "flower_worker_prefetched_tasks", "Number of tasks of given type prefetched at "
            "a worker", labels=["worker", "task"])
        online = GaugeMetricFamily("flower_worker_online", "Worker online status",
                                   labels=["worker"])
        for row in _run(connection, "workers"):
            online.add_metric([row["name"]], 1 if row["live"] else 0)
        executing = GaugeMetricFamily(
            "flower_worker_number_of_currently_executing_tasks",
            "Number of tasks currently executing at a worker", labels=["worker"])
        running = {int(row["id"]): row["worker_name"]
                   for row in _run(connection, "running", limit=METRICS_BATCH)}
        with self._lock:
            # Kept one more scrape: a job seen running may finish before the lag passes.
            self._ran_on = {**{job: worker for job, worker in self._ran_on.items()
                               if job in self._seen_last}, **running}
            self._seen_last = set(running)
        per_worker: dict[str, int] = defaultdict(int)
        for worker in running.values():
            per_worker[worker] += 1
        for worker, jobs in sorted(per_worker.items()):
            executing.add_metric([worker], jobs)
        return [events, runtime, prefetch, prefetched, online, executing]


def flower_extension(app: Celery) -> Callable[[Any], Sequence[BaseRoute]]:
    """What ``DashboardConfig.extensions`` takes to serve Flower's API for ``app``: a
    callable of the dashboard (``akadze_core.dashboard.web.Dashboard``)."""
    def extend(dashboard: Any) -> Sequence[BaseRoute]:
        return FlowerApi(app, dashboard).routes()
    return extend


__all__ = ["FlowerApi", "FlowerMetrics", "flower_extension", "task_fields"]
