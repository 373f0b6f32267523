"""``akadze queues``: list the queues, pause and resume one for the whole fleet."""

from __future__ import annotations

import click

from ..model.errors import InvalidArgs
from ..store import pauses
from .base import CliError, format_json, format_table, format_when, open_connection
from .support import printable


@click.group("queues")
def queues_group() -> None:
    """List queues; pause and resume one for every worker."""


@queues_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def queues_list(ctx: click.Context, as_json: bool) -> None:
    """List the queues with queued jobs, live workers or a pause, and whether each is
    paused."""
    with open_connection(ctx) as connection:
        states = pauses.list_queues(connection)
    if as_json:
        click.echo(format_json([
            {"queue": state.queue, "paused": state.paused,
             "paused_at": state.paused_at.isoformat() if state.paused_at else None,
             "paused_by": state.paused_by, "due": state.due, "workers": state.workers}
            for state in states]))
        return
    if not states:
        click.echo("no queues")
        return
    click.echo(format_table(
        ("QUEUE", "STATE", "DUE", "WORKERS", "PAUSED_AT", "PAUSED_BY"),
        [(printable(state.queue), "paused" if state.paused else "active", state.due,
          state.workers, format_when(state.paused_at), printable(state.paused_by or "-"))
         for state in states]))


@queues_group.command("pause")
@click.argument("queue")
@click.option("--by", default="cli", show_default=True,
              help="Who paused it, as `akadze queues list` shows.")
@click.pass_context
def queues_pause(ctx: click.Context, queue: str, by: str) -> None:
    """Pause QUEUE for every worker, running or started later, until resumed.

    Once this returns, no worker starts a new job of QUEUE; jobs already running finish, and
    enqueues still insert (the jobs wait).
    """
    with open_connection(ctx) as connection:
        try:
            changed = pauses.pause(connection, queue, by)
        except InvalidArgs as exc:
            raise CliError(str(exc)) from None
    click.echo(f"paused queue {printable(queue)}" if changed
               else f"queue {printable(queue)} was already paused")


@queues_group.command("resume")
@click.argument("queue")
@click.pass_context
def queues_resume(ctx: click.Context, queue: str) -> None:
    """Resume QUEUE: its idle workers claim its jobs at once."""
    with open_connection(ctx) as connection:
        try:
            changed = pauses.resume(connection, queue)
        except InvalidArgs as exc:
            raise CliError(str(exc)) from None
    click.echo(f"resumed queue {printable(queue)}" if changed
               else f"queue {printable(queue)} was not paused")
