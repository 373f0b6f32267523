"""What every ``akadze-compat`` command shares: one-line errors, secrets, logging, ``-A``.

Every expected failure ends a command with exactly one line ``akadze-compat: error: ...`` on
stderr and a non-zero exit code, as the core ``akadze`` command does. Nothing printed or
logged contains a database password: each line goes through ``dsn.redact_password`` and
through the literal passwords of every URL this invocation saw.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import socket
import sys
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar

import click
import psycopg

from akadze_core import AkadzeError
from akadze_core.integration import (
    MIGRATE_COMMAND,
    SCHEMA_ERRORS,
    OneLineErrorGroup,
    Secrets,
    exit_now,
    one_line,
    printable,
    schema_missing,
)

from ..app.base import Celery
from ..exceptions import CeleryCommandException, ImproperlyConfigured

__all__ = ["PROG_NAME", "URL_VARIABLES", "CliError", "CliState", "CompatGroup", "cli_state",
           "exit_now", "find_app", "host_format", "nodename", "report", "secrets", "warn"]

PROG_NAME = "akadze-compat"
#: The commands the core and the app's own messages name for applying the schema.
_MIGRATE_COMMANDS = re.compile(rf"`(?:{re.escape(MIGRATE_COMMAND)}|{PROG_NAME} -A \S+ migrate)`")
#: Environment variables that may hold a database URL (their passwords are scrubbed).
URL_VARIABLES = ("AKADZE_DATABASE_URL", "AKADZE_LISTEN_URL", "CELERY_BROKER_URL", "BROKER_URL",
                 "DATABASE_URL")


class CliError(CeleryCommandException):
    """An expected failure: printed as one ``akadze-compat: error: ...`` line, exit code 1."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message, exit_code)


#: The passwords (and URLs) of this invocation, scrubbed from every line we print or log.
secrets = Secrets()


class CompatGroup(OneLineErrorGroup):
    """The ``akadze-compat`` group: the shared one-line failures, Celery's ``CELERY_``
    environment prefix, and the command line kept for prefork children."""

    prog_name = PROG_NAME
    secrets = secrets
    # Ctrl-C at a prompt exits 1, and usage errors keep click's own lines (scrubbed), as
    # akadze-compat always did.
    abort_exit_code = 1
    join_usage_errors = False
    #: The command line (without the program name) of the running invocation.
    invocation: ClassVar[list[str]] = []

    def begin(self, args: Sequence[str] | None, extra: dict[str, Any]) -> None:
        """Record the command line, forget the previous invocation's passwords, remember
        the environment's, and read options from ``CELERY_<COMMAND>_<OPTION>``."""
        CompatGroup.invocation = list(sys.argv[1:] if args is None else args)
        secrets.clear()
        secrets.add_environment(URL_VARIABLES)
        extra.setdefault("auto_envvar_prefix", "CELERY")

    def report(self, exc: Exception) -> int:
        """The one line for ``exc`` (see ``report``); returns its exit code."""
        return report(exc)


def warn(message: str) -> None:
    """Print one ``akadze-compat: warning: ...`` line on stderr."""
    click.echo(f"{PROG_NAME}: warning: {printable(secrets.scrub(one_line(message)))}", err=True)


def report(exc: BaseException) -> int:
    """Print the one error line for ``exc``; returns the exit code to use.

    Unexpected exceptions (bugs) also get their traceback, scrubbed, before the line.
    """
    if isinstance(exc, click.ClickException):
        line = exc.format_message()
    elif isinstance(exc, ImproperlyConfigured | AkadzeError):
        # The core names its own command (or the library's placeholder); this one migrates.
        line = re.sub(_MIGRATE_COMMANDS, f"`{PROG_NAME} migrate`", str(exc))
    elif isinstance(exc, psycopg.OperationalError) and exc.sqlstate is None:
        line = f"cannot connect to Postgres: {exc}"
    elif isinstance(exc, SCHEMA_ERRORS):
        line = str(schema_missing(command=f"{PROG_NAME} migrate"))  # the core's words, no SQL
    elif isinstance(exc, psycopg.Error):
        line = f"database error: {exc}"
    else:
        click.echo(secrets.scrub("".join(traceback.format_exception(exc))).rstrip(), err=True)
        line = f"unexpected {type(exc).__name__}: {exc}"
    click.echo(CompatGroup.error_line(line), err=True)
    return getattr(exc, "exit_code", 1) if isinstance(exc, click.ClickException) else 1


# --- node names (Celery's -n) ---------------------------------------------------------------

def nodename(value: str | None) -> str:
    """Celery's node name for ``-n``: ``name@host``, ``celery@`` added when no name is given,
    with ``%h`` (host), ``%n`` (host's first label) and ``%d`` (domain) expanded."""
    value = value or ""
    name, _, host = value.rpartition("@") if "@" in value else ("", "", value)
    return host_format(f"{name or 'celery'}@{host or socket.gethostname()}")


def host_format(text: str, index: int | None = None) -> str:
    """Expand ``%h``, ``%n``, ``%d``, ``%i`` (process index, 0 in the main process), ``%I``
    (``-index`` in a child, empty otherwise) and ``%%`` in ``text``."""
    host = socket.gethostname()
    short, _, domain = host.partition(".")
    keys = {"h": host, "n": short, "d": domain, "i": str(index or 0),
            "I": f"-{index}" if index else "", "%": "%"}
    out, chars = [], iter(text)
    for char in chars:
        if char != "%":
            out.append(char)
            continue
        key = next(chars, "")
        out.append(keys.get(key, f"%{key}"))
    return "".join(out)


# --- -A resolution (Celery's find_app, written anew) ---------------------------------------

def _import_from_cwd(name: str) -> ModuleType:
    # The project root (the current directory) goes first, as with `celery -A`.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    return importlib.import_module(name)


def _is_app(value: Any) -> bool:
    return isinstance(value, Celery)


def _foreign_celery(value: Any) -> str | None:
    """The full name of the class of a Celery app that is not akadze's (an app of the real
    celery package, installed beside akadze), e.g. ``celery.app.base.Celery``; else None."""
    if isinstance(value, type) or _is_app(value):
        return None
    for klass in type(value).__mro__:
        if klass.__name__ == "Celery" and not klass.__module__.startswith("akadze_compat"):
            return f"{klass.__module__}.{klass.__qualname__}"
    return None


def _not_akadze_app(spec: str, value: Any, class_name: str) -> CliError:
    """The error for a Celery app of another package: which one, and the two ways out."""
    package = class_name.partition(".")[0]
    module = sys.modules.get(package)
    version = getattr(module, "__version__", None)
    origin = f"{package} {version}" if isinstance(version, str) else package
    where = getattr(module, "__file__", None)
    origin += f" at {os.path.dirname(where)}" if isinstance(where, str) else ""
    return CliError(f"{spec!r} is a {class_name} ({origin}), not an akadze_compat app: "
                    "change the module's import to `from akadze_compat import Celery`, or "
                    "set AKADZE_CELERY=1 so that `import celery` gives akadze_compat")


def _symbol(spec: str) -> Any:
    """``module:attr.path`` → the attribute; ``a.b.c`` → attribute ``c`` of module ``a.b``,
    or module ``a.b.c`` when ``a.b`` has no such attribute (yet)."""
    if ":" in spec:
        module_name, _, attribute = spec.partition(":")
        value: Any = _import_from_cwd(module_name)
        for part in attribute.split("."):
            value = getattr(value, part)
        return value
    module_name, _, attribute = spec.rpartition(".")
    if not module_name:
        return _import_from_cwd(spec)
    try:
        return getattr(_import_from_cwd(module_name), attribute)
    except AttributeError:
        return _import_from_cwd(spec)


def _app_in_module(module: ModuleType, spec: str) -> Any:
    """The app a module stands for: its ``app``, its ``celery``, its submodule ``celery``
    (for a package), else the first Celery instance defined in it."""
    foreign: tuple[str, Any, str] | None = None
    for attribute in ("app", "celery"):
        found = getattr(module, attribute, None)
        # Celery takes any non-module `app`; we skip one that is not a Celery app (a Flask
        # `app` next to the Celery one is common) and go on looking.
        if _is_app(found):
            return found
        class_name = _foreign_celery(found)
        if class_name and foreign is None:
            foreign = (f"{spec}:{attribute}", found, class_name)
    if hasattr(module, "__path__"):
        try:
            submodule = _import_from_cwd(f"{spec}.celery")
        except ModuleNotFoundError as exc:
            if exc.name != f"{spec}.celery":
                raise
        else:
            return _app_in_module(submodule, f"{spec}.celery")
    for value in vars(module).values():
        if _is_app(value):
            return value
    if foreign is not None:
        raise _not_akadze_app(*foreign)
    raise CliError(f"unable to load the app: module {spec!r} has no attribute 'app' or "
                   "'celery' and defines no Celery instance (name it: -A module:attribute)")


def find_app(spec: str) -> Any:
    """The Celery app named by ``-A``: ``proj``, ``proj.celery``, ``proj.celery:app``,
    ``proj.app`` ... with Celery's rules. Raises ``CliError`` with one clear line."""
    if not spec or spec.endswith(":") or spec.startswith(":"):
        raise CliError(f"invalid app {spec!r}: expected a module or module:attribute")
    top = spec.partition(":")[0]
    try:
        found = _symbol(spec)
        if isinstance(found, ModuleType) and ":" not in spec:
            found = _app_in_module(found, found.__name__)
    except CliError:
        raise
    except ModuleNotFoundError as exc:
        if exc.name and (top == exc.name or top.startswith(f"{exc.name}.")):
            raise CliError(f"unable to load the app: module {exc.name!r} was not found "
                           f"(from {os.getcwd()!r}; set --workdir or PYTHONPATH)") from None
        raise CliError(_import_failed(spec, exc)) from None
    except AttributeError as exc:
        raise CliError(f"unable to load the app {spec!r}: {exc}") from None
    except Exception as exc:
        raise CliError(_import_failed(spec, exc)) from None
    class_name = _foreign_celery(found)
    if class_name:
        raise _not_akadze_app(spec, found, class_name)
    if not _is_app(found):
        raise CliError(f"{spec!r} is not a Celery app (it is a {type(found).__name__}): "
                       "name the app with -A module:attribute")
    return found


def _import_failed(spec: str, exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"unable to load the app {spec!r}: {type(exc).__name__}: {exc}{where}"


def split_names(values: Iterable[str] | None) -> list[str]:
    """Comma-separated (and repeated) names as one list, in order, without duplicates."""
    names = [name.strip() for value in values or () for name in value.split(",")]
    return list(dict.fromkeys(name for name in names if name))


@dataclass
class CliState:
    """What the global options leave for the commands."""

    app_spec: str | None
    config: str | None
    quiet: bool
    #: The command line (without the program name), re-executed by prefork children.
    invocation: list[str] = field(default_factory=list)
    _app: Any = None

    def load_app(self, required: bool = True) -> Any:
        """The app of ``-A`` (imported once); without ``-A``, a bare app when allowed."""
        if self._app is not None:
            return self._app
        if self.app_spec:
            app = find_app(self.app_spec)
        elif required:
            raise CliError("no app given: name it with -A, e.g. akadze-compat -A proj worker",
                           exit_code=2)
        else:
            app = Celery("default", set_as_current=False)
        if self.config and getattr(app, "config_source", None) is None:
            app.config_from_object(self.config)
        with contextlib.suppress(Exception):
            secrets.add_url(app.conf.broker_url)
        self._app = app
        return app


def cli_state(ctx: click.Context) -> CliState:
    """The ``CliState`` of this invocation."""
    state = ctx.find_object(CliState)
    assert state is not None
    return state
