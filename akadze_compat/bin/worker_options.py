"""The options of ``akadze-compat worker``: Celery's names and defaults, and what they become.

Every option of ``celery worker`` is accepted. The ones without a meaning here print one
``akadze-compat: warning: ...`` line each and are otherwise ignored; options Celery does not
have either are warned about the same way, never a crash.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click

from akadze_core.integration import DEFAULTS, seconds

from ..app.defaults import DEFAULTS as CELERY_DEFAULTS
from ..app.routes import queue_names
from ..django_beat import names_database_scheduler
from .base import CliError, host_format, nodename, split_names, warn

__all__ = ["WorkerSettings", "settings_from_options", "warn_unsupported", "worker_options"]

POOLS = ("prefork", "processes", "threads", "solo", "eventlet", "gevent")
LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING,
          "WARN": logging.WARNING, "ERROR": logging.ERROR, "CRITICAL": logging.CRITICAL,
          "FATAL": logging.CRITICAL}
#: Celery's default worker_prefetch_multiplier, also used in place of its 0 ("no limit").
PREFETCH_MULTIPLIER: int = CELERY_DEFAULTS["worker_prefetch_multiplier"]
#: Hidden overrides of the core Worker's timings (seconds), for tests and tuning.
INTERVAL_VARIABLES = {"poll_interval": "AKADZE_POLL_INTERVAL",
                      "heartbeat_interval": "AKADZE_HEARTBEAT_INTERVAL",
                      "heartbeat_ttl": "AKADZE_HEARTBEAT_TTL",
                      "shutdown_timeout": "AKADZE_SHUTDOWN_TIMEOUT"}

#: Celery options accepted and ignored: (flags, is a flag, why it does not apply).
IGNORED: tuple[tuple[tuple[str, ...], bool, str], ...] = (
    (("-D", "--detach"), True, "the worker runs in the foreground; let your process manager "
                               "(systemd, supervisord, Docker) keep it in the background"),
    (("-S", "--statedb"), False, "there is no worker state file: revokes live in the database"),
    (("--disable-prefetch",), True, "use --prefetch-multiplier 1 (prefork) instead"),
    (("-E", "--task-events", "--events"), True, "there is no event stream; task states are in "
                                                "the database (`akadze-compat inspect`)"),
    (("--pool-start-method",), False, "prefork children are always fresh interpreters"),
    (("--max-memory-per-child",), False, "not supported; --max-tasks-per-child is"),
    (("--without-gossip",), True, "workers never gossip"),
    (("--without-mingle",), True, "workers never mingle"),
    (("--without-heartbeat",), True, "heartbeats are how the jobs of a lost worker are "
                                     "rescued: they stay on"),
    (("-s", "--schedule-filename", "--schedule"), False, "schedules keep their state in the "
                                                         "database"),
    (("--uid",), False, "start the worker as the user you want instead"),
    (("--gid",), False, "start the worker as the group you want instead"),
    (("--umask",), False, "set the umask before starting the worker instead"),
    (("--executable",), False, "prefork children run this Python"),
)


def _dest(flags: tuple[str, ...]) -> str:
    return max(flags, key=len).lstrip("-").replace("-", "_")


def worker_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add Celery's worker options to ``command``."""
    declared = [
        click.option("-n", "--hostname", help="Node name, e.g. w1@%h.  [default: celery@%h]"),
        click.option("-l", "--loglevel", default="WARNING", show_default=True,
                     help="Logging level (DEBUG, INFO, WARNING, ERROR, CRITICAL)."),
        click.option("-f", "--logfile", help="Log to this file instead of stderr (%n, %h, "
                                             "%i are expanded)."),
        click.option("--pidfile", help="Write the main process's pid here."),
        click.option("-c", "--concurrency", help="Processes (prefork) or tasks at once "
                     "(threads).  [default: worker_concurrency, else the number of CPUs]"),
        click.option("-P", "--pool", type=click.Choice(POOLS, case_sensitive=False),
                     help="prefork (processes), threads or solo.  [default: worker_pool, "
                          "prefork]"),
        click.option("-Q", "--queues", multiple=True, help="Queues to work on, "
                     "comma-separated.  [default: task_queues, else task_default_queue]"),
        click.option("-X", "--exclude-queues", multiple=True, help="Queues not to work on."),
        click.option("-I", "--include", multiple=True, help="More task modules to import."),
        click.option("--max-tasks-per-child", type=click.IntRange(min=1),
                     help="Replace a prefork process after this many tasks."),
        click.option("--prefetch-multiplier", type=click.IntRange(min=0),
                     help="Claim up to this many tasks per process (or thread); they wait "
                          "for a free one.  [default: worker_prefetch_multiplier, "
                          f"{PREFETCH_MULTIPLIER}]"),
        click.option("--time-limit", type=float, help="Hard time limit of every task (s)."),
        click.option("--soft-time-limit", type=float, help="Soft time limit of every task (s)."),
        click.option("--purge", "--discard", "purge", is_flag=True,
                     help="Delete the queued tasks of the worker's queues first."),
        click.option("-B", "--beat", is_flag=True, help="Accepted: every worker runs the "
                                                        "schedules already."),
        click.option("--scheduler", help="beat_scheduler for this worker: django_celery_beat's "
                                         "DatabaseScheduler runs the periodic tasks of its "
                                         "tables; another is named in a warning at start."),
        click.option("-O", "--optimization", type=click.Choice(("default", "fair")),
                     help="Accepted: claims are always 'fair' (a claimed task waits for a "
                          "free process, never for a busy one)."),
        click.option("--heartbeat-interval", type=click.IntRange(min=1),
                     help="Seconds between this worker's heartbeats.  "
                          f"[default: {DEFAULTS.heartbeat_interval:g}]"),
        click.option("--autoscale", help="Not supported: MAX,MIN runs a fixed pool of MAX."),
        click.option("--metrics-port", type=click.IntRange(0, 65535),
                     help="Serve Prometheus metrics on this port (http://ADDRESS:N/metrics; "
                          "0: any free port). Not a Celery option: akadze's own."),
        click.option("--metrics-address", help="The address --metrics-port binds.  "
                                               f"[default: {DEFAULTS.metrics_address}]"),
    ]
    for flags, is_flag, _why in IGNORED:
        declared.append(click.option(*flags, _dest(flags), is_flag=is_flag, default=None,
                                     hidden=True))
    for option in reversed(declared):
        command = option(command)
    return command


def warn_unsupported(options: dict[str, Any], extra: list[str]) -> None:
    """One warning per ignored option used, and per unknown word on the command line."""
    for flags, _is_flag, why in IGNORED:
        value = options.get(_dest(flags))
        if flags[0] == "-S" and names_database_scheduler(value):
            warn(f"-S is --statedb in `celery worker`; {value} names a scheduler, so it is "
                 "read as --scheduler")
        elif value not in (None, False):
            warn(f"{'/'.join(flags)} is ignored: {why}")
    if options.get("autoscale"):
        warn("--autoscale is not supported: the pool has a fixed size (its maximum)")
    for word in extra:
        if word in ("-A", "--app") or word.startswith("--app="):
            raise CliError("-A/--app goes before the command: akadze-compat -A proj worker",
                           exit_code=2)
        what = "option" if word.startswith("-") else "argument"
        warn(f"unknown {what} {word!r} is ignored")


@dataclass
class WorkerSettings:
    """The worker's configuration once options, settings and defaults are combined."""

    hostname: str
    loglevel: int
    logfile: str | None
    pidfile: str | None
    pool: str
    concurrency: int
    queues: list[str]
    include: list[str]
    max_tasks_per_child: int | None
    #: Tasks claimed per process or thread (Celery's worker_prefetch_multiplier).
    prefetch_multiplier: int
    time_limit: float | None
    soft_time_limit: float | None
    purge: bool
    quiet: bool
    options: dict[str, Any]
    #: Lines logged at INFO once logging is set up (notes on accepted options).
    notes: list[str] = field(default_factory=list)
    #: Extra keyword arguments of akadze_core's Worker (timings).
    worker_kwargs: dict[str, Any] = field(default_factory=dict)
    #: ``--scheduler`` (or a scheduler given to ``-S``): the app's beat_scheduler.
    scheduler: str | None = None


def _level(value: str) -> int:
    text = str(value).strip().upper()
    if text.isdigit():
        return int(text)
    if text not in LEVELS:
        raise CliError(f"invalid log level {value!r}: use DEBUG, INFO, WARNING, ERROR or "
                       "CRITICAL", exit_code=2)
    return LEVELS[text]


def _pool(app: Any, value: str | None, main: bool) -> str:
    pool = str(value or app.conf.worker_pool or "prefork").lower()
    pool = "prefork" if pool == "processes" else pool
    if pool in ("eventlet", "gevent"):
        if main:
            warn(f"-P {pool} is not supported: running the threads pool instead (async def "
                 "tasks run on the worker's event loop)")
        return "threads"
    if pool not in ("prefork", "threads", "solo"):
        raise CliError(f"unknown pool {pool!r}: use prefork, threads or solo", exit_code=2)
    return pool


def _concurrency(app: Any, value: Any, autoscale: str | None) -> int:
    if value in (None, "", 0) and autoscale:
        value = autoscale.split(",")[0]
    if value in (None, "", 0):
        value = app.conf.worker_concurrency
    if value in (None, "", 0, "auto"):
        return os.cpu_count() or 2
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        raise CliError(f"invalid concurrency {value!r}: a number of at least 1, or auto",
                       exit_code=2)
    return number


def _timings(heartbeat_interval: int | None) -> dict[str, float]:
    timings: dict[str, float] = {}
    for name, variable in INTERVAL_VARIABLES.items():
        text = os.environ.get(variable)
        if text:
            try:
                timings[name] = float(text)
            except ValueError:
                raise CliError(f"{variable}={text!r} is not a number of seconds") from None
    if heartbeat_interval:
        timings["heartbeat_interval"] = float(heartbeat_interval)
    interval = timings.get("heartbeat_interval")
    if interval and "heartbeat_ttl" not in timings:
        # A slower heartbeat keeps six beats' worth of ttl, never less than the default.
        timings["heartbeat_ttl"] = max(seconds(DEFAULTS.heartbeat_ttl), 6 * interval)
    return timings


def settings_from_options(app: Any, options: dict[str, Any], child: Any, *,
                          quiet: bool = False) -> WorkerSettings:
    """Combine the command line, the app's settings and Celery's defaults."""
    main = child is None
    conf = app.conf
    pool = _pool(app, options.get("pool"), main)
    concurrency = 1 if pool == "solo" else _concurrency(app, options.get("concurrency"),
                                                        options.get("autoscale"))
    queues = split_names(options.get("queues")) or queue_names(conf.task_queues) or \
        [conf.task_default_queue or "celery"]
    excluded = set(split_names(options.get("exclude_queues")))
    queues = [queue for queue in queues if queue not in excluded]
    if not queues:
        raise CliError("no queue left to work on after --exclude-queues", exit_code=2)
    max_tasks = options.get("max_tasks_per_child") or conf.worker_max_tasks_per_child
    notes = []
    if max_tasks and pool != "prefork":
        if main and options.get("max_tasks_per_child"):
            warn(f"--max-tasks-per-child applies to the prefork pool only, not {pool}")
        max_tasks = None
    prefetch = options.get("prefetch_multiplier")
    if prefetch is None:
        prefetch = conf.worker_prefetch_multiplier
    if int(prefetch) < 1:
        # Celery's 0 means "no limit"; a claim needs one, so 0 keeps Celery's default.
        notes.append("worker_prefetch_multiplier 0 (no limit) is not supported: using "
                     f"{PREFETCH_MULTIPLIER}")
        prefetch = PREFETCH_MULTIPLIER
    if options.get("beat"):
        notes.append("-B: periodic tasks are enqueued by every worker, exactly once per tick; "
                     "no beat process is needed")
    if options.get("optimization") == "fair":
        notes.append("-O fair: a claimed task waits for a free process, never for a busy one")
    logfile = options.get("logfile")
    return WorkerSettings(
        hostname=nodename(options.get("hostname")), loglevel=_level(options["loglevel"]),
        logfile=host_format(logfile, child.number if child else None) if logfile else None,
        pidfile=options.get("pidfile"), pool=pool, concurrency=concurrency, queues=queues,
        include=split_names(options.get("include")), max_tasks_per_child=max_tasks,
        prefetch_multiplier=max(1, int(prefetch)),
        time_limit=options.get("time_limit"), soft_time_limit=options.get("soft_time_limit"),
        purge=bool(options.get("purge")), quiet=quiet,
        options={key: value for key, value in options.items() if value is not None},
        notes=notes, worker_kwargs={**_timings(options.get("heartbeat_interval")),
                                    **_metrics(options)},
        scheduler=_scheduler(options))


def _metrics(options: dict[str, Any]) -> dict[str, Any]:
    """``--metrics-port`` and ``--metrics-address`` as the core WorkerConfig's settings."""
    if options.get("metrics_port") is None:
        if options.get("metrics_address"):
            warn("--metrics-address is ignored without --metrics-port")
        return {}
    return {"metrics_port": options["metrics_port"],
            "metrics_address": options.get("metrics_address") or DEFAULTS.metrics_address}


def _scheduler(options: dict[str, Any]) -> str | None:
    """``--scheduler``, else a ``-S`` value that names a scheduler (Celery's worker reads -S
    as --statedb, but a scheduler's name there can only mean the scheduler)."""
    statedb = options.get("statedb")
    for value in (options.get("scheduler"), statedb):
        if names_database_scheduler(value):
            return str(value)
    return None
