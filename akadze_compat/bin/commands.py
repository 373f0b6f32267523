"""``akadze-compat`` commands other than ``worker``: Celery's, answered from the database.

Celery asks its workers over the broker; here the database already knows: the ``workers``
table (heartbeats) says who is online, and the jobs say what runs and what waits. So
``inspect`` and ``status`` answer even for a worker that is busy, and ``scheduled`` lists
every waiting future task, whichever worker will run it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from datetime import datetime
from typing import Any

import click

from akadze_core import Job, run_schedules
from akadze_core.cli import dashboard_options, run_dashboard

from .. import states
from ..beat import warn_unhonoured_scheduler
from ..django_beat import names_database_scheduler
from ..exceptions import TimeoutError as CeleryTimeout
from .base import CliError, cli_state, secrets, split_names, warn
from .logs import setup_command_logging

__all__ = ["COMMANDS"]

#: Celery's EX_UNAVAILABLE: no worker answered.
EX_UNAVAILABLE = 69
#: At most this many rows are listed by ``inspect active``/``scheduled``.
LIST_LIMIT = 1000

def _state(ctx: click.Context) -> Any:
    return cli_state(ctx)


def _existing(app: Any) -> Any:
    """``app``, its database resolved without creating one: a command that only reads (or
    deletes what waits) must not leave a new embedded Postgres where it was typed."""
    app.core.resolve_database_url(create=False)
    return app


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _dumps(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


# --- reading the database -------------------------------------------------------------------

def live_nodes(core: Any) -> dict[str, list[dict[str, Any]]]:
    """Node name -> its live worker rows (one per process), judged on the database clock."""
    nodes: dict[str, list[dict[str, Any]]] = {}
    for row in core.list_workers(live=True):
        nodes.setdefault(row["name"], []).append(row)
    return nodes


def job_counts(core: Any) -> dict[str, dict[str, int]]:
    """Queue -> state -> number of jobs."""
    return dict(core.job_counts())


def _task_id(job: Job) -> str:
    return str(job.meta.get("task_id") or job.id)


def _request(job: Job, worker: dict[str, Any] | None = None) -> dict[str, Any]:
    """A job as Celery's request info (what ``inspect active`` lists)."""
    args = job.args if isinstance(job.args, dict) else {}
    meta = job.meta.get("celery")
    sent: dict[str, Any] = meta if isinstance(meta, dict) else {}
    return {
        "id": _task_id(job), "name": job.task, "args": args.get("args", []),
        "kwargs": args.get("kwargs", {}), "type": job.task,
        "hostname": worker["name"] if worker else None,
        "time_start": job.started_at.timestamp() if job.started_at else None,
        "acknowledged": job.state == "running",
        "delivery_info": {"exchange": sent.get("exchange") or "",
                          "routing_key": sent.get("routing_key") or job.queue,
                          "priority": job.priority, "redelivered": job.run_count > 1},
        "worker_pid": worker["pid"] if worker else None,
    }


# --- inspect / status -------------------------------------------------------------------------

def _inspect_ping(app: Any) -> dict[str, Any]:
    return {name: {"ok": "pong"} for name in live_nodes(app.core)}


def _inspect_reserved(app: Any) -> dict[str, Any]:
    # The database does not tell a worker's prefetched tasks from the running ones:
    # both are claimed (they are listed by active).
    return {name: [] for name in live_nodes(app.core)}


def _inspect_active_queues(app: Any) -> dict[str, Any]:
    return {name: [{"name": queue, "exchange": {"name": queue, "type": "direct"},
                    "routing_key": queue}
                   for queue in sorted({q for row in rows for q in row["queues"]})]
            for name, rows in live_nodes(app.core).items()}


def _inspect_active(app: Any) -> dict[str, Any]:
    core = app.core
    workers = {row["id"]: row for row in core.list_workers()}
    replies: dict[str, Any] = {name: [] for name in live_nodes(core)}
    for job in reversed(core.list_jobs(state="running", limit=LIST_LIMIT)):
        worker = workers.get(job.worker_id)
        name = worker["name"] if worker else f"worker-{job.worker_id}"
        replies.setdefault(name, []).append(_request(job, worker))
    return replies


def _inspect_scheduled(app: Any) -> dict[str, Any]:
    replies: dict[str, Any] = {}
    for job in app.core.list_scheduled(LIST_LIMIT):
        replies.setdefault(job.queue, []).append({
            "eta": job.scheduled_at.isoformat(), "priority": job.priority,
            "request": _request(job)})
    return replies


def _inspect_registered(app: Any) -> dict[str, Any]:
    app.prepare_worker()
    return {app.main or "default": sorted(app.tasks)}


def _inspect_stats(app: Any) -> dict[str, Any]:
    core = app.core
    workers: dict[str, Any] = {}
    for name, rows in live_nodes(core).items():
        workers[name] = {
            "hostname": rows[0]["hostname"], "pid": [row["pid"] for row in rows],
            "processes": len(rows), "queues": sorted({q for row in rows for q in row["queues"]}),
            "started_at": min(row["started_at"] for row in rows).isoformat(),
            "heartbeat_at": max(row["heartbeat_at"] for row in rows).isoformat(),
        }
    return {"workers": workers, "jobs": job_counts(core)}


INSPECT = {"active": _inspect_active, "active_queues": _inspect_active_queues,
           "ping": _inspect_ping, "registered": _inspect_registered,
           "reserved": _inspect_reserved, "scheduled": _inspect_scheduled,
           "stats": _inspect_stats}
#: Replies keyed by worker node (the others are keyed by queue, app or section).
_BY_NODE = ("active", "active_queues", "ping", "reserved")


def _say(replies: dict[str, Any], quiet: bool, nodes: bool) -> None:
    """Celery's chat format: ``->  key: OK`` then the reply, indented."""
    if not replies:
        click.echo("- empty -")
    for key, reply in replies.items():
        click.echo(f"->  {key}: OK")
        if isinstance(reply, list):
            body = "\n".join(f"* {item}" for item in reply) or "- empty -"
        elif isinstance(reply, dict) and set(reply) != {"ok"}:
            body = json.dumps(reply, indent=4, sort_keys=True, default=str)
        else:
            body = ""
        if body:
            click.echo("\n".join(f"    {line}" for line in body.splitlines()))
    if nodes and not quiet:
        click.echo(f"\n{_plural(len(replies), 'node')} online.")


_REMOTE = [
    click.option("-t", "--timeout", type=float, default=1.0, help="Accepted (no waiting: the "
                                                                  "database answers)."),
    click.option("-d", "--destination", multiple=True, help="Only these nodes."),
    click.option("-j", "--json", "as_json", is_flag=True, help="Print JSON."),
]


def _remote_options(command: Any) -> Any:
    for option in reversed(_REMOTE):
        command = option(command)
    return command


def _only(replies: dict[str, Any], destination: tuple[str, ...], by_node: bool) -> dict:
    wanted = split_names(destination)
    if not wanted or not by_node:
        return replies
    return {node: reply for node, reply in replies.items() if node in wanted}


@click.command("inspect", context_settings={"ignore_unknown_options": True,
                                            "allow_extra_args": True})
@click.argument("command", metavar="COMMAND")
@_remote_options
@click.pass_context
def inspect_command(ctx: click.Context, command: str, timeout: float,
                    destination: tuple[str, ...], as_json: bool) -> None:
    """Inspect the workers and queues: active, active_queues, ping, registered, reserved,
    scheduled or stats.

    active, active_queues, ping and reserved (always empty: claimed tasks are active) reply
    per worker node; scheduled lists the waiting future tasks per queue; registered lists
    the app's task names; stats gives the live workers and the jobs per queue and state.
    """
    if command not in INSPECT:
        raise click.UsageError(f"Command {command} not recognized. Available inspect "
                               f"commands: {', '.join(sorted(INSPECT))}", ctx)
    state = _state(ctx)
    by_node = command in _BY_NODE
    app = state.load_app(required=command == "registered")
    if command != "registered":  # the app's own task names: no database needed
        _existing(app)
    replies = _only(INSPECT[command](app), destination, by_node)
    if by_node and not replies:
        raise CliError("No nodes replied: no worker heartbeat in the database",
                       exit_code=EX_UNAVAILABLE)
    if as_json:
        click.echo(_dumps(replies))
    elif command == "stats":
        _say(replies["workers"], True, False)
        _say({"jobs": replies["jobs"]}, True, False)
        if not state.quiet:
            click.echo(f"\n{_plural(len(replies['workers']), 'node')} online.")
    else:
        _say(replies, state.quiet, by_node)


@click.command("status")
@_remote_options
@click.pass_context
def status_command(ctx: click.Context, timeout: float, destination: tuple[str, ...],
                   as_json: bool) -> None:
    """Show the worker nodes online (live heartbeats in the database)."""
    state = _state(ctx)
    replies = _only(_inspect_ping(_existing(state.load_app(required=False))), destination,
                    True)
    if not replies:
        raise CliError("No nodes replied: no worker heartbeat in the database",
                       exit_code=EX_UNAVAILABLE)
    if as_json:
        click.echo(_dumps(replies))
    else:
        for node in replies:
            click.echo(f"->  {node}: OK")
    if not state.quiet:
        click.echo(f"\n{_plural(len(replies), 'node')} online.")


# --- purge -----------------------------------------------------------------------------------

@click.command("purge", context_settings={"ignore_unknown_options": True,
                                          "allow_extra_args": True})
@click.option("-f", "--force", is_flag=True, help="Don't prompt for verification.")
@click.option("-Q", "--queues", multiple=True, help="Comma-separated queues to purge "
                                                    "(default: every queue).")
@click.option("-X", "--exclude-queues", multiple=True, help="Queues not to purge.")
@click.pass_context
def purge_command(ctx: click.Context, force: bool, queues: tuple[str, ...],
                  exclude_queues: tuple[str, ...]) -> None:
    """Delete every waiting task (of the given queues). There is no undo.

    Running tasks are not touched.
    """
    core = _existing(_state(ctx).load_app(required=False)).core
    names = split_names(queues)
    excluded = set(split_names(exclude_queues))
    if not names:
        names = sorted(queue for queue, by_state in job_counts(core).items()
                       if by_state.get("queued"))
    names = [name for name in names if name not in excluded]
    if not names:
        click.echo("No messages purged: no queue has waiting tasks.")
        return
    headline = f"{'queue' if len(names) == 1 else 'queues'}: {', '.join(names)}"
    if not force:
        click.confirm(f"WARNING: This will remove all tasks from {headline}.\n"
                      "         There is no undo for this operation!\n\n"
                      "(to skip this prompt use the -f option)\n"
                      "Are you sure you want to delete all tasks?", abort=True)
    purged = core.purge(names)
    where = _plural(len(names), "queue")
    if purged:
        click.echo(f"Purged {_plural(purged, 'message')} from {len(names)} known task "
                   f"{where.split(' ', 1)[1]}.")
    else:
        click.echo(f"No messages purged from {where}.")


# --- call / result ---------------------------------------------------------------------------

def _json(kind: type, what: str) -> Any:
    def convert(ctx: click.Context, param: click.Parameter, value: str) -> Any:
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            raise click.BadParameter(f"{what} is not JSON: {exc}") from None
        if not isinstance(parsed, kind):
            noun = "array" if kind is list else "object"
            raise click.BadParameter(f"{what} must be a JSON {noun}")
        return parsed

    return convert


def _when(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    if param.name == "expires":
        try:
            return float(value)
        except ValueError:
            pass
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an ISO 8601 time") from None


@click.command("call")
@click.argument("name")
@click.option("-a", "--args", "args", default="[]", callback=_json(list, "--args"),
              help="Positional arguments (a JSON array).")
@click.option("-k", "--kwargs", "kwargs", default="{}", callback=_json(dict, "--kwargs"),
              help="Keyword arguments (a JSON object).")
@click.option("--eta", callback=_when, help="Run at this ISO 8601 time.")
@click.option("--countdown", type=float, help="Run in this many seconds.")
@click.option("--expires", callback=_when, help="Expire at this ISO time, or in seconds.")
@click.option("--serializer", default="json", show_default=True, help="Only json.")
@click.option("--queue", help="The queue (default: the app's routing).")
@click.option("--exchange", help="Kept with the task, like Celery's.")
@click.option("--routing-key", help="Kept with the task, like Celery's.")
@click.pass_context
def call_command(ctx: click.Context, name: str, args: list[Any], kwargs: dict[str, Any],
                 **options: Any) -> None:
    """Send the task NAME; prints its task id."""
    app = _state(ctx).load_app(required=False)
    sent = {key: value for key, value in options.items() if value is not None}
    click.echo(app.send_task(name, args=args, kwargs=kwargs, **sent).id)


@click.command("result")
@click.argument("task_id")
@click.option("-t", "--task", help="The task's name (optional).")
@click.option("--traceback", "show_traceback", is_flag=True,
              help="Show the traceback instead.")
@click.option("--timeout", type=float, help="Wait at most this many seconds (default: for "
                                            "as long as it takes, like Celery).")
@click.pass_context
def result_command(ctx: click.Context, task_id: str, task: str | None, show_traceback: bool,
                   timeout: float | None) -> None:
    """Print the return value of a task (waiting for it to finish)."""
    app = _existing(_state(ctx).load_app(required=False))
    result = app.AsyncResult(task_id, task_name=task)
    if show_traceback:
        click.echo(result.traceback)
        return
    try:
        value = result.get(timeout=timeout, propagate=False)
    except CeleryTimeout:
        raise CliError(f"task {task_id} did not finish within {timeout:g}s "
                       f"(state {result.state})") from None
    state = result.state
    if state in states.PROPAGATE_STATES:
        raise CliError(f"task {task_id} ended {state}: {type(value).__name__}: {value}")
    click.echo(value)


# --- migrate / beat ---------------------------------------------------------------------------

@click.command("migrate")
@click.pass_context
def migrate_command(ctx: click.Context) -> None:
    """Create or upgrade the akadze schema in the database (idempotent)."""
    applied = _state(ctx).load_app(required=False).core.migrate()
    if applied:
        click.echo(f"applied migrations {', '.join(str(version) for version in applied)}")
    else:
        click.echo("schema already up to date: nothing to do")


@click.command("beat", context_settings={"ignore_unknown_options": True,
                                         "allow_extra_args": True})
@click.option("-l", "--loglevel", default="INFO", help="Logging level.")
@click.option("-S", "--scheduler", help="beat_scheduler: django_celery_beat's "
                                        "DatabaseScheduler runs the tasks of its tables; "
                                        "another is named in a warning at start.")
@click.pass_context
def beat_command(ctx: click.Context, loglevel: str, scheduler: str | None) -> None:
    """Run only the scheduler: enqueue the app's periodic tasks until stopped.

    Optional: every ``akadze-compat worker`` already enqueues them, exactly once per tick
    across the fleet. This is for teams that want the scheduler in its own process.
    """
    for extra in ctx.args:
        warn(f"beat: ignoring unsupported option {extra}")
    app = _state(ctx).load_app()
    if scheduler and names_database_scheduler(scheduler):
        app.conf.beat_scheduler = scheduler
    setup_command_logging(logging.getLevelName(loglevel.upper()))
    warn_unhonoured_scheduler(app, scheduler)
    core = app.prepare_worker()
    more = " and django_celery_beat's" if core.schedule_sources else ""
    click.echo(f"akadze-compat beat: {len(core.schedules)} periodic tasks{more}; Ctrl-C stops")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await run_schedules(core, stop)

    asyncio.run(main())


@click.command("flower", context_settings={"ignore_unknown_options": True,
                                           "allow_extra_args": True})
@click.option("--port", type=click.IntRange(min=0, max=65535), default=5555, show_default=True,
              help="The TCP port to listen on (Flower's default).")
@dashboard_options
@click.option("-l", "--loglevel", "--log-level", "loglevel", default="INFO",
              help="Logging level.")
@click.pass_context
def flower_command(ctx: click.Context, port: int, address: str, basic_auth: str | None,
                   tokens: tuple[str, ...], read_only: bool, url_prefix: str,
                   loglevel: str) -> None:
    """Serve akadze's web dashboard where Flower would run: Flower's --port, --address,
    --basic-auth and --url-prefix; its other options are ignored with a warning."""
    for extra in ctx.args:
        warn(f"flower: ignoring unsupported option {extra}")
    app = _existing(_state(ctx).load_app())
    setup_command_logging(logging.getLevelName(loglevel.upper()))
    core = app.core
    run_dashboard(core, port=port, address=address, basic_auth=basic_auth, tokens=tokens,
                  read_only=read_only, url_prefix=url_prefix, log_level=loglevel,
                  secrets=secrets)


COMMANDS: tuple[click.Command, ...] = (beat_command, call_command, flower_command,
                                       inspect_command, migrate_command, purge_command,
                                       result_command, status_command)
