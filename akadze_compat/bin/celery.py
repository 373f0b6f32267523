"""The ``akadze-compat`` console script: Celery's ``celery`` command for akadze_compat apps.

``celery -A proj worker -l INFO`` becomes ``akadze-compat -A proj worker -l INFO``. The global
options are Celery's (``-A/--app``, ``-b/--broker``, ``--workdir``, ``--config``, ...) with its
environment variables (``APP``, ``BROKER_URL``, ``CELERY_<COMMAND>_<OPTION>``). Commands:
``worker``, ``beat``, ``purge``, ``inspect``, ``status``, ``call``, ``result``, ``migrate``,
``schedules``, ``doctor``.

Every expected error ends the command with one ``akadze-compat: error: ...`` line on stderr
and a non-zero exit code; no output ever contains a database password.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib import metadata

import click

from .._alias import disabled_by_env
from .._alias import install as install_celery_alias
from ..worker.pool import child_info
from .base import PROG_NAME, CliError, CliState, CompatGroup, secrets, warn
from .commands import COMMANDS
from .doctor import doctor_command
from .worker import worker_command

__all__ = ["cli", "main"]


def _workdir(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    # A prefork child inherits the directory already: a relative path must not apply twice.
    if value and child_info() is None:
        try:
            os.chdir(value)
        except OSError as exc:
            raise CliError(f"--workdir {value!r}: {exc.strerror}") from None
    return value


def _version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        click.echo(f"{PROG_NAME} {metadata.version('akadze')} (akadze, Celery-compatible)")
        ctx.exit()


@click.group(name=PROG_NAME, cls=CompatGroup, invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-A", "--app", "app_spec", envvar="APP", metavar="MODULE",
              help="The Celery app: proj, proj.celery, proj.celery:app ...")
@click.option("-b", "--broker", envvar="BROKER_URL", metavar="URL",
              help="The Postgres URL of the queue (sets CELERY_BROKER_URL).")
@click.option("--result-backend", envvar="RESULT_BACKEND", metavar="URL",
              help="Accepted and ignored: results live in the same database.")
@click.option("--loader", envvar="LOADER", help="Accepted and ignored.")
@click.option("--config", envvar="CONFIG_MODULE", metavar="MODULE",
              help="Settings module, for an app that calls no config_from_object.")
@click.option("--workdir", callback=_workdir, is_eager=True, metavar="DIR",
              help="Change to this directory first.")
@click.option("-C", "--no-color", is_flag=True, help="Accepted (output is never colored).")
@click.option("-q", "--quiet", is_flag=True, help="Less output (no banner, no node count).")
@click.option("--skip-checks", is_flag=True, help="Accepted (no Django checks are run).")
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_version, help="Show the version and exit.")
@click.pass_context
def cli(ctx: click.Context, app_spec: str | None, broker: str | None,
        result_backend: str | None, loader: str | None, config: str | None,
        workdir: str | None, no_color: bool, quiet: bool, skip_checks: bool) -> None:
    """akadze-compat: run a Celery 5 project on akadze (a Postgres job queue)."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())
        ctx.exit()
    secrets.add_url(broker)
    secrets.add_url(result_backend)
    # As Celery does: the options reach the app through its environment variables.
    if broker:
        os.environ["CELERY_BROKER_URL"] = broker
    if result_backend:
        os.environ["CELERY_RESULT_BACKEND"] = result_backend
    if config:
        os.environ["CELERY_CONFIG_MODULE"] = config
    if loader and child_info() is None:
        warn("--loader is ignored: task modules are found by imports/include and "
             "autodiscover_tasks")
    ctx.obj = CliState(app_spec or None, config or None, quiet, list(CompatGroup.invocation))


def _register() -> None:
    cli.add_command(worker_command)
    cli.add_command(doctor_command)
    for command in COMMANDS:
        cli.add_command(command)


_register()


def main(argv: Sequence[str] | None = None) -> None:
    """The ``akadze-compat`` console script: ``import celery`` in the project (and in the
    pool children it starts) resolves to akadze_compat, unless ``AKADZE_CELERY=0``."""
    if not disabled_by_env():
        install_celery_alias()
    cli.main(args=list(argv) if argv is not None else None, prog_name=PROG_NAME)


if __name__ == "__main__":
    main()
