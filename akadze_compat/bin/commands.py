"""``akadze-compat`` commands other than ``worker``: Celery's.

``inspect``, ``control`` and ``status`` are ``app.control`` as Celery's are: the live
workers (heartbeats in the database) answer, through the database, within ``--timeout``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from datetime import datetime
from typing import Any

import click

from akadze_core import run_schedules
from akadze_core.integration import (
    dashboard_options,
    describe_database,
    printable,
    run_dashboard,
    show_schedules,
)

from .. import redbeat_import, states
from ..beat import warn_unhonoured_scheduler
from ..django_beat import names_database_scheduler
from ..exceptions import TimeoutError as CeleryTimeout
from ..flower_api import flower_extension
from ..worker.control import Panel
from .base import CliError, cli_state, secrets, split_names, warn
from .flower import read_flower_options
from .logs import setup_command_logging

__all__ = ["COMMANDS"]

#: Celery's EX_UNAVAILABLE: no worker answered.
EX_UNAVAILABLE = 69


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
    return printable(json.dumps(value, default=str, ensure_ascii=False), json_text=True)


# --- reading the database -------------------------------------------------------------------

def job_counts(core: Any) -> dict[str, dict[str, int]]:
    """Queue -> state -> number of jobs."""
    return dict(core.job_counts())


# --- inspect / control / status: app.control, as Celery's commands ---------------------------

def _say(replies: dict[str, Any]) -> None:
    """Celery's chat format: ``->  node: OK`` (or ``ERROR``), then the reply, indented."""
    for node, reply in replies.items():
        status, body = _pretty(reply)
        click.echo(printable(f"->  {node}: {status}"))
        if body:
            # Replies carry task names, arguments and queue names from rows: control
            # characters are shown escaped, never sent to the terminal.
            click.echo("\n".join(f"    {printable(line)}" for line in body.split("\n")))


def _pretty(reply: Any) -> tuple[str, str]:
    """Celery's ``pretty``: a list as ``* item`` lines, ``{"ok"|"error": x}`` as x, other
    dicts as JSON."""
    if isinstance(reply, list):
        return "OK", "\n".join(f"* {item}" for item in reply) or "- empty -"
    if isinstance(reply, dict):
        if "ok" in reply:
            return "OK", "\n".join(f"    {line}" for line in _pretty(reply["ok"])[1].splitlines())
        if "error" in reply:
            return "ERROR", "\n".join(f"    {line}"
                                       for line in _pretty(reply["error"])[1].splitlines())
        return "OK", json.dumps(reply, indent=4, sort_keys=True, default=str)
    return "OK", reply if isinstance(reply, str) else repr(reply)


_REMOTE = [
    click.option("-t", "--timeout", type=float, default=1.0,
                 help="Timeout in seconds waiting for reply."),
    click.option("-d", "--destination", multiple=True,
                 help="Comma separated list of destination node names."),
    click.option("-j", "--json", "as_json", is_flag=True, help="Use json as output format."),
]


def _remote_options(command: Any) -> Any:
    for option in reversed(_REMOTE):
        command = option(command)
    return command


def _commands_of(kind: str) -> dict[str, Any]:
    return dict(sorted((name, info) for name, info in Panel.meta.items()
                       if info.type == kind and info.visible))


def _arguments(ctx: click.Context, kind: str, command: str, args: list[str]) -> dict[str, Any]:
    """Celery's parsing of a command's arguments: ``meta.args`` in order, the rest to
    ``meta.variadic``."""
    choices = _commands_of(kind)
    if command not in choices:
        raise click.UsageError(f"Command {command} not recognized. Available {kind} "
                               f"commands: {', '.join(choices)}", ctx)
    meta = choices[command]
    arguments: dict[str, Any] = {}
    rest = list(args)
    for name, convert in meta.args or ():
        if not rest:
            break
        value = rest.pop(0)
        arguments[name] = convert(value) if convert is not None else value
    if rest and not meta.variadic:
        raise click.UsageError(f"Command {command!r} takes arguments: {meta.signature}", ctx)
    if meta.variadic:
        arguments[meta.variadic] = rest
    return arguments


def _control_app(ctx: click.Context) -> Any:
    """The app, its modules imported (a project's own commands register when they are)."""
    app = _existing(_state(ctx).load_app(required=False))
    app.loader.import_default_modules()
    app.finalize()
    return app


def _no_replies() -> CliError:
    return CliError("No nodes replied within time constraint", exit_code=EX_UNAVAILABLE)


def _finish(ctx: click.Context, replies: Any, as_json: bool) -> None:
    if not replies:
        raise _no_replies()
    if as_json:
        click.echo(_dumps(replies))
        return
    if not _state(ctx).quiet:
        click.echo(f"\n{_plural(len(replies), 'node')} online.")


@click.command("inspect", context_settings={"ignore_unknown_options": True,
                                            "allow_extra_args": True})
@click.argument("command", metavar="COMMAND")
@_remote_options
@click.pass_context
def inspect_command(ctx: click.Context, command: str, timeout: float,
                    destination: tuple[str, ...], as_json: bool) -> None:
    """Inspect the workers by sending them the COMMAND inspect command (active, scheduled,
    reserved, registered, stats, active_queues, revoked, conf, query_task, ping, and the
    project's own); the live workers answer through the database."""
    app = _control_app(ctx)
    arguments = _arguments(ctx, "inspect", command, list(ctx.args))
    inspect = app.control.inspect(timeout=timeout, destination=split_names(destination) or None,
                                  callback=None if as_json else _say)
    _finish(ctx, inspect._request(command, **arguments), as_json)


@click.command("control", context_settings={"ignore_unknown_options": True,
                                            "allow_extra_args": True})
@click.argument("command", metavar="COMMAND")
@_remote_options
@click.pass_context
def control_command(ctx: click.Context, command: str, timeout: float,
                    destination: tuple[str, ...], as_json: bool) -> None:
    """Send the COMMAND control command to the workers (add_consumer, cancel_consumer,
    pool_grow, pool_shrink, rate_limit, time_limit, shutdown, and the project's own)."""
    app = _control_app(ctx)
    arguments = _arguments(ctx, "control", command, list(ctx.args))
    replies = app.control.broadcast(command, arguments=arguments, timeout=timeout,
                                    destination=split_names(destination) or None,
                                    callback=None if as_json else _say, reply=True)
    if not replies:
        raise _no_replies()
    if as_json:
        click.echo(_dumps(replies))


@click.command("status")
@_remote_options
@click.pass_context
def status_command(ctx: click.Context, timeout: float, destination: tuple[str, ...],
                   as_json: bool) -> None:
    """Show the worker nodes online (those that answer a ping)."""
    app = _existing(_state(ctx).load_app(required=False))

    def say(reply: dict[str, Any]) -> None:
        for node in reply:
            click.echo(printable(f"->  {node}: OK"))

    replies = app.control.inspect(timeout=timeout,
                                  destination=split_names(destination) or None,
                                  callback=None if as_json else say).ping()
    _finish(ctx, replies, as_json)


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
    headline = printable(f"{'queue' if len(names) == 1 else 'queues'}: {', '.join(names)}")
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
        click.echo(_shown(result.traceback))
        return
    try:
        value = result.get(timeout=timeout, propagate=False)
    except CeleryTimeout:
        raise CliError(f"task {task_id} did not finish within {timeout:g}s "
                       f"(state {result.state})") from None
    state = result.state
    if state in states.PROPAGATE_STATES:
        raise CliError(f"task {task_id} ended {state}: {type(value).__name__}: {value}")
    click.echo(_shown(value))


def _shown(value: Any) -> str | None:
    """What ``click.echo(value)`` prints (None: an empty line), control characters escaped:
    a result and a traceback are row data."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return printable(value, lines=True)


# --- migrate / beat ---------------------------------------------------------------------------

@click.command("migrate")
@click.pass_context
def migrate_command(ctx: click.Context) -> None:
    """Create or upgrade the akadze schema in the database (idempotent)."""
    core = _state(ctx).load_app(required=False).core
    applied = core.migrate()
    # Which database: the embedded one or a URL from the environment is easy to mistake.
    where = describe_database(core.database_url)
    if applied:
        click.echo(f"applied migrations {', '.join(str(version) for version in applied)} "
                   f"in {where}")
    else:
        click.echo(f"schema already up to date in {where}: nothing to do")


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


@click.command("import-redbeat")
@click.option("--redis-url", "--redis", "redis_url",
              help="Where RedBeat keeps its entries (default: redbeat_redis_url, else a "
                   "redis:// broker_url).")
@click.option("--key-prefix", help="RedBeat's redbeat_key_prefix (default: the app's, else "
                                   "redbeat:).")
@click.option("--replace", is_flag=True, help="Change a runtime schedule of the same name "
                                              "(else the entry is skipped).")
@click.option("--dry-run", is_flag=True, help="Say what would be imported; store nothing.")
@click.pass_context
def import_redbeat_command(ctx: click.Context, redis_url: str | None, key_prefix: str | None,
                           replace: bool, dry_run: bool) -> None:
    """Import celery-redbeat's entries once into akadze's runtime schedules.

    The entries added at run time (RedBeatSchedulerEntry(...).save()) become runtime
    schedules, which every worker runs; the beat_schedule entries RedBeat copied to Redis are
    left to the code, which the workers already run. Run it once, then drop
    beat_scheduler='redbeat...' from the configuration.
    """
    app = _state(ctx).load_app()
    secrets.add_url(redis_url)
    url = redis_url or redbeat_import.redis_url_of(app.conf)
    if not url:
        raise CliError("import-redbeat: no Redis to read: give --redis-url (the "
                       "redbeat_redis_url RedBeat used)")
    secrets.add_url(url)
    try:
        done = redbeat_import.import_entries(app, url, prefix=key_prefix, replace=replace,
                                             dry_run=dry_run)
    except ImportError as exc:
        raise CliError(f"import-redbeat needs the redis package: {exc}") from exc
    verb = "would import" if dry_run else "imported"
    click.echo(f"{verb} {len(done.stored)} RedBeat entries as runtime schedules"
               + (f": {', '.join(done.stored)}" if done.stored else ""))
    if done.static:
        click.echo(f"left to beat_schedule in the code: {', '.join(done.static)}")
    for name, why in done.skipped.items():
        click.echo(f"skipped {name}: {why}")


@click.command("schedules")
@click.option("-j", "--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def schedules_command(ctx: click.Context, as_json: bool) -> None:
    """List the app's periodic tasks (beat_schedule, add_periodic_task) and the runtime
    schedules, with their last and next run.

    Celery has no such command: beat reads beat_schedule in its own process. Here every
    worker (or `akadze-compat beat`) runs these, and the database keeps their last runs.
    django-celery-beat's entries stay in its tables (its admin lists them).
    """
    app = _existing(_state(ctx).load_app())
    core = app.prepare_worker()  # imports the task modules, declares beat_schedule's entries
    with core.connect(autocommit=True) as connection:
        show_schedules(core, connection, as_json=as_json)


@click.command("flower", context_settings={"ignore_unknown_options": True,
                                           "allow_extra_args": True})
@click.option("--port", type=click.IntRange(min=0, max=65535), default=5555, show_default=True,
              help="The TCP port to listen on (Flower's default).")
@dashboard_options
@click.option("-l", "--loglevel", "--log-level", "loglevel", default="INFO",
              help="Logging level.")
@click.pass_context
def flower_command(ctx: click.Context, port: int, address: str, basic_auth: str | None,
                   tokens: tuple[str, ...], read_only: bool, unauthenticated: bool,
                   url_prefix: str, loglevel: str) -> None:
    """Serve akadze's web dashboard where Flower would run: Flower's --port, --address,
    --basic-auth (also --basic_auth=, FLOWER_BASIC_AUTH, flowerconfig.py), --url-prefix and
    --read-only; its other options are ignored with a warning, except OAuth (--auth) and
    TLS, which stop it."""
    flower = read_flower_options(ctx.args)
    for extra in flower.ignored:
        warn(f"flower: ignoring unsupported option {extra}")

    def given(name: str) -> bool:
        # Flower's order: its command line over its config file over FLOWER_*; click's own
        # parse of the same option counts as the command line, its AKADZE_* variable as
        # the environment.
        return ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE

    if flower.basic_auth is not None and not given("basic_auth"):
        basic_auth = flower.basic_auth
    if flower.port is not None and not given("port"):
        port = flower.port
    if flower.address is not None and not given("address"):
        address = flower.address
    if flower.url_prefix is not None and not given("url_prefix"):
        url_prefix = flower.url_prefix
    if flower.read_only is not None and not given("read_only"):
        read_only = flower.read_only
    app = _existing(_state(ctx).load_app())
    setup_command_logging(logging.getLevelName(loglevel.upper()))
    core = app.core
    run_dashboard(core, port=port, address=address, basic_auth=basic_auth, tokens=tokens,
                  read_only=read_only, url_prefix=url_prefix, log_level=loglevel,
                  secrets=secrets, unauthenticated=unauthenticated,
                  extensions=[flower_extension(app)])


COMMANDS: tuple[click.Command, ...] = (beat_command, call_command, control_command,
                                       flower_command, import_redbeat_command,
                                       inspect_command, migrate_command, purge_command,
                                       result_command, schedules_command, status_command)
