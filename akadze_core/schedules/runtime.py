"""Runtime schedules: periodic jobs stored in the database, made and changed while workers run.

``app.runtime_schedules.add("reports.hourly", "report.build", trigger=Every(3600))`` stores
the definition in ``akadze.schedules``, next to the ticks; every running worker hears of it
(NOTIFY ``akadze_schedules`` at commit, polling as the fallback) and enqueues its ticks like
a code schedule's: each tick once across the fleet. ``pause``, ``resume``, ``remove`` and
``add(..., replace=True)`` (a change) take effect within about a second.

The rules, chosen to match code schedules and Celery's database schedulers:

- **Names** are one namespace with code schedules. ``add`` refuses a name the app declares
  in code, and a name whose stored row belongs to a code schedule unless ``replace=True``
  (which takes the name over: workers still declaring it skip their declaration, with a
  warning). A worker declaring in code a name a runtime schedule holds skips it likewise.
- **Validation** is ``Schedule.declare``'s (bad args, meta, trigger, expires, priority,
  max_attempts raise before anything is stored), plus: the trigger must be a ``Cron`` or an
  ``Every`` (stored as its spec text, ``cron */5 * * * * tz=Europe/Berlin``, ``every 60s``).
- **Defaults** are resolved when stored, not when enqueued: ``queue``, ``priority`` and
  ``max_attempts`` left at None take the task's if this app registers it, else the app's
  default queue, 0 and 3. Every worker then enqueues the same job, whatever its app knows.
- **Ticks.** A new schedule first runs at its next tick; a change of trigger starts over the
  same way (a change of anything else keeps its place); pausing stops its ticks, and
  resuming does not run the ticks missed meanwhile, only the following ones (as
  django_celery_beat does for a re-enabled task). After downtime only the latest missed
  tick runs, as for code schedules.
- **Transactions.** ``session=`` (a psycopg connection) runs the statement in the caller's
  transaction, like ``TaskCall.using``: a rollback stores nothing and notifies no one.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

import psycopg

from ..model.serialization import encode_args
from ..store import database
from ..store.dberrors import SCHEMA_ERRORS
from ..store.migrations import schema_missing
from .scheduler import Schedule, ScheduledTask, ScheduleHost, ScheduleSpec
from .triggers import EPOCH, Trigger, parse_spec

T = TypeVar("T")


@dataclass(frozen=True)
class StoredSchedule:
    """A runtime schedule as stored: its definition (defaults resolved), whether it is
    paused, and when it was created, last changed and last enqueued a job (``last_run``,
    the tick of that job; None if none yet)."""

    name: str
    task: str
    trigger: str
    args: Mapping[str, Any] = field(default_factory=dict)
    queue: str = "default"
    priority: int = 0
    max_attempts: int = 3
    expires: timedelta | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    paused: bool = False
    created_at: datetime | None = None
    changed_at: datetime | None = None
    last_run: datetime | None = None
    version: int = 0

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> StoredSchedule:
        """From a row of ``schedule_runtime_list`` / ``schedule_runtime_add``."""
        return cls(
            name=row["name"], task=row["task"], trigger=row["spec"], args=row["args"],
            queue=row["queue"], priority=row["priority"], max_attempts=row["max_attempts"],
            expires=row["expires"], meta=row["meta"], paused=row["paused"],
            created_at=row["created_at"], changed_at=row["changed_at"],
            last_run=row["last_run"], version=int(row["version"]))

    def next_run(self, now: datetime) -> datetime | None:
        """The first tick after ``now`` (None while paused)."""
        return None if self.paused else parse_spec(self.trigger).next(now)


def _storable_trigger(trigger: Trigger) -> str:
    spec = trigger.spec
    try:
        stored = parse_spec(spec).spec
    except ValueError:
        stored = None
    if stored != spec:
        raise ValueError(f"a runtime schedule's trigger must be a Cron or an Every (it is "
                         f"stored as its spec text), not {trigger!r}")
    return spec


def definition(app: ScheduleHost, name: str, task: ScheduledTask | str, spec: ScheduleSpec,
               *, paused: bool = False, replace: bool = False) -> dict[str, Any]:
    """Validate a runtime schedule as ``Schedule.declare`` does and return the parameters of
    ``schedule_runtime_add`` (defaults resolved; see the module's docstring)."""
    if name in app.schedules:
        raise ValueError(f"a schedule named {name!r} is declared in code by this app: a "
                         "runtime schedule needs another name")
    schedule = Schedule.from_spec(app, name, task, spec)
    stored_trigger = _storable_trigger(schedule.trigger)
    # The job of any tick, with its defaults resolved as this app sees the task.
    request = schedule.request(app, EPOCH)
    return {
        "name": schedule.name, "spec": stored_trigger, "task": schedule.task, "args": request.args,
        "queue": request.queue, "priority": request.priority,
        "max_attempts": request.max_attempts, "expires": schedule.expires,
        "meta": encode_args(dict(schedule.meta), app.json_dumps, app.max_args_bytes),
        "paused": bool(paused), "replace": bool(replace),
    }


def _refused(name: str, owner: str | None) -> ValueError:
    if owner == "code":
        return ValueError(f"schedule {name!r} is a code schedule's (its state row is "
                          "stored): pick another name, or pass replace=True (--replace) "
                          "to take it over (workers that still declare it then skip it)")
    return ValueError(f"a runtime schedule named {name!r} exists already: pass "
                      "replace=True (--replace) to change it")


class RuntimeSchedules:
    """The runtime schedules of an app's database: ``app.runtime_schedules``.

    Every method has an ``_async`` twin, and takes ``session=``, a psycopg connection (sync
    for the plain methods, async for the twins) whose current transaction the statement
    joins; without one it runs on a pooled autocommit connection of the app.
    """

    def __init__(self, app: ScheduleHost) -> None:
        self.app = app

    # --- plumbing -------------------------------------------------------------------------

    def _run(self, session: psycopg.Connection | None,
             call: Callable[[psycopg.Connection], T]) -> T:
        if isinstance(session, psycopg.AsyncConnection):
            raise TypeError("an async session needs the _async method (e.g. add_async)")
        try:
            if session is not None:
                return call(session)
            return self.app.connections.run_pooled(call)  # type: ignore[no-any-return]
        except SCHEMA_ERRORS as exc:
            raise schema_missing(command=self.app.migrate_command) from exc

    async def _run_async(self, session: psycopg.AsyncConnection | None,
                         call: Callable[[psycopg.AsyncConnection], Awaitable[T]]) -> T:
        if session is not None and not isinstance(session, psycopg.AsyncConnection):
            raise TypeError("a sync session needs the plain method (e.g. add)")
        try:
            if session is not None:
                return await call(session)
            return await self.app.connections.run_pooled_async(call)  # type: ignore[no-any-return]
        except SCHEMA_ERRORS as exc:
            raise schema_missing(command=self.app.migrate_command) from exc

    # --- add (and change) -----------------------------------------------------------------

    def add(self, name: str, task: ScheduledTask | str, *, trigger: Trigger | str,
            args: Mapping[str, Any] | None = None, queue: str | None = None,
            priority: int | None = None, max_attempts: int | None = None,
            expires: timedelta | float | None = None, meta: Mapping[str, Any] | None = None,
            paused: bool = False, replace: bool = False,
            session: psycopg.Connection | None = None) -> StoredSchedule:
        """Store a runtime schedule: run ``task`` with ``args`` at every tick of ``trigger``
        (a ``Cron``, an ``Every``, a spec text such as ``every 60s``, or a cron string in
        UTC). ``replace=True`` changes the one of that name (the whole definition); without
        it an existing name raises ValueError. Invalid input raises what ``App.add_schedule``
        raises (ValueError, ``InvalidArgs``, TypeError), and nothing is stored."""
        params = definition(self.app, name, task, ScheduleSpec(
            trigger=trigger, args=args, queue=queue, priority=priority,
            max_attempts=max_attempts, expires=expires, meta=meta),
            paused=paused, replace=replace)

        def store(connection: psycopg.Connection) -> StoredSchedule:
            row = database.fetch_one(connection, "schedule_runtime_add", **params)
            if row is None:
                owner = database.fetch_one(connection, "schedule_owner", name=name)
                raise _refused(name, owner["source"] if owner else None)
            return StoredSchedule.from_row(row)

        return self._run(session, store)

    async def add_async(self, name: str, task: ScheduledTask | str, *, trigger: Trigger | str,
                        args: Mapping[str, Any] | None = None, queue: str | None = None,
                        priority: int | None = None, max_attempts: int | None = None,
                        expires: timedelta | float | None = None,
                        meta: Mapping[str, Any] | None = None, paused: bool = False,
                        replace: bool = False,
                        session: psycopg.AsyncConnection | None = None) -> StoredSchedule:
        """Async twin of ``add``."""
        params = definition(self.app, name, task, ScheduleSpec(
            trigger=trigger, args=args, queue=queue, priority=priority,
            max_attempts=max_attempts, expires=expires, meta=meta),
            paused=paused, replace=replace)

        async def store(connection: psycopg.AsyncConnection) -> StoredSchedule:
            row = await database.fetch_one_async(connection, "schedule_runtime_add", **params)
            if row is None:
                owner = await database.fetch_one_async(connection, "schedule_owner", name=name)
                raise _refused(name, owner["source"] if owner else None)
            return StoredSchedule.from_row(row)

        return await self._run_async(session, store)

    # --- pause, resume, remove ------------------------------------------------------------

    def pause(self, name: str, *, session: psycopg.Connection | None = None) -> bool:
        """Stop enqueueing the ticks of runtime schedule ``name``; False if there is none
        (a code schedule is paused by removing it from the code)."""
        return self._run(session, lambda connection: database.fetch_one(
            connection, "schedule_runtime_pause", name=name, paused=True) is not None)

    async def pause_async(self, name: str, *,
                          session: psycopg.AsyncConnection | None = None) -> bool:
        """Async twin of ``pause``."""
        async def call(connection: psycopg.AsyncConnection) -> bool:
            return await database.fetch_one_async(
                connection, "schedule_runtime_pause", name=name, paused=True) is not None
        return await self._run_async(session, call)

    def resume(self, name: str, *, session: psycopg.Connection | None = None) -> bool:
        """Enqueue the ticks of runtime schedule ``name`` again, from the next one (those
        missed while paused do not run); False if there is none."""
        return self._run(session, lambda connection: database.fetch_one(
            connection, "schedule_runtime_pause", name=name, paused=False) is not None)

    async def resume_async(self, name: str, *,
                           session: psycopg.AsyncConnection | None = None) -> bool:
        """Async twin of ``resume``."""
        async def call(connection: psycopg.AsyncConnection) -> bool:
            return await database.fetch_one_async(
                connection, "schedule_runtime_pause", name=name, paused=False) is not None
        return await self._run_async(session, call)

    def remove(self, name: str, *, session: psycopg.Connection | None = None) -> bool:
        """Delete runtime schedule ``name`` (the jobs it enqueued stay); False if there is
        none."""
        return self._run(session, lambda connection: database.fetch_one(
            connection, "schedule_runtime_remove", name=name) is not None)

    async def remove_async(self, name: str, *,
                           session: psycopg.AsyncConnection | None = None) -> bool:
        """Async twin of ``remove``."""
        async def call(connection: psycopg.AsyncConnection) -> bool:
            return await database.fetch_one_async(
                connection, "schedule_runtime_remove", name=name) is not None
        return await self._run_async(session, call)

    # --- reading --------------------------------------------------------------------------

    def get(self, name: str, *, session: psycopg.Connection | None = None
            ) -> StoredSchedule | None:
        """Runtime schedule ``name``, or None."""
        found = self._run(session, lambda connection: database.fetch_all(
            connection, "schedule_runtime_list", names=[name]))
        return StoredSchedule.from_row(found[0]) if found else None

    async def get_async(self, name: str, *, session: psycopg.AsyncConnection | None = None
                        ) -> StoredSchedule | None:
        """Async twin of ``get``."""
        async def call(connection: psycopg.AsyncConnection) -> list[dict[str, Any]]:
            return await database.fetch_all_async(connection, "schedule_runtime_list",
                                                  names=[name])
        found = await self._run_async(session, call)
        return StoredSchedule.from_row(found[0]) if found else None

    def list(self, *, session: psycopg.Connection | None = None
             ) -> builtins.list[StoredSchedule]:
        """Every runtime schedule, by name."""
        rows = self._run(session, lambda connection: database.fetch_all(
            connection, "schedule_runtime_list", names=None))
        return [StoredSchedule.from_row(row) for row in rows]

    async def list_async(self, *, session: psycopg.AsyncConnection | None = None
                         ) -> builtins.list[StoredSchedule]:
        """Async twin of ``list``."""
        async def call(connection: psycopg.AsyncConnection) -> builtins.list[dict[str, Any]]:
            return await database.fetch_all_async(connection, "schedule_runtime_list",
                                                  names=None)
        return [StoredSchedule.from_row(row) for row in await self._run_async(session, call)]


__all__ = ["RuntimeSchedules", "StoredSchedule"]
