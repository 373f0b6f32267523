"""``app.control``: Celery's remote control, delivered through the database.

``broadcast`` writes one request for the live workers (their heartbeats, on the database
clock) and, with ``reply=True``, collects their replies until ``timeout`` or until every
one answered (``akadze_core.ops.control.broadcast``); a dead worker never answers. Replies come
as Celery's: ``broadcast`` and ``ping`` a list of ``{node: reply}``, ``inspect()`` methods
one dict ``{node: reply}`` (None when no worker answered). ``revoke`` and ``purge`` are
database writes that need no worker.
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from collections.abc import Callable, Iterable
from fnmatch import fnmatch
from typing import TYPE_CHECKING, Any

import psycopg

from akadze_core import ControlReply, broadcast, request_cancel_sync
from akadze_core.integration import signal_number

from ..backends.base import lookup_job

if TYPE_CHECKING:
    from .base import Celery

__all__ = ["Control", "Inspect", "flatten_reply"]

logger = logging.getLogger("akadze_compat.control")

#: Celery's control_queue_ttl: how long a request waits for its workers to take it up.
DEFAULT_CONTROL_TTL = 300.0


class DuplicateNodenameWarning(UserWarning):
    """Several workers answered under one node name (Celery's warning)."""


def flatten_reply(reply: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """``[{node: reply}, ...]`` as one ``{node: reply}`` (warning on duplicate names)."""
    nodes: dict[str, Any] = {}
    dupes: set[str] = set()
    for item in reply:
        dupes.update(name for name in item if name in nodes)
        nodes.update(item)
    if dupes:
        warnings.warn(DuplicateNodenameWarning(
            f"Received multiple replies from node name(s): {', '.join(sorted(dupes))}. "
            "Please make sure you give each node a unique nodename using the worker `-n` "
            "option."), stacklevel=2)
    return nodes


def _matches(name: str, pattern: str, matcher: str | None) -> bool:
    """kombu's matchers: ``glob`` (the default) and ``pcre``."""
    if matcher in (None, "glob"):
        return fnmatch(name, pattern)
    if matcher == "pcre":
        return re.match(pattern, name) is not None
    raise KeyError(f"No matcher installed for {matcher}")


class Inspect:
    """``app.control.inspect(...)``: ask the workers what they hold (Celery's names and
    replies: ``{node: reply}``, or None when no worker answered in time)."""

    app: Any = None

    def __init__(self, destination: Any = None, timeout: float = 1.0,
                 callback: Callable[[dict[str, Any]], Any] | None = None,
                 connection: Any = None, app: Any = None, limit: int | None = None,
                 pattern: str | None = None, matcher: str | None = None) -> None:
        self.app = app or self.app
        self.destination = destination
        self.timeout = timeout
        self.callback = callback
        self.connection = connection
        self.limit = limit
        self.pattern = pattern
        self.matcher = matcher

    def _prepare(self, reply: list[dict[str, Any]] | None) -> Any:
        if not reply:
            return None
        by_node = flatten_reply(reply)
        if self.destination and not isinstance(self.destination, list | tuple):
            return by_node.get(self.destination)
        if self.pattern:
            return {node: one for node, one in by_node.items()
                    if _matches(node, self.pattern, self.matcher)}
        return by_node

    def _request(self, command: str, **kwargs: Any) -> Any:
        return self._prepare(self.app.control.broadcast(
            command, arguments=kwargs, destination=self.destination,
            callback=self.callback, connection=self.connection, limit=self.limit,
            timeout=self.timeout, reply=True, pattern=self.pattern, matcher=self.matcher))

    def report(self) -> Any:
        """``{node: {"ok": bug-report text}}`` (``app.bugreport()`` on each worker)."""
        return self._request("report")

    def clock(self) -> Any:
        """``{node: {"clock": n}}``: each worker's logical clock."""
        return self._request("clock")

    def ping(self, destination: Any = None) -> Any:
        """``{node: {"ok": "pong"}}`` for every live worker."""
        if destination:
            self.destination = destination
        return self._request("ping")

    def active(self, safe: bool | None = None) -> Any:
        """``{node: [task info, ...]}``: the tasks each worker runs."""
        return self._request("active", safe=safe)

    def scheduled(self, safe: bool | None = None) -> Any:
        """``{node: [{"eta", "priority", "request"}, ...]}``: tasks waiting for their eta
        (each listed once, under one of the workers consuming its queue)."""
        return self._request("scheduled")

    def reserved(self, safe: bool | None = None) -> Any:
        """``{node: [task info, ...]}``: tasks claimed ahead, waiting for a free slot."""
        return self._request("reserved")

    def stats(self) -> Any:
        """``{node: {...}}``: Celery's stats sections (pool, broker: the database, total,
        rusage, ...)."""
        return self._request("stats")

    def revoked(self) -> Any:
        """``{node: [task id, ...]}``: the tasks revoked in the last three hours."""
        return self._request("revoked")

    def registered(self, *taskinfoitems: str) -> Any:
        """``{node: [task name, ...]}`` (with ``[attr=value ...]`` for the attributes
        asked for)."""
        return self._request("registered", taskinfoitems=taskinfoitems)

    registered_tasks = registered

    def active_queues(self) -> Any:
        """``{node: [queue info, ...]}``: the queues each worker consumes."""
        return self._request("active_queues")

    def query_task(self, *ids: Any) -> Any:
        """``{node: {task id: [state, task info]}}`` for the tasks a worker holds."""
        if len(ids) == 1 and isinstance(ids[0], list | tuple):
            ids = tuple(ids[0])
        return self._request("query_task", ids=list(ids))

    def conf(self, with_defaults: bool = False) -> Any:
        """``{node: {setting: value}}``: each worker's configuration."""
        return self._request("conf", with_defaults=with_defaults)


class Control:
    """Celery's ``app.control``: revoke and purge in the database, the rest sent to the
    live workers through it."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def revoke(self, task_id: str | Iterable[str], destination: Any = None,
               terminate: bool = False, signal: Any = "SIGTERM", **kwargs: Any) -> None:
        """Revoke tasks by id (or list of ids): a task that has not started never runs.

        A running task is not interrupted unless ``terminate=True``: then a prefork worker
        sends ``signal`` (a name such as ``"SIGKILL"``/``"KILL"`` or a number, as Celery
        takes it; SIGTERM by default) to the child process running it. A child that dies of
        it is replaced, and the task ends REVOKED without spending an attempt
        (``task_revoked`` is sent with ``terminated=True``). Threads and solo workers cannot
        stop a running body: there, as without ``terminate``, a task that returns succeeds
        and one that raises ends REVOKED. Unknown ids are ignored, as in Celery.
        """
        signum = signal_number(signal or "SIGTERM") if terminate else None
        ids = [task_id] if isinstance(task_id, str) else list(task_id)
        core = self.app.core
        for one in ids:
            job = lookup_job(core, str(one))
            if job is not None:
                job_id = job.id

                def cancel(connection: psycopg.Connection, job_id: int = job_id) -> bool:
                    if signum is None:
                        return request_cancel_sync(connection, job_id)
                    return request_cancel_sync(connection, job_id, terminate=True,
                                               signal=signum)

                core.run_pooled(cancel)

    def purge(self, connection: Any = None) -> int:
        """Delete every waiting task of every queue; returns how many."""
        return int(self.app.core.purge(None))

    def inspect(self, destination: Any = None, timeout: float = 1.0,
                callback: Callable[[dict[str, Any]], Any] | None = None,
                connection: Any = None, app: Any = None, limit: int | None = None,
                pattern: str | None = None, matcher: str | None = None) -> Inspect:
        """An ``Inspect`` for this app's workers (Celery's ``app.control.inspect(...)``)."""
        return Inspect(destination=destination, timeout=timeout, callback=callback,
                       connection=connection, app=app or self.app, limit=limit,
                       pattern=pattern, matcher=matcher)

    def broadcast(self, command: str, arguments: dict[str, Any] | None = None,
                  destination: Any = None, connection: Any = None, reply: bool = False,
                  timeout: float = 1.0, limit: int | None = None,
                  callback: Callable[[dict[str, Any]], Any] | None = None,
                  channel: Any = None, pattern: str | None = None,
                  matcher: str | None = None, **extra_kwargs: Any) -> Any:
        """Send ``command`` to the live workers (those in ``destination``, a list of node
        names, or matching ``pattern`` with ``matcher``, "glob" or "pcre"); with
        ``reply=True`` a list of ``{node: reply}`` collected for up to ``timeout`` seconds
        (fewer when every worker answered, at most ``limit``), else None."""
        if destination is not None and not isinstance(destination, list | tuple):
            raise ValueError(f"destination must be a list/tuple not {type(destination)}")
        select = None
        if pattern and matcher:
            def select(name: str) -> bool:
                return _matches(name, pattern, matcher)

        def each(one: ControlReply) -> None:
            if callback is not None:
                callback({one.worker: one.reply})

        ttl = float(self.app.conf.get("control_queue_ttl") or DEFAULT_CONTROL_TTL)
        replies = broadcast(self.app.core, command, dict(arguments or {}, **extra_kwargs),
                            destination=destination, select=select, reply=reply,
                            timeout=timeout, limit=limit, callback=each, ttl=ttl)
        return [{one.worker: one.reply} for one in replies] if reply else None

    def ping(self, destination: Any = None, timeout: float = 1.0, **kwargs: Any) -> Any:
        """``[{node: {"ok": "pong"}}, ...]`` from the live workers."""
        return self.broadcast("ping", reply=True, arguments={}, destination=destination,
                              timeout=timeout, **kwargs)

    def shutdown(self, destination: Any = None, **kwargs: Any) -> Any:
        """Stop the workers (warm: running tasks finish); they send no reply."""
        return self.broadcast("shutdown", arguments={}, destination=destination, **kwargs)

    def enable_events(self, destination: Any = None, **kwargs: Any) -> Any:
        """Turn task events on in the workers (Celery's reply; akadze has no event
        stream: task states are rows in the database)."""
        return self.broadcast("enable_events", arguments={}, destination=destination,
                              **kwargs)

    def disable_events(self, destination: Any = None, **kwargs: Any) -> Any:
        """Turn task events off in the workers (Celery's reply)."""
        return self.broadcast("disable_events", arguments={}, destination=destination,
                              **kwargs)

    def pool_grow(self, n: int = 1, destination: Any = None, **kwargs: Any) -> Any:
        """Let the workers run ``n`` more tasks at once (threads pool)."""
        return self.broadcast("pool_grow", arguments={"n": n}, destination=destination,
                              **kwargs)

    def pool_shrink(self, n: int = 1, destination: Any = None, **kwargs: Any) -> Any:
        """Let the workers run ``n`` fewer tasks at once (threads pool)."""
        return self.broadcast("pool_shrink", arguments={"n": n}, destination=destination,
                              **kwargs)

    def add_consumer(self, queue: str, exchange: str | None = None,
                     exchange_type: str = "direct", routing_key: str | None = None,
                     options: dict[str, Any] | None = None, destination: Any = None,
                     **kwargs: Any) -> Any:
        """Make the workers claim from ``queue`` too, from now on."""
        return self.broadcast("add_consumer", destination=destination, arguments=dict({
            "queue": queue, "exchange": exchange, "exchange_type": exchange_type,
            "routing_key": routing_key}, **options or {}), **kwargs)

    def cancel_consumer(self, queue: str, destination: Any = None, **kwargs: Any) -> Any:
        """Make the workers stop claiming from ``queue`` (running tasks finish)."""
        return self.broadcast("cancel_consumer", destination=destination,
                              arguments={"queue": queue}, **kwargs)

    # Not Celery's: Celery has no pause that holds for the whole fleet. cancel_consumer
    # above keeps Celery's meaning (the workers named stop consuming, until they restart).

    def pause_queue(self, queue: str) -> bool:
        """Pause ``queue`` for every worker, running or started later, until
        ``resume_queue``; True when it was not paused already (an akadze extension). Once
        this returns no worker starts a new task of ``queue``; running tasks finish, and
        ``delay``/``apply_async`` still store tasks (they wait)."""
        return bool(self.app.core.pause_queue(queue))

    def resume_queue(self, queue: str) -> bool:
        """Resume a paused ``queue``, waking its idle workers at once; True when it was
        paused (an akadze extension)."""
        return bool(self.app.core.resume_queue(queue))

    def paused_queues(self) -> list[str]:
        """The names of the paused queues (an akadze extension)."""
        return list(self.app.core.paused_queues())

    def time_limit(self, task_name: str, soft: float | None = None,
                   hard: float | None = None, destination: Any = None,
                   **kwargs: Any) -> Any:
        """Set the time limits of ``task_name`` in the workers."""
        return self.broadcast("time_limit", arguments={
            "task_name": task_name, "hard": hard, "soft": soft},
            destination=destination, **kwargs)

    def rate_limit(self, task_name: str, rate_limit: Any, destination: Any = None,
                   **kwargs: Any) -> Any:
        """Set the rate limit of ``task_name`` ("10/s", "10/m", "10/h"; 0 or None removes
        it). Unlike Celery's, which each worker enforces on its own, the limit is global: it
        is set in the database here, for every worker's next claim, whatever
        ``destination`` says; the workers named are told too (their task's ``rate_limit``
        attribute) and reply as Celery's do."""
        # A rate Celery's workers refuse (their reply says so) sets nothing.
        with contextlib.suppress(ValueError):
            self.app.core.set_rate_limit(rate_limit or None, task=task_name)
        return self.broadcast("rate_limit", destination=destination, arguments={
            "task_name": task_name, "rate_limit": rate_limit}, **kwargs)
