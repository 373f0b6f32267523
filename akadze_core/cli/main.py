"""The ``akadze`` command line: run a worker, apply the schema, inspect and steer jobs.

This module holds the group and the commands ``migrate``, ``dashboard`` and ``worker``;
``jobs``, ``stats`` (``cli.jobs``) and ``schedules`` (``cli.schedules``) are added to it.
What they all share (one-line errors, password scrubbing, the connection, loading an app)
is ``cli.base``.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Sequence
from typing import Any

import click
import psycopg

from ..app import App
from ..execution.heap import settle_heap
from ..execution.processes import ProcessPool, serve
from ..execution.processes import is_child as is_pool_child
from ..model.dsn import ENV_VAR, prepare_threshold
from ..store import database
from ..store.embedded import describe_database
from ..store.migrations import apply_citus, apply_migrations, latest_version
from ..worker.config import DEFAULTS, WorkerConfig
from ..worker.lifecycle import Worker
from .base import (
    LOG_LEVELS,
    PROG_NAME,
    SECONDS,
    SECRETS,
    AkadzeGroup,
    CliError,
    GroupOptions,
    app_for,
    group_options,
    load_app,
    open_connection,
    report_error,
    stderr_logging,
)
from .jobs import jobs_group, stats_command
from .queues import queues_group
from .schedules import schedules_group
from .support import (
    Secrets,
    exit_now,
    scrubbed_stdio,
)


@click.group(name=PROG_NAME, cls=AkadzeGroup, invoke_without_command=True,
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
    SECRETS.add_url(database_url)
    source = ctx.get_parameter_source("database_url")
    ctx.obj = GroupOptions(database_url or None, source == click.core.ParameterSource.COMMANDLINE)


cli.add_command(jobs_group)
cli.add_command(stats_command)
cli.add_command(schedules_group)
cli.add_command(queues_group)


# --- migrate -------------------------------------------------------------------------------------

@cli.command("migrate")
@click.option("--citus", is_flag=True, default=False,
              help="Citus mode (on a Citus coordinator): distribute the jobs table by shard "
                   "and make the small tables reference tables (docs/how-to/citus.md).")
@click.option("--lanes", type=click.IntRange(1, 16), default=None, metavar="N",
              help="With --citus: how many shards one queue's jobs without a tenant or "
                   "unique key spread over (default 1).")
@click.pass_context
def migrate_command(ctx: click.Context, citus: bool, lanes: int | None) -> None:
    """Create or upgrade the akadze schema (idempotent, safe to run concurrently)."""
    if lanes is not None and not citus:
        raise click.UsageError("--lanes is a Citus mode setting: give --citus too")
    app = App(group_options(ctx).url)
    with open_connection(ctx, check_schema=False, create=True, app=app) as connection:
        applied = apply_migrations(connection)
        if citus:
            connection.autocommit = True
            applied.repeatable.extend(apply_citus(connection, lanes=lanes))
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
                  log_level: str, secrets: Secrets, unauthenticated: bool = False,
                  extensions: Sequence[Any] = ()) -> None:
    """Serve the dashboard of ``app`` (shared by ``akadze dashboard`` and
    ``akadze-compat flower``, which adds Flower's API as ``extensions``: see
    ``DashboardConfig.extensions``); expected errors raise ``CliError``.

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
    config = DashboardConfig(basic_auth=users, tokens=tokens, read_only=read_only,
                             extensions=tuple(extensions))
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
    with stderr_logging(log_level.upper()):
        app = app_for(ctx, app_spec)
        run_dashboard(app, port=port, address=address, basic_auth=basic_auth, tokens=tokens,
                      read_only=read_only, url_prefix=url_prefix, log_level=log_level,
                      secrets=SECRETS, unauthenticated=unauthenticated)


# --- worker --------------------------------------------------------------------------------------

@cli.command("worker")
@click.argument("app_spec", metavar="MODULE:APP")
@click.option("--queue", "-q", "queues", multiple=True, metavar="NAME",
              help="A queue to work on (repeat it, or comma-separate). Default: the app's "
                   "default queue.")
@click.option("--slots", "-c", type=click.IntRange(min=1),
              help=f"Concurrent runs per queue.  [default: {DEFAULTS.slots}]")
@click.option("--heartbeat-interval", type=SECONDS, metavar="S",
              help=f"Seconds between heartbeats.  [default: {DEFAULTS.heartbeat_interval:g}]")
@click.option("--heartbeat-ttl", type=SECONDS, metavar="S",
              help="Seconds without a heartbeat after which a worker is dead.  "
                   f"[default: {DEFAULTS.heartbeat_ttl:g}]")
@click.option("--poll-interval", type=SECONDS, metavar="S",
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
@click.option("--lock-timeout", type=SECONDS, metavar="S",
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
    with stderr_logging(log_level.upper()):
        app = load_app(app_spec)
        SECRETS.redactors.append(app.redact)
        # What the tasks print goes out scrubbed of passwords, as the log lines do (a pool
        # child runs this too: its prints are its own).
        ctx.with_resource(scrubbed_stdio(SECRETS.scrub))
        options = group_options(ctx)
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
        # The command owns this process, whose start-up is over: it only runs jobs now.
        settle_heap()
        try:
            code = worker.run_sync()
        except Exception as exc:  # WorkerError: schema missing, permission denied, ...
            report_error(exc)
            code = 1
        exit_now(code)


def main(argv: Sequence[str] | None = None) -> None:
    """The ``akadze`` console script."""
    cli.main(args=list(argv) if argv is not None else None, prog_name=PROG_NAME)


if __name__ == "__main__":
    main()
