"""Flower's own ways of configuring ``flower``, read by ``akadze-compat flower``.

Flower (``flower/options.py``, ``flower/command.py``) takes its options as tornado options
(``--basic_auth=user:pass`` and ``--basic-auth=...`` alike), from ``FLOWER_<OPTION>``
environment variables, and from a config file (``--conf``, default ``flowerconfig.py``),
command line over file over environment. A deployment that keeps its credentials in any of
these must not get an open dashboard: the credentials are read, and an authentication or
TLS option the dashboard cannot honour (Flower's OAuth ``--auth``, ``--auth_provider``,
``--certfile``) stops the command instead of being ignored.

The config file is read as data (``ast.literal_eval`` of ``NAME = literal`` lines), never
executed.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .base import CliError

__all__ = ["FlowerOptions", "read_flower_options"]

ENV_PREFIX = "FLOWER_"
DEFAULT_CONFIG_FILE = "flowerconfig.py"

#: The options read here, by their tornado name (dashes as underscores).
_VALUE_OPTIONS = ("basic_auth", "port", "address", "url_prefix", "read_only")
#: Authentication the dashboard does not have: serving without it would serve open pages.
_AUTH_OPTIONS = ("auth", "auth_provider", "oauth2_key", "oauth2_secret", "oauth2_redirect_uri")
#: TLS the dashboard does not serve (a proxy in front does).
_TLS_OPTIONS = ("certfile", "keyfile", "ca_certs")
#: Flower's variables that are not options: the config file's name, and the switch that
#: opens the API without credentials (honoured by ``akadze_compat.flower_api``).
_NOT_OPTIONS = (f"{ENV_PREFIX}CONF", f"{ENV_PREFIX}UNAUTHENTICATED_API")
_TRUE = ("1", "true", "yes", "y", "on", "t")
_FALSE = ("0", "false", "no", "n", "off", "f")


@dataclass
class FlowerOptions:
    """What Flower's spellings asked for; None where they said nothing."""

    basic_auth: str | None = None
    port: int | None = None
    address: str | None = None
    url_prefix: str | None = None
    read_only: bool | None = None
    #: Options understood but not used (warned about, as before).
    ignored: list[str] = field(default_factory=list)


def _name(option: str) -> str:
    return option.strip().lstrip("-").replace("-", "_").lower()


def _refuse(name: str, where: str) -> CliError:
    if name in _TLS_OPTIONS:
        return CliError(f"flower: {where} asks for TLS ({name}), which the dashboard does not "
                        "serve: terminate TLS in a proxy in front of it and drop the option")
    return CliError(f"flower: {where} asks for Flower's OAuth login ({name}), which the "
                    "dashboard does not have: use --basic-auth user:password (or --token) "
                    "and drop the option; refusing to serve the pages without a login")


def _set(options: FlowerOptions, name: str, value: object, where: str) -> None:
    """Apply one option (tornado name) from ``where`` (for messages, never the value)."""
    if name in _AUTH_OPTIONS or name in _TLS_OPTIONS:
        if value in (None, "", [], (), False):
            return  # Flower's own default: no OAuth, no TLS
        raise _refuse(name, where)
    if name not in _VALUE_OPTIONS:
        options.ignored.append(where)
        return
    try:
        if name == "basic_auth":
            entries = [value] if isinstance(value, str) else list(value)  # type: ignore[call-overload]
            options.basic_auth = ",".join(str(entry) for entry in entries)
        elif name == "port":
            options.port = int(value)  # type: ignore[call-overload]
        elif name == "read_only":
            text = str(value).strip().lower()
            if text not in _TRUE + _FALSE:
                raise ValueError(name)
            options.read_only = text in _TRUE
        else:
            setattr(options, name, str(value))
    except (TypeError, ValueError):
        raise CliError(f"flower: {where}: not a valid {name}") from None


def _from_environment(options: FlowerOptions, environ: Mapping[str, str]) -> None:
    for variable in sorted(environ):
        if variable.startswith(ENV_PREFIX) and variable not in _NOT_OPTIONS:
            _set(options, _name(variable[len(ENV_PREFIX):]), environ[variable], variable)


def _from_config_file(options: FlowerOptions, path: Path, explicit: bool) -> None:
    """Flower's ``flowerconfig.py``, read as data: ``name = literal`` lines."""
    try:
        tree = ast.parse(path.read_text("utf-8"), str(path))
    except FileNotFoundError:
        if explicit:
            raise CliError(f"flower: --conf {path}: no such file") from None
        return
    except (OSError, SyntaxError, ValueError) as exc:
        raise CliError(f"flower: cannot read {path}: {type(exc).__name__}") from None
    for statement in tree.body:
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)):
            continue
        name = _name(statement.targets[0].id)
        where = f"{path.name}: {name}"
        try:
            value = ast.literal_eval(statement.value)
        except ValueError:
            if name in _VALUE_OPTIONS + _AUTH_OPTIONS + _TLS_OPTIONS:
                raise CliError(f"flower: {where} is not a plain value (the file is read, not "
                               "run): write it as a literal") from None
            options.ignored.append(where)
            continue
        _set(options, name, value, where)


def _from_command_line(options: FlowerOptions, args: Sequence[str]) -> str | None:
    """Flower's tornado-style options left over by click; returns ``--conf``'s value."""
    conf = None
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if not arg.startswith("-"):
            options.ignored.append(arg)
            continue
        name, equals, value = arg.partition("=")
        name = _name(name)
        known = name in _VALUE_OPTIONS + _AUTH_OPTIONS + _TLS_OPTIONS + ("conf",)
        if not equals and known and name != "read_only":
            # click's spelling, ``--basic_auth user:pass``: the value is the next word.
            if index >= len(args):
                raise CliError(f"flower: option --{name} needs a value")
            value = args[index]
            index += 1
        elif not equals and name == "read_only":
            value = "true"
        if name == "conf":
            conf = value
            continue
        # An ignored option is named with its value unless the value may be a secret.
        secret = any(word in name for word in ("secret", "key", "password", "token"))
        _set(options, name, value, f"--{name}" if known or secret else arg)
    return conf


def read_flower_options(args: Sequence[str], environ: Mapping[str, str] | None = None,
                        cwd: Path | None = None) -> FlowerOptions:
    """Flower's options from ``FLOWER_*`` variables, the config file and ``args`` (what click
    did not parse), in Flower's order: each later source overrides the earlier.

    Raises ``CliError`` (one line, no value quoted) on an option the dashboard cannot honour
    or a malformed one.
    """
    environ = os.environ if environ is None else environ
    from_args = FlowerOptions()
    conf = _from_command_line(from_args, args)
    options = FlowerOptions()
    _from_environment(options, environ)
    conf = conf or environ.get(f"{ENV_PREFIX}CONF")
    path = Path(conf or DEFAULT_CONFIG_FILE)
    if not path.is_absolute():
        path = (cwd or Path.cwd()) / path
    _from_config_file(options, path, explicit=bool(conf))
    for name in _VALUE_OPTIONS:
        if getattr(from_args, name) is not None:
            setattr(options, name, getattr(from_args, name))
    options.ignored.extend(from_args.ignored)
    return options
