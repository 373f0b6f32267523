"""What every ``akadze`` command shares: its secrets and logging, the group whose failures
print one line, the group's options, the connection a command opens, and loading an app.

Every expected error (bad URL, server unreachable, schema missing, an app that cannot be
imported) ends the command with exactly one line ``akadze: error: ...`` on stderr and a
non-zero exit code (``CliError``, ``report_error``). Nothing printed or logged ever contains
a database password: every message goes through ``SECRETS``, which holds the passwords of
every URL in play.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import click
import psycopg

from ..app import App
from ..model.dsn import ENV_VAR, LISTEN_VAR, prepare_threshold
from ..model.errors import AkadzeError, DatabaseUnavailable
from ..store import database
from ..store.dberrors import fatal_message
from .support import (
    OneLineErrorGroup,
    ScrubbingFormatter,
    Secrets,
    logging_to_stderr,
    printable,
)

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
PROG_NAME = "akadze"
SECONDS = click.FloatRange(min=0, min_open=True)


class CliError(click.ClickException):
    """An expected failure: printed as one ``akadze: error: ...`` line, exit code 1."""


# --- secrets, logging, the command group (shared with akadze-compat: cli_support) ----------

#: The passwords (and apps) of this invocation, scrubbed from every line we emit.
SECRETS = Secrets()


def reset_secrets() -> None:
    """Forget the previous invocation's secrets; remember the environment's URLs."""
    SECRETS.clear()
    SECRETS.add_environment((ENV_VAR, LISTEN_VAR))


class CommandFormatter(ScrubbingFormatter):
    """The shared scrubbing formatter, on this command's secrets."""

    def __init__(self, fmt: str | None = None, datefmt: str | None = None) -> None:
        super().__init__(SECRETS, fmt, datefmt)


def stderr_logging(level: str) -> contextlib.AbstractContextManager[None]:
    """Send every log record (the tasks' own included) to stderr, one line each, scrubbed."""
    return logging_to_stderr(level, CommandFormatter(LOG_FORMAT))


class AkadzeGroup(OneLineErrorGroup):
    """A click group whose failures print one line instead of usage text or a traceback."""

    prog_name = PROG_NAME
    secrets = SECRETS

    def begin(self, args: Sequence[str] | None, extra: dict[str, Any]) -> None:
        """Forget the previous invocation's secrets; remember the environment's URL."""
        reset_secrets()

    def report(self, exc: Exception) -> int:
        """The one line for ``exc`` (see ``report_error``); exit code 1."""
        report_error(exc)
        return 1


def report_error(exc: Exception) -> None:
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
        click.echo(SECRETS.scrub(traceback.format_exc()).rstrip(), err=True)
        line = f"unexpected {type(exc).__name__}: {exc}"
    click.echo(AkadzeGroup.error_line(line), err=True)


@dataclass
class GroupOptions:
    """What the group's options left for the subcommands."""

    url: str | None
    url_from_command_line: bool


def group_options(ctx: click.Context) -> GroupOptions:
    """What the ``akadze`` group's options left for the subcommand of ``ctx``."""
    options = ctx.find_object(GroupOptions)
    assert options is not None
    return options


@contextlib.contextmanager
def open_connection(ctx: click.Context, *, check_schema: bool = True, app: App | None = None,
                create: bool = False) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the configured database (or ``app``'s), schema checked
    by default.

    Without a URL the embedded Postgres is used only if it exists, unless ``create``: a
    command that only reads (or needs an existing job) must not leave a new database in
    whatever directory it was typed in.
    """
    # INFO: the embedded Postgres says it started, migrations say what they applied.
    with stderr_logging("INFO"):
        if app is None:
            app = App(group_options(ctx).url)
        SECRETS.redactors.append(app.redact)
        # Explicit, else the environment, else the embedded Postgres.
        url = app.resolve_database_url(create=create)
        SECRETS.add_url(url)
        try:
            connection = psycopg.connect(url, autocommit=True, connect_timeout=10,
                                         prepare_threshold=prepare_threshold())
        except psycopg.Error as exc:
            raise CliError(f"cannot connect to Postgres: {exc}") from None
        with connection:
            if check_schema:
                database.check_schema(connection)
            yield connection


def app_for(ctx: click.Context, app_spec: str | None) -> App:
    """MODULE:APP pointed at --database-url if given, or an App of the configured URL."""
    options = group_options(ctx)
    if app_spec is None:
        return App(options.url)
    app = load_app(app_spec)
    if options.url_from_command_line and options.url:
        app.set_database_url(options.url)
    return app


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


# --- what the listing commands print -------------------------------------------------------

def format_when(value: datetime | None) -> str:
    """An instant as a table cell (``-`` for none)."""
    return value.isoformat(sep=" ", timespec="seconds") if value else "-"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """``rows`` under ``headers`` in aligned columns."""
    # Cells hold names and texts from rows: control characters shown escaped.
    cells = [[printable(cell) for cell in row] for row in [headers, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
                     .rstrip() for row in cells)


def format_json(value: Any) -> str:
    """``value`` as indented JSON, control characters shown escaped."""
    return printable(json.dumps(value, indent=2, ensure_ascii=False, default=str),
                     json_text=True)
