"""The ``akadze`` command line: run a worker, apply the schema, inspect and steer jobs.

Every expected error (bad URL, server unreachable, schema missing, an app that cannot be
imported) ends the command with exactly one line ``akadze: error: ...`` on stderr and a
non-zero exit code. Nothing printed or logged ever contains a database password: every
message goes through ``dsn.redact_password`` with the passwords of every URL in play.
"""

from __future__ import annotations

import contextlib
import importlib
import ipaddress
import json
import os
import signal
import socket
import sys
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import click
import psycopg

from ..app import App
from ..execution.processes import ProcessPool, serve
from ..execution.processes import is_child as is_pool_child
from ..model.dsn import ENV_VAR, LISTEN_VAR, prepare_threshold
from ..model.errors import AkadzeError, DatabaseUnavailable
from ..model.jobs import JOB_STATES, Job
from ..ops.control import request_cancel_sync, requeue_sync, signal_number
from ..schedules.triggers import Cron, Every, Trigger
from ..store import database
from ..store.dberrors import fatal_message
from ..store.embedded import describe_database
from ..store.migrations import apply_migrations, latest_version
from ..worker.config import DEFAULTS, WorkerConfig
from ..worker.lifecycle import Worker
from .support import (
    OneLineErrorGroup,
    ScrubbingFormatter,
    Secrets,
    exit_now,
    logging_to_stderr,
    printable,
    scrubbed_stdio,
)

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
PROG_NAME = "akadze"
_SECONDS = click.FloatRange(min=0, min_open=True)


class CliError(click.ClickException):
    """An expected failure: printed as one ``akadze: error: ...`` line, exit code 1."""


# --- secrets, logging, the command group (shared with akadze-compat: cli_support) ----------

#: The passwords (and apps) of this invocation, scrubbed from every line we emit.
_secrets = Secrets()


def _reset_secrets() -> None:
    _secrets.clear()
    _secrets.add_environment((ENV_VAR, LISTEN_VAR))


class _ScrubbingFormatter(ScrubbingFormatter):
    """The shared scrubbing formatter, on this command's secrets."""

    def __init__(self, fmt: str | None = None, datefmt: str | None = None) -> None:
        super().__init__(_secrets, fmt, datefmt)


def _logging_to_stderr(level: str) -> contextlib.AbstractContextManager[None]:
    """Send every log record (the tasks' own included) to stderr, one line each, scrubbed."""
    return logging_to_stderr(level, _ScrubbingFormatter(LOG_FORMAT))


class _AkadzeGroup(OneLineErrorGroup):
    """A click group whose failures print one line instead of usage text or a traceback."""

    prog_name = PROG_NAME
    secrets = _secrets

    def begin(self, args: Sequence[str] | None, extra: dict[str, Any]) -> None:
        """Forget the previous invocation's secrets; remember the environment's URL."""
        _reset_secrets()

    def report(self, exc: Exception) -> int:
        """The one line for ``exc`` (see ``_report``); exit code 1."""
        _report(exc)
        return 1


def _report(exc: Exception) -> None:
    """Print the one error line for ``exc`` (after a scrubbed traceback if it is a bug)."""
    if isinstance(exc, DatabaseUnavailable):
        line = str(exc)  # says "cannot connect to Postgres" itself
    elif isinstance(exc, psycopg.OperationalError) and exc.sqlstate is None:
        line = f"cannot connect to Postgres: {exc}"
    elif isinstance(exc, psycopg.Error):
        line = fatal_message(exc)  # schema missing, permission denied, ...
    elif isinstance(exc, AkadzeError):
        line = str(exc)
    else:
        # A bug in akadze: keep the traceback for the report, minus the secrets.
        click.echo(_secrets.scrub(traceback.format_exc()).rstrip(), err=True)
        line = f"unexpected {type(exc).__name__}: {exc}"
    click.echo(_AkadzeGroup.error_line(line), err=True)


@dataclass
class _Options:
    """What the group's options left for the subcommands."""

    url: str | None
    url_from_command_line: bool


@click.group(name=PROG_NAME, cls=_AkadzeGroup, invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--database-url", envvar=ENV_VAR, show_envvar=True, metavar="URL",
              help="Postgres URL. Without one (and without the environment variable) the "
                   "embedded Postgres of the project is used: in $AKADZE_HOME, else in "
                   ".akadze/ of the project root (the nearest directory upwards with "
                   "pyproject.toml, setup.py, setup.cfg, .git or .akadze/), else in "
                   "$XDG_DATA_HOME/akadze (~/.local/share/akadze). `worker` and `migrate` "
                   "create it; the other commands only use one that exists. For `worker`, a "
                   "URL given as this option overrides the one the app was built with; the "
                   "environment variable applies only to apps built without a URL.")
@click.version_option(package_name="akadze", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context, database_url: str | None) -> None:
    """akadze: a Postgres-backed job queue."""
    if ctx.invoked_subcommand is None:
        # Bare `akadze`: the help, as `akadze --help` prints it (click would raise it as a
        # usage error, which the one-line error handler squashes into a single line).
        click.echo(ctx.get_help())
        ctx.exit()
    _secrets.add_url(database_url)
    source = ctx.get_parameter_source("database_url")
    ctx.obj = _Options(database_url or None, source == click.core.ParameterSource.COMMANDLINE)


def _options(ctx: click.Context) -> _Options:
    options = ctx.find_object(_Options)
    assert options is not None
    return options


@contextlib.contextmanager
def _connection(ctx: click.Context, *, check_schema: bool = True, app: App | None = None,
                create: bool = False) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the configured database (or ``app``'s), schema checked
    by default.

    Without a URL the embedded Postgres is used only if it exists, unless ``create``: a
    command that only reads (or needs an existing job) must not leave a new database in
    whatever directory it was typed in.
    """
    # INFO: the embedded Postgres says it started, migrations say what they applied.
    with _logging_to_stderr("INFO"):
        if app is None:
            app = App(_options(ctx).url)
        _secrets.redactors.append(app.redact)
        # Explicit, else the environment, else the embedded Postgres.
        url = app.resolve_database_url(create=create)
        _secrets.add_url(url)
        try:
            connection = psycopg.connect(url, autocommit=True, connect_timeout=10,
                                         prepare_threshold=prepare_threshold())
        except psycopg.Error as exc:
            raise CliError(f"cannot connect to Postgres: {exc}") from None
        with connection:
            if check_schema:
                database.check_schema(connection)
            yield connection


# --- migrate -------------------------------------------------------------------------------------

@cli.command("migrate")
@click.pass_context
def migrate_command(ctx: click.Context) -> None:
    """Create or upgrade the akadze schema (idempotent, safe to run concurrently)."""
    app = App(_options(ctx).url)
    with _connection(ctx, check_schema=False, create=True, app=app) as connection:
        applied = apply_migrations(connection)
    # Which database: the embedded one or a URL from the environment is easy to mistake.
    where = f"in {describe_database(app.resolve_database_url())}"
    if applied.versions:
        versions = ", ".join(str(version) for version in applied.versions)
        click.echo(f"applied migrations {versions}: schema at version {latest_version()} "
                   f"{where}")
    elif applied.repeatable:
        click.echo(f"re-applied {', '.join(applied.repeatable)}: schema at version "
                   f"{latest_version()} {where}")
    else:
        click.echo(f"schema already at version {latest_version()} {where}: nothing to do")


# --- jobs ----------------------------------------------------------------------------------------

@cli.group("jobs")
def jobs_group() -> None:
    """List, show, cancel and requeue jobs."""


def _when(value: datetime | None) -> str:
    return value.isoformat(sep=" ", timespec="seconds") if value else "-"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    # Cells hold names and texts from rows: control characters shown escaped.
    cells = [[printable(cell) for cell in row] for row in [headers, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
                     .rstrip() for row in cells)


def _dump(value: Any) -> str:
    return printable(json.dumps(value, indent=2, ensure_ascii=False, default=str),
                     json_text=True)


@jobs_group.command("list")
@click.option("--state", type=click.Choice(JOB_STATES), help="Only jobs in this state.")
@click.option("--queue", help="Only jobs of this queue.")
@click.option("--task", help="Only jobs of this task.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True,
              help="At most this many jobs, newest first.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def jobs_list(ctx: click.Context, state: str | None, queue: str | None, task: str | None,
              limit: int, as_json: bool) -> None:
    """List jobs, newest first."""
    with _connection(ctx) as connection:
        rows = database.fetch_all(connection, "job_list", state=state, queue=queue, task=task,
                                  limit=limit)
    jobs = [Job.from_row(row) for row in rows]
    if as_json:
        click.echo(_dump([job.to_json() for job in jobs]))
        return
    if not jobs:
        click.echo("no jobs")
        return
    click.echo(_table(
        ("ID", "QUEUE", "TASK", "STATE", "ATTEMPT", "SCHEDULED_AT", "FINISHED_AT"),
        [(job.id, job.queue, job.task, job.state, f"{job.attempt}/{job.max_attempts}",
          _when(job.scheduled_at), _when(job.finished_at)) for job in jobs]))


def _get_job(connection: psycopg.Connection, job_id: int) -> Job | None:
    row = database.fetch_one(connection, "job_get", id=job_id)
    return Job.from_row(row) if row else None


@jobs_group.command("show")
@click.argument("job_id", metavar="ID", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def jobs_show(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """Show one job: its fields, args, result and the error of each failed attempt."""
    with _connection(ctx) as connection:
        job = _get_job(connection, job_id)
    if job is None:
        raise CliError(f"job {job_id} not found")
    data = job.to_json()
    if as_json:
        click.echo(_dump(data))
        return
    errors = data.pop("errors")
    width = max(len(name) for name in data)
    for name, value in data.items():
        text = json.dumps(value, ensure_ascii=False) if name in ("args", "result", "meta") \
            else ("-" if value is None else str(value))
        click.echo(f"{name.ljust(width)}  {printable(text)}")
    click.echo(f"{'errors'.ljust(width)}  {len(errors)}")
    for error in errors:
        click.echo(printable(f"  attempt {error.get('attempt')} at {error.get('at')}: "
                             f"{error.get('type')}: {error.get('message')}"))
        for line in str(error.get("traceback") or "").rstrip().split("\n"):
            click.echo(f"    {printable(line)}")


def _signal_label(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _not_active(job_id: int, job: Job | None, verb: str) -> str:
    where = f"job {job_id} does not exist" if job is None else f"job {job_id} is {job.state}"
    return f"job is not active ({where}): only queued or running jobs can be {verb}"


@jobs_group.command("cancel")
@click.argument("job_id", metavar="ID", type=int)
@click.option("--terminate", is_flag=True,
              help="Also end the process running the body (workers with a process pool).")
@click.option("--signal", "signal_name", default="SIGTERM", show_default=True,
              metavar="SIGNAL", help="The signal --terminate sends (a name or a number).")
@click.pass_context
def jobs_cancel(ctx: click.Context, job_id: int, terminate: bool, signal_name: str) -> None:
    """Cancel a queued job, or ask a running one to stop.

    A running body is not interrupted: if it returns a value the job succeeds; if it raises,
    the job ends cancelled. With --terminate, a worker running it in a process pool sends
    the signal to that process: if the process dies of it, the job ends cancelled (attempt
    unspent) and the process is replaced. Workers running bodies in threads cannot stop
    one: there --terminate is a plain cancel.
    """
    try:
        signum = signal_number(signal_name)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--signal") from None
    with _connection(ctx) as connection:
        marked = request_cancel_sync(connection, job_id, terminate=terminate, signal=signum)
        job = _get_job(connection, job_id)
    if not marked:
        raise CliError(_not_active(job_id, job, "cancelled"))
    if job is not None and job.state == "running" and terminate:
        click.echo(f"job {job_id} is running: cancel requested, its worker sends "
                   f"{_signal_label(signum)} to the process running it (process pools only)")
    elif job is not None and job.state == "running":
        click.echo(f"job {job_id} is running: cancel requested (it ends cancelled unless "
                   "its body returns a value)")
    else:
        click.echo(f"job {job_id} cancelled")


@jobs_group.command("requeue")
@click.argument("job_id", metavar="ID", type=int)
@click.pass_context
def jobs_requeue(ctx: click.Context, job_id: int) -> None:
    """Put a failed job back in the queue (attempts, errors and args are kept)."""
    with _connection(ctx) as connection:
        requeued = requeue_sync(connection, job_id)
        job = _get_job(connection, job_id)
    if not requeued:
        where = "does not exist" if job is None else f"is {job.state}"
        raise CliError(f"job {job_id} {where}: only failed jobs can be requeued")
    assert job is not None
    click.echo(f"job {job_id} requeued (attempt {job.attempt} of {job.max_attempts} spent)")


# --- stats ---------------------------------------------------------------------------------------

@cli.command("stats")
@click.option("--json", "as_json", is_flag=True,
              help='Print JSON: {"queue": {"queued": n, "running": n, ...}}.')
@click.pass_context
def stats_command(ctx: click.Context, as_json: bool) -> None:
    """Count jobs per queue and state."""
    with _connection(ctx) as connection:
        rows = database.fetch_all(connection, "job_stats")
    counts: dict[str, dict[str, int]] = {}
    for row in rows:
        counts.setdefault(row["queue"], dict.fromkeys(JOB_STATES, 0))[row["state"]] = row["jobs"]
    if as_json:
        click.echo(_dump(counts))
        return
    if not counts:
        click.echo("no jobs")
        return
    click.echo(_table(
        ("QUEUE", *(state.upper() for state in JOB_STATES), "TOTAL"),
        [(queue, *(by_state[state] for state in JOB_STATES), sum(by_state.values()))
         for queue, by_state in counts.items()]))


# --- schedules -----------------------------------------------------------------------------------

class _SchedulesGroup(click.Group):
    """``akadze schedules [MODULE:APP] [--json]`` lists, as it did before the subcommands
    came: a first word that names none of them (or none at all) means ``list``. A module
    named like a subcommand is listed with ``akadze schedules list MODULE``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ctx.help_option_names):
            args = ["list", *args]
        return super().parse_args(ctx, args)


@cli.group("schedules", cls=_SchedulesGroup)
def schedules_group() -> None:
    """List schedules; add, pause, resume and remove runtime schedules.

    `akadze schedules [MODULE:APP] [--json]` is `akadze schedules list`.
    Runtime schedules live in the database: running workers take in a change within about
    a second.
    """


@schedules_group.command("list")
@click.argument("app_spec", metavar="[MODULE:APP]", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def schedules_list(ctx: click.Context, app_spec: str | None, as_json: bool) -> None:
    """List the runtime schedules, and those MODULE:APP declares, with their last and next
    run.

    Last run is the tick of the last enqueued job (\"never\" if none); next run is the first
    tick after the database's current time (\"paused\" for a paused runtime schedule).
    """
    app = _schedules_app(ctx, app_spec)
    with _connection(ctx, app=app) as connection:
        show_schedules(app, connection, as_json=as_json, named=app_spec is not None)


#: Where the schedules code declares are listed from, said when they were not.
CODE_SCHEDULES_HINT = ("Declared in an app's code (add_schedule, declare_schedule, or a Celery "
                       "app's beat_schedule and add_periodic_task), they are listed with "
                       "their app: `akadze schedules MODULE:APP`, or for a Celery app "
                       "`akadze-compat -A proj schedules`.")


def show_schedules(app: App, connection: psycopg.Connection, *, as_json: bool,
                   named: bool = True) -> None:
    """Print the runtime schedules and those ``app`` declares in code, with their last and
    next run (``akadze schedules``, ``akadze-compat schedules``). Unless the app was
    ``named``, the schedules of code that ran against this database are not known here:
    their names are said on stderr, with where they are listed from."""
    clock = database.fetch_one(connection, "schedule_clock")
    rows = database.fetch_all(connection, "schedule_list", names=list(app.schedules))
    stored = app.runtime_schedules.list(session=connection)
    unseen = [] if named else database.fetch_all(connection, "schedule_code_list")
    assert clock is not None
    now = clock["now"]
    last_runs = {row["name"]: row["last_run"] for row in rows if row["source"] == "code"}
    listed: list[dict[str, Any]] = [
        {"name": name, "task": schedule.task, "trigger": schedule.trigger.spec,
         "queue": schedule.resolved_queue(app), "last_run": _utc(last_runs.get(name)),
         "next_run": _utc(schedule.trigger.next(now)), "source": "code", "paused": False}
        for name, schedule in app.schedules.items()
        if not any(entry.name == name for entry in stored)  # a runtime one holds the name
    ]
    listed += [{"name": entry.name, "task": entry.task, "trigger": entry.trigger,
                "queue": entry.queue, "last_run": _utc(entry.last_run),
                "next_run": _utc(entry.next_run(now)), "source": "runtime",
                "paused": entry.paused} for entry in stored]
    listed.sort(key=lambda entry: entry["name"])
    if as_json:
        click.echo(_dump([{key: value.isoformat() if isinstance(value, datetime) else value
                           for key, value in entry.items()} for entry in listed]))
    elif not listed:
        click.echo("no runtime schedules" if unseen else "no schedules")
    else:
        click.echo(_table(
            ("NAME", "TASK", "TRIGGER", "QUEUE", "LAST_RUN", "NEXT_RUN"),
            [(entry["name"], entry["task"], entry["trigger"], entry["queue"],
              _when(entry["last_run"]) if entry["last_run"] else "never",
              "paused" if entry["paused"] else _when(entry["next_run"]))
             for entry in listed]))
    if unseen:
        names = ", ".join(f"{row['name']} (last run "
                          f"{_when(_utc(row['last_run'])) if row['last_run'] else 'never'})"
                          for row in unseen)
        click.echo(printable(f"not listed: {names}. {CODE_SCHEDULES_HINT}"), err=True)


def _schedules_app(ctx: click.Context, app_spec: str | None) -> App:
    """MODULE:APP pointed at --database-url if given, or an App of the configured URL."""
    options = _options(ctx)
    if app_spec is None:
        return App(options.url)
    app = load_app(app_spec)
    if options.url_from_command_line and options.url:
        app.set_database_url(options.url)
    return app


def _json_object(value: str | None, option: str) -> dict[str, Any] | None:
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise CliError(f"{option} is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise CliError(f"{option} must be a JSON object, not {value}")
    return parsed


@schedules_group.command("add")
@click.argument("name")
@click.option("--task", "-t", required=True, help="The task to run (its name).")
@click.option("--cron", metavar="EXPRESSION",
              help="A cron expression: 5 fields, or 6 with seconds last, or @daily etc.")
@click.option("--tz", metavar="ZONE", default="UTC", show_default=True,
              help="The time zone of --cron's wall clock.")
@click.option("--day-and", is_flag=True,
              help="With --cron: both day fields must match (Celery's crontab), not either.")
@click.option("--every", type=_SECONDS, metavar="S",
              help="Instead of --cron: every S seconds (ticks at multiples of S since the "
                   "Unix epoch).")
@click.option("--args", "args_json", metavar="JSON", help="The job's arguments, a JSON object.")
@click.option("--queue", "-q", help="Default: the task's queue with --app, else the default "
                                    "queue.")
@click.option("--priority", type=int, help="Default: the task's with --app, else 0.")
@click.option("--max-attempts", type=click.IntRange(min=1),
              help="Default: the task's with --app, else 3.")
@click.option("--expires", type=_SECONDS, metavar="S",
              help="Each job expires S seconds after its tick.")
@click.option("--meta", "meta_json", metavar="JSON", help="Extra meta of each job, a JSON "
                                                           "object.")
@click.option("--paused", is_flag=True, help="Store it paused.")
@click.option("--replace", is_flag=True, help="Change the schedule of that name if it exists.")
@click.option("--app", "app_spec", metavar="MODULE:APP",
              help="Take the task's defaults from this app, and check --args against the "
                   "task's function.")
@click.pass_context
def schedules_add(ctx: click.Context, name: str, task: str, cron: str | None, tz: str,
                  day_and: bool, every: float | None, args_json: str | None,
                  queue: str | None, priority: int | None, max_attempts: int | None,
                  expires: float | None, meta_json: str | None, paused: bool, replace: bool,
                  app_spec: str | None) -> None:
    """Add (or with --replace change) runtime schedule NAME: TASK at every tick of --cron
    or --every. Running workers take it in within about a second; its first run is its
    next tick."""
    if (cron is None) == (every is None):
        raise click.UsageError("give exactly one of --cron and --every", ctx)
    args = _json_object(args_json, "--args")
    meta = _json_object(meta_json, "--meta")
    app = _schedules_app(ctx, app_spec)
    try:
        trigger: Trigger = Every(every) if every is not None \
            else Cron(cron or "", timezone=tz, day_or=not day_and)
        with _connection(ctx, app=app) as connection:
            stored = app.runtime_schedules.add(
                name, task, trigger=trigger, args=args, queue=queue, priority=priority,
                max_attempts=max_attempts, expires=expires, meta=meta, paused=paused,
                replace=replace, session=connection)
            clock = database.fetch_one(connection, "schedule_clock")
    except (ValueError, TypeError) as exc:
        raise CliError(str(exc)) from None
    assert clock is not None
    following = stored.next_run(clock["now"])
    when = "paused" if following is None else f"next run {_when(_utc(following))}"
    click.echo(printable(f"schedule {name} {'stored' if replace else 'added'}: {stored.task} "
                         f"at {stored.trigger}, queue {stored.queue} ({when})"))


def _runtime_change(ctx: click.Context, name: str, verb: str) -> None:
    app = App(_options(ctx).url)
    with _connection(ctx, app=app) as connection:
        change = getattr(app.runtime_schedules, verb)
        if change(name, session=connection):
            done = {"pause": "paused", "resume": "resumed", "remove": "removed"}[verb]
            click.echo(printable(f"schedule {name} {done}"))
            return
        owner = database.fetch_one(connection, "schedule_owner", name=name)
    if owner is not None:
        raise CliError(f"schedule {name!r} is declared in code, not a runtime schedule: "
                       f"change it in the code")
    raise CliError(f"no runtime schedule named {name!r}")


@schedules_group.command("pause")
@click.argument("name")
@click.pass_context
def schedules_pause(ctx: click.Context, name: str) -> None:
    """Pause runtime schedule NAME: its ticks are not enqueued."""
    _runtime_change(ctx, name, "pause")


@schedules_group.command("resume")
@click.argument("name")
@click.pass_context
def schedules_resume(ctx: click.Context, name: str) -> None:
    """Resume runtime schedule NAME from its next tick (missed ones do not run)."""
    _runtime_change(ctx, name, "resume")


@schedules_group.command("remove")
@click.argument("name")
@click.pass_context
def schedules_remove(ctx: click.Context, name: str) -> None:
    """Delete runtime schedule NAME (the jobs it enqueued stay)."""
    _runtime_change(ctx, name, "remove")


def _utc(value: datetime | None) -> datetime | None:
    return value.astimezone(timezone.utc) if value else None


# --- dashboard -----------------------------------------------------------------------------------

#: The dashboard's credentials may come from the environment rather than the command line
#: (which other users of the host can read).
BASIC_AUTH_VAR = "AKADZE_DASHBOARD_BASIC_AUTH"
TOKEN_VAR = "AKADZE_DASHBOARD_TOKEN"
#: Serve a non-loopback address without credentials on purpose (e.g. behind an
#: authenticating proxy); otherwise that is refused.
UNAUTHENTICATED_VAR = "AKADZE_DASHBOARD_UNAUTHENTICATED"


def dashboard_options(command: Any) -> Any:
    """The options ``akadze dashboard`` and ``akadze-compat flower`` share (Flower's names)."""
    for option in reversed([
        click.option("--address", "--host", "address", default="127.0.0.1", show_default=True,
                     help="The address to listen on (0.0.0.0: every interface; put it "
                          "behind TLS and credentials then)."),
        click.option("--basic-auth", envvar=BASIC_AUTH_VAR, show_envvar=True,
                     metavar="USER:PASS[,USER2:PASS2]",
                     help="HTTP basic credentials that may use the dashboard and its "
                          "actions."),
        click.option("--token", "tokens", multiple=True, envvar=TOKEN_VAR, show_envvar=True,
                     metavar="TOKEN", help="A bearer token that may use the dashboard and "
                                           "its actions (header, or the login form)."),
        click.option("--read-only", is_flag=True,
                     help="No actions (retry, cancel, purge), whatever the credentials."),
        click.option("--unauthenticated", is_flag=True, envvar=UNAUTHENTICATED_VAR,
                     show_envvar=True,
                     help="Serve the pages without credentials on an address other than "
                          "loopback (behind a proxy that authenticates); refused "
                          "otherwise."),
        click.option("--url-prefix", default="", metavar="PREFIX",
                     help="Serve under this path, e.g. /flower behind a proxy."),
    ]):
        command = option(command)
    return command


def is_loopback(address: str) -> bool:
    """True when ``address`` (an IP or a host name) listens on loopback only: every address
    it resolves to is one. ``""`` and ``0.0.0.0`` are every interface."""
    host = address.strip().strip("[]")
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(
        ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def run_dashboard(app: App, *, port: int, address: str, basic_auth: str | None,
                  tokens: Sequence[str], read_only: bool, url_prefix: str,
                  log_level: str, secrets: Secrets, unauthenticated: bool = False) -> None:
    """Serve the dashboard of ``app`` (shared by ``akadze dashboard`` and
    ``akadze-compat flower``); expected errors raise ``CliError``.

    Without credentials the pages are open (the actions off): refused on an address other
    than loopback unless ``unauthenticated`` says that is meant."""
    try:
        from ..dashboard.server import parse_basic_auth, serve
        from ..dashboard.web import DashboardConfig
    except ImportError as exc:
        raise CliError("the dashboard needs the 'dashboard' extra: pip install "
                       f"'akadze[dashboard]' ({exc})") from None
    try:
        users = parse_basic_auth(basic_auth)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    for password in users.values():
        secrets.passwords.add(password)
    tokens = [token for token in tokens if token]
    for token in tokens:
        secrets.passwords.add(token)
    if not users and not tokens and not unauthenticated and not is_loopback(address):
        raise CliError(f"refusing to serve the dashboard on {address or 'every interface'} "
                       "without credentials: give --basic-auth user:password or --token, or "
                       f"--unauthenticated ({UNAUTHENTICATED_VAR}=1) if a proxy in front "
                       "authenticates")
    secrets.redactors.append(app.redact)
    url = app.resolve_database_url(create=False)
    secrets.add_url(url)
    with psycopg.connect(url, autocommit=True, connect_timeout=10,
                         prepare_threshold=prepare_threshold()) as connection:
        database.check_schema(connection)
    config = DashboardConfig(basic_auth=users, tokens=tokens, read_only=read_only)
    serve(app, config, host=address, port=port, url_prefix=url_prefix, log_level=log_level)


@cli.command("dashboard")
@click.option("--port", "-p", type=click.IntRange(min=0, max=65535), default=8080,
              show_default=True, help="The TCP port to listen on.")
@dashboard_options
@click.option("--app", "app_spec", metavar="MODULE:APP",
              help="The app whose code schedules to show (and whose database to use "
                   "unless --database-url says otherwise).")
@click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False),
              default="INFO", show_default=True)
@click.pass_context
def dashboard_command(ctx: click.Context, port: int, address: str, basic_auth: str | None,
                      tokens: tuple[str, ...], read_only: bool, unauthenticated: bool,
                      url_prefix: str, app_spec: str | None, log_level: str) -> None:
    """Serve the web dashboard: queues, jobs, workers, schedules, and (with credentials)
    retry, cancel and purge. Listens on 127.0.0.1 unless --address says otherwise; without
    --basic-auth or --token the pages are open and the actions off (refused on an address
    other than loopback unless --unauthenticated)."""
    with _logging_to_stderr(log_level.upper()):
        app = _schedules_app(ctx, app_spec)
        run_dashboard(app, port=port, address=address, basic_auth=basic_auth, tokens=tokens,
                      read_only=read_only, url_prefix=url_prefix, log_level=log_level,
                      secrets=_secrets, unauthenticated=unauthenticated)


# --- worker --------------------------------------------------------------------------------------

def load_app(spec: str) -> App:
    """Import ``MODULE:APP`` (APP may be dotted) or ``MODULE`` (its ``app``, or its only App).

    The current directory goes first on ``sys.path``, as with celery and uvicorn, so
    ``akadze worker proj.tasks:app`` works from the project root. Raises ``CliError``.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or (":" in spec and not attribute):
        raise CliError(f"invalid app {spec!r}: expected MODULE:APP, e.g. proj.tasks:app")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise CliError(f"cannot import module {module_name!r}: {exc}") from None
        raise CliError(_import_failed(module_name, exc)) from None
    except Exception as exc:
        raise CliError(_import_failed(module_name, exc)) from None
    if not attribute:
        return _default_app(module, module_name)
    value: Any = module
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise CliError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(value, App):
        raise CliError(f"{spec!r} is not an akadze_core.App (it is a {type(value).__name__})")
    return value


def _default_app(module: Any, module_name: str) -> App:
    candidate = getattr(module, "app", None)
    if isinstance(candidate, App):
        return candidate
    apps = {id(value): value for value in vars(module).values() if isinstance(value, App)}
    if len(apps) == 1:
        return next(iter(apps.values()))
    found = f"{len(apps)} apps" if apps else "no akadze_core.App"
    raise CliError(f"module {module_name!r} has no attribute 'app' that is an akadze_core.App "
                   f"({found} found): name it with MODULE:APP")


def _import_failed(module_name: str, exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"importing {module_name!r} failed: {type(exc).__name__}: {exc}{where}"



@cli.command("worker")
@click.argument("app_spec", metavar="MODULE:APP")
@click.option("--queue", "-q", "queues", multiple=True, metavar="NAME",
              help="A queue to work on (repeat it, or comma-separate). Default: the app's "
                   "default queue.")
@click.option("--slots", "-c", type=click.IntRange(min=1),
              help=f"Concurrent runs per queue.  [default: {DEFAULTS.slots}]")
@click.option("--heartbeat-interval", type=_SECONDS, metavar="S",
              help=f"Seconds between heartbeats.  [default: {DEFAULTS.heartbeat_interval:g}]")
@click.option("--heartbeat-ttl", type=_SECONDS, metavar="S",
              help="Seconds without a heartbeat after which a worker is dead.  "
                   f"[default: {DEFAULTS.heartbeat_ttl:g}]")
@click.option("--poll-interval", type=_SECONDS, metavar="S",
              help=f"Longest wait between claims when idle.  [default: {DEFAULTS.poll_interval:g}]")
@click.option("--shutdown-timeout", type=click.FloatRange(min=0), metavar="S",
              help="Seconds to wait for running jobs on stop.  "
                   f"[default: {DEFAULTS.shutdown_timeout:g}]")
@click.option("--fair", is_flag=True, default=None,
              help="Rotate claims across the task names of each queue.")
@click.option("--health-file", type=click.Path(dir_okay=False), metavar="PATH",
              help="Touched when the worker is up, removed when it stops.")
@click.option("--processes", "-p", type=click.IntRange(min=1), metavar="N",
              help="Run bodies in N child processes (for CPU-bound sync tasks); this "
                   "process still claims and writes outcomes. At most N run at once, and "
                   "N are claimed unless --slots says how many to hold per queue (the "
                   "rest wait for a free process).")
@click.option("--max-connections", type=click.IntRange(min=3), metavar="N",
              help="The most connections this worker opens at once (its pool and its "
                   "LISTEN connection).  [default: min(total slots, 16) + 7]")
@click.option("--lock-timeout", type=_SECONDS, metavar="S",
              help="Seconds a statement waits for a lock (LOCK TABLE, a migration) before "
                   "it is retried.  [default: 2, less on a short --heartbeat-ttl]")
@click.option("--metrics-port", type=click.IntRange(0, 65535), metavar="N",
              help="Serve Prometheus metrics on this port (http://ADDRESS:N/metrics; 0: any "
                   "free port, logged).  [default: none]")
@click.option("--metrics-address", metavar="HOST", default=DEFAULTS.metrics_address,
              show_default=True, help="The address --metrics-port binds.")
@click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False),
              default="INFO", show_default=True)
@click.pass_context
def worker_command(ctx: click.Context, app_spec: str, queues: tuple[str, ...],
                   log_level: str, **settings: Any) -> None:
    """Run a worker for the tasks of MODULE:APP until SIGINT or SIGTERM.

    The first signal stops claiming and waits up to --shutdown-timeout for running jobs,
    then returns the rest to the queue without spending an attempt; a second one stops at
    once. Exits 0, or 1 when the database was unreachable for longer than --heartbeat-ttl.
    """
    # Left in place when the worker ran: the process ends in _exit_now.
    with _logging_to_stderr(log_level.upper()):
        app = load_app(app_spec)
        _secrets.redactors.append(app.redact)
        # What the tasks print goes out scrubbed of passwords, as the log lines do (a pool
        # child runs this too: its prints are its own).
        ctx.with_resource(scrubbed_stdio(_secrets.scrub))
        options = _options(ctx)
        if options.url_from_command_line and options.url:
            app.set_database_url(options.url)
        if is_pool_child():
            # A --processes child: the parent claims and writes outcomes; this runs bodies.
            exit_now(serve(app))
        names = [name.strip() for value in queues for name in value.split(",") if name.strip()]
        processes = settings.pop("processes")
        # Settings of the config alone (Worker takes no keyword for them).
        config = WorkerConfig(metrics_port=settings.pop("metrics_port"),
                              metrics_address=settings.pop("metrics_address"))
        kwargs = {name: value for name, value in settings.items() if value is not None}
        if processes:
            if "slots" not in kwargs:
                # Nothing claimed ahead: at most N jobs held, all of them running. With
                # --slots M, M per queue are held and those beyond N wait for a process.
                kwargs["slots"] = processes
                kwargs["max_running"] = processes
            kwargs["process_pool"] = ProcessPool(
                processes, [sys.executable, "-m", "akadze_core.cli", *sys.argv[1:]])
        try:
            worker = Worker(app, queues=names or [app.default_queue], config=config, **kwargs)
        except ValueError as exc:
            raise click.UsageError(str(exc), ctx) from None
        try:
            code = worker.run_sync()
        except Exception as exc:  # WorkerError: schema missing, permission denied, ...
            _report(exc)
            code = 1
        exit_now(code)


def main(argv: Sequence[str] | None = None) -> None:
    """The ``akadze`` console script."""
    cli.main(args=list(argv) if argv is not None else None, prog_name=PROG_NAME)


if __name__ == "__main__":
    main()
