"""``akadze schedules``: list the schedules (declared in code and stored in the database);
add, pause, resume and remove the runtime ones."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import click
import psycopg

from ..app import App
from ..schedules.triggers import Cron, Every, Trigger
from ..store import database
from .base import (
    SECONDS,
    CliError,
    app_for,
    format_json,
    format_table,
    format_when,
    group_options,
    open_connection,
)
from .support import printable


class SchedulesGroup(click.Group):
    """``akadze schedules [MODULE:APP] [--json]`` lists, as it did before the subcommands
    came: a first word that names none of them (or none at all) means ``list``. A module
    named like a subcommand is listed with ``akadze schedules list MODULE``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ctx.help_option_names):
            args = ["list", *args]
        return super().parse_args(ctx, args)


@click.group("schedules", cls=SchedulesGroup)
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
    app = app_for(ctx, app_spec)
    with open_connection(ctx, app=app) as connection:
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
        click.echo(format_json([{key: value.isoformat() if isinstance(value, datetime) else value
                           for key, value in entry.items()} for entry in listed]))
    elif not listed:
        click.echo("no runtime schedules" if unseen else "no schedules")
    else:
        click.echo(format_table(
            ("NAME", "TASK", "TRIGGER", "QUEUE", "LAST_RUN", "NEXT_RUN"),
            [(entry["name"], entry["task"], entry["trigger"], entry["queue"],
              format_when(entry["last_run"]) if entry["last_run"] else "never",
              "paused" if entry["paused"] else format_when(entry["next_run"]))
             for entry in listed]))
    if unseen:
        names = ", ".join(f"{row['name']} (last run "
                          f"{format_when(_utc(row['last_run'])) if row['last_run'] else 'never'})"
                          for row in unseen)
        click.echo(printable(f"not listed: {names}. {CODE_SCHEDULES_HINT}"), err=True)


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
@click.option("--every", type=SECONDS, metavar="S",
              help="Instead of --cron: every S seconds (ticks at multiples of S since the "
                   "Unix epoch).")
@click.option("--args", "args_json", metavar="JSON", help="The job's arguments, a JSON object.")
@click.option("--queue", "-q", help="Default: the task's queue with --app, else the default "
                                    "queue.")
@click.option("--priority", type=int, help="Default: the task's with --app, else 0.")
@click.option("--max-attempts", type=click.IntRange(min=1),
              help="Default: the task's with --app, else 3.")
@click.option("--expires", type=SECONDS, metavar="S",
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
    app = app_for(ctx, app_spec)
    try:
        trigger: Trigger = Every(every) if every is not None \
            else Cron(cron or "", timezone=tz, day_or=not day_and)
        with open_connection(ctx, app=app) as connection:
            stored = app.runtime_schedules.add(
                name, task, trigger=trigger, args=args, queue=queue, priority=priority,
                max_attempts=max_attempts, expires=expires, meta=meta, paused=paused,
                replace=replace, session=connection)
            clock = database.fetch_one(connection, "schedule_clock")
    except (ValueError, TypeError) as exc:
        raise CliError(str(exc)) from None
    assert clock is not None
    following = stored.next_run(clock["now"])
    when = "paused" if following is None else f"next run {format_when(_utc(following))}"
    click.echo(printable(f"schedule {name} {'stored' if replace else 'added'}: {stored.task} "
                         f"at {stored.trigger}, queue {stored.queue} ({when})"))


def _runtime_change(ctx: click.Context, name: str, verb: str) -> None:
    app = App(group_options(ctx).url)
    with open_connection(ctx, app=app) as connection:
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
