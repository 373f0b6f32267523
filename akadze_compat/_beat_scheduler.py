"""Celery's ``celery.beat.Scheduler`` and ``ScheduleEntry``, for code that subclasses or wraps
them (``celery.beat`` re-exports them).

akadze runs ``beat_schedule`` inside its workers (``akadze_compat.beat``), not through a
Scheduler: these classes exist for add-ons built on them (celery-redbeat subclasses both;
Sentry and ddtrace wrap ``Scheduler.apply_entry`` and ``tick``) and for projects with a
scheduler of their own. They keep Celery's attributes, constructor arguments and call order
(``tick`` -> ``is_due`` -> ``reserve`` -> ``apply_entry`` -> ``apply_async``), so a subclass
driven by its own loop sends its due tasks through ``Task.apply_async`` as on Celery. What
differs: akadze sends through Postgres, so ``connection`` and ``producer`` are None, and no
``celery.backend_cleanup`` entry is added (results expire with their jobs).
"""

from __future__ import annotations

import copy
import heapq
import logging
import numbers
import time
from calendar import timegm
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any, NamedTuple

from .schedules import maybe_schedule
from .utils.time import humanize_seconds, maybe_make_aware

__all__ = ["DEFAULT_MAX_INTERVAL", "ScheduleEntry", "Scheduler", "SchedulingError", "event_t"]

logger = logging.getLogger("celery.beat")

#: The longest a scheduler sleeps between two looks at its schedule (seconds).
DEFAULT_MAX_INTERVAL = 300


class SchedulingError(Exception):
    """An entry could not be sent."""


class event_t(NamedTuple):
    """A scheduler heap item: when (a UTC timestamp), a priority, the entry."""

    time: float
    priority: int
    entry: Any


class ScheduleEntry:
    """One entry of a schedule: which task, when (``schedule``), with what arguments and
    options, when it last ran and how many times."""

    name: str | None = None
    schedule: Any = None
    args: Any = None
    kwargs: Any = None
    options: Any = None
    last_run_at: datetime | None = None
    total_run_count: int = 0

    def __init__(self, name: str | None = None, task: str | None = None,
                 last_run_at: datetime | None = None, total_run_count: int | None = None,
                 schedule: Any = None, args: Any = (), kwargs: Any = None,
                 options: Any = None, relative: bool = False, app: Any = None) -> None:
        self.app = app
        self.name = name
        self.task = task
        self.args = args
        self.kwargs = kwargs or {}
        self.options = options or {}
        self.schedule = maybe_schedule(schedule, relative, app=app)
        self.last_run_at = last_run_at or self.default_now()
        self.total_run_count = total_run_count or 0

    def default_now(self) -> datetime:
        """Now, in the schedule's time (the app's when there is no schedule)."""
        if self.schedule is not None:
            now: datetime = self.schedule.now()
            return now
        app_now: datetime = self.app.now()
        return app_now

    _default_now = default_now

    def _next_instance(self, last_run_at: datetime | None = None) -> ScheduleEntry:
        """A copy that ran once more, at ``last_run_at`` (default: now)."""
        fields = dict(self)
        fields.update(last_run_at=last_run_at or self.default_now(),
                      total_run_count=self.total_run_count + 1)
        return self.__class__(**fields)

    __next__ = next = _next_instance

    def __reduce__(self) -> tuple[Any, ...]:
        return self.__class__, (self.name, self.task, self.last_run_at, self.total_run_count,
                                self.schedule, self.args, self.kwargs, self.options)

    def update(self, other: ScheduleEntry) -> None:
        """Take ``task``, ``schedule``, ``args``, ``kwargs`` and ``options`` from ``other``
        (the fields a schedule's owner edits; run times and counts stay)."""
        for field in _EDITABLE:
            setattr(self, field, getattr(other, field))

    def is_due(self) -> Any:
        """``(is_due, seconds until the next check)``, from the schedule."""
        return self.schedule.is_due(self.last_run_at)

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(vars(self).items())

    def __repr__(self) -> str:
        arguments = [repr(arg) for arg in self.args or ()]
        arguments += [f"{key}={value!r}" for key, value in (self.kwargs or {}).items()]
        return (f"<{type(self).__name__}: {self.name} {self.task}({', '.join(arguments)}) "
                f"{self.schedule}")

    def __lt__(self, other: object) -> bool:
        # Heap items compare by time and priority first; entries only break exact ties,
        # where any order will do.
        if isinstance(other, ScheduleEntry):
            return id(self) < id(other)
        return NotImplemented

    def editable_fields_equal(self, other: ScheduleEntry) -> bool:
        """Whether ``other`` has the same task, arguments, options and schedule."""
        return all(getattr(self, field) == getattr(other, field) for field in _EDITABLE)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ScheduleEntry):
            return NotImplemented
        return self.editable_fields_equal(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by content


_EDITABLE = ("task", "schedule", "args", "kwargs", "options")


class Scheduler:
    """A schedule (name -> entry) and the loop step that sends what is due (``tick``).

    ``Scheduler(app, schedule=None, max_interval=None, Producer=None, lazy=False,
    sync_every_tasks=None)``: with ``lazy`` the schedule is not set up (Celery builds
    schedulers that way to ask them questions); otherwise ``setup_schedule`` merges
    ``beat_schedule`` into it.
    """

    Entry: type[ScheduleEntry] = ScheduleEntry

    #: The longest ``tick`` asks its caller to sleep (seconds).
    max_interval: float = DEFAULT_MAX_INTERVAL
    #: ``sync`` at least this often (seconds)...
    sync_every: float = 3 * 60
    #: ... and after this many sends (None: no count).
    sync_every_tasks: int | None = None

    _last_sync: float | None = None
    _tasks_since_sync = 0

    logger = logger

    def __init__(self, app: Any, schedule: Mapping[str, Any] | None = None,
                 max_interval: float | None = None, Producer: Any = None,
                 lazy: bool = False, sync_every_tasks: int | None = None,
                 **kwargs: Any) -> None:
        self.app = app
        self.data: Any = {} if schedule is None else schedule
        self.max_interval = (max_interval or app.conf.get("beat_max_loop_interval")
                             or self.max_interval)
        self.Producer = Producer
        self._heap: list[event_t] | None = None
        self.old_schedulers: Any = None
        self.sync_every_tasks = (app.conf.get("beat_sync_every") if sync_every_tasks is None
                                 else sync_every_tasks)
        if not lazy:
            self.setup_schedule()

    # --- the schedule ------------------------------------------------------------------

    def get_schedule(self) -> Any:
        """The entries, by name."""
        return self.data

    def set_schedule(self, schedule: Any) -> None:
        """Replace the entries."""
        self.data = schedule

    schedule = property(get_schedule, set_schedule)

    def setup_schedule(self) -> None:
        """Fill the schedule: default entries, then ``beat_schedule``."""
        self.install_default_entries(self.data)
        self.merge_inplace(self.app.conf.get("beat_schedule") or {})

    def install_default_entries(self, data: Any) -> None:
        """Entries every schedule has. Celery adds ``celery.backend_cleanup`` for a result
        store that does not expire results itself; akadze's expire with their jobs."""

    def add(self, **kwargs: Any) -> ScheduleEntry:
        """Add an entry made of ``kwargs`` (the Entry's constructor arguments)."""
        entry = self.Entry(app=self.app, **kwargs)
        self.schedule[entry.name] = entry
        return entry

    def _maybe_entry(self, name: str, entry: Any) -> ScheduleEntry:
        if isinstance(entry, self.Entry):
            entry.app = self.app
            return entry
        return self.Entry(**dict(entry, name=name, app=self.app))

    def update_from_dict(self, dict_: Mapping[str, Any]) -> None:
        """Add or replace entries from ``{name: entry or entry fields}``."""
        self.schedule.update({name: self._maybe_entry(name, entry)
                              for name, entry in dict_.items()})

    def merge_inplace(self, b: Mapping[str, Any]) -> None:
        """Make the schedule hold exactly ``b``'s names: drop the others, update the kept
        entries' editable fields (their run times stay), add the new ones."""
        schedule = self.schedule
        for key in set(schedule) ^ set(b):
            schedule.pop(key, None)
        for key in b:
            entry = self.Entry(**dict(b[key], name=key, app=self.app))
            if schedule.get(key):
                schedule[key].update(entry)
            else:
                schedule[key] = entry

    def schedules_equal(self, old_schedules: Any, new_schedules: Any) -> bool:
        """Whether two schedules have the same names and entries."""
        if old_schedules is None or new_schedules is None:
            return old_schedules is new_schedules
        if set(old_schedules) != set(new_schedules):
            return False
        return all(new_schedules.get(name) and new_schedules[name] == entry
                   for name, entry in old_schedules.items())

    # --- the loop step -----------------------------------------------------------------

    def adjust(self, n: float | None, drift: float = -0.010) -> float | None:
        """A positive delay made slightly shorter, so the next look is not late."""
        if n and n > 0:
            return n + drift
        return n

    def is_due(self, entry: ScheduleEntry) -> Any:
        """``(is_due, seconds until the next check)`` for ``entry``."""
        return entry.is_due()

    def _is_due_failed(self, entry: ScheduleEntry) -> tuple[bool, float]:
        # One entry whose next run cannot be computed must not stop the others.
        self.logger.error("beat: Cannot calculate the next run of %r, trying again in %s.",
                          entry.name, humanize_seconds(self.max_interval), exc_info=True)
        return False, self.max_interval

    def _when(self, entry: ScheduleEntry, next_time_to_run: float | None,
              mktime: Any = timegm) -> float:
        """The UTC timestamp ``next_time_to_run`` seconds from the entry's now."""
        now = maybe_make_aware(entry.default_now())
        return (mktime(now.utctimetuple()) + now.microsecond / 1e6
                + (self.adjust(next_time_to_run) or 0))

    def populate_heap(self) -> None:
        """Order the entries by when each is next due."""
        self._heap = []
        for entry in self.schedule.values():
            try:
                due, delay = entry.is_due()
            except Exception:
                due, delay = self._is_due_failed(entry)
            self._heap.append(event_t(self._when(entry, 0 if due else delay) or 0, 5, entry))
        heapq.heapify(self._heap)

    def tick(self, event_t: type[event_t] = event_t, min: Any = min,
             heappop: Any = heapq.heappop, heappush: Any = heapq.heappush) -> float:
        """Send the first entry if it is due; return how long to sleep before the next
        call (0: call again now), at most ``max_interval``."""
        max_interval = self.max_interval
        if self._heap is None or not self.schedules_equal(self.old_schedulers, self.schedule):
            self.old_schedulers = copy.copy(self.schedule)
            self.populate_heap()
        heap = self._heap
        assert heap is not None
        if not heap:
            return max_interval
        event = heap[0]
        entry = event.entry
        now = self._when(entry, 0)
        if event.time > now:
            return min(event.time - now, max_interval)
        try:
            due, next_time_to_run = self.is_due(entry)
        except Exception:
            due, next_time_to_run = self._is_due_failed(entry)
        first = heappop(heap)
        if first is not event:  # the heap changed under us: look again
            heappush(heap, first)
            return min(first.time - self._when(first.entry, 0), max_interval)
        if due:
            next_entry = self.reserve(entry)
            self.apply_entry(entry, producer=self.producer)
            heappush(heap, event_t(self._when(next_entry, next_time_to_run), event.priority,
                                   next_entry))
            return 0
        # The heap said due, the entry says later: put it back at its own time so that the
        # entries behind it get their turn.
        delay = next_time_to_run if isinstance(next_time_to_run, numbers.Number) \
            else max_interval
        heappush(heap, event_t(self._when(entry, delay), event.priority, entry))  # type: ignore[arg-type]
        if heap[0].entry is not entry:
            return 0
        return min(self.adjust(delay) or 0, max_interval)  # type: ignore[arg-type]

    def reserve(self, entry: ScheduleEntry) -> ScheduleEntry:
        """Count a run of ``entry`` now; the schedule keeps the updated copy."""
        new_entry = self.schedule[entry.name] = next(entry)
        return new_entry

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        """Send ``entry``'s task (an error is logged, not raised: beat keeps going)."""
        self.logger.info("Scheduler: Sending due task %s (%s)", entry.name, entry.task)
        try:
            result = self.apply_async(entry, producer=producer, advance=False)
        except Exception as exc:
            self.logger.error("Message Error: %s", exc, exc_info=True)
        else:
            self.logger.debug("%s sent. id->%s", entry.task, getattr(result, "id", None))

    def apply_async(self, entry: ScheduleEntry, producer: Any = None, advance: bool = True,
                    **kwargs: Any) -> Any:
        """Send ``entry``'s task with its arguments and options, marked as a beat send
        (the ``celery_beat_task`` header), through the task's ``apply_async`` when the app
        knows the task, else ``send_task``. Errors come out as ``SchedulingError``."""
        entry = self.reserve(entry) if advance else entry
        task = self.app.tasks.get(entry.task)
        try:
            args = list(entry.args or ())
            kwargs_ = dict(entry.kwargs or {})
            options = dict(entry.options)
            options["headers"] = {**(options.get("headers") or {}), "celery_beat_task": True}
            if task is not None:
                return task.apply_async(args, kwargs_, producer=producer, **options)
            return self.send_task(entry.task, args, kwargs_, producer=producer, **options)
        except Exception as exc:
            raise SchedulingError(
                f"Couldn't apply scheduled task {entry.name}: {exc}").with_traceback(
                    exc.__traceback__) from exc
        finally:
            self._tasks_since_sync += 1
            if self.should_sync():
                self._do_sync()

    def send_task(self, *args: Any, **kwargs: Any) -> Any:
        """``app.send_task``: an entry whose task this process does not know."""
        return self.app.send_task(*args, **kwargs)

    # --- persistence -------------------------------------------------------------------

    def should_sync(self) -> bool:
        """Whether ``sync`` is due (time since the last, or sends since the last)."""
        return bool(not self._last_sync
                    or time.monotonic() - self._last_sync > self.sync_every
                    or (self.sync_every_tasks
                        and self._tasks_since_sync >= self.sync_every_tasks))

    def _do_sync(self) -> None:
        try:
            self.sync()
        finally:
            self._last_sync = time.monotonic()
            self._tasks_since_sync = 0

    def sync(self) -> None:
        """Save the schedule (subclasses with storage do)."""

    def close(self) -> None:
        """Save the schedule; subclasses also release their storage."""
        self.sync()

    @property
    def connection(self) -> Any:
        """Celery's broker connection for sends: none here (sends go through Postgres)."""
        return None

    @property
    def producer(self) -> Any:
        """Celery's kombu producer for sends: none here (sends go through Postgres)."""
        return None

    @property
    def info(self) -> str:
        """A line about the scheduler's storage, for the beat banner."""
        return ""

