"""The worker's side of remote control: take up the requests sent to it (``control.broadcast``),
run their commands in its loop, write its replies.

The worker hears of a request by the ``akadze_control`` NOTIFY (its payload lists the target
worker ids), and, should that be lost with the LISTEN connection, from its next heartbeat,
which says whether a request waits for it. Requests are answered one at a time, in the order
they were sent, so an ``add_queue`` followed by a ``remove_queue`` ends as the sender meant.
A reply row is written for every request, with a NULL reply when none was asked for: that
row is what keeps a worker from running a request twice.

A command is a callable ``handler(worker, **arguments)``: an ``async def`` runs in the
worker's loop (it may change the worker: queues, concurrency, stop); a plain function runs
in a thread, so a slow one does not hold up claims or heartbeats. Its return value is the
reply (JSON; sets and tuples become lists, other values their ``str``); an exception is the
reply ``{"error": repr(exc)}``, and an unknown command ``{"error": "KeyError('name')"}``, as
Celery's workers answer. Return ``NO_REPLY`` to answer nothing (the sender only learns that
it was handled).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
from collections.abc import Callable
from datetime import date, datetime
from typing import Any, Protocol

import psycopg

from ..store import database
from ..store.listener import first_of
from .maintenance import Guard

logger = logging.getLogger("akadze.worker")

class PanelWorker(Protocol):
    """What the panel and its built-in commands use of the worker they run in (a
    ``akadze_core.Worker``; named here so this module need not import the worker)."""

    @property
    def worker_id(self) -> int | None:
        """The worker's id in akadze.workers."""

    @property
    def name(self) -> str:
        """The worker's name."""

    @property
    def queues(self) -> list[str]:
        """The queues it claims from."""

    @property
    def control(self) -> ControlPanel:
        """Its control panel."""

    def request_stop(self) -> None:
        """Stop gracefully."""

    async def add_queue(self, queue: str, slots: int | None = None) -> bool:
        """Claim from ``queue`` too."""

    async def remove_queue(self, queue: str) -> bool:
        """Stop claiming from ``queue``."""

    @property
    def concurrency(self) -> int | None:
        """How many bodies run at once (None: no limit of threads to change)."""

    def resize(self, concurrency: int | None = None, *, slots: int | None = None,
               max_running: int | None = None) -> None:
        """Change how many bodies run at once."""


#: A command's handler: ``handler(worker, **arguments)``, plain or ``async def``.
Handler = Callable[..., Any]


class _NoReply:
    def __repr__(self) -> str:
        return "NO_REPLY"


#: Returned by a handler: the request is handled, and no reply goes back.
NO_REPLY: Any = _NoReply()


def _jsonable(value: Any) -> Any:
    if isinstance(value, set | frozenset | tuple):
        return sorted(value, key=str) if isinstance(value, set | frozenset) else list(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)


def encode_reply(value: Any) -> str:
    """A reply as the JSON text stored in its row."""
    return json.dumps(value, default=_jsonable, ensure_ascii=False)


async def _ping(worker: PanelWorker, **arguments: Any) -> Any:
    return "pong"


async def _shutdown(worker: PanelWorker, **arguments: Any) -> Any:
    logger.warning("stopping: asked to by a remote-control shutdown")
    worker.control.after_reply(worker.request_stop)
    return NO_REPLY


async def _queues(worker: PanelWorker, **arguments: Any) -> Any:
    return list(worker.queues)


async def _add_queue(worker: PanelWorker, queue: str, slots: int | None = None,
                     **arguments: Any) -> Any:
    await worker.add_queue(queue, slots)
    return list(worker.queues)


async def _remove_queue(worker: PanelWorker, queue: str, **arguments: Any) -> Any:
    await worker.remove_queue(queue)
    return list(worker.queues)


async def _resize(worker: PanelWorker, delta: int) -> Any:
    concurrency = worker.concurrency
    if concurrency is None:
        return {"error": "this worker's pool cannot be resized (only a threads pool can)"}
    try:
        worker.resize(max(1, concurrency + delta))
    except ValueError as exc:
        return {"error": str(exc)}
    return {"ok": f"pool now runs {worker.concurrency} bodies at once"}


async def _pool_grow(worker: PanelWorker, n: int = 1, **arguments: Any) -> Any:
    return await _resize(worker, int(n))


async def _pool_shrink(worker: PanelWorker, n: int = 1, **arguments: Any) -> Any:
    return await _resize(worker, -int(n))


#: The commands every worker answers; integrations add theirs (or replace these) in
#: ``worker.control.commands``.
BUILTIN_COMMANDS: dict[str, Handler] = {
    "ping": _ping, "shutdown": _shutdown, "queues": _queues, "add_queue": _add_queue,
    "remove_queue": _remove_queue, "pool_grow": _pool_grow, "pool_shrink": _pool_shrink,
}


class ControlPanel:
    """One worker's remote-control commands (``commands``, by name) and the loop that
    answers the requests sent to it."""

    def __init__(self, worker: PanelWorker) -> None:
        self.worker = worker
        #: The commands this worker answers, by name.
        self.commands: dict[str, Handler] = dict(BUILTIN_COMMANDS)
        self._poke = asyncio.Event()
        self._after: list[Callable[[], Any]] = []

    def poke(self) -> None:
        """Look for requests now (a NOTIFY or a heartbeat said one waits)."""
        self._poke.set()

    def heard(self, payload: str) -> None:
        """The ``akadze_control`` NOTIFY: look if this worker is among the targets listed
        (an empty payload lists none: look anyway)."""
        if not payload or str(self.worker.worker_id) in payload.split(","):
            self._poke.set()

    def after_reply(self, call: Callable[[], Any]) -> None:
        """Call ``call()`` once the reply to the request being handled is written (a stop
        must not cut its own reply off)."""
        self._after.append(call)

    async def run(self, guard: Guard, healthy: asyncio.Event, stop: asyncio.Event) -> None:
        """Answer requests whenever poked, until ``stop`` is set."""
        while not stop.is_set():
            await first_of(stop, self._poke)
            if stop.is_set():
                return
            self._poke.clear()
            if not healthy.is_set():
                # The heartbeat that restores health says again whether a request waits.
                await first_of(stop, healthy)
                continue
            rows: list[dict[str, Any]] = []
            if not await guard(functools.partial(self._pending, rows=rows), "control"):
                continue
            for row in rows:
                if stop.is_set():
                    return
                await self._answer(guard, row)

    async def _pending(self, connection: psycopg.AsyncConnection,
                       rows: list[dict[str, Any]]) -> None:
        rows.extend(await database.fetch_all_async(
            connection, "control_pending", worker_id=self.worker.worker_id))

    async def _answer(self, guard: Guard, row: dict[str, Any]) -> None:
        value = await self.run_command(row["command"], row["arguments"] or {})
        text = None if not row["reply"] or value is NO_REPLY else encode_reply(value)

        async def write(connection: psycopg.AsyncConnection) -> None:
            await database.fetch_one_async(
                connection, "control_reply", request_id=row["id"],
                worker_id=self.worker.worker_id, worker_name=self.worker.name, reply=text)

        await guard(write, "control reply")
        after, self._after = self._after, []
        for call in after:
            call()

    async def run_command(self, command: str, arguments: dict[str, Any]) -> Any:
        """Run ``command`` here (no database involved): its reply, or ``{"error": ...}``."""
        handler = self.commands.get(command)
        if handler is None:
            logger.warning("remote-control command %r is unknown to this worker", command)
            return {"error": repr(KeyError(command))}
        try:
            if inspect.iscoroutinefunction(handler):
                return await handler(self.worker, **arguments)
            value = await asyncio.to_thread(
                functools.partial(handler, self.worker, **arguments))
            return await value if inspect.isawaitable(value) else value
        except Exception as exc:
            logger.exception("remote-control command %r failed", command)
            return {"error": repr(exc)}

    async def prune(self, connection: psycopg.AsyncConnection) -> None:
        """Delete the expired requests and their replies (the worker's prune round)."""
        await database.execute_query(connection, "control_prune")
