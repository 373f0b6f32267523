"""``akadze jobs`` (list, show, cancel and requeue jobs) and ``akadze stats``."""

from __future__ import annotations

import json
import signal

import click
import psycopg

from ..model.jobs import JOB_STATES, Job
from ..ops.control import request_cancel_sync, requeue_sync, signal_number
from ..store import database
from .base import CliError, format_json, format_table, format_when, open_connection
from .support import printable


@click.group("jobs")
def jobs_group() -> None:
    """List, show, cancel and requeue jobs."""


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
    with open_connection(ctx) as connection:
        rows = database.fetch_all(connection, "job_list", state=state, queue=queue, task=task,
                                  limit=limit)
    jobs = [Job.from_row(row) for row in rows]
    if as_json:
        click.echo(format_json([job.to_json() for job in jobs]))
        return
    if not jobs:
        click.echo("no jobs")
        return
    click.echo(format_table(
        ("ID", "QUEUE", "TASK", "STATE", "ATTEMPT", "SCHEDULED_AT", "FINISHED_AT"),
        [(job.id, job.queue, job.task, job.state, f"{job.attempt}/{job.max_attempts}",
          format_when(job.scheduled_at), format_when(job.finished_at)) for job in jobs]))


def _get_job(connection: psycopg.Connection, job_id: int) -> Job | None:
    row = database.fetch_one(connection, "job_get", id=job_id)
    return Job.from_row(row) if row else None


@jobs_group.command("show")
@click.argument("job_id", metavar="ID", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def jobs_show(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """Show one job: its fields, args, result and the error of each failed attempt."""
    with open_connection(ctx) as connection:
        job = _get_job(connection, job_id)
    if job is None:
        raise CliError(f"job {job_id} not found")
    data = job.to_json()
    if as_json:
        click.echo(format_json(data))
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
    with open_connection(ctx) as connection:
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
    with open_connection(ctx) as connection:
        requeued = requeue_sync(connection, job_id)
        job = _get_job(connection, job_id)
    if not requeued:
        where = "does not exist" if job is None else f"is {job.state}"
        raise CliError(f"job {job_id} {where}: only failed jobs can be requeued")
    assert job is not None
    click.echo(f"job {job_id} requeued (attempt {job.attempt} of {job.max_attempts} spent)")


# --- stats ---------------------------------------------------------------------------------------

@click.command("stats")
@click.option("--json", "as_json", is_flag=True,
              help='Print JSON: {"queue": {"queued": n, "running": n, ...}}.')
@click.pass_context
def stats_command(ctx: click.Context, as_json: bool) -> None:
    """Count jobs per queue and state."""
    with open_connection(ctx) as connection:
        rows = database.fetch_all(connection, "job_stats")
    counts: dict[str, dict[str, int]] = {}
    for row in rows:
        counts.setdefault(row["queue"], dict.fromkeys(JOB_STATES, 0))[row["state"]] = row["jobs"]
    if as_json:
        click.echo(format_json(counts))
        return
    if not counts:
        click.echo("no jobs")
        return
    click.echo(format_table(
        ("QUEUE", *(state.upper() for state in JOB_STATES), "TOTAL"),
        [(queue, *(by_state[state] for state in JOB_STATES), sum(by_state.values()))
         for queue, by_state in counts.items()]))


