"""What each dashboard page shows, read from the database (statements: dashboard.sql).

Plain functions of a sync connection, so the pages, the tests and the benchmark share
them. The actions are the core's own functions (``control.requeue_sync``,
``control.request_cancel_sync``, ``lookup.purge``, ``pauses.pause``), never a statement
of their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg

from ..model.jobs import Job
from ..model.task_ids import TaskIds
from ..ops.control import broadcast, request_cancel_sync, requeue_sync
from ..schedules.triggers import parse_spec
from ..store import database, lookup, pauses
from ..store.queries import load_queries

if TYPE_CHECKING:
    from ..app import App

#: Counts beyond this are shown as "N+": the overview reads at most this many index entries
#: per count, whatever the size of the backlog.
COUNT_CAP = 100_000
#: The last hour's statistics use at most this many finished jobs per final state.
HOUR_CAP = 20_000
#: Ids one jobs page walks at most (the primary key, newest first) when its filters match
#: few rows: the page then offers the next, older window.
ID_WINDOW = 50_000
#: A bulk action changes at most this many jobs per click (one transaction).
BULK_LIMIT = 1_000
#: A job page follows its workflow links this many jobs deep at most.
RELATIVES_LIMIT = 200
MINUTES = 60


def _statement(name: str) -> str:
    return load_queries("akadze_core", "dashboard/dashboard.sql")[name]


def run(connection: psycopg.Connection, name: str, /, **params: Any) -> list[dict[str, Any]]:
    """The rows of the dashboard statement ``name``."""
    return database.run_statement_sync(connection, _statement(name), **params)


def now(connection: psycopg.Connection) -> datetime:
    """The database's clock (the only one the pages use)."""
    return run(connection, "clock")[0]["now"]  # type: ignore[no-any-return]


# --- overview ------------------------------------------------------------------------------

@dataclass
class QueueRow:
    """One queue's line of the overview."""

    queue: str
    queued: int = 0
    scheduled: int = 0
    running: int = 0
    failed: int = 0
    succeeded_hour: int = 0
    failed_hour: int = 0
    cancelled_hour: int = 0
    latency_avg: float | None = None
    latency_p95: float | None = None
    #: Paused for the fleet (``akadze queues pause``): no worker claims its jobs.
    paused: bool = False

    @property
    def throughput(self) -> float:
        """Jobs finished per minute over the last hour."""
        return (self.succeeded_hour + self.failed_hour + self.cancelled_hour) / MINUTES

    @property
    def failure_rate(self) -> float | None:
        """Failed / (succeeded + failed) over the last hour (None: nothing finished)."""
        done = self.succeeded_hour + self.failed_hour
        return self.failed_hour / done if done else None


@dataclass
class Overview:
    """The overview page: per queue counts, and per minute series of the last hour."""

    queues: list[QueueRow]
    estimate: int
    succeeded: list[float] = field(default_factory=list)
    failed: list[float] = field(default_factory=list)
    latency_avg: list[float | None] = field(default_factory=list)
    latency_p95: list[float | None] = field(default_factory=list)
    capped: bool = False
    cap: int = COUNT_CAP

    @property
    def failure_rate(self) -> list[float | None]:
        """Per minute: failed / (succeeded + failed), None when nothing finished."""
        return [f / (s + f) if s + f else None
                for s, f in zip(self.succeeded, self.failed, strict=True)]


def overview(connection: psycopg.Connection) -> Overview:
    """Everything the overview shows, in five bounded statements."""
    rows: dict[str, QueueRow] = {}

    def row(queue: str) -> QueueRow:
        return rows.setdefault(queue, QueueRow(queue))

    capped = False
    active = run(connection, "active_counts", cap=COUNT_CAP)
    for line in active:
        entry = row(line["queue"])
        entry.queued, entry.scheduled, entry.running = (
            int(line["queued"]), int(line["scheduled"]), int(line["running"]))
    if sum(entry.queued + entry.scheduled for entry in rows.values()) >= COUNT_CAP:
        capped = True
    failed = run(connection, "failed_counts", cap=COUNT_CAP)
    for line in failed:
        row(line["queue"]).failed = int(line["failed"])
    if sum(int(line["failed"]) for line in failed) >= COUNT_CAP:
        capped = True
    result = Overview(queues=[], estimate=int(run(connection, "table_estimate")[0]["jobs"]))
    result.succeeded = [0.0] * MINUTES
    result.failed = [0.0] * MINUTES
    result.latency_avg = [None] * MINUTES
    result.latency_p95 = [None] * MINUTES
    for line in run(connection, "hour_stats", cap=HOUR_CAP):
        minute = line["minutes_ago"]
        if line["per_minute"]:
            if minute is None or not 0 <= minute < MINUTES:
                continue
            slot = MINUTES - 1 - minute  # oldest first
            if line["all_states"]:
                result.latency_avg[slot] = _float(line["latency_avg"])
                result.latency_p95[slot] = _float(line["latency_p95"])
            elif line["state"] == "succeeded":
                result.succeeded[slot] = float(line["jobs"])
            elif line["state"] == "failed":
                result.failed[slot] = float(line["jobs"])
            continue
        entry = row(line["queue"])
        if line["all_states"]:
            entry.latency_avg = _float(line["latency_avg"])
            entry.latency_p95 = _float(line["latency_p95"])
        else:
            setattr(entry, f"{line['state']}_hour", int(line["jobs"]))
    for paused in pauses.paused(connection):
        row(paused.queue).paused = True
    result.queues = [rows[name] for name in sorted(rows)]
    result.capped = capped
    return result


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def queue_names(connection: psycopg.Connection) -> list[str]:
    """Queues with active or failed jobs or a worker (the filter forms' choices)."""
    return [row["queue"] for row in run(connection, "queue_names")]


# --- jobs list -----------------------------------------------------------------------------

@dataclass(frozen=True)
class JobFilter:
    """The jobs list's filters (None: any)."""

    state: str | None = None
    queue: str | None = None
    task: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def params(self) -> dict[str, Any]:
        """The statement parameters of these filters."""
        return {"state": self.state, "queue": self.queue, "task": self.task,
                "since": self.since, "until": self.until}

    @property
    def empty(self) -> bool:
        """No filter at all."""
        return not any(self.params().values())


@dataclass
class JobPage:
    """One page of the jobs list: its rows, and where the next (older) page starts."""

    jobs: list[dict[str, Any]]
    #: The ``before`` of the next page (None: this is the oldest).
    next_before: int | None
    #: The id window this page searched (shown when the filters matched few rows in it).
    low: int
    high: int
    window_exhausted: bool


def _id_at(connection: psycopg.Connection, when: datetime, low: int, high: int) -> int:
    """The smallest id whose job was created at or after ``when`` (binary search on the
    primary key: about 20 probes for a million ids), or ``high + 1`` if none."""
    while low < high:
        middle = (low + high) // 2
        found = run(connection, "id_at_time", id=middle)
        if not found or found[0]["id"] > high or found[0]["created_at"] >= when:
            high = middle
        else:
            low = found[0]["id"] + 1
    found = run(connection, "id_at_time", id=low)
    if found and found[0]["created_at"] >= when:
        return int(found[0]["id"])
    return high + 1


def job_page(connection: psycopg.Connection, filters: JobFilter, before: int | None,
             codec: TaskIds, limit: int = 50) -> JobPage:
    """The newest ``limit`` jobs matching ``filters`` with ids below ``before``.

    Keyset pagination on the primary key: a page never counts or skips rows, so page 1,000
    costs what page 1 does. A time filter becomes an id range first (ids follow insert
    order), and each page walks at most ``ID_WINDOW`` ids: with sparse matches the page
    says so and links to the next window.
    """
    bounds = run(connection, "id_bounds")[0]
    if bounds["low"] is None:
        return JobPage([], None, 0, 0, True)
    first, last = int(bounds["low"]), int(bounds["high"])
    high = last if before is None else min(last, before - 1)
    floor = first
    if filters.since is not None:
        floor = max(floor, _id_at(connection, filters.since, first, last))
    if filters.until is not None:
        high = min(high, _id_at(connection, filters.until, first, last) - 1)
    low = max(floor, high - ID_WINDOW + 1)
    if high < floor:
        return JobPage([], None, floor, high, True)
    rows = run(connection, "job_page", **filters.params(), low=low, high=high,
               limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    for row in rows:
        if row["task_id"] is None:  # known by the id derived from its job id
            row["task_id"] = codec.derive(int(row["id"]))
    if more:
        next_before: int | None = int(rows[-1]["id"])
    elif low > floor:
        # The window ran out before the page filled: older ids remain to be searched.
        next_before = rows[-1]["id"] if len(rows) == limit else low
    else:
        next_before = None
    return JobPage(rows, next_before, low, high, not more and len(rows) < limit)


def find(connection: psycopg.Connection, text: str, codec: TaskIds) -> Job | None:
    """The job of a job id, or of a task id (``meta.task_id``, its index; or derived from
    a job id: ``akadze_core.model.task_ids``)."""
    text = text.strip()
    if text.isdigit() and len(text) < 19:
        job = lookup.get_job(connection, int(text))
        if job is not None:
            return job
    if not text:
        return None
    return lookup.find_job(connection, text, codec.job_id(text))


# --- one job -------------------------------------------------------------------------------

@dataclass
class Relative:
    """A job linked to the shown one by a workflow (chain, group, chord, errback)."""

    id: int
    task: str
    queue: str
    state: str
    upstreams: list[int]
    dependents: list[int]


def relatives(connection: psycopg.Connection, job: Job) -> list[Relative]:
    """The jobs reachable from ``job`` through upstreams and dependents (its whole
    workflow: a chain's steps, a chord's members and body, errbacks), hop by hop, at most
    ``RELATIVES_LIMIT``, by id."""
    seen: dict[int, Relative] = {}
    frontier = {*(job.upstreams or ()), *(job.dependents or ())} - {job.id}
    while frontier and len(seen) < RELATIVES_LIMIT:
        ids = sorted(frontier)[: RELATIVES_LIMIT - len(seen)]
        frontier = set()
        for row in run(connection, "relatives", ids=ids):
            entry = Relative(int(row["id"]), row["task"], row["queue"], row["state"],
                             list(row["upstreams"] or ()), list(row["dependents"] or ()))
            seen[entry.id] = entry
            frontier.update(entry.upstreams)
            frontier.update(entry.dependents)
        frontier -= set(seen) | {job.id}
    return [seen[key] for key in sorted(seen)]


def timeline(job: Job) -> list[tuple[datetime, str]]:
    """The job's state changes that its row records, in time order: created, due,
    each failed attempt, the last start, the end."""
    events: list[tuple[datetime, str]] = []
    if job.created_at is not None:
        events.append((job.created_at, "created"))
    if job.created_at is None or (job.scheduled_at - job.created_at).total_seconds() > 1:
        events.append((job.scheduled_at, "due (countdown, eta or retry backoff)"))
    for error in job.errors:
        at = error.get("at")
        when = _parse_time(at)
        if when is not None:
            events.append((when, f"attempt {error.get('attempt')} ended: "
                                 f"{error.get('type')}: {error.get('message')}"))
    if job.started_at is not None:
        events.append((job.started_at, f"started (attempt {job.attempt})"))
    if job.finished_at is not None:
        events.append((job.finished_at, job.state))
    if job.cancel_requested and job.state == "running":
        events.append((job.started_at or job.scheduled_at, "cancel requested"))
    return sorted(events, key=lambda event: event[0])


def _parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


# --- workers and schedules -----------------------------------------------------------------

def workers(connection: psycopg.Connection) -> tuple[list[dict[str, Any]],
                                                      dict[int | None, list[dict[str, Any]]]]:
    """Registered workers (with ``live``), and the running jobs by worker id."""
    running: dict[int | None, list[dict[str, Any]]] = {}
    for row in run(connection, "running_jobs", limit=1000):
        running.setdefault(row["worker_id"], []).append(row)
    return run(connection, "workers"), running


def schedules(connection: psycopg.Connection, app: App | None) -> list[dict[str, Any]]:
    """Every schedule: the runtime ones, the code ones of ``app`` (when the dashboard was
    given one) and the code state rows of other apps, each with its last and next run."""
    clock = now(connection)
    stored = {row["name"]: row for row in run(connection, "schedules")}
    listed: list[dict[str, Any]] = []
    declared = app.schedules if app is not None else {}
    for name, schedule in declared.items():
        assert app is not None
        row = stored.get(name)
        if row is not None and row["source"] == "runtime":
            continue
        listed.append({"name": name, "source": "code", "task": schedule.task,
                       "trigger": schedule.trigger.spec, "queue": schedule.resolved_queue(app),
                       "paused": False, "last_run": row["last_run"] if row else None,
                       "next_run": schedule.trigger.next(clock)})
    for name, row in stored.items():
        if row["source"] == "code" and name in declared:
            continue
        try:
            trigger: Any = parse_spec(row["spec"])
        except ValueError:
            trigger = None
        next_run = None if row["paused"] or trigger is None else trigger.next(clock)
        listed.append({"name": name, "source": row["source"], "task": row["task"],
                       "trigger": row["spec"], "queue": row["queue"], "paused": row["paused"],
                       "last_run": row["last_run"], "next_run": next_run,
                       "undeclared": row["source"] == "code"})
    return sorted(listed, key=lambda entry: entry["name"])


# --- actions: the core's own functions -----------------------------------------------------

def retry(connection: psycopg.Connection, job_id: int) -> bool:
    """Requeue a failed job (``control.requeue_sync``)."""
    return requeue_sync(connection, job_id)


def cancel(connection: psycopg.Connection, job_id: int) -> bool:
    """Cancel a queued job or ask a running one to stop (``control.request_cancel_sync``)."""
    return request_cancel_sync(connection, job_id)


def terminate(connection: psycopg.Connection, job_id: int) -> bool:
    """Cancel a running job and have its worker send SIGTERM to the process running it
    (``control.request_cancel_sync(terminate=True)``); False when it is not running."""
    job = lookup.get_job(connection, job_id)
    if job is None or job.state != "running":
        return False
    return request_cancel_sync(connection, job_id, terminate=True)


#: The remote-control commands the workers page sends, with what the notice says of each.
WORKER_COMMANDS = {"pool_grow": "pool grown by 1", "pool_shrink": "pool shrunk by 1",
                   "add_queue": "now consuming from {queue}",
                   "remove_queue": "no longer consuming from {queue}",
                   "shutdown": "shutdown requested (running jobs finish first)"}


def worker_control(app: App, name: str, command: str, queue: str | None) -> str:
    """Send ``command`` (one of ``WORKER_COMMANDS``) to the live worker ``name`` and wait
    for its answer (``control.broadcast``); returns what to tell the user."""
    arguments: dict[str, Any] = {"queue": queue} if command in ("add_queue", "remove_queue") \
        else {"n": 1} if command.startswith("pool_") else {}
    if command == "shutdown":
        broadcast(app, command, arguments, destination=[name])
        return WORKER_COMMANDS[command]
    replies = broadcast(app, command, arguments, destination=[name], reply=True, timeout=3.0)
    if not replies:
        return "no answer (the worker may have stopped)"
    reply = replies[0].reply
    if isinstance(reply, dict) and "error" in reply:
        return f"refused: {reply['error']}"
    if isinstance(reply, dict) and isinstance(reply.get("ok"), str):
        return str(reply["ok"])
    return WORKER_COMMANDS[command].format(queue=queue)


def purge(connection: psycopg.Connection, queue: str) -> int:
    """Delete the queued (and waiting) jobs of ``queue`` (``lookup.purge``)."""
    return lookup.purge(connection, [queue])


def set_paused(connection: psycopg.Connection, queue: str, paused: bool) -> bool:
    """Pause or resume ``queue`` for the fleet (``pauses.pause``/``resume``); True when
    that changed it."""
    if paused:
        return pauses.pause(connection, queue, "dashboard")
    return pauses.resume(connection, queue)


def bulk(connection: psycopg.Connection, action: str, filters: JobFilter) -> tuple[int, int]:
    """Retry (``action='retry'``: the failed ones) or cancel (``'cancel'``: the queued and
    running ones) up to ``BULK_LIMIT`` jobs matching ``filters``, newest first, in one
    transaction; returns (changed, selected). Run it again for the next batch."""
    # Not "waiting": no index has it, and cancelling a workflow's upstream ends its waiting
    # steps with it (akadze.settle).
    states: Sequence[str] = ("failed",) if action == "retry" else ("queued", "running")
    if filters.state is not None:
        states = [state for state in states if state == filters.state]
    params = {**filters.params()}
    params.pop("state")
    ids: list[int] = []
    for state in states:
        ids += [int(row["id"]) for row in run(connection, "bulk_targets", state=state,
                                              limit=BULK_LIMIT - len(ids), **params)]
        if len(ids) >= BULK_LIMIT:
            break
    step = retry if action == "retry" else cancel
    changed = 0
    with connection.transaction():
        for job_id in ids:
            changed += bool(step(connection, job_id))
    return changed, len(ids)
