"""Periodic jobs: schedules declared in code (and runtime schedules stored in the database,
see ``runtime_schedules``), enqueued by the workers themselves.

There is no beat process. Every worker of the app, whatever its queues, runs a
``Scheduler`` in its maintenance round. Each schedule has one state row holding the last tick
accounted for; enqueueing a tick advances that row and inserts the job in one statement, so
however many workers race for a tick, its job is inserted once (see ``schedule_enqueue``).

What happens at each check, on the database clock (``plan``):

- a schedule without a state row starts at its latest tick, unfired: ticks that passed
  before the schedule existed do not run;
- a schedule whose trigger changed since the row was written starts over the same way;
- otherwise, if a tick came after the stored one, the latest such tick is enqueued. After
  downtime that is the latest missed tick only: the missed ones before it are skipped.

A schedule with a ``since`` (one kept elsewhere that knows when it last ran, e.g. a
django_celery_beat row) counts its ticks from that instant instead: when new or changed it
starts there, so a tick after ``since`` that already passed still runs (the latest one), and
no tick at or before ``since`` ever does.

Besides the code-declared ``App.schedules``, a worker asks each of ``App.schedule_sources``
(``ScheduleSource``) for its schedules on every pass, and lets it write its own rows in the
transaction that enqueues a tick.

Runtime schedules follow the same rules from their own rows (the row is the definition and
the state): the worker holds them in a ``Timetable`` and enqueues their due ticks in batches,
one statement per ``RUNTIME_BATCH`` schedules (``schedule_runtime_enqueue``), each row locked
and re-checked so that every tick is still enqueued once across the fleet. A name held by a
runtime row is skipped by a code declaration of it, with one warning.

A ``LastRunTrigger`` (a schedule that decides from its last run, like Celery's ``is_due``) is
asked ``latest_after(stored tick, now)`` instead, and its tick is enqueued only if the stored
tick is still the one it was given.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import psycopg

from ..model.dsn import listen_url
from ..model.serialization import check_name, check_storable, encode_args
from ..store import ticks
from ..store.database import JobRequest
from ..store.dberrors import is_prepared_statement_lost, is_transient
from ..store.deadlines import cancel_and_wait
from ..store.listener import first_of, listen_for_jobs
from .timetable import Timetable
from .triggers import EPOCH, LastRunTrigger, Trigger, as_trigger

if TYPE_CHECKING:
    from ..model.serialization import Dumps
    from ..store.connections import Connections

logger = logging.getLogger("akadze.schedules")

#: A worker checks its schedules at most this often (seconds)...
MIN_CHECK_INTERVAL = 1.0
#: ...and at least this often, even when the next tick is far away.
MAX_CHECK_INTERVAL = 60.0


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, not {value!r}")
    return check_storable(value, what)


def _expires(value: timedelta | float | None) -> timedelta | None:
    if value is None:
        return None
    if not isinstance(value, timedelta):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expires must be a timedelta or seconds, not {value!r}")
        value = timedelta(seconds=value)
    if value <= timedelta(0):
        raise ValueError(f"expires must be positive, not {value!r}")
    return value


@runtime_checkable
class ScheduledTask(Protocol):
    """What a schedule needs of a task object (a ``Task`` is one): its name and defaults,
    and the check that its function can take the schedule's arguments."""

    @property
    def name(self) -> str: ...

    @property
    def queue(self) -> str: ...

    @property
    def priority(self) -> int: ...

    @property
    def max_attempts(self) -> int: ...

    def check_call(self, kwargs: Mapping[str, Any], /) -> None: ...


class ScheduleHost(Protocol):
    """What schedules need of the app that declares them (an ``App`` is one): its tasks
    and schedules, how it encodes arguments, and its connections. A protocol, so that this
    module does not import the app that imports it."""

    @property
    def connections(self) -> Connections: ...

    @property
    def tasks(self) -> Mapping[str, ScheduledTask]: ...

    @property
    def schedules(self) -> Mapping[str, Schedule]: ...

    @property
    def schedule_sources(self) -> Sequence[ScheduleSource]: ...

    @property
    def json_dumps(self) -> Dumps: ...

    @property
    def max_args_bytes(self) -> int: ...

    @property
    def default_queue(self) -> str: ...

    @property
    def migrate_command(self) -> str: ...


@dataclass(frozen=True)
class ScheduleSpec:
    """When and how a schedule runs its task, as given (validated by ``Schedule.from_spec``):
    the keywords ``App.add_schedule``, ``Task.schedule`` and ``runtime_schedules.add``
    take, held once.

    ``trigger``: a ``Cron``, an ``Every``, a cron string (UTC) or any object with ``spec``,
    ``latest()`` and ``next()``; ``args``: the job arguments; ``queue``, ``priority`` and
    ``max_attempts``: None takes the task's defaults; ``expires``: each job expires at its
    tick plus this; ``meta``: added to each job's meta; ``task_ids``: each job gets its own
    uuid4 ``meta["task_id"]``.
    """

    trigger: Trigger | str
    args: Mapping[str, Any] | None = None
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    expires: timedelta | float | None = None
    meta: Mapping[str, Any] | None = None
    task_ids: bool = False


@dataclass(frozen=True)
class Schedule:
    """A periodic job: ``task`` with ``args`` at every tick of ``trigger``.

    Made by ``App.add_schedule`` (or ``Task.schedule``). ``queue``, ``priority`` and
    ``max_attempts`` left at None take the task's defaults when the task is registered in
    the app, else the app's default queue, 0 and 3. Each job's ``expires_at`` is its tick
    plus ``expires``, and its ``meta`` carries ``{"schedule": name, "tick": ISO time}``;
    with ``task_ids`` also a fresh uuid4 ``"task_id"`` (the external id ``App.find_job``
    looks up, which the Celery facade uses as the task id).
    """

    name: str
    task: str
    trigger: Trigger
    args: Mapping[str, Any] = field(default_factory=dict)
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    expires: timedelta | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    task_ids: bool = False
    task_object: ScheduledTask | None = field(default=None, repr=False, compare=False)
    #: Count ticks from this instant (see the module docstring); None: from first sight.
    since: datetime | None = None

    @classmethod
    def declare(
        cls,
        app: ScheduleHost,
        name: str,
        task: ScheduledTask | str,
        *,
        trigger: Trigger | str,
        args: Mapping[str, Any] | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        expires: timedelta | float | None = None,
        meta: Mapping[str, Any] | None = None,
        task_ids: bool = False,
    ) -> Schedule:
        """``from_spec`` with the spec's fields as keywords."""
        return cls.from_spec(app, name, task, ScheduleSpec(
            trigger=trigger, args=args, queue=queue, priority=priority,
            max_attempts=max_attempts, expires=expires, meta=meta, task_ids=task_ids))

    @classmethod
    def from_spec(cls, app: ScheduleHost, name: str, task: ScheduledTask | str,
                  spec: ScheduleSpec) -> Schedule:
        """Validate everything now (ValueError, ``InvalidArgs`` for args and meta, TypeError
        for args the task's function cannot take), so a mistake fails at import time rather
        than in every worker round."""
        task_object = task if isinstance(task, ScheduledTask) else None
        task_name = _text(task.name if isinstance(task, ScheduledTask) else task, "task name")
        max_attempts, priority, args, meta = spec.max_attempts, spec.priority, spec.args, spec.meta
        if max_attempts is not None and max_attempts < 1:
            raise ValueError("max_attempts must be at least 1 (it includes the first run)")
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
            raise ValueError(f"priority must be an int, not {priority!r}")
        for label, value in (("args", args), ("meta", meta)):
            if value is not None and not isinstance(value, Mapping):
                raise ValueError(f"{label} must be a mapping, not {value!r}")
        schedule = cls(
            name=_text(name, "schedule name"), task=task_name, trigger=as_trigger(spec.trigger),
            args=dict(args or {}),
            queue=None if spec.queue is None else _text(spec.queue, "queue"),
            priority=priority, max_attempts=max_attempts, expires=_expires(spec.expires),
            meta=dict(meta or {}), task_ids=bool(spec.task_ids), task_object=task_object,
        )
        # Every name is indexed (a schedule's, in its table's key): the enqueue's limits.
        check_name(schedule.name, "a schedule name")
        check_name(schedule.task, "a task name")
        check_name(schedule.resolved_queue(app), "a queue name")
        schedule.args_json(app)
        schedule.meta_json(app, EPOCH)
        # A task named by string may live in another process; a Task's function is here.
        target = task_object or app.tasks.get(task_name)
        if target is not None:
            target.check_call(schedule.args)
        return schedule

    def args_json(self, app: ScheduleHost) -> str:
        """The job arguments as JSON text (raises ``InvalidArgs``)."""
        return encode_args(dict(self.args), app.json_dumps, app.max_args_bytes)

    def meta_json(self, app: ScheduleHost, tick: datetime) -> str:
        """The meta of the job for ``tick``: the schedule's own, plus schedule and tick (and
        a new task id with ``task_ids``)."""
        meta = {**self.meta, "schedule": self.name, "tick": tick.isoformat()}
        if self.task_ids:
            meta["task_id"] = str(uuid.uuid4())
        return encode_args(meta, app.json_dumps, app.max_args_bytes)

    def resolved_queue(self, app: ScheduleHost) -> str:
        """The queue its jobs go to."""
        task = self.task_object or app.tasks.get(self.task)
        return self.queue or (task.queue if task else app.default_queue)

    def request(self, app: ScheduleHost, tick: datetime) -> JobRequest:
        """The job to insert for ``tick`` (due at once; the SQL sets scheduled_at)."""
        task = self.task_object or app.tasks.get(self.task)
        priority = self.priority if self.priority is not None else (task.priority if task else 0)
        max_attempts = self.max_attempts or (task.max_attempts if task else 3)
        return JobRequest(
            task=self.task, queue=self.resolved_queue(app), args=self.args_json(app),
            priority=priority, max_attempts=max_attempts,
            expires_at=tick + self.expires if self.expires else None,
            meta=self.meta_json(app, tick),
        )


Action = Literal["start", "reset", "enqueue"]


def plan(trigger: Trigger, state: Mapping[str, Any] | None, now: datetime,
         since: datetime | None = None) -> tuple[Action, datetime] | None:
    """What to do with a schedule at ``now`` given its state row (None when it has none):
    ``("start" | "reset", tick)`` records ``tick`` without running it, ``("enqueue", tick)``
    runs it, None does nothing. ``since``: the schedule's own reference instant."""
    if state is None or state["spec"] != trigger.spec:
        tick = trigger.latest(now)
        action: Action = "start" if state is None else "reset"
        if since is not None:
            # Ticks after since count; never step back behind a tick already accounted for
            # (a worker still on the old definition may have run it a moment ago).
            return action, since if state is None else max(since, state["last_tick"])
        # Nothing at or before now fires: with no tick yet, the first one after now will.
        return action, (now if tick is None else tick)
    tick = trigger.latest_after(state["last_tick"], now) if isinstance(trigger, LastRunTrigger) \
        else trigger.latest(now)
    floor = state["last_tick"] if since is None else max(state["last_tick"], since)
    if tick is not None and tick > floor:
        return "enqueue", tick
    return None


def next_check_in(triggers: list[Trigger], now: datetime) -> float:
    """Seconds until the next check: at the earliest next tick, but no sooner than
    ``MIN_CHECK_INTERVAL`` nor later than ``MAX_CHECK_INTERVAL``."""
    wait = MAX_CHECK_INTERVAL
    for trigger in triggers:
        try:
            wait = min(wait, (trigger.next(now) - now).total_seconds())
        except Exception:  # a broken custom trigger must not stop the others
            logger.exception("trigger %r failed", trigger)
    return max(MIN_CHECK_INTERVAL, wait)


class ScheduleSource(Protocol):
    """Schedules kept outside the code, e.g. in another application's tables.

    ``load`` is awaited on every pass of every worker (about once a second while it asks
    for that with ``check_interval``): it returns the schedules to bring up to date now,
    may cache them between passes, and handles its own errors other than transient ones.
    ``enqueued`` is awaited in the transaction that enqueued ``job_id`` for ``tick``:
    returning False rolls that back (no job, the tick not taken).
    """

    @property
    def check_interval(self) -> float:
        """The longest wait (seconds) before this source wants to be asked again."""

    async def load(self, connection: psycopg.AsyncConnection) -> Sequence[Schedule]:
        """The schedules of this source, as of now."""

    async def enqueued(self, connection: psycopg.AsyncConnection, schedule: Schedule,
                       tick: datetime, job_id: int) -> bool:
        """Record the run in the source's own rows (same transaction); False withdraws it."""


#: A worker compares the runtime schedules it holds with the stored ones this often (seconds)
#: even without a notification (a lost LISTEN connection, PgBouncer in transaction mode):
#: one aggregate over the rows, and the versions only when it differs.
RUNTIME_POLL_INTERVAL = 10.0
#: Runtime ticks per enqueue statement. Each statement costs the worker ~0.4 ms of CPU
#: however few ticks it carries (psycopg, the lock timeout's pipeline, the pause, the pass's
#: bookkeeping) against ~2.5 µs a tick, so a minute boundary's thousands of ticks go in a
#: few large statements: each holds the event loop ~2.5 ms (taking, encoding and advancing
#: its ticks) and a server core ~15 ms, and the whole boundary takes about half the wall
#: time and the server work of statements of 100 (bench.schedules, see bench/PROFILE.md).
RUNTIME_BATCH = 1000
#: Seconds between two tick statements of one pass.
RUNTIME_BATCH_PAUSE = 0.002
#: Runtime schedules per timing read (loading the timetable).
RUNTIME_READ_BATCH = 500
#: Rows placed in the timetable between two yields to the event loop.
RUNTIME_LOAD_SLICE = 25
#: Seconds of trigger evaluation in one slice of the work moved off a boundary (the tick
#: after the next of each schedule that fired), and slices per pass: a pass, about once a
#: second from ``RUNTIME_PREPARE_DELAY`` after a boundary until done, spends at most ~10 ms
#: on it. A boundary's dozens of distinct cron triggers cost about half a millisecond each.
RUNTIME_PREPARE_SLICE = 0.002
RUNTIME_PREPARE_SLICES = 5
#: Seconds after a pass that enqueued ticks before that work starts.
RUNTIME_PREPARE_DELAY = 2.0
#: A worker that hears of a changed runtime schedule looks this many seconds later, so that
#: a burst of changes (a bulk add) makes one pass.
SCHEDULE_CHANGE_GRACE = 0.05


class Scheduler:
    """Enqueues the due runs of an app's schedules; every worker runs one.

    Two kinds: the schedules the app declares in code (``app.schedules``, checked one by one
    each pass, as few as a codebase declares), and the runtime schedules stored in the
    database (``App.runtime_schedules``), held in a ``Timetable``: loaded in full on the
    first pass, then again only for the names ``changed`` reports (the worker's LISTEN on
    ``akadze_schedules``) and when the stored versions' fingerprint, polled every
    ``RUNTIME_POLL_INTERVAL`` seconds, differs from the one held. Their due ticks are
    enqueued ``RUNTIME_BATCH`` at a time, one statement each.
    """

    def __init__(self, app: ScheduleHost) -> None:
        self.app = app
        self.timetable = Timetable()
        self._changed: set[str] = set()
        self._resync = True  # compare every version (at the first pass: load them all)
        self._next_poll = 0.0
        self._conflicts: set[str] = set()
        self._prepare_after = 0.0  # monotonic; see RUNTIME_PREPARE_DELAY

    @property
    def pending(self) -> bool:
        """Whether changes were heard that no pass has taken in yet."""
        return self._resync or bool(self._changed)

    def changed(self, name: str) -> None:
        """The runtime schedule ``name`` was added, changed or removed (a notification);
        an empty name means any may have been: the next pass compares every version."""
        if name:
            self._changed.add(name)
        else:
            self._resync = True

    async def enqueue_due(self, connection: psycopg.AsyncConnection) -> float:
        """Bring every schedule up to the database's ``now()``: record new and changed code
        schedules, take in changed runtime ones, enqueue due ticks. Returns seconds until it
        should run again."""
        now = await ticks.schedule_clock(connection)
        wait = MAX_CHECK_INTERVAL
        schedules = list(self.app.schedules.values())
        sources: dict[str, ScheduleSource] = {}
        for source in self.app.schedule_sources:
            wait = min(wait, source.check_interval)
            for schedule in await source.load(connection):
                if schedule.name in self.app.schedules or schedule.name in sources:
                    logger.warning("schedule %r is declared twice: the second is ignored",
                                   schedule.name)
                    continue
                schedules.append(schedule)
                sources[schedule.name] = source
        if schedules:
            states = await ticks.schedule_states(
                connection, [schedule.name for schedule in schedules])
            schedules = [schedule for schedule in schedules
                         if not self._owned_by_runtime(schedule, states.get(schedule.name))]
            for schedule in schedules:
                await self._bring_up_to_date(connection, schedule, states.get(schedule.name),
                                             now, sources.get(schedule.name))
            wait = min(wait, next_check_in([schedule.trigger for schedule in schedules], now))
        return max(MIN_CHECK_INTERVAL, min(wait, await self._runtime_due(connection, now)))

    def _owned_by_runtime(self, schedule: Schedule, state: Mapping[str, Any] | None) -> bool:
        owned = state is not None and state.get("source") == "runtime"
        if owned and schedule.name not in self._conflicts:
            logger.warning("schedule %r is declared in code, but a runtime schedule holds "
                           "that name: the runtime one runs; rename the code one or remove "
                           "the runtime one", schedule.name)
        if owned:
            self._conflicts.add(schedule.name)
        else:
            self._conflicts.discard(schedule.name)
        return owned

    async def _bring_up_to_date(self, connection: psycopg.AsyncConnection, schedule: Schedule,
                                state: Mapping[str, Any] | None, now: datetime,
                                source: ScheduleSource | None = None) -> None:
        spec = schedule.trigger.spec
        try:
            step = plan(schedule.trigger, state, now, schedule.since)
            if step is not None and step[0] != "enqueue":
                action, tick = step
                recorded = await ticks.record_schedule_tick(
                    connection, schedule.name, spec, tick, reset=action == "reset")
                if recorded and action == "reset":
                    logger.info("schedule %r changed to %s: it runs from the next tick "
                                "after %s", schedule.name, spec, tick.isoformat())
                # Counted from its own instant, a tick that already passed may be due now.
                step = None if schedule.since is None else \
                    plan(schedule.trigger, {"spec": spec, "last_tick": tick}, now, schedule.since)
            request = schedule.request(self.app, step[1]) if step is not None else None
        except psycopg.Error:
            raise
        except Exception:  # a custom trigger's bug, or a task whose defaults broke
            logger.exception("schedule %r: cannot compute its next run", schedule.name)
            return
        if step is None or request is None:
            return
        tick = step[1]
        # A tick that depends on the last run is enqueued only from that same last run.
        expected = state["last_tick"] if state is not None and isinstance(
            schedule.trigger, LastRunTrigger) else None
        if source is None:
            job_id = await ticks.enqueue_schedule_tick(
                connection, request, name=schedule.name, spec=spec, tick=tick,
                expected=expected)
        else:
            job_id = await self._enqueue_for(source, connection, schedule, request, tick,
                                             expected)
        if job_id is not None:
            logger.info("schedule %r: enqueued job %s %s for %s", schedule.name, job_id,
                        schedule.task, tick.isoformat())

    @staticmethod
    async def _enqueue_for(source: ScheduleSource, connection: psycopg.AsyncConnection,
                           schedule: Schedule, request: JobRequest, tick: datetime,
                           expected: datetime | None = None) -> int | None:
        """Enqueue the tick and let ``source`` record it, in one transaction."""
        async with connection.transaction():
            job_id = await ticks.enqueue_schedule_tick(
                connection, request, name=schedule.name, spec=schedule.trigger.spec, tick=tick,
                expected=expected)
            if job_id is None:
                return None
            if not await source.enqueued(connection, schedule, tick, job_id):
                raise psycopg.Rollback()
            return job_id
        return None  # rolled back: the source withdrew the run

    # --- runtime schedules ----------------------------------------------------------------

    async def _runtime_due(self, connection: psycopg.AsyncConnection, now: datetime) -> float:
        """Refresh the timetable where needed, enqueue its due ticks; seconds until the next
        tick (or poll)."""
        await self._refresh(connection, now)
        enqueued = 0
        took = False
        while True:
            due = self.timetable.take_due(now, RUNTIME_BATCH)
            if not due:
                break
            took = True
            try:
                if enqueued:
                    # Paced: a minute's thousands of ticks spread over a few hundred ms, so
                    # the claims of every worker never queue behind one burst of inserts.
                    await asyncio.sleep(RUNTIME_BATCH_PAUSE)
                enqueued += await ticks.enqueue_runtime_ticks(connection, due)
            except BaseException:
                self.timetable.put_back(due)
                raise
            # Enqueued here, or by another worker (or paused, changed, removed: then a
            # notification is on its way and reloads it).
            self.timetable.advance(due)
        if enqueued:
            logger.info("runtime schedules: enqueued %d jobs for ticks up to %s", enqueued,
                        now.isoformat(timespec="seconds"))
        wait = self._next_poll - time.monotonic()
        following = self.timetable.next_fire()
        if following is not None:
            wait = min(wait, (following - now).total_seconds())
        if took:
            # Not in the seconds of the boundary's own work: those are the busiest.
            self._prepare_after = time.monotonic() + RUNTIME_PREPARE_DELAY
        elif self.timetable.unprepared and time.monotonic() >= self._prepare_after:
            await self._prepare()
        if self.timetable.unprepared:
            wait = min(wait, max(MIN_CHECK_INTERVAL, self._prepare_after - time.monotonic()))
        return wait

    async def _prepare(self) -> None:
        """Compute ahead the tick after the next one of schedules a boundary moved on, in
        slices with the event loop let through between them."""
        for _ in range(RUNTIME_PREPARE_SLICES):
            if self.timetable.prepare(RUNTIME_PREPARE_SLICE):
                return
            await asyncio.sleep(0)

    async def _refresh(self, connection: psycopg.AsyncConnection, now: datetime) -> None:
        if time.monotonic() >= self._next_poll:
            self._next_poll = time.monotonic() + RUNTIME_POLL_INTERVAL
            if not self._resync:
                stored = await ticks.runtime_schedule_fingerprint(connection)
                self._resync = stored != self.timetable.fingerprint()
        names: list[str]
        if self._resync:
            # Cleared first: a notification arriving meanwhile is handled next pass.
            self._resync = False
            self._changed.clear()
            versions = await ticks.runtime_schedule_versions(connection)
            names, removed = self.timetable.stale(versions)
            self.timetable.drop(removed)
        else:
            names, self._changed = sorted(self._changed), set()
        for start in range(0, len(names), RUNTIME_READ_BATCH):
            chunk = names[start:start + RUNTIME_READ_BATCH]
            rows = await ticks.runtime_schedule_timing(connection, chunk)
            found = {row["name"] for row in rows}
            self.timetable.drop(name for name in chunk if name not in found)
            for first in range(0, len(rows), RUNTIME_LOAD_SLICE):
                # Slices, with the loop let through between them: schedules with many
                # distinct cron triggers cost about a millisecond each to place, and claims
                # must not wait for thousands of them.
                self.timetable.load(rows[first:first + RUNTIME_LOAD_SLICE], now)
                await asyncio.sleep(0)


async def run_schedules(app: ScheduleHost, stop: asyncio.Event) -> None:
    """Enqueue the app's schedules until ``stop`` is set, with no worker around them: for
    teams that want a separate scheduler process (workers do this by default). Changes of
    runtime schedules are heard on a LISTEN connection of its own, as in a worker. Transient
    database errors are logged and retried with backoff; others propagate."""
    scheduler = Scheduler(app)
    poke = asyncio.Event()

    def changed(name: str) -> None:
        scheduler.changed(name)
        poke.set()

    listener = asyncio.create_task(listen_for_jobs(
        listen_url(app.connections.database_url), [], lambda: None, _backoff,
        connect_kwargs=app.connections.connection_kwargs, schedules_changed=changed),
        name="listener")
    failures = 0
    try:
        while not stop.is_set():
            try:
                async with await app.connections.connect_async(autocommit=True) as connection:
                    failures = 0
                    while not stop.is_set():
                        poke.clear()
                        wait = await scheduler.enqueue_due(connection)
                        if scheduler.pending:
                            wait = SCHEDULE_CHANGE_GRACE
                        await first_of(stop, poke, timeout=wait)
                        if poke.is_set() and not stop.is_set():
                            await asyncio.sleep(SCHEDULE_CHANGE_GRACE)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                if is_prepared_statement_lost(exc):
                    app.connections.stop_preparing()  # the next connection runs it unprepared
                failures += 1
                delay = _backoff(failures)
                logger.warning("scheduler lost the database (%s); retrying in %.1fs",
                               type(exc).__name__, delay)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
    finally:
        await cancel_and_wait(listener)


def _backoff(failures: int) -> float:
    return min(30.0, 0.5 * 2 ** failures) * random.uniform(0.5, 1.0)


__all__ = ["Schedule", "ScheduleHost", "ScheduleSource", "ScheduleSpec", "ScheduledTask",
           "Scheduler", "next_check_in", "plan",
           "run_schedules"]
